"""Demonstration episodes: their file format, recording them, loading them into replay.

A demonstration directory holds one `.npz` file per episode and a manifest
(docs/demonstrations.md has the format for people writing their own):

  demos.json              {"format": FORMAT, "env_id": ..., "episodes": N, "steps": S,
                           "source": what played them, "returns": [...]}
  episode_000000.npz      observations [T + 1, *obs_shape]  (observations[t + 1] followed step t)
                          actions      [T, *action_shape]   (int for discrete actions)
                          rewards      [T]
                          terminated   []  bool: the episode reached a terminal state;
                                            False: it was cut off (a time limit, or the
                                            recording stopped), and learners bootstrap
                                            from its last observation

Observations and actions are those of the env as actors see it (envpool with
the training preprocessing, `envs.make_env`), so that a demonstration becomes
the same replay items an actor would write for the same steps: the loader
feeds each episode through the agent's own adder (n-step returns included),
into the demonstration table (`replay.DEMO_TABLE`), as source `replay.DEMO_SOURCE`.
"""

import functools
import glob
import json
import os
import threading
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay, types
from gorila_jax.acting import parts

FORMAT = "gorila-demos/1"
MANIFEST = "demos.json"
_EPISODE_GLOB = "episode_*.npz"


class Episode(NamedTuple):
    """One demonstrated episode of T steps."""

    observations: np.ndarray  # [T + 1, *obs_shape]
    actions: np.ndarray  # [T, *action_shape]
    rewards: np.ndarray  # [T]
    terminated: bool  # the last step reached a terminal state (else it was cut off)

    @property
    def steps(self) -> int:
        return len(self.rewards)


class DemonstrationError(ValueError):
    """A demonstration directory or episode that cannot be used, and why."""


def write(out_dir: str, episodes: list[Episode], env_id: str, source: str) -> None:
    """Writes `episodes` and the manifest to `out_dir` (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    if glob.glob(os.path.join(out_dir, _EPISODE_GLOB)):
        raise DemonstrationError(f"{out_dir} already holds episodes; give an empty directory")
    for index, episode in enumerate(episodes):
        np.savez(
            os.path.join(out_dir, f"episode_{index:06d}.npz"),
            observations=episode.observations,
            actions=episode.actions,
            rewards=episode.rewards,
            terminated=np.bool_(episode.terminated),
        )
    manifest = {
        "format": FORMAT,
        "env_id": env_id,
        "episodes": len(episodes),
        "steps": int(sum(episode.steps for episode in episodes)),
        "source": source,
        "returns": [float(np.sum(episode.rewards)) for episode in episodes],
    }
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def read(demo_dir: str, spec: types.EnvSpec, limit: int | None = None) -> list[Episode]:
    """The episodes of `demo_dir` (the first `limit`), checked against the env `spec`.

    Raises:
      DemonstrationError: no such directory, no episodes, another env's
        demonstrations, or an episode whose arrays do not fit the env (naming
        the file and what is wrong).
    """
    if not os.path.isdir(demo_dir):
        raise DemonstrationError(f"demonstrations: no directory {demo_dir}")
    manifest_path = os.path.join(demo_dir, MANIFEST)
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise DemonstrationError(
                f"{manifest_path}: format {manifest.get('format')!r}, this version reads {FORMAT!r}"
            )
        if manifest.get("env_id") != spec.env_id:
            raise DemonstrationError(
                f"{demo_dir} holds demonstrations of {manifest.get('env_id')}, not of {spec.env_id}"
            )
    paths = sorted(glob.glob(os.path.join(demo_dir, _EPISODE_GLOB)))
    if not paths:
        raise DemonstrationError(f"{demo_dir} holds no {_EPISODE_GLOB} files")
    return [_read_episode(path, spec) for path in paths[:limit]]


def _read_episode(path: str, spec: types.EnvSpec) -> Episode:
    try:
        with np.load(path) as arrays:
            fields = {name: arrays[name] for name in Episode._fields}
    except KeyError as missing:
        raise DemonstrationError(
            f"{path}: no array {missing}; it needs {Episode._fields}"
        ) from None
    except (OSError, ValueError) as error:
        raise DemonstrationError(f"{path}: not a readable .npz file ({error})") from None
    observations, actions = fields["observations"], fields["actions"]
    rewards = fields["rewards"].astype(np.float32)
    steps = len(rewards)
    problem = None
    if steps < 1 or rewards.ndim != 1:
        problem = f"rewards must be [T], T >= 1; got shape {rewards.shape}"
    elif observations.shape != (steps + 1, *spec.observation_shape):
        problem = (
            f"observations must be [T + 1, *{spec.observation_shape}] = "
            f"{(steps + 1, *spec.observation_shape)}, got {observations.shape}"
        )
    elif actions.shape != (steps, *spec.action_shape):
        problem = (
            f"actions must be [T, *{spec.action_shape}] = {(steps, *spec.action_shape)}, "
            f"got {actions.shape}"
        )
    elif spec.discrete and not (
        np.issubdtype(actions.dtype, np.integer)
        and actions.min() >= 0
        and actions.max() < spec.num_actions
    ):
        problem = f"actions must be integers in [0, {spec.num_actions}), got {actions.dtype}"
    elif not np.isfinite(rewards).all():
        problem = "rewards hold NaN or inf"
    if problem is not None:
        raise DemonstrationError(f"{path} does not fit {spec.env_id}: {problem}")
    action_dtype = np.int32 if spec.discrete else np.float32
    return Episode(
        observations.astype(spec.observation_dtype),
        actions.astype(action_dtype),
        rewards,
        bool(fields["terminated"]),
    )


def add_episodes(adder: builder_lib.Adder, episodes: list[Episode], source: int) -> None:
    """Feeds `episodes` to an actor's `adder` as one env's steps, written as actor `source`'s."""
    for episode in episodes:
        last = episode.steps - 1
        for t in range(episode.steps):
            ended = t == last
            adder.add(
                types.EnvStep(
                    observation=episode.observations[t : t + 1],
                    action=episode.actions[t : t + 1],
                    reward=episode.rewards[t : t + 1],
                    terminated=np.array([ended and episode.terminated]),
                    truncated=np.array([ended and not episode.terminated]),
                    next_observation=episode.observations[t + 1 : t + 2],
                    valid=np.ones(1, bool),
                    actor_index=source,
                )
            )


