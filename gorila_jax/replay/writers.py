"""From vectorized env steps to replay items: n-step transitions and trajectory chunks,
written through any backend's `api.Writer`."""

import jax
from typing import NamedTuple

import numpy as np

from gorila_jax import types
from gorila_jax.replay import api, codec


class NStepAccumulator:
    """Turns steps of E parallel envs into n-step transitions (Sutton & Barto, 7.1).

    Every env keeps its last n steps in a ring shared by all envs (all envs step
    together). A transition leaves when its env has n steps after it, or when
    the episode ends: then every held step leaves with the return up to the
    end. A termination zeroes the bootstrap discount; a truncation (time limit)
    keeps gamma**k so that the learner bootstraps from the last observation.
    """

    def __init__(self, num_envs: int, n: int, discount: float):
        if n < 1:
            raise ValueError(f"n-step length must be >= 1, got {n}")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"discount must lie in [0, 1], got {discount}")
        self._num_envs, self._n, self._gamma = num_envs, n, discount
        self._powers = discount ** np.arange(n + 1, dtype=np.float64)
        self._count = np.zeros(num_envs, np.int64)  # steps held per env
        self._head = 0  # ring slot the next step is written to
        self._obs = self._action = None
        self._reward = np.zeros((n, num_envs), np.float64)

    def _slot(self, age) -> np.ndarray:
        """Ring slot of the step `age` steps before the newest one."""
        return (self._head - 1 - np.asarray(age)) % self._n

    def add(
        self, obs, action, reward, terminated, truncated, next_obs, valid
    ) -> types.Transition | None:
        """Adds one vectorized step; returns the transitions completed by it, or None.

        Args:
          obs, action, reward, terminated, truncated, next_obs: [E, ...] as returned
            around one `env.step(action)`; `obs` is the observation acted on.
          valid: [E] bool; False for envs whose step only reset them (envpool's
            auto-reset step), which hold no transition.

        Returns:
          A Transition batch [K, ...], K >= 1, or None when nothing completed.
        """
        if self._obs is None:
            self._obs = np.zeros((self._n,) + obs.shape, obs.dtype)
            self._action = np.zeros((self._n,) + action.shape, action.dtype)
        slot = self._head
        self._obs[slot], self._action[slot], self._reward[slot] = obs, action, reward
        self._head = (self._head + 1) % self._n
        self._count += valid
        ended = valid & (terminated | truncated)
        full = valid & ~ended & (self._count == self._n)
        parts = []
        if full.any():
            parts.append(self._emit_oldest(np.flatnonzero(full), next_obs))
            self._count[full] -= 1
        for env in np.flatnonzero(ended):
            parts.append(self._emit_episode_end(env, next_obs[env], bool(terminated[env])))
            self._count[env] = 0
        if not parts:
            return None
        return types.Transition(*(np.concatenate(field) for field in zip(*parts)))

    def _emit_oldest(self, envs: np.ndarray, next_obs: np.ndarray) -> types.Transition:
        n = self._n
        start = self._slot(n - 1)
        rewards = self._reward[self._slot(np.arange(n - 1, -1, -1))][:, envs]  # [n, K]
        n_step_return = self._powers[:n] @ rewards
        return types.Transition(
            observation=self._obs[start, envs],
            action=self._action[start, envs],
            reward=n_step_return.astype(np.float32),
            discount=np.full(len(envs), self._powers[n], np.float32),
            next_observation=next_obs[envs],
        )

    def _emit_episode_end(self, env: int, last_obs, terminated: bool) -> types.Transition:
        count = int(self._count[env])
        ages = np.arange(count - 1, -1, -1)  # oldest first
        rewards = self._reward[self._slot(ages), env]  # [count], oldest first
        returns = np.array([self._powers[: count - i] @ rewards[i:] for i in range(count)])
        steps_to_end = count - np.arange(count)
        discount = np.zeros(count) if terminated else self._powers[steps_to_end]
        return types.Transition(
            observation=self._obs[self._slot(ages), env],
            action=self._action[self._slot(ages), env],
            reward=returns.astype(np.float32),
            discount=discount.astype(np.float32),
            next_observation=np.repeat(last_obs[None], count, axis=0),
        )


class NStep(NamedTuple):
    """How an agent's transitions are made (`NStepAdder`, and an Anakin learner's on the
    device): n-step returns at `discount`, each item written at `initial_priority`."""

    n: int
    discount: float
    initial_priority: float = 1.0


