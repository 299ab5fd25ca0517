"""Running observation statistics: what PPO normalizes observations with.

The learner merges each batch's statistics (over all devices) into the
running ones; actors and the learner normalize with the same statistics, so
the network sees the same inputs on both sides.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agents.ppo import config as config_lib
from gorila_jax import parallel


class RunningStats(NamedTuple):
    """Running mean and variance of observations (Chan et al.'s parallel merge)."""

    count: jax.Array  # [] float32
    mean: jax.Array  # observation shape
    var: jax.Array  # observation shape


def init_stats(observation_shape: tuple) -> RunningStats:
    # A tiny starting count (SB3's 1e-4) makes the first batch's statistics win.
    return RunningStats(
        jnp.float32(1e-4),
        jnp.zeros(observation_shape, jnp.float32),
        jnp.ones(observation_shape, jnp.float32),
    )


def merge_stats(stats: RunningStats, count, mean, var) -> RunningStats:
    """Stats of the union of what `stats` summarizes and a batch of `count` items."""
    total = stats.count + count
    delta = mean - stats.mean
    new_mean = stats.mean + delta * count / total
    m2 = stats.var * stats.count + var * count + delta**2 * stats.count * count / total
    return RunningStats(total, new_mean, m2 / total)


def updated_stats(stats: RunningStats, observations: jax.Array) -> RunningStats:
    """`stats` merged with the batch's observations [b, T, ...] of all devices."""
    obs = observations.reshape((-1,) + observations.shape[2:]).astype(jnp.float32)
    count = parallel.psum(jnp.float32(obs.shape[0]))
    mean = parallel.psum(jnp.sum(obs, axis=0)) / count
    var = parallel.psum(jnp.sum((obs - mean) ** 2, axis=0)) / count
    return merge_stats(stats, count, mean, var)


def normalize(obs: jax.Array, stats: RunningStats, clip: float) -> jax.Array:
    z = (obs.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + 1e-8)
    return jnp.clip(z, -clip, clip)


def prepare_observations(obs: jax.Array, stats: RunningStats, cfg: config_lib.PPOConfig):
    """What the network sees: normalized observations if the config asks for them."""
    return normalize(obs, stats, cfg.observation_clip) if cfg.normalize_observations else obs
