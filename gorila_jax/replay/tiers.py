"""The Reverb backend's tiered replay (`tiering.Tiering`): the newest items in Reverb, older
ones on local disk.

The sampled table keeps `hot_size` items in memory (the hot tier, Reverb's
own table, FIFO removal). Every item is also created in a spill queue beside
it (`spill_table`; the writers find it on the server, `TransitionWriter`),
which shares the item's chunks, so it costs an item record, not its bytes.
The replay node's mover (`TierMover`) takes items out of the spill queue,
oldest first, once it holds more than `hot_size` of them: those are the
items the hot table evicted (both saw the same inserts in the same order,
up to the interleaving of concurrent writers), and it writes them into the
cold tier (`cold.ColdStore`, a ring on local disk) with their priorities.

Priorities move with the items. The learner's priority updates of hot rows
go to Reverb as always, and their content hashes and priorities also to the
node (`note_priorities`); an item that leaves the hot table takes the last
priority noted for its content, or the priority it was inserted with if the
learner never sampled it. Cold rows' updates go to the cold tier by key.

The learner samples both tiers as shards of one replay (`ShardedSampler`,
each tier a stream, split by priority mass): probabilities are
p**alpha / (M_hot + M_cold) and the table size hot + cold, so importance
weights are those of one replay holding every item.

The samples-per-insert ratio. Reverb's limiter on the hot table sees only
the hot samples, so under tiering it keeps the minimum size and the upper
bound (sampling ahead of inserts) on hot samples, and stops holding
inserts back (it would wait for hot samples that the cold tier takes
instead, and never come). The node enforces the ratio on both tiers' samples
together: cold samples wait while hot + cold samples would exceed the upper
bound, and the mover stops moving, so the full spill queue holds the
actors' inserts back, while hot + cold samples lag the lower bound. So that
this holds from the first insert, not only once the hot tier is full, a new
spill queue starts with `hot_size` placeholder items (one shared chunk; the
mover drops them as it would move evicted items): the queue is then as
full as it is in a full replay. Without them DQN on CartPole, whose actors
ran ahead of the learner for the first 10k inserts, ended below 475 in 5
of 9 seeds, against 0 of 10 in memory.

Checkpoints hold both tiers: Reverb's (hot and spill tables) and the cold
tier's record (`ColdStore.checkpoint`) written under the mover's lock, so
that an item is in exactly one of spill and cold in the pair.
"""

import collections
import logging
import math
import os
import threading
import time
from typing import Any, Sequence

import numpy as np
import reverb

from gorila_jax.replay import codec, cold, shard_streams
from gorila_jax.replay.tiering import COLD_CHECKPOINT, Tiering, spill_table

# Items the mover takes out of the spill queue per call (a Reverb sample call each).
_MOVE_ROWS = 512
_MOVE_PERIOD_S = 0.02
# Spill queue room beyond the hot tier: what actors may write while the mover catches up.
_MIN_SPILL_SLACK = 256
# The source actor of the spill queue's placeholder items (`TierMover._add_placeholders`).
_PLACEHOLDER_SOURCE = -3


def reverb_tables(tiering: Tiering, tables: Sequence[reverb.Table]) -> list[reverb.Table]:
    """The agent's tables (checked by `Tiering.sampled_spec`) with the sampled one cut to the
    hot tier, and its spill queue."""
    tables = list(tables)
    info = next(table.info for table in tables if table.name == tiering.table)
    limits = info.rate_limiter_info
    hot = next(table for table in tables if table.name == tiering.table).replace(
        max_size=tiering.hot_size,
        rate_limiter=reverb.rate_limiters.RateLimiter(
            samples_per_insert=limits.samples_per_insert,
            min_size_to_sample=min(limits.min_size_to_sample, tiering.hot_size),
            min_diff=limits.min_diff,
            max_diff=float("inf"),  # the mover holds inserts back (module docstring)
        ),
    )
    spill = reverb.Table.queue(
        spill_table(tiering.table),
        tiering.hot_size + _spill_slack(limits),
        signature=info.signature,
    )
    return [hot if table.name == tiering.table else table for table in tables] + [spill]


def _spill_slack(limits: Any) -> int:
    """Spill room for the rate limiter's allowed deviation, in items."""
    spread = (limits.max_diff - limits.min_diff) / max(limits.samples_per_insert, 1e-9)
    if not math.isfinite(spread):
        return 4 * _MIN_SPILL_SLACK
    return max(_MIN_SPILL_SLACK, math.ceil(spread))


class _Ratio:
    """The hot table's samples-per-insert settings, applied to hot + cold samples together."""

    def __init__(self, limits: Any):
        self.samples_per_insert = limits.samples_per_insert
        self.min_size = limits.min_size_to_sample
        self.min_diff, self.max_diff = limits.min_diff, limits.max_diff

    def samples_allowed(self, table: Any, cold_samples: int) -> float:
        """How many more rows may be sampled now (may be infinite)."""
        if table.current_size < self.min_size:
            return 0.0
        inserts = table.rate_limiter_info.insert_stats.completed
        samples = table.rate_limiter_info.sample_stats.completed + cold_samples
        return self.samples_per_insert * inserts - samples - self.min_diff

    def sampling_keeps_up(self, table: Any, cold_samples: int) -> bool:
        """Whether samples are within the ratio's lower bound: inserts may go on."""
        inserts = table.rate_limiter_info.insert_stats.completed
        samples = table.rate_limiter_info.sample_stats.completed + cold_samples
        return self.samples_per_insert * inserts - samples <= self.max_diff


