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
      agents_per_env: rows of the batch one env copy gives: its agents of the
        role acted for (multi-agent tasks, gorila_jax/multiagent.py); 1 elsewhere.
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
    agents_per_env: int = 1

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def image_stack(self) -> bool:
        """uint8 [C, H, W] frame stacks (Atari's layout), what the Nature torso takes."""
        return len(self.observation_shape) == 3 and self.observation_dtype == "uint8"

    @property
    def grid(self) -> bool:
        """[H, W, C] grids of numbers, no more channels than rows or columns (MinAtar's 0/1
        channels in gymnax: 4 to 10 on 10x10, Seaquest's 10), what the MinAtar torso
        takes. A channel-first float grid (highway's Racetrack occupancy, [2, 12, 12]) is
        not one: it is flattened."""
        shape = self.observation_shape
        return len(shape) == 3 and not self.image_stack and shape[2] <= min(shape[:2])

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
    """One vectorized env step as an actor sees it; array leaves are [E, ...].

    The last three fields matter to agents whose learner corrects for the
    policy that acted (PPO); adders of other agents ignore them.
    """

    observation: np.ndarray  # the observation the action was chosen on
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_observation: np.ndarray
    valid: np.ndarray  # False where the step only reset the env (envpool auto-reset)
    extras: PyTree = None  # what the policy returned beside the action ([E, ...] leaves)
    param_version: int = -1  # learner version of the parameters that chose the action
    actor_index: int = 0  # the actor that took the step


class Trajectory(NamedTuple):
    """T consecutive steps of one env, as stored in replay: [T, ...] per item, [B, T, ...] batched.

    Steps are kept as the env gave them, envpool's auto-reset steps included
    (`valid` False: the action was ignored, the reward is 0), so that every
    env's chunk covers the same T actor steps. `observation` has T + 1 entries:
    observation[t + 1] is what followed step t, and for a step that ended its
    episode it is the episode's last observation (the reset comes one step
    later), so a truncated step bootstraps from the right state.
    """

    observation: np.ndarray  # [T + 1, ...]
    action: np.ndarray  # [T, ...]
    reward: np.ndarray  # [T] float32
    terminated: np.ndarray  # [T] bool
    truncated: np.ndarray  # [T] bool
    valid: np.ndarray  # [T] bool
    extras: PyTree  # the policy's extras, [T, ...] leaves
    param_version: np.ndarray  # [T] int32: learner version of the acting parameters
    actor_index: np.ndarray  # [] int32
