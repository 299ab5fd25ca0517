"""Environments by id: validation, construction and the spec agents build from.

Every id belongs to one family (`FAMILIES`, the interface in env_api.py): envpool's
tasks, multi-agent `mpe/...` tasks (multiagent.py), any registered Gymnasium env as
`gym:<id>` (gym_envs.py) and gymnax's JAX envs as `gymnax/<id>` (gymnax_envs.py), each
a `env_api.VectorEnv` of the same rules.
"""

import functools
import warnings
from typing import Any

import gymnasium
import numpy as np

from gorila_jax import env_api, gym_envs, gymnax_envs, multiagent, types


@functools.cache
def _envpool() -> Any:
    """envpool, imported when an env is first asked for: a learner never needs it, and the
    GPU check runs one where envpool is not installed (bench/gpu_check.sh --offline)."""
    import envpool  # noqa: PLC0415

    return envpool


def _known_env_ids() -> tuple[str, ...]:
    return tuple(_envpool().list_all_envs())


def _quiet_box_warnings() -> None:
    # gymnasium notes every float64 -> float32 Box cast envpool makes; harmless.
    # A filter, not catch_warnings(): that one is not thread-safe and actors
    # build envs in threads under the local launcher.
    warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered")


def _check_envpool_id(env_id: str) -> None:
    env_api.check_known(env_id, _known_env_ids(), "see envpool.list_all_envs()")


# The DQN preprocessing of Mnih et al. (2015) that envpool does not do by
# default. envpool's Atari defaults already give the rest: 84x84 grayscale,
# 4-frame stacks, frame skip 4 (max-pooled over the last two frames), up to 30
# no-op starts, fire on reset, no sticky actions, and 27,000-step (108k-frame)
# episodes. Training ends an "episode" at each lost life (bootstrapping stops
# there) and clips rewards to [-1, 1]; evaluation plays whole games and sums
# the raw score.
_TRAINING_PREPROCESSING = {"episodic_life": True, "reward_clip": True}
_EVALUATION_PREPROCESSING = {"episodic_life": False, "reward_clip": False}


@functools.cache
def _config_fields(env_id: str) -> frozenset[str]:
    return frozenset(_envpool().make_spec(env_id).config._fields)


def preprocessing(env_id: str, evaluation: bool) -> dict[str, Any]:
    """envpool options of the training (or evaluation) preprocessing for `env_id`.

    Applies to every env family whose envpool config has these options
    (Atari); other envs get none.
    """
    options = _EVALUATION_PREPROCESSING if evaluation else _TRAINING_PREPROCESSING
    fields = _config_fields(env_id)
    return {name: value for name, value in options.items() if name in fields}


def game_signals(reward, terminated, truncated, info) -> tuple[np.ndarray, np.ndarray]:
    """(raw reward, whole game over) of one vector step, for reporting training returns.

    With the training preprocessing, Atari rewards are clipped and an
    "episode" ends at each lost life; users compare runs by game scores, so
    returns are summed from envpool's unclipped `info["reward"]` until the
    game really ends (`info["terminated"]`). Other envs: the step's own values.
    """
    raw_reward = info.get("reward", reward)
    game_terminated = info["terminated"].astype(bool) if "lives" in info else terminated
    return raw_reward, game_terminated | truncated


