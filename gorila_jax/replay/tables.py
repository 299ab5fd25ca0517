"""The agents' table declarations (`api.TableSpec`): prioritized, uniform and queue tables
with their rate limit. Backends build their own tables from these."""

from gorila_jax.replay import api


def rate_limiter(
    samples_per_insert: float, min_size: int, batch_size: int, tolerance: float = 0.1
) -> api.RateLimit:
    """Keeps samples/inserts near `samples_per_insert` once `min_size` items exist.

    The allowed deviation (the error buffer) is the largest of: Acme's rule
    (`tolerance` of the minimum size's worth of samples), Reverb's floor of
    2*max(1, spi), and 16 batches. The last one matters: the learner keeps
    several batches in flight (sampling prefetch, device prefetch); a buffer
    smaller than that makes learner and actors wait on each other's latency
    instead of running side by side.
    """
    if samples_per_insert <= 0:
        raise ValueError(f"samples_per_insert must be positive, got {samples_per_insert}")
    if min_size < 1:
        raise ValueError(f"min_replay_size must be positive, got {min_size}")
    error_buffer = max(
        min_size * samples_per_insert * tolerance,
        2.0 * max(1.0, samples_per_insert),
        16.0 * batch_size,
    )
    return api.RateLimit(min_size, samples_per_insert, error_buffer)


def prioritized_table(
    name: str, max_size: int, priority_exponent: float, limiter: api.RateLimit, item_bytes: int
) -> api.TableSpec:
    """Prioritized experience replay (Schaul et al., 2016) with FIFO removal."""
    return api.TableSpec(name, api.PRIORITIZED, max_size, item_bytes, priority_exponent, limiter)


def uniform_table(
    name: str, max_size: int, limiter: api.RateLimit, item_bytes: int
) -> api.TableSpec:
    """Uniform sampling with FIFO removal (SAC and other off-policy agents without PER)."""
    return api.TableSpec(name, api.UNIFORM, max_size, item_bytes, rate_limit=limiter)


def queue_table(name: str, max_size: int, item_bytes: int) -> api.TableSpec:
    """Each item is sampled exactly once, oldest first (on-policy agents such as PPO).

    A full queue blocks writers: with `max_size` = k learner batches, actors
    run at most k batches (about k parameter versions) ahead of the learner.
    """
    if max_size < 1:
        raise ValueError(f"queue max_size must be positive, got {max_size}")
    return api.TableSpec(name, api.QUEUE, max_size, item_bytes)
