"""Reverb's tables built from the agents' declarations (`api.TableSpec`)."""

import reverb
import tensorflow as tf

from gorila_jax.replay import api


def signature(item_bytes: int) -> tf.TensorSpec:
    """The Reverb signature of packed items of `item_bytes` bytes."""
    return tf.TensorSpec([item_bytes], tf.uint8)


def make_table(spec: api.TableSpec) -> reverb.Table:
    """The `reverb.Table` that `spec` declares; alpha goes to Reverb's prioritized selector."""
    if spec.kind == api.QUEUE:
        return reverb.Table.queue(
            name=spec.name, max_size=spec.max_size, signature=signature(spec.item_bytes)
        )
    limit = spec.rate_limit
    if limit.samples_per_insert is None:
        limiter = reverb.rate_limiters.MinSize(limit.min_size)
    else:
        limiter = reverb.rate_limiters.RateLimiter(
            samples_per_insert=limit.samples_per_insert,
            min_size_to_sample=limit.min_size,
            min_diff=limit.min_diff,
            max_diff=limit.max_diff,
        )
    sampler = (
        reverb.selectors.Prioritized(spec.priority_exponent)
        if spec.prioritized
        else reverb.selectors.Uniform()
    )
    return reverb.Table(
        name=spec.name,
        sampler=sampler,
        remover=reverb.selectors.Fifo(),
        max_size=spec.max_size,
        rate_limiter=limiter,
        signature=signature(spec.item_bytes),
    )