class FlatDictObservations:
    """An envpool vector env that observes a dict of numeric arrays, handing out
    `flatten_observations` of them instead: `reset`, `step` and `recv` return one
    float32 array [E, D]; everything else (`send`, `close`, `render`,
    `action_space`, `config`, ...) is the envpool env's own.

    `observation_space` is the flat single-env Box, unbounded: envpool's dm_control
    bounds are [DBL_MIN, DBL_MAX], no real bounds.
    """

    def __init__(self, env: Any):
        self.env = env
        self.keys = env_api.flat_keys(env.observation_space)
        shape = env_api.flat_shape(env.observation_space)
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, shape, np.float32)
        self.single_observation_space = self.observation_space

    def reset(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(*args, **kwargs)
        return env_api.flatten_observations(obs, self.keys), info

    def step(self, *args: Any, **kwargs: Any) -> tuple:
        obs, *rest = self.env.step(*args, **kwargs)
        return env_api.flatten_observations(obs, self.keys), *rest

    def recv(self, *args: Any, **kwargs: Any) -> tuple:
        obs, *rest = self.env.recv(*args, **kwargs)
        return env_api.flatten_observations(obs, self.keys), *rest

    def __getattr__(self, name: str) -> Any:
        if name in ("env", "keys"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


def make_env(
    env_id: str, num_envs: int, seed: int, evaluation: bool = False, **env_kwargs: Any
) -> env_api.VectorEnv:
    """A gymnasium-API envpool vector env of `num_envs` copies, seeded with `seed`.

    A multi-agent task's copies give `spec.agents_per_env` rows each
    (`multiagent.RoleEnv`).

    Training envs (the default) and evaluation envs differ in their
    preprocessing (see `preprocessing`); `env_kwargs` override both. An env
    that observes a dict of numeric arrays (dm_control) comes wrapped in a
    `FlatDictObservations`, which hands out one float32 array [num_envs, D]
    (see `flatten_observations`), the observations `env_spec` describes.
    envpool resets an env on the step *after* it ended: that step returns the
    first observation of the new episode with reward 0 and ignores the action.
    """
    check_env_id(env_id)
    if num_envs < 1:
        raise ValueError(f"num_envs must be positive, got {num_envs}")
    return family(env_id).make_env(env_id, num_envs, seed, evaluation, **env_kwargs)


def _envpool_spec(env_id: str, **env_kwargs: Any) -> types.EnvSpec:
    _quiet_box_warnings()
    try:
        spec = _envpool().make_spec(env_id, **env_kwargs)
    except (ImportError, RuntimeError) as error:  # Procgen without Qt; ViZDoom's custom map
        reason = str(error).splitlines()[0] if str(error) else ""
        raise ValueError(f"{env_id}: envpool cannot load it here ({reason})") from None
    try:
        # The gymnasium spaces by name: envpool 0.8 (the DeepMind set) gives gym's as
        # `observation_space`, envpool 1.2 gymnasium's; both have these.
        obs_space, act_space = spec.gymnasium_observation_space, spec.gymnasium_action_space
        return env_api.spec_from_spaces(env_id, obs_space, act_space, spec.config.max_episode_steps)
    except TypeError as error:  # envpool 1.2 fails on some dm_control, Jumanji and pgx specs
        raise ValueError(f"{env_id}: envpool cannot describe its spaces ({error})") from None


def _make_envpool_env(
    env_id: str, num_envs: int, seed: int, evaluation: bool = False, **env_kwargs: Any
) -> env_api.VectorEnv:
    _quiet_box_warnings()
    options = {**preprocessing(env_id, evaluation), **env_kwargs}
    env = _envpool().make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **options)
    space = env.observation_space
    if isinstance(space, gymnasium.spaces.Dict) and env_api.dict_problem(space) is None:
        return FlatDictObservations(env)
    return env


def _make_mpe_env(
    env_id: str, num_envs: int, seed: int, evaluation: bool = False, **env_kwargs: Any
) -> env_api.VectorEnv:
    # Preprocessing and the thread pool are envpool's; the rest go to the task.
    env_kwargs.pop("num_threads", None)
    return multiagent.RoleEnv(env_id, num_envs, seed, **env_kwargs)


# The families by the prefix of their ids; envpool's ids have none, so it comes last.
FAMILIES = (
    env_api.EnvFamily(
        "mpe2 (several agents)",
        multiagent.is_multiagent,
        multiagent.check_env_id,
        lambda env_id, **_: multiagent.env_spec(env_id),
        _make_mpe_env,
    ),
    gym_envs.FAMILY,
    gymnax_envs.FAMILY,
    env_api.EnvFamily(
        "envpool",
        lambda env_id: True,
        _check_envpool_id,
        _envpool_spec,
        _make_envpool_env,
        thread_pool=True,
    ),
)


def family(env_id: str) -> env_api.EnvFamily:
    """The family whose id `env_id` is."""
    return next(candidate for candidate in FAMILIES if candidate.owns(env_id))


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if `env_id`'s family does not know it."""
    family(env_id).check_env_id(env_id)


def env_spec(env_id: str, **env_kwargs: Any) -> types.EnvSpec:
    """The spec of `env_id` without building the environment.

    Raises:
      ValueError: for an unknown id, an env its family cannot load or describe here,
        or spaces no agent takes (saying which and why).
    """
    check_env_id(env_id)
    return family(env_id).env_spec(env_id, **env_kwargs)


def uniform_random_actions(spec: types.EnvSpec, rng: np.random.Generator, count: int):
    """`count` actions drawn uniformly from `spec`'s action space (a random policy's)."""
    if spec.discrete:
        return rng.integers(0, spec.num_actions, count, dtype=np.int32)
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    return rng.uniform(low, high, (count, *spec.action_shape)).astype(spec.action_dtype)


@functools.lru_cache(maxsize=8)
def random_policy_absmax(
    env_id: str, num_steps: int = 2048, num_envs: int = 8, seed: int = 0
) -> np.ndarray:
    """Each observation feature's largest magnitude over `num_steps` env steps of a uniform
    random policy, float32 [*observation_shape].

    Seeded (the env and the actions), so every process that asks gets the same
    answer: what a float8 replay's per-feature scale is fixed from
    (gorila_jax/replay/compact.py).
    """
    spec = env_spec(env_id)
    env = make_env(env_id, num_envs, seed)
    rng = np.random.default_rng(seed)
    try:
        observations, _ = env.reset()
        absmax = np.abs(np.asarray(observations, np.float32)).max(axis=0)
        for _ in range(max(1, num_steps // num_envs)):
            observations = env.step(uniform_random_actions(spec, rng, num_envs))[0]
            absmax = np.maximum(absmax, np.abs(np.asarray(observations, np.float32)).max(axis=0))
    finally:
        env.close()
    absmax.setflags(write=False)  # cached: shared by every caller
    return absmax
