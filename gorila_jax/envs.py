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
    return frozenset(envpool.make_spec(env_id).config._fields)


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


def make_env(
    env_id: str, num_envs: int, seed: int, evaluation: bool = False, **env_kwargs: Any
) -> Any:
    """A gymnasium-API envpool vector env of `num_envs` copies, seeded with `seed`.

    Training envs (the default) and evaluation envs differ in their
    preprocessing (see `preprocessing`); `env_kwargs` override both.
    envpool resets an env on the step *after* it ended: that step returns the
    first observation of the new episode with reward 0 and ignores the action.
    """
    check_env_id(env_id)
    if num_envs < 1:
        raise ValueError(f"num_envs must be positive, got {num_envs}")
    _quiet_box_warnings()
    options = {**preprocessing(env_id, evaluation), **env_kwargs}
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **options)


def _space_problem(env_id: str, kind: str, space: Any) -> str | None:
    """Why agents here cannot take `space` as their `kind` ("observations"/"actions"), or None.

    Agents take one array of observations and one Discrete or flat Box of actions.
    """
    name = type(space).__name__
    if hasattr(space, "spaces"):  # gymnasium's Dict and Tuple
        parts = space.spaces
        keys = ", ".join(map(str, parts.keys() if hasattr(parts, "keys") else range(len(parts))))
        return f"{env_id} has {name.lower()} {kind} ({keys}); gorila-jax agents take one array"
    if space.shape is None:
        return f"{env_id} has {name} {kind}; gorila-jax agents take one Box or Discrete array"
    if kind == "observations" and hasattr(space, "n"):
        # A tabular state index (toy_text's FrozenLake, Taxi): as one number it
        # carries no features to generalize over; agents would need a one-hot.
        return (
            f"{env_id} observes one integer state out of {int(space.n)} (a Discrete space, "
            "tabular); gorila-jax agents take an array of features"
        )
    if kind == "actions" and not hasattr(space, "n"):
        if not np.issubdtype(space.dtype, np.floating):
            return f"{env_id} has {np.dtype(space.dtype).name} Box actions; agents take float ones"
        if len(space.shape) != 1:
            return f"{env_id} has Box actions of shape {space.shape}; agents take flat (A,) ones"
    return None


def env_spec(env_id: str, **env_kwargs: Any) -> types.EnvSpec:
    """The spec of `env_id` without building the environment.

    Raises:
      ValueError: for an unknown id, an env envpool cannot load or describe here,
        or spaces no agent takes (saying which and why).
    """
    check_env_id(env_id)
    _quiet_box_warnings()
    try:
        spec = envpool.make_spec(env_id, **env_kwargs)
    except (ImportError, RuntimeError) as error:  # Procgen without Qt; ViZDoom's custom map
        reason = str(error).splitlines()[0] if str(error) else ""
        raise ValueError(f"{env_id}: envpool cannot load it here ({reason})") from None
    try:
        obs_space, act_space = spec.observation_space, spec.action_space
        problems = [
            _space_problem(env_id, "observations", obs_space),
            _space_problem(env_id, "actions", act_space),
        ]
    except TypeError as error:  # envpool 1.2 fails on some dm_control, Jumanji and pgx specs
        raise ValueError(f"{env_id}: envpool cannot describe its spaces ({error})") from None
    if any(problems):
        raise ValueError(next(problem for problem in problems if problem))
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
