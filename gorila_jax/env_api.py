"""The environment interface: what an actor, an evaluator and `env_spec` need of an
environment family, and the checks every family's spaces go through.

A family (envpool's tasks; `mpe/` tasks, gorila_jax/multiagent.py; `gym:` ids,
gorila_jax/gym_envs.py) gives `VectorEnv`s under one rule set, envpool's, so that the
actor, the evaluator and every agent's adder take any of them unchanged, and describes
each of its ids as a `types.EnvSpec` made by `spec_from_spaces`.
"""

import difflib
import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import gymnasium
import numpy as np

from gorila_jax import types


@runtime_checkable
class VectorEnv(Protocol):
    """`num_envs` copies of an environment, stepped together (gymnasium's vector API).

    The rules every family keeps, envpool's:
      - `reset()` -> (observations [E, ...], info); `step(actions)` and
        `send(actions)` then `recv()` -> (observations, rewards [E],
        terminated [E], truncated [E], info), numpy arrays.
      - Auto-reset on the next step: the step *after* a copy's episode ended
        returns that copy's first observation of a new episode, with reward 0
        and terminated/truncated False, and ignores its action.
      - One row per copy, or `EnvSpec.agents_per_env` rows per copy for a
        multi-agent task (copy-major).
      - Observations as the family's `env_spec` describes them (dtype, shape).
    """

    observation_space: Any
    action_space: Any

    def reset(self) -> tuple[np.ndarray, dict]: ...

    def step(self, actions: np.ndarray) -> tuple: ...

    def send(self, actions: np.ndarray) -> None: ...

    def recv(self) -> tuple: ...

    def close(self) -> None: ...


class SendRecvByStep:
    """`send(actions)` then `recv()` as one `step(actions)`: envpool's asynchronous surface
    for families whose copies step in the caller's thread (Gymnasium's, gymnax's)."""

    _sent: np.ndarray | None = None

    def step(self, actions: np.ndarray) -> tuple:
        raise NotImplementedError

    def send(self, actions: np.ndarray) -> None:
        self._sent = actions

    def recv(self) -> tuple:
        if self._sent is None:
            raise RuntimeError("recv() before send(): nothing to step")
        actions, self._sent = self._sent, None
        return self.step(actions)


class EnvFamily(NamedTuple):
    """One family of env ids and how to check, describe and build them.

    Attributes:
      name: what `--list_envs` calls it.
      owns: whether an env id is this family's (by its prefix).
      check_env_id: raises ValueError naming close matches for an id it lacks.
      env_spec: (env_id, **env_kwargs) -> types.EnvSpec, without building envs.
      make_env: (env_id, num_envs, seed, evaluation, **env_kwargs) -> VectorEnv.
      thread_pool: whether its envs step in a pool of worker threads (`num_threads`,
        `--env_threads_per_actor`); without one they step in the actor's thread.
    """

    name: str
    owns: Callable[[str], bool]
    check_env_id: Callable[[str], None]
    env_spec: Callable[..., types.EnvSpec]
    make_env: Callable[..., VectorEnv]
    thread_pool: bool = False


def check_known(env_id: str, known: Any, otherwise: str) -> None:
    """Raises ValueError for an `env_id` not in `known`, naming close matches (or
    `otherwise`, where to look, when none is close)."""
    if env_id in known:
        return
    close = difflib.get_close_matches(env_id, list(known), n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; {otherwise}"
    raise ValueError(f"unknown env id {env_id!r}{hint}")


def refuse_options(env_id: str, kind: str, options: dict[str, Any]) -> None:
    """Raises ValueError for envpool options given to a family (`kind`) that takes none;
    `num_threads`, the size of envpool's thread pool, goes to every family and is dropped."""
    unused = sorted(name for name in options if name != "num_threads")
    if unused:
        raise ValueError(f"{env_id}: {kind} envs take no envpool options ({unused})")


def family_without_options(
    name: str,
    kind: str,
    owns: Callable[[str], bool],
    check_env_id: Callable[[str], None],
    describe: Callable[[str], types.EnvSpec],
    vector_env: Callable[[str, int, int], VectorEnv],
) -> EnvFamily:
    """A family whose envs take no envpool options (refused, not ignored: `refuse_options`)
    and whose training and evaluation envs are alike: `describe(env_id)` gives the spec,
    `vector_env(env_id, num_envs, seed)` the envs."""

    def env_spec(env_id: str, **options: Any) -> types.EnvSpec:
        refuse_options(env_id, kind, options)
        return describe(env_id)

    def make_env(
        env_id: str, num_envs: int, seed: int, evaluation: bool = False, **options: Any
    ) -> VectorEnv:
        refuse_options(env_id, kind, options)
        return vector_env(env_id, num_envs, seed)

    return EnvFamily(name, owns, check_env_id, env_spec, make_env)


# Dict observations (dm_control's position, velocity, ...; robotics' goals)
# reach agents as one array: every entry flattened to 1-D, in sorted key order,
# concatenated, as float32. The one place that does it is `flatten_observations`.
FLAT_DTYPE = "float32"


def dict_problem(space: gymnasium.spaces.Dict) -> str | None:
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


def flat_shape(space: gymnasium.spaces.Dict) -> tuple[int]:
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


def space_problem(env_id: str, kind: str, space: Any) -> str | None:
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
            problem = dict_problem(space)
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


def spec_from_spaces(
    env_id: str, obs_space: Any, act_space: Any, max_episode_steps: int
) -> types.EnvSpec:
    """The spec of an env with these gymnasium spaces (a dict of numeric Boxes observed
    as one flat float32 array, `flatten_observations`).

    Raises:
      ValueError: for spaces no agent takes, saying which and why (`space_problem`).
    """
    problems = [
        space_problem(env_id, "observations", obs_space),
        space_problem(env_id, "actions", act_space),
    ]
    if any(problems):
        raise ValueError(next(problem for problem in problems if problem))
    discrete = hasattr(act_space, "n")
    if isinstance(obs_space, gymnasium.spaces.Dict):
        observation_shape, observation_dtype = flat_shape(obs_space), FLAT_DTYPE
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
        max_episode_steps=int(max_episode_steps),
    )
