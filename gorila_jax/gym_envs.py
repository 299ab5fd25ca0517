"""Any registered Gymnasium environment as an env family: `--env=gym:<id>`.

`gym:CartPole-v1` is `gymnasium.make_vec("CartPole-v1", ...)`, its copies stepped one
after another in the actor's process (gymnasium's sync vector env), with the
next-step auto-reset that envpool has (`env_api.VectorEnv`). `gym:<module>:<id>`
imports `module` first, as `gymnasium.make` does, so an environment a user registers
there is found in every process of a run (a Ray actor imports it too).
"""

import functools
import importlib
from typing import Any

import gymnasium
import numpy as np

from gorila_jax import env_api, types

PREFIX = "gym:"


def owns(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def _gym_id(env_id: str) -> str:
    return env_id[len(PREFIX) :]


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if Gymnasium's registry lacks the id (after
    importing its module, for `gym:<module>:<id>`)."""
    gym_id = _gym_id(env_id)
    module, _, name = gym_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)  # it registers its envs, as gymnasium.make does
        except ImportError as error:
            raise ValueError(f"{env_id}: cannot import {module!r} ({error})") from None
    known = [f"{PREFIX}{module + ':' if module else ''}{key}" for key in gymnasium.registry]
    env_api.check_known(env_id, known, "gymnasium.pprint_registry() lists them")


@functools.cache
def _spaces(gym_id: str) -> tuple[Any, Any, int]:
    """(observation space, action space, max episode steps) of one copy."""
    env = gymnasium.make(gym_id)
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
        return env.observation_space, env.action_space, limit
    finally:
        env.close()


def env_spec(env_id: str) -> types.EnvSpec:
    """The spec of one copy (made and closed once per process).

    Raises:
      ValueError: spaces no agent takes, or an env without a time limit (the actor's
        episode accounting and the evaluation need episodes that end).
    """
    obs_space, act_space, limit = _spaces(_gym_id(env_id))
    if not limit:
        raise ValueError(
            f"{env_id} has no max_episode_steps: register it with one (gymnasium.register("
            "..., max_episode_steps=N)), so that its episodes end"
        )
    return env_api.spec_from_spaces(env_id, obs_space, act_space, limit)


class GymVectorEnv(env_api.SendRecvByStep):
    """A Gymnasium vector env with envpool's surface: `send`/`recv` beside `step`, a
    seed given once at the first `reset`, float32 rewards, and observations in the
    spec's dtype (a dict of Boxes flattened, `env_api.flatten_observations`)."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        self.env = gymnasium.make_vec(
            _gym_id(env_id),
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP},
        )
        self.num_envs, self._seed = num_envs, seed
        space = self.env.single_observation_space
        self._keys = env_api.flat_keys(space) if isinstance(space, gymnasium.spaces.Dict) else None
        self._dtype = env_spec(env_id).observation_dtype
        self.observation_space = space
        self.action_space = self.env.single_action_space

    def _observations(self, observations: Any) -> np.ndarray:
        if self._keys is not None:
            return env_api.flatten_observations(observations, self._keys)
        return np.asarray(observations, self._dtype)

    def reset(self) -> tuple[np.ndarray, dict]:
        observations, info = self.env.reset(seed=self._seed)
        return self._observations(observations), info

    def step(self, actions: np.ndarray) -> tuple:
        observations, reward, terminated, truncated, info = self.env.step(actions)
        return (
            self._observations(observations),
            np.asarray(reward, np.float32),
            np.asarray(terminated, bool),
            np.asarray(truncated, bool),
            info,
        )

    def close(self) -> None:
        self.env.close()


# Training and evaluation envs are alike: Gymnasium's preprocessing is the env's own.
FAMILY = env_api.family_without_options(
    "Gymnasium (gym:<id>)", "gym:", owns, check_env_id, env_spec, GymVectorEnv
)
