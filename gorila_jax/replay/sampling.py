"""Batched sampling from one Reverb server and the priority updates that go back to it."""

import logging
import queue
import threading
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import reverb
import tensorflow as tf

from gorila_jax import types
from gorila_jax.replay import codec as codec_lib
from gorila_jax.replay import server

CONNECTION_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


class Batch(NamedTuple):
    """A sampled batch: item keys stay on the host; data goes to the devices."""

    keys: np.ndarray  # [B] uint64
    probabilities: np.ndarray  # [B] float64, the sampling probability of each item
    table_size: np.ndarray  # [B] int64
    data: types.PyTree  # [B, ...]
    # [B] int32 the replay shard that holds each item (gorila_jax/replay/sharded.py);
    # None: every item is on the one replay there is.
    shards: np.ndarray | None = None
    # [B] int32 the actor that wrote each item (`ItemCodec.sources`); None: items not packed.
    sources: np.ndarray | None = None
    # [B] uint64 a hash of each item's content (`ItemCodec.content_hashes`); None: not asked.
    hashes: np.ndarray | None = None
    # [B] bool the rows drawn from the demonstration table (`replay.MixedSampler`); None: none.
    demo: np.ndarray | None = None


class SampledKeys(NamedTuple):
    """Item keys of a sampled batch, with the shard that owns each and the actor that wrote each.

    What the learner hands back with new priorities, so that `PriorityUpdater`
    sends each one to its item's shard, and what it counts each actor's
    sampled rows by (gorila_jax/health/balance.py). `row_keys` gives plain key arrays
    when there is neither.
    """

    keys: np.ndarray  # [B] uint64
    shards: np.ndarray | None = None  # [B] int32; None: one replay
    sources: np.ndarray | None = None  # [B] int32 source actors; None: unknown
    hashes: np.ndarray | None = None  # [B] uint64 content hashes; None: not sampled with them
    demo: np.ndarray | None = None  # [B] bool demonstration rows (no priority to send); None: none

    @property
    def size(self) -> int:
        """Rows, as for a key array."""
        return self.keys.size


def row_keys(batch: Batch, with_sources: bool = False) -> np.ndarray | SampledKeys:
    """What identifies the batch's items for a priority update: their keys, their shards
    when the replay is sharded and, `with_sources`, the actor that wrote each item and
    the hash of its content (if sampled with them)."""
    sources = batch.sources if with_sources else None
    hashes = batch.hashes if with_sources else None
    if batch.shards is None and sources is None and hashes is None and batch.demo is None:
        return batch.keys
    return SampledKeys(batch.keys, batch.shards, sources, hashes, batch.demo)


