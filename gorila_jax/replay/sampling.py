"""The Reverb backend's sampling: batches from one Reverb server's tf.data dataset."""

from typing import Any, Iterator

import reverb
import tensorflow as tf

from gorila_jax.replay import api
from gorila_jax.replay import codec as codec_lib

CONNECTION_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def batches(
    server_address: str,
    table: str,
    batch_size: int,
    codec: codec_lib.ItemCodec | None = None,
    prefetch: int = 4,
    rate_limiter_timeout_ms: int = 1000,
    num_workers: int = 2,
) -> Iterator[api.Batch]:
    """Batches from Reverb's tf.data dataset, prefetched in TensorFlow's threads.

    The iterator ends when the rate limiter holds samples back longer than
    `rate_limiter_timeout_ms`, so that a stopping learner is never stuck in it;
    the caller builds a new one if it wants to go on. `num_workers` sampling
    streams per iterator: Reverb's automatic choice gave about 37k CartPole
    items/s on 2 cores, two streams about 48k (bench/learner_throughput.py).
    """
    samples = sample_stream(
        server_address, table, batch_size, prefetch, rate_limiter_timeout_ms, num_workers
    )
    for sample in samples:
        yield api.Batch(
            keys=sample.info.key,
            probabilities=sample.info.probability,
            table_size=sample.info.table_size,
            data=sample.data if codec is None else codec.decode(sample.data, table),
            sources=None if codec is None else codec.sources(sample.data, table),
        )


def sample_stream(
    server_address: str,
    table: str,
    batch_size: int,
    prefetch: int = 4,
    rate_limiter_timeout_ms: int = 1000,
    num_workers: int = 2,
) -> Iterator[Any]:
    """Reverb's samples of `table` in batches of `batch_size` (numpy `ReplaySample`s, packed
    items undecoded), prefetched in TensorFlow's threads; see `batches` for the settings."""
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address,
        table,
        max_in_flight_samples_per_worker=2 * batch_size,
        num_workers_per_iterator=num_workers,
        rate_limiter_timeout_ms=rate_limiter_timeout_ms,
    )
    dataset = dataset.batch(batch_size, drop_remainder=True).prefetch(prefetch)
    # No tf.data autotuning: nothing here is AUTOTUNE, and its model thread sleeps up to
    # 60 s between optimizations without waking for the iterator's cancellation, so
    # freeing the iterator waited up to that long (gdb under load: ~LogicalThreadWrapper
    # on `Model::OptimizeLoop`); the thread left waiting outlived the replay server.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options).as_numpy_iterator()
