"""Array and pytree types shared by the skeleton and the agents.

Everything that crosses jit, pmap, a Ray call, Reverb or a checkpoint is a
NamedTuple of arrays defined at module level (picklable, a pytree for JAX,
a nest for tf.nest).
"""

from typing import Any, NamedTuple

import numpy as np

PyTree = Any
Params = Any


class EnvSpec(NamedTuple):
    """What agents need to know of an environment to build networks and replay.

    Attributes:
      env_id: the envpool task id.
      observation_shape: one observation, without the env batch axis.
      observation_dtype: numpy dtype name of observations ("float32", "uint8").
      action_shape: () for discrete actions, (A,) for continuous ones.
      action_dtype: numpy dtype name of actions.
      num_actions: number of discrete actions; 0 for continuous actions.
      action_low: per-dimension lower bound (continuous only, else empty).
      action_high: per-dimension upper bound (continuous only, else empty).
      max_episode_steps: the time limit after which episodes are truncated.
    """

    env_id: str
    observation_shape: tuple
    observation_dtype: str
    action_shape: tuple
    action_dtype: str
    num_actions: int
    action_low: tuple = ()
    action_high: tuple = ()
    max_episode_steps: int = 0

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    def zeros_observation(self, batch: int) -> np.ndarray:
        return np.zeros((batch, *self.observation_shape), self.observation_dtype)


class Transition(NamedTuple):
    """An n-step transition as stored in replay: [...] per item, [B, ...] in a batch.

    `reward` is the discounted n-step return and `discount` the factor on the
    bootstrap value of `next_observation`: gamma**k after k steps, 0 at a
    true termination (but not at a time-limit truncation).
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_observation: np.ndarray


class EnvStep(NamedTuple):
    """One vectorized env step as an actor sees it; every leaf is [E, ...]."""

    observation: np.ndarray  # the observation the action was chosen on
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_observation: np.ndarray
    valid: np.ndarray  # False where the step only reset the env (envpool auto-reset)
