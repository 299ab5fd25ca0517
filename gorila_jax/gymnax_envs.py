"""gymnax's JAX environments as an env family: `--env=gymnax/<id>` (`gymnax/CartPole-v1`,
`gymnax/Breakout-MinAtar`, `gymnax/Pendulum-v1`, ...).

An actor steps `num_envs` copies as one jitted, vmapped program on its JAX device,
under envpool's rules (`env_api.VectorEnv`): a copy whose episode ended is reset on
its *next* step, which returns the new episode's first observation with reward 0 and
ignores the action. gymnax's own `step` resets in the same step instead, so this
calls `step_env` and `reset_env` and picks per copy. Terminated and truncated come
apart as gymnax 1.0 gives them: `step_env`'s terminal flag and `is_truncated` (its
time limit, `max_steps_in_episode`).
"""

import functools
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from gorila_jax import env_api, types

PREFIX = "gymnax/"


@functools.cache
def _gymnax() -> Any:
    """gymnax, imported when a gymnax env is first asked for (it imports its every family).

    Raises:
      ValueError: where it is not installed (the DeepMind set has no gymnax).
    """
    try:
        import gymnax  # noqa: PLC0415
    except ImportError as error:
        raise ValueError(
            f"gymnax envs need gymnax, which this Python lacks ({error}); the default set "
            "(requirements.txt) has it"
        ) from None
    return gymnax


def owns(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def _name(env_id: str) -> str:
    return env_id[len(PREFIX) :]


def known_env_ids() -> tuple[str, ...]:
    """gymnax's ids, with the prefix; none where gymnax is not installed."""
    try:
        return tuple(PREFIX + name for name in _gymnax().registered_envs)
    except ValueError:
        return ()


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if gymnax lacks the id (or is not installed)."""
    _gymnax()
    env_api.check_known(env_id, known_env_ids(), "python -m launch.train --list_envs lists them")


@functools.cache
def _made(env_id: str) -> tuple[Any, Any]:
    """(gymnax env, its default params), one per id and process."""
    try:
        return _gymnax().make(_name(env_id))
    except Exception as error:  # noqa: BLE001 (MNISTBandit downloads MNIST, which may fail)
        raise ValueError(f"{env_id}: gymnax cannot make it here ({error})") from None


def _gymnasium_space(space: Any) -> Any:
    """gymnax's space as gymnasium's, for `env_api.spec_from_spaces` and its checks."""
    spaces = _gymnax().environments.spaces
    if isinstance(space, spaces.Discrete):
        return gymnasium.spaces.Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype)
        low = np.broadcast_to(np.asarray(space.low, dtype), space.shape)
        high = np.broadcast_to(np.asarray(space.high, dtype), space.shape)
        return gymnasium.spaces.Box(low, high, tuple(space.shape), dtype)
    if isinstance(space, spaces.Dict):
        return gymnasium.spaces.Dict(
            {key: _gymnasium_space(entry) for key, entry in space.spaces.items()}
        )
    if isinstance(space, spaces.Tuple):
        return gymnasium.spaces.Tuple([_gymnasium_space(entry) for entry in space.spaces])
    raise ValueError(f"gymnax space {type(space).__name__} has no gymnasium counterpart here")


def spaces(env_id: str) -> tuple[Any, Any]:
    """(observation space, action space) of one copy, as gymnasium spaces."""
    env, params = _made(env_id)
    return _gymnasium_space(env.observation_space(params)), _gymnasium_space(
        env.action_space(params)
    )


def env_spec(env_id: str) -> types.EnvSpec:
    """The spec of one copy.

    Raises:
      ValueError: spaces no agent takes (`env_api.space_problem`: FrozenLake's state
        index), or an env gymnax cannot make here.
    """
    obs_space, act_space = spaces(env_id)
    _, params = _made(env_id)
    return env_api.spec_from_spaces(env_id, obs_space, act_space, params.max_steps_in_episode)


@functools.cache
def vector_programs(env_id: str, num_envs: int) -> tuple[Any, Any]:
    """(reset, step), jitted over `num_envs` copies; one pair per id, size and process.

    reset(key) -> (key, observations, state, ended); step(key, state, ended, actions) ->
    (key, observations, state, reward, terminated, truncated), `ended` being the previous
    step's terminated | truncated. Pure: an actor calls them from the host, an Anakin
    learner (gorila_jax/anakin) inside its own compiled loop."""
    env, params = _made(env_id)
    reset_copies = jax.vmap(env.reset_env, in_axes=(0, None))
    step_copies = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))
    truncated_copies = jax.vmap(env.is_truncated, in_axes=(0, None))

    @jax.jit
    def reset(key):
        key, reset_key = jax.random.split(key)
        observations, state = reset_copies(jax.random.split(reset_key, num_envs), params)
        return key, observations, state, jnp.zeros(num_envs, bool)

    @jax.jit
    def step(key, state, ended, actions):
        key, step_key, reset_key = jax.random.split(key, 3)
        stepped_obs, stepped, reward, terminated, _ = step_copies(
            jax.random.split(step_key, num_envs), state, actions, params
        )
        truncated = truncated_copies(stepped, params)
        reset_obs, reset = reset_copies(jax.random.split(reset_key, num_envs), params)

        def pick(reset_leaf, stepped_leaf):  # a copy that ended before this step restarts
            mask = ended.reshape((num_envs,) + (1,) * (stepped_leaf.ndim - 1))
            return jnp.where(mask, reset_leaf, stepped_leaf)

        observations = jax.tree.map(pick, reset_obs, stepped_obs)
        state = jax.tree.map(pick, reset, stepped)
        terminated = jnp.asarray(terminated, bool).reshape(num_envs) & ~ended
        truncated = jnp.asarray(truncated, bool).reshape(num_envs) & ~ended & ~terminated
        reward = jnp.where(ended, 0.0, jnp.asarray(reward).reshape(num_envs))
        return key, observations, state, reward.astype(jnp.float32), terminated, truncated

    return reset, step


class GymnaxVectorEnv(env_api.SendRecvByStep):
    """`num_envs` copies of a gymnax env, stepped by one jitted program; numpy in and out."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        self.num_envs = num_envs
        self.observation_space, self.action_space = spaces(env_id)
        spec = env_spec(env_id)
        self._observation_dtype = spec.observation_dtype
        self._action_dtype = spec.action_dtype
        self._reset, self._step = vector_programs(env_id, num_envs)
        self._key = jax.random.key(seed)
        self._state: Any = None
        self._ended: Any = None

    def reset(self) -> tuple[np.ndarray, dict]:
        self._key, observations, self._state, self._ended = self._reset(self._key)
        return np.asarray(observations, self._observation_dtype), {}

    def step(self, actions: np.ndarray) -> tuple:
        if self._state is None:
            raise RuntimeError("step() before reset()")
        actions = jnp.asarray(np.asarray(actions, self._action_dtype))
        self._key, observations, self._state, reward, terminated, truncated = self._step(
            self._key, self._state, self._ended, actions
        )
        self._ended = terminated | truncated
        observations, reward, terminated, truncated = jax.device_get(
            (observations, reward, terminated, truncated)
        )
        return (
            np.asarray(observations, self._observation_dtype),
            reward,
            terminated,
            truncated,
            {},
        )

    def close(self) -> None:
        self._state = None


# gymnax envs take their params' defaults (no envpool options); no preprocessing differs
# between training and evaluation.
FAMILY = env_api.family_without_options(
    "gymnax (gymnax/<id>)", "gymnax", owns, check_env_id, env_spec, GymnaxVectorEnv
)
