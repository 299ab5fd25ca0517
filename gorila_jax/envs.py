"""envpool environments: id validation, construction and the spec agents build from.

Multi-agent tasks (`mpe/...` ids) come from gorila_jax/multiagent.py through the
same three functions, as vector envs of the same shape.
"""

import difflib
import functools
import math
import warnings
from typing import Any

import gymnasium
import numpy as np

from gorila_jax import multiagent, types


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


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if neither envpool nor mpe2 knows `env_id`."""
    known = _known_env_ids()
    if multiagent.is_multiagent(env_id):
        known = multiagent.known_env_ids()
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


# Dict observations (dm_control's position, velocity, ...; robotics' goals)
# reach agents as one array: every entry flattened to 1-D, in sorted key order,
# concatenated, as float32. The one place that does it is `flatten_observations`.
FLAT_DTYPE = "float32"


def _dict_problem(space: gymnasium.spaces.Dict) -> str | None:
    """Why `space`'s entries cannot be flattened into one array of numbers, or None.

    Every entry must be a Box of numbers (float, int or bool). Refused: uint8
    arrays (images, or text as bytes: MiniGrid's image and mission, Sokoban's
    grid), other spaces (Discrete, MultiBinary, Text) and nested dicts.
    """
    if not space.spaces:
        return "it has no entries"
    for key, entry in space.spaces.items():
        kind = type(entry).__name__
        if hasattr(entry, "spaces"):
            return f"{key!r} is a nested {kind.lower()}"
        if not isinstance(entry, gymnasium.spaces.Box):
            return f"{key!r} is a {kind} space"
        dtype = np.dtype(entry.dtype)
        if dtype == np.uint8:
            return f"{key!r} is a uint8 Box {list(entry.shape)} (an image or text as bytes)"
        if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
            return f"{key!r} is a Box of {dtype.name}"
    return None


def _flat_shape(space: gymnasium.spaces.Dict) -> tuple[int]:
    return (sum(math.prod(entry.shape) for entry in space.spaces.values()),)


def flat_keys(space: gymnasium.spaces.Dict) -> list[str]:
    """The order `flatten_observations` concatenates a dict space's entries in: sorted keys."""
    return sorted(space.spaces)


def flatten_observations(observations: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """One float32 array [E, D] of a vector env's dict observations {key: [E, ...]}:
    the entries of `keys` (`flat_keys` of the space), each flattened per env,
    concatenated in that order."""
    num_envs = len(observations[keys[0]])
    parts = [np.asarray(observations[key]).reshape(num_envs, -1) for key in keys]
    return np.concatenate(parts, axis=1, dtype=np.float32)


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
        self.keys = flat_keys(env.observation_space)
        shape = _flat_shape(env.observation_space)
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, shape, np.float32)
        self.single_observation_space = self.observation_space

    def reset(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(*args, **kwargs)
        return flatten_observations(obs, self.keys), info

    def step(self, *args: Any, **kwargs: Any) -> tuple:
        obs, *rest = self.env.step(*args, **kwargs)
        return flatten_observations(obs, self.keys), *rest

    def recv(self, *args: Any, **kwargs: Any) -> tuple:
        obs, *rest = self.env.recv(*args, **kwargs)
        return flatten_observations(obs, self.keys), *rest

    def __getattr__(self, name: str) -> Any:
        if name in ("env", "keys"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


def make_env(
    env_id: str, num_envs: int, seed: int, evaluation: bool = False, **env_kwargs: Any
) -> Any:
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
    if multiagent.is_multiagent(env_id):
        # Preprocessing and the thread pool are envpool's; the rest go to the task.
        env_kwargs.pop("num_threads", None)
        return multiagent.RoleEnv(env_id, num_envs, seed, **env_kwargs)
    _quiet_box_warnings()
    options = {**preprocessing(env_id, evaluation), **env_kwargs}
    env = _envpool().make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **options)
    space = env.observation_space
    if isinstance(space, gymnasium.spaces.Dict) and _dict_problem(space) is None:
        return FlatDictObservations(env)
    return env


def _space_problem(env_id: str, kind: str, space: Any) -> str | None:
    """Why agents here cannot take `space` as their `kind` ("observations"/"actions"), or None.

    Agents take one array of observations and one Discrete or flat Box of actions.
    A dict of numeric Box observations counts as one array: its entries are
    flattened and concatenated (`flatten_observations`).
    """
    name = type(space).__name__
    if hasattr(space, "spaces"):  # gymnasium's Dict and Tuple
        parts = space.spaces
        keys = ", ".join(map(str, parts.keys() if hasattr(parts, "keys") else range(len(parts))))
        refusal = f"{env_id} has {name.lower()} {kind} ({keys}); gorila-jax agents take one array"
        if kind == "observations" and isinstance(space, gymnasium.spaces.Dict):
            problem = _dict_problem(space)
            if problem is None:
                return None  # flattened: see `flatten_observations`
            return (
                f"{refusal} (they flatten a dict into one when every entry is a numeric Box; "
                f"here {problem})"
            )
        return refusal
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
    if multiagent.is_multiagent(env_id):
        return multiagent.env_spec(env_id)
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
        problems = [
            _space_problem(env_id, "observations", obs_space),
            _space_problem(env_id, "actions", act_space),
        ]
    except TypeError as error:  # envpool 1.2 fails on some dm_control, Jumanji and pgx specs
        raise ValueError(f"{env_id}: envpool cannot describe its spaces ({error})") from None
    if any(problems):
        raise ValueError(next(problem for problem in problems if problem))
    discrete = hasattr(act_space, "n")
    if isinstance(obs_space, gymnasium.spaces.Dict):  # flattened, as `make_env`'s envs hand it
        observation_shape, observation_dtype = _flat_shape(obs_space), FLAT_DTYPE
    else:
        observation_shape = tuple(obs_space.shape)
        observation_dtype = np.dtype(obs_space.dtype).name
    return types.EnvSpec(
        env_id=env_id,
        observation_shape=observation_shape,
        observation_dtype=observation_dtype,
        action_shape=() if discrete else tuple(act_space.shape),
        action_dtype="int32" if discrete else np.dtype(act_space.dtype).name,
        num_actions=int(act_space.n) if discrete else 0,
        action_low=() if discrete else tuple(float(x) for x in act_space.low),
        action_high=() if discrete else tuple(float(x) for x in act_space.high),
        max_episode_steps=int(spec.config.max_episode_steps),
    )


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