class TierMover:
    """The replay node's side of a tiered replay: the cold tier, and the mover that fills it.

    Args:
      client: a client of the node's Reverb server (local).
      tiering: this node's tiers.
      agent_tables: the agent's tables as declared (before `Tiering.tables`): the
        sampled table's rate limiter is the ratio both tiers keep.
      restore_path: a checkpoint directory to restore the cold tier from (None: empty).
    """

    def __init__(
        self,
        client: reverb.Client,
        tiering: Tiering,
        agent_tables: Sequence[reverb.Table],
        restore_path: str | None = None,
    ):
        self._client, self._tiering = client, tiering
        info = next(t.info for t in agent_tables if t.name == tiering.table)
        self.exponent = shard_streams.priority_exponent(info)
        self._ratio = _Ratio(info.rate_limiter_info)
        self._store = cold.ColdStore(
            tiering.cold_dir,
            tiering.cold_size,
            info.signature.shape[0],
            self.exponent,
            tiering.cold_bytes,
            tiering.cold_compression,
        )
        if restore_path is not None:
            self._store.restore(os.path.join(restore_path, COLD_CHECKPOINT))
        self.restored_items = self._store.size  # before the mover adds any
        if restore_path is None:
            self._add_placeholders()
        # content hash -> the newest priority the learner gave a hot item with that content
        self._noted: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._noted_capacity = 2 * tiering.hot_size
        self._noted_lock = threading.Lock()
        self._rng = np.random.default_rng()
        self._lock = threading.Lock()  # an item is in spill or cold, never neither, while held
        self._counts_lock = threading.Lock()
        self.moved = 0
        self._buffer: np.ndarray | None = None
        self.cold_samples = 0
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="replay-tier-mover", daemon=True)
        self._thread.start()

    @property
    def table(self) -> str:
        return self._tiering.table

    def _tables(self) -> dict[str, Any]:
        return self._client.server_info()

    def _add_placeholders(self) -> None:
        """Fills a new spill queue with `hot_size` placeholder items (module docstring)."""
        item = np.zeros(self._store.item_bytes, np.uint8)
        item[-codec.SOURCE_BYTES :] = np.array([_PLACEHOLDER_SOURCE], np.int32).view(np.uint8)
        writer = self._client.trajectory_writer(num_keep_alive_refs=1)
        try:
            cpp_writer = writer._writer  # as `TransitionWriter`: one chunk, many items
            refs = [[ref] for ref in cpp_writer.Append([item])]
            for count in range(1, self._tiering.hot_size + 1):
                cpp_writer.CreateItem(spill_table(self._tiering.table), 1.0, refs, [True])
                if count % 1000 == 0:
                    writer.flush(500)
            writer.flush()
        finally:
            writer.close()

    # ------------------------------------------------------------ the mover

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.move():
                    self._stop.wait(_MOVE_PERIOD_S)
        except BaseException as error:  # noqa: BLE001  reported by `tier_info` and `close`
            self._failure = error
            logging.exception("replay tier mover failed; the spill queue will fill up")

    def move(self) -> int:
        """Moves the items the hot tier evicted into the cold tier; returns how many."""
        tables = self._tables()
        hot = tables[self._tiering.table]
        excess = tables[spill_table(self._tiering.table)].current_size - self._tiering.hot_size
        if excess <= 0 or not self._ratio.sampling_keeps_up(hot, self.cold_samples):
            return 0
        with self._lock:
            samples = list(
                self._client.sample(
                    spill_table(self._tiering.table),
                    num_samples=min(excess, _MOVE_ROWS),
                    emit_timesteps=False,
                    unpack_as_table_signature=True,
                )
            )
            items = self._staging(len(samples))
            for row, sample in zip(items, samples):
                row[:] = sample.data
            real = codec.packed_sources(items) != _PLACEHOLDER_SOURCE
            if not real.all():
                items = items[real]
                samples = [sample for sample, keep in zip(samples, real) if keep]
                if not samples:
                    return int(np.size(real))
            hashes = codec.packed_hashes(items)
            inserted = np.array([sample.info.priority for sample in samples], np.float64)
            with self._noted_lock:
                priorities = np.array(
                    [self._noted.pop(h, p) for h, p in zip(hashes.tolist(), inserted.tolist())]
                )
            self._store.add(items, priorities, hashes)
            self.moved += len(samples)
        return int(np.size(real))

    def _staging(self, rows: int) -> np.ndarray:
        """[rows, item_bytes] of a buffer the mover keeps: a new array per move paid its
        page faults again (a third of a move's time for Atari items)."""
        if self._buffer is None or len(self._buffer) < rows:
            self._buffer = np.empty((max(rows, _MOVE_ROWS), self._store.item_bytes), np.uint8)
        return self._buffer[:rows]

    def note_priorities(self, hashes: np.ndarray, priorities: np.ndarray) -> None:
        """The learner's new priorities of hot items, by content: they move with the items."""
        pairs = zip(
            np.asarray(hashes).reshape(-1).tolist(), np.asarray(priorities).reshape(-1).tolist()
        )
        with self._noted_lock:
            for content, priority in pairs:
                self._noted.pop(content, None)
                self._noted[content] = priority  # newest last: the oldest go first
            while len(self._noted) > self._noted_capacity:
                self._noted.popitem(last=False)

    # ------------------------------------------------------------ the learner's side

    def sample(self, count: int) -> tuple[shard_streams.Rows | None, float, int]:
        """Up to `count` cold rows, as the ratio allows (none: wait and ask again).

        Returns:
          (rows or None, the cold tier's mass, its size).
        """
        rows = None
        if count > 0:
            hot = self._tables()[self._tiering.table]
            allowed = self._ratio.samples_allowed(hot, self.cold_samples)
            count = int(min(count, max(allowed, 0)))
        if count > 0:
            drawn = self._store.sample(count, self._rng)
            if len(drawn.keys):
                rows = shard_streams.Rows(
                    drawn.keys, drawn.probabilities, drawn.table_size, drawn.data
                )
                with self._counts_lock:
                    self.cold_samples += len(drawn.keys)
        return rows, self._store.mass, self._store.size

    def update(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self._store.update(keys, priorities)

    def info(self) -> dict[str, float]:
        """Items and bytes per tier, cold reads, items moved."""
        if self._failure is not None:
            raise RuntimeError(f"the replay tier mover failed: {self._failure!r}")
        tables = self._tables()
        hot = tables[self._tiering.table]
        item_bytes = self._store.item_bytes
        return {
            "hot_items": hot.current_size,
            "hot_bytes": hot.current_size * item_bytes,
            "spill_items": tables[spill_table(self._tiering.table)].current_size,
            "cold_items": self._store.size,
            "cold_bytes": self._store.bytes,
            "cold_reads": self._store.reads,
            "moved": self.moved,
        }

    # ------------------------------------------------------------ checkpoints

    def paused(self) -> threading.Lock:
        """Held while a checkpoint is taken: no item is between spill and cold."""
        return self._lock

    def checkpoint(self, directory: str) -> None:
        """Writes the cold tier's record into Reverb's checkpoint `directory` (under `paused`)."""
        self._store.checkpoint(os.path.join(directory, COLD_CHECKPOINT))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30.0)
        self._store.close()


