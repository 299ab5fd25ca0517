"""envpool environments: id validation, construction and the spec agents build from."""

import difflib
import functools
import warnings
from typing import Any

import envpool
import numpy as np

from gorila_jax import types


@functools.cache
def _known_env_ids() -> tuple[str, ...]:
    return tuple(envpool.list_all_envs())


def _quiet_box_warnings() -> None:
    # gymnasium notes every float64 -> float32 Box cast envpool makes; harmless.
    # A filter, not catch_warnings(): that one is not thread-safe and actors
    # build envs in threads under the local launcher.
    warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered")


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if envpool does not know `env_id`."""
    known = _known_env_ids()
    if env_id in known:
        return
    close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see envpool.list_all_envs()"
    raise ValueError(f"unknown env id {env_id!r}{hint}")


def make_env(env_id: str, num_envs: int, seed: int, **env_kwargs: Any) -> Any:
    """A gymnasium-API envpool vector env of `num_envs` copies, seeded with `seed`.

    envpool resets an env on the step *after* it ended: that step returns the
    first observation of the new episode with reward 0 and ignores the action.
    """
    check_env_id(env_id)
    if num_envs < 1:
        raise ValueError(f"num_envs must be positive, got {num_envs}")
    _quiet_box_warnings()
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **env_kwargs)


def env_spec(env_id: str, **env_kwargs: Any) -> types.EnvSpec:
    """The spec of `env_id` without building the environment."""
    check_env_id(env_id)
    _quiet_box_warnings()
    spec = envpool.make_spec(env_id, **env_kwargs)
    obs_space, act_space = spec.observation_space, spec.action_space
    discrete = hasattr(act_space, "n")
    return types.EnvSpec(
        env_id=env_id,
        observation_shape=tuple(obs_space.shape),
        observation_dtype=np.dtype(obs_space.dtype).name,
        action_shape=() if discrete else tuple(act_space.shape),
        action_dtype="int32" if discrete else np.dtype(act_space.dtype).name,
        num_actions=int(act_space.n) if discrete else 0,
        action_low=() if discrete else tuple(float(x) for x in act_space.low),
        action_high=() if discrete else tuple(float(x) for x in act_space.high),
        max_episode_steps=int(spec.config.max_episode_steps),
    )
