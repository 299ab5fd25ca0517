"""SAC acting: uniform random actions at first, then samples of the squashed Gaussian.

Evaluation acts with the mean action tanh(mean), as Haarnoja et al. (2018b)
evaluate their policies.
"""

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from agents.sac import learning
from gorila_jax import builder as builder_lib
from gorila_jax import types


def actor_random_steps(random_steps: int, num_actors: int) -> int:
    """Each actor's share of the `random_steps` env steps of uniform random actions."""
    return math.ceil(random_steps / num_actors)


def make_policy(
    policy_apply: Callable, spec: types.EnvSpec, evaluation: bool, random_steps: int = 0
) -> builder_lib.Policy:
    """A jitted `select_action(params, obs [E, O], key, env_steps) -> action [E, A]`.

    Actions are env-scale, in [spec.action_low, spec.action_high]. While
    `env_steps` (the actor's own count) is below `random_steps`, actions are
    uniform over that box: the first replay items cover the action space
    before the untrained policy narrows it (Haarnoja et al., 2018b, appendix D).
    The random draws come from `key` alone.
    """
    low = np.asarray(spec.action_low, np.float32)
    high = np.asarray(spec.action_high, np.float32)

    @jax.jit
    def select_action(params, obs, key, env_steps):
        mean, log_std = policy_apply(params, obs)  # [E, A] each
        if evaluation:
            return learning.from_unit_interval(jnp.tanh(mean), low, high)
        noise_key, random_key = jax.random.split(key)
        sampled, _ = learning.sample_tanh_gaussian(
            mean, log_std, jax.random.normal(noise_key, mean.shape)
        )
        uniform = jax.random.uniform(random_key, mean.shape, minval=-1.0, maxval=1.0)
        unit = jnp.where(env_steps < random_steps, uniform, sampled)
        return learning.from_unit_interval(unit, low, high)

    return select_action