class ColdStream:
    """A replay node's cold tier as one more stream of `ShardedSampler` (`ShardStream`'s interface).

    Args:
      node: the replay node (its `cold_sample`).
      chunk_rows: rows asked per call.
      wait_s: how long `fill` waits for rows the ratio holds back before it gives up.
    """

    # How stale the mass of a tier that no batch drew from may get.
    _REFRESH_S = 0.25

    def __init__(self, node: Any, chunk_rows: int, wait_s: float):
        self._node, self._chunk_rows, self._wait_s = node, chunk_rows, wait_s
        self._rows: list[shard_streams.Rows] = []
        self.buffered = 0
        self.mass: float | None = None
        self.table_size = 0
        self._refreshed = -math.inf

    def know_mass(self) -> bool:
        """Asks the node for the cold tier's mass (an empty tier has one too: 0)."""
        self._ask(0)
        return True

    def fill(self, count: int) -> bool:
        """As `ShardStream.fill`; with `count` 0 it refreshes the mass now and then."""
        if count == 0:
            if time.monotonic() - self._refreshed > self._REFRESH_S:
                self._ask(0)
            return True
        deadline = time.monotonic() + self._wait_s
        while self.buffered < count:
            if not self._ask(max(self._chunk_rows, count - self.buffered)):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
        return True

    def _ask(self, count: int) -> bool:
        rows, mass, size = self._node.cold_sample(count)
        self._refreshed = time.monotonic()
        self.mass, self.table_size = float(mass), int(size)
        if rows is None:
            return False
        self._rows.append(rows)
        self.buffered += len(rows.keys)
        return True

    def take(self, count: int) -> shard_streams.Rows:
        rows = shard_streams.concatenate(self._rows)
        self._rows = [] if count == len(rows.keys) else [shard_streams.slice_rows(rows, count)]
        self.buffered -= count
        return shard_streams.slice_rows(rows, 0, count)

    def close(self, deadline: float) -> None:
        del deadline  # nothing runs in the background
        self._rows, self.buffered = [], 0


class ColdPriorities:
    """A replay node's cold tier as `PriorityUpdater` sends to a shard (`mutate_priorities`)."""

    def __init__(self, node: Any):
        self._node = node

    def mutate_priorities(self, table: str, updates: dict[int, float]) -> None:
        del table  # the node's cold tier holds one table
        keys = np.fromiter(updates.keys(), np.uint64, len(updates))
        self._node.cold_update(keys, np.fromiter(updates.values(), np.float64, len(updates)))