class NStepAdder:
    """An actor's adder for n-step transition agents (DQN, SAC): accumulate, then write."""

    def __init__(
        self,
        writer: api.Writer,
        codec: codec.ItemCodec,
        num_envs: int,
        n: int,
        discount: float,
        initial_priority: float = 1.0,
    ):
        self._writer, self._codec = writer, codec
        self._accumulator = NStepAccumulator(num_envs, n, discount)
        self._initial_priority = initial_priority

    def add(self, step: types.EnvStep) -> None:
        transitions = self._accumulator.add(
            step.observation,
            step.action,
            step.reward,
            step.terminated,
            step.truncated,
            step.next_observation,
            step.valid,
        )
        if transitions is not None:
            priorities = np.full(len(transitions.reward), self._initial_priority)
            items = self._codec.encode(transitions, source=step.actor_index)
            self._writer.write(items, priorities)

    def close(self) -> None:
        self._writer.close()


def _no_extras_as_empty(extras: types.PyTree) -> types.PyTree:
    # dm-tree (which packs items) counts None as a leaf; () is the empty structure.
    return () if extras is None else extras


def trajectory_example(
    spec: types.EnvSpec, length: int, extras_example: types.PyTree
) -> types.Trajectory:
    """One zero `types.Trajectory` of `length` steps of `spec`'s env (for an `ItemCodec`).

    Args:
      extras_example: one step's policy extras, without the env axis (None: no extras).
    """
    if length < 1:
        raise ValueError(f"trajectory length must be positive, got {length}")
    extras_example = _no_extras_as_empty(extras_example)
    steps = lambda dtype: np.zeros(length, dtype)
    return types.Trajectory(
        observation=np.zeros((length + 1, *spec.observation_shape), spec.observation_dtype),
        action=np.zeros((length, *spec.action_shape), spec.action_dtype),
        reward=steps(np.float32),
        terminated=steps(bool),
        truncated=steps(bool),
        valid=steps(bool),
        extras=jax.tree.map(
            lambda x: np.zeros((length, *np.shape(x)), np.asarray(x).dtype), extras_example
        ),
        param_version=steps(np.int32),
        actor_index=np.int32(0),
    )


class TrajectoryAdder:
    """An actor's adder for on-policy agents (PPO): one item per env every `length` steps.

    Each item is a `types.Trajectory` of `length` consecutive steps of one env.
    Every step goes in, envpool's auto-reset steps too (marked invalid), so all
    envs of the actor fill their chunks on the same step and one batched write
    sends them; consecutive chunks of an env share their boundary observation,
    so no step is written twice and none is left out.

    Args:
      writer: writes the items (a queue table's writer blocks while the table is full).
      codec: the agent's codec of `trajectory_example(spec, length, extras)`.
      num_envs: envs of the actor.
      length: steps per chunk (T).
    """

    def __init__(self, writer: api.Writer, codec: codec.ItemCodec, num_envs: int, length: int):
        if length < 1:
            raise ValueError(f"trajectory length must be positive, got {length}")
        self._writer, self._codec = writer, codec
        self._num_envs, self._length = num_envs, length
        self._chunk: types.Trajectory | None = None  # [E, T, ...] leaves, filled step by step
        self._t = 0

    def _allocate(self, step: types.EnvStep) -> types.Trajectory:
        num_envs, length = self._num_envs, self._length

        def per_step(x):
            return np.zeros((num_envs, length, *np.shape(x)[1:]), np.asarray(x).dtype)

        obs = np.asarray(step.observation)
        return types.Trajectory(
            observation=np.zeros((num_envs, length + 1, *obs.shape[1:]), obs.dtype),
            action=per_step(step.action),
            reward=np.zeros((num_envs, length), np.float32),
            terminated=np.zeros((num_envs, length), bool),
            truncated=np.zeros((num_envs, length), bool),
            valid=np.zeros((num_envs, length), bool),
            extras=jax.tree.map(per_step, _no_extras_as_empty(step.extras)),
            param_version=np.zeros((num_envs, length), np.int32),
            actor_index=np.full(num_envs, step.actor_index, np.int32),
        )

    def add(self, step: types.EnvStep) -> None:
        if self._chunk is None:
            self._chunk = self._allocate(step)
        chunk, t = self._chunk, self._t
        chunk.observation[:, t] = step.observation
        chunk.action[:, t] = step.action
        chunk.reward[:, t] = step.reward
        chunk.terminated[:, t] = step.terminated
        chunk.truncated[:, t] = step.truncated
        chunk.valid[:, t] = step.valid
        extras = _no_extras_as_empty(step.extras)
        for buffer, value in zip(jax.tree.leaves(chunk.extras), jax.tree.leaves(extras)):
            buffer[:, t] = value
        chunk.param_version[:, t] = step.param_version
        self._t += 1
        if self._t == self._length:
            chunk.observation[:, self._length] = step.next_observation
            items = self._codec.encode(chunk, source=step.actor_index)
            self._writer.write(items, np.ones(self._num_envs))
            self._t = 0

    def close(self) -> None:
        self._writer.close()