def batches(
    server_address: str,
    table: str,
    batch_size: int,
    codec: codec_lib.ItemCodec | None = None,
    prefetch: int = 4,
    rate_limiter_timeout_ms: int = 1000,
    num_workers: int = 2,
) -> Iterator[Batch]:
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
        yield Batch(
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


class PriorityUpdater:
    """Sends new priorities to Reverb from a thread, so the learner never waits on it.

    `submit` takes priorities that may still be computing on a device; the
    thread does the device->host copy, so the learner can dispatch its next
    update at once. A bounded queue keeps memory flat if Reverb falls behind.
    With a sharded replay each item's priority goes to the shard that holds
    it (`SampledKeys`), in one call per shard.

    Args:
      clients: a Reverb client of the replay, or one per shard, in shard order.
        A `ReplayClient` whose update fails asks its node where it serves now,
        so that the next updates reach a shard restarted elsewhere.
      table: the table the keys were sampled from.
      hot_priorities: {shard: its replay node} of tiered shards whose items take their
        newest priority to the cold tier: each also gets its rows' content hashes and new
        priorities (`ReplayNode.note_priorities`; keys need `hashes`).
    """

    def __init__(
        self,
        clients: reverb.Client | Sequence[reverb.Client],
        table: str,
        max_queued: int = 8,
        hot_priorities: dict[int, Any] | None = None,
    ):
        self._clients = list(clients) if isinstance(clients, (list, tuple)) else [clients]
        self._hot_priorities = hot_priorities or {}
        self._table = table
        self._queue: queue.Queue = queue.Queue(max_queued)
        self.updates_sent = 0  # mutate calls that succeeded (one per shard a batch touches)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="priority-updater", daemon=True)
        self._thread.start()

    def submit(
        self,
        keys: np.ndarray | SampledKeys,
        priorities: Any,
        scale: np.ndarray | None = None,
        bonus: np.ndarray | None = None,
    ) -> None:
        """Queues new priorities for the sampled items `keys` (a key array: a single replay).

        Args:
          keys: the items, as `row_keys` gives them.
          priorities: [B] new priorities, possibly still computing on a device.
          scale: [B] host factors the priorities are multiplied by once they
            are on the host (a dominant actor's items: `balance.SampledRows`).
          bonus: [B] host terms added to the priorities before `scale` (duplicate
            transitions: `replay.DuplicateCounter`).
        """
        self._queue.put((keys, priorities, scale, bonus))

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                self._update(*work)
            except Exception:  # noqa: BLE001  the thread must live on: `close` waits for it
                logging.exception("priority update to table %s failed", self._table)

    def _update(
        self, keys: np.ndarray | SampledKeys, priorities: Any, scale: Any, bonus: Any
    ) -> None:
        shards = demo = hashes = None
        if isinstance(keys, SampledKeys):
            keys, shards, demo, hashes = keys.keys, keys.shards, keys.demo, keys.hashes
            shards = None if shards is None else shards.reshape(-1)
            hashes = None if hashes is None else hashes.reshape(-1)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if bonus is not None:
            priorities = priorities + np.asarray(bonus, np.float64).reshape(-1)
        if scale is not None:
            priorities = priorities * np.asarray(scale, np.float64).reshape(-1)
        keys = keys.reshape(-1)
        # A skipped (non-finite) update: the items keep their old ones. Demonstration
        # rows' keys are the demonstration table's, which has no priorities.
        sent = np.isfinite(priorities)
        if demo is not None:
            sent &= ~np.asarray(demo, bool).reshape(-1)
        if not sent.all():
            keys, priorities = keys[sent], priorities[sent]
            shards = None if shards is None else shards[sent]
            hashes = None if hashes is None else hashes[sent]
        if shards is None:
            shards = np.zeros(keys.shape, np.int32)
        for shard in np.unique(shards).tolist():
            owned = shards == shard
            self._send(shard, keys[owned], priorities[owned])
            if shard in self._hot_priorities and hashes is not None:
                self._note(shard, hashes[owned], priorities[owned])

    def _note(self, shard: int, hashes: np.ndarray, priorities: np.ndarray) -> None:
        try:
            self._hot_priorities[shard].note_priorities(hashes, priorities)
        except Exception:  # noqa: BLE001  a lost note: the item moves with an older priority
            logging.exception("replay shard %d: hot priorities not noted", shard)

    def _send(self, shard: int, keys: np.ndarray, priorities: np.ndarray) -> None:
        if not keys.size:
            return
        client = self._clients[shard]
        try:
            client.mutate_priorities(
                self._table, updates=dict(zip(keys.tolist(), priorities.tolist()))
            )
            self.updates_sent += 1
        except Exception:  # noqa: BLE001  a lost update only leaves old priorities
            logging.exception("priority update to table %s (shard %d) failed", self._table, shard)
            if isinstance(client, server.ReplayClient):
                try:
                    self._clients[shard] = client.at(client.current_address())
                except Exception:  # noqa: BLE001  the node is unreachable too: retry next time
                    logging.exception("replay shard %d: no current address", shard)

    def close(self, timeout_s: float = 30.0) -> None:
        """Sends what is queued, then ends the thread and waits for it (once; later calls
        return at once).

        Call it before the replay's servers stop: a thread still inside
        `mutate_priorities` then, or when the interpreter finalizes, can
        abort the process (see `prefetch.DevicePrefetcher.close`).
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)  # the thread lives until it takes this (see `_loop`)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logging.warning(
                "priority updates to table %s still running after %.0fs", self._table, timeout_s
            )