def load_into_replay(
    demo_dir: str,
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    connection: replay.Connection,
) -> int:
    """Writes the episodes of `demo_dir` to the demonstration table as the agent's items.

    Each episode goes through the agent's own adder, as an actor's steps do (so
    n-step returns and the item format are the actor's), one env at a time.

    Returns:
      The number of items written.
    """
    episodes = read(demo_dir, spec)
    adder = builder.replay_layout(spec).make_adder(
        connection, 1, threading.Event(), table=replay.DEMO_TABLE
    )
    try:
        add_episodes(adder, episodes, replay.DEMO_SOURCE)
    finally:
        adder.close()
    return connection.table_size(replay.DEMO_TABLE)


def check_run(
    demo_dir: str | None,
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    agents_that_can: Sequence[str] = (),
) -> None:
    """`--demos` and the agent's `demo_fraction` together, before any node starts.

    Raises:
      ValueError: one without the other, an agent that cannot learn from
        demonstrations (naming `agents_that_can`), or a directory whose first
        episode does not fit the env.
    """
    fraction = builder_lib.demo_fraction(builder)
    if demo_dir and fraction is None:
        can = f"; agents that can: {', '.join(agents_that_can)}" if agents_that_can else ""
        raise ValueError(
            f"--demos: {type(builder).__name__} learns on-policy, from its own policy's steps "
            f"only, and cannot take demonstrations{can}"
        )
    if demo_dir and not fraction:
        raise ValueError(
            "--demos needs --config.demo_fraction > 0: the share of every learner batch drawn "
            "from the demonstrations (for example 0.25)"
        )
    if fraction and not demo_dir:
        raise ValueError(
            f"config.demo_fraction={fraction} needs --demos=DIR (docs/demonstrations.md)"
        )
    if demo_dir:
        read(demo_dir, spec, limit=1)


def first_shard(
    make_tables: Callable[[], Sequence[Any]],
    demo_dir: str,
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
) -> tuple[Callable[[], list[Any]], "Loader"]:
    """What the first replay shard of a run with demonstrations is built from: the agent's
    tables (`make_tables`) with the demonstration table, and the loader that fills it."""
    tables = functools.partial(_with_demo_table, make_tables, builder, spec)
    return tables, Loader(os.path.abspath(demo_dir), builder, spec)


def _with_demo_table(make_tables, builder: builder_lib.AgentBuilder, spec: types.EnvSpec):
    # The demonstration table's items are the sampled table's: one codec decodes both.
    return list(make_tables()) + [replay.demo_table(builder.replay_layout(spec).codec.num_bytes)]


class Loader:
    """`ReplayNode(preload=...)`: fills the first shard's demonstration table unless it holds
    items already (restored from a checkpoint of this run). A class, not a closure, so
    that Ray can send it to the replay's process."""

    def __init__(self, demo_dir: str, builder: builder_lib.AgentBuilder, spec: types.EnvSpec):
        self.demo_dir, self._builder, self._spec = demo_dir, builder, spec

    def __call__(self, connection: replay.Connection) -> int:
        held = connection.table_size(replay.DEMO_TABLE)
        if held:
            return held
        return load_into_replay(self.demo_dir, self._builder, self._spec, connection)


def record(
    env_id: str,
    act: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int,
    num_envs: int = 8,
) -> list[Episode]:
    """Plays `episodes` whole episodes with `act` (observations [E, ...] -> actions [E, ...])
    in the env as actors see it; returns them in the order they ended."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    num_envs = min(num_envs, episodes)
    env = envs.make_env(env_id, num_envs, seed=seed)
    done: list[Episode] = []
    try:
        obs, _ = env.reset()
        history = [([o], [], []) for o in obs]
        valid = np.ones(num_envs, bool)
        while len(done) < episodes:
            action = np.asarray(act(obs))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for index in range(num_envs):
                if not valid[index]:  # envpool's reset step: a new episode starts here
                    history[index] = ([next_obs[index]], [], [])
                    continue
                observations, actions, rewards = history[index]
                observations.append(next_obs[index])
                actions.append(action[index])
                rewards.append(reward[index])
                if (terminated[index] or truncated[index]) and len(done) < episodes:
                    done.append(
                        Episode(
                            np.stack(observations),
                            np.stack(actions),
                            np.asarray(rewards, np.float32),
                            bool(terminated[index]),
                        )
                    )
            valid = ~(valid & (terminated | truncated))
            obs = next_obs
    finally:
        env.close()
    return done


def policy_actions(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, params: Any, seed: int
) -> Callable[[np.ndarray], np.ndarray]:
    """The agent's evaluation policy on `params`, as `record` takes it."""
    policy = builder.make_policy(spec, 0, 1, evaluation=True)
    params = jax.device_put(params)
    keys = parts.step_keys(jax.random.PRNGKey(seed))
    step = [0]

    def act(observations: np.ndarray) -> np.ndarray:
        action, _ = builder_lib.split_policy_output(
            policy(params, observations, next(keys), step[0])
        )
        step[0] += 1
        return np.asarray(action)

    return act
