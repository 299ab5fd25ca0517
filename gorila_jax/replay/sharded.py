"""Replay sharded over K Reverb servers, sampled by learners as one prioritized replay.

Actor i writes to shard i % K (`assigned_shard`). A learner samples every
batch across all shards (`ShardedSampler`): it splits the batch's rows over
the shards with a multinomial draw in proportion to each shard's priority
mass M_k (the sum of priority**alpha over its items; a uniform or FIFO
table's mass is its size), and rescales Reverb's within-shard probabilities
to global ones, p_i**alpha / sum_k M_k, so that agents' importance weights
are those of one replay holding every item. Reverb does not report a
table's mass, but its prioritized sampler gives each sampled item
`probability = priority**alpha / M_k`, so every sample of shard k tells M_k
exactly (priority**alpha / probability). The sampler keeps the estimate of
each shard from the latest rows it pulled from it. New priorities go back
to the shard that holds each item (`sampling.PriorityUpdater`).

With one shard everything reduces to Reverb's own sampling: the same
datasets, batch for batch, and the probabilities and table sizes Reverb gives.
"""

import collections
import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import reverb
import tree

from gorila_jax.replay import codec, sampling, server


def assigned_shard(actor_index: int, num_shards: int) -> int:
    """The shard actor `actor_index` writes to: actors are dealt out over shards in turn."""
    return actor_index % num_shards


def shard_tables(
    make_tables: Callable[[], Sequence[reverb.Table]], num_shards: int
) -> list[reverb.Table]:
    """The agent's tables cut to the size of one of `num_shards` shards.

    The agent declares tables for the whole replay. Each shard sees 1/K of
    the inserts and samples, so it keeps 1/K of the capacity (`max_size`),
    needs 1/K of the minimum size before it may be sampled, and its rate
    limiter allows 1/K of the deviation from samples_per_insert, but at
    least 2 * max(1, samples_per_insert) (Reverb's rule: narrower can
    deadlock inserts against samples). K shards then hold as many items and
    start learning as early as one replay would. A queue (PPO's) becomes a
    queue of 1/K of the capacity.
    """
    return [_shard_table(table, num_shards) for table in make_tables()]


def _shard_table(table: reverb.Table, num_shards: int) -> reverb.Table:
    if num_shards == 1:
        return table
    info = table.info
    limits = info.rate_limiter_info
    max_size = math.ceil(info.max_size / num_shards)
    is_queue = (
        info.max_times_sampled == 1 and limits.min_diff == 0 and limits.max_diff == info.max_size
    )
    if is_queue:  # reverb.Table.queue: inserts wait while it is full
        limiter = reverb.rate_limiters.Queue(max_size)
    else:
        min_diff, max_diff = limits.min_diff, limits.max_diff
        if math.isfinite(max_diff - min_diff):
            center = (min_diff + max_diff) / 2 / num_shards
            half = max((max_diff - min_diff) / 2 / num_shards, max(1.0, limits.samples_per_insert))
            min_diff, max_diff = center - half, center + half
        limiter = reverb.rate_limiters.RateLimiter(
            samples_per_insert=limits.samples_per_insert,
            min_size_to_sample=max(1, math.ceil(limits.min_size_to_sample / num_shards)),
            min_diff=min_diff,
            max_diff=max_diff,
        )
    return table.replace(max_size=max_size, rate_limiter=limiter)


class ReplayShards:
    """A run's replay shards as a learner uses them: one replay to sample, checkpoint and prune.

    Args:
      nodes: the client of the replay node, or of each shard in shard order.
    """

    def __init__(self, nodes: Any | Sequence[Any]):
        self.nodes = list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]
        if not self.nodes:
            raise ValueError("a replay needs at least one shard")

    def __len__(self) -> int:
        return len(self.nodes)

    def sampler(
        self, table: str, codec: codec.ItemCodec | None, stop: threading.Event | None = None
    ) -> "ShardedSampler":
        return ShardedSampler(self.nodes, table, codec, stop=stop)

    def priority_updater(self, table: str) -> sampling.PriorityUpdater:
        """Sends priorities to the shard of each item, at the address each serves at now."""
        return sampling.PriorityUpdater([server.ReplayClient(node) for node in self.nodes], table)

    def checkpoint(self, step: int) -> dict[str, Any]:
        """Checkpoints every shard as learner step `step`.

        Returns:
          The replay node's record (`ReplayNode.checkpoint`) for a single
          replay; with shards, the table sizes summed over them and each
          shard's record under "shards".
        """
        records = [node.checkpoint(step) for node in self.nodes]
        if len(records) == 1:
            return records[0]
        sizes: dict[str, int] = {}
        for record in records:
            for name, size in record["table_sizes"].items():
                sizes[name] = sizes.get(name, 0) + size
        return {"table_sizes": sizes, "shards": records}

    def keep_checkpoints(self, steps: Sequence[int]) -> None:
        for node in self.nodes:
            node.keep_checkpoints(steps)


class _Rows(NamedTuple):
    """Rows sampled from one shard, as Reverb gave them."""

    keys: np.ndarray  # [n] uint64
    probabilities: np.ndarray  # [n] float64, within the shard
    table_size: np.ndarray  # [n] int64, the shard's
    data: Any  # [n, ...] packed items (or the item pytree)


def _concatenate(parts: list[_Rows]) -> _Rows:
    if len(parts) == 1:
        return parts[0]
    return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def _slice(rows: _Rows, start: int, stop: int) -> _Rows:
    return tree.map_structure(lambda leaf: leaf[start:stop], rows)


def _priority_exponent(address: str, table: str) -> float | None:
    """The exponent of `table`'s prioritized sampler; None for any other sampler."""
    options = reverb.Client(address).server_info()[table].sampler_options
    if options.WhichOneof("distribution") != "prioritized":
        return None
    return options.prioritized.priority_exponent


# How long `ShardedSampler.close` waits for the shards' dataset threads: each
# ends within its rate limiter's timeout on an idle machine, several times
# that on a loaded one.
_CLOSE_TIMEOUT_S = 30.0

_ENDED = object()  # a _Puller's last item: its dataset ended (the rate limiter held samples)


class _Puller(threading.Thread):
    """Pulls the chunks of one shard's Reverb dataset in a thread of its own.

    A Reverb dataset whose server is gone waits for it indefinitely; in this
    thread it can be abandoned when the shard turns out to serve elsewhere
    (`abandon`). Queues chunks, then `_ENDED` or the error that ended it.
    """

    def __init__(
        self,
        address: str,
        table: str,
        chunk_rows: int,
        settings: dict,
        stop: threading.Event,
        with_exponent: bool,
    ):
        super().__init__(name=f"replay-shard-{address}", daemon=True)
        self.address, self._table, self._chunk_rows = address, table, chunk_rows
        # Not `_stop`: threading.Thread has a method of that name, which `join` calls.
        self._settings, self._stop_event, self._with_exponent = settings, stop, with_exponent
        self.chunks: queue.Queue = queue.Queue(1)
        self._abandoned = threading.Event()
        self.exponent: float | None = None  # set before the first chunk is queued
        self.start()

    def abandon(self) -> None:
        self._abandoned.set()

    def run(self) -> None:
        try:
            if self._with_exponent:
                self.exponent = _priority_exponent(self.address, self._table)
            samples = sampling.sample_stream(
                self.address, self._table, self._chunk_rows, **self._settings
            )
            while self._put(next(samples)):
                pass
        except StopIteration:
            self._put(_ENDED)
        except BaseException as error:  # noqa: BLE001  handed to the sampler's thread
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not (self._abandoned.is_set() or self._stop_event.is_set()):
            try:
                self.chunks.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False


class _ShardStream:
    """One shard's samples, pulled in chunks, with the rows that no batch has taken yet.

    Its Reverb dataset (`_Puller`) is built at the first pull, and built
    again, at the address the shard's node gives then, after it ended (the
    rate limiter held samples back, or the connection failed). A dataset
    that brings nothing for `probe_after_s` makes it ask the node where the
    shard serves: if elsewhere (restarted on another host), it samples
    there; at the same address Reverb reconnects by itself. Rows already
    pulled stay.
    """

    def __init__(
        self,
        node: Any,
        table: str,
        chunk_rows: int,
        estimate_mass: bool,
        settings: dict,
        stop: threading.Event,
        probe_after_s: float,
    ):
        self._node, self._table, self._chunk_rows = node, table, chunk_rows
        self._estimate_mass, self._settings, self._stop = estimate_mass, settings, stop
        self._wait_s = settings["rate_limiter_timeout_ms"] / 1000
        self._probe_after_s = probe_after_s
        self._puller: _Puller | None = None
        # Pullers left on a server the shard moved away from; `close` waits for them briefly.
        self._abandoned: list[_Puller] = []
        self._waiting_since: float | None = None
        self._rows: collections.deque[_Rows] = collections.deque()
        self._offset = 0  # rows of the oldest chunk already taken
        self.buffered = 0
        self.mass: float | None = None  # None until a sample tells it
        self.table_size = 0

    def fill(self, count: int) -> bool:
        """Pulls chunks until `count` rows are buffered; False if none came for a while
        (the caller may stop, or call again).

        Raises:
          sampling.CONNECTION_ERRORS: the shard is unreachable (the next fill rebuilds).
        """
        while self.buffered < count:
            if self._puller is None:
                self._puller = _Puller(
                    self._node.address(),
                    self._table,
                    self._chunk_rows,
                    self._settings,
                    self._stop,
                    with_exponent=self._estimate_mass,
                )
            try:
                item = self._puller.chunks.get(timeout=self._wait_s)
            except queue.Empty:
                self._probe_if_stuck()
                return False
            self._waiting_since = None
            if item is _ENDED or isinstance(item, BaseException):
                self._puller = None
                if item is _ENDED:
                    return False
                raise item
            info = item.info
            self._rows.append(_Rows(info.key, info.probability, info.table_size, item.data))
            self.buffered += len(info.key)
            self._update_mass(info, self._puller.exponent)
        return True

    def _probe_if_stuck(self) -> None:
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since < self._probe_after_s:
            return
        self._waiting_since = now
        address = self._node.address()
        if address == self._puller.address:
            logging.warning("replay shard at %s brings no samples; waiting for it", address)
            return
        logging.warning(
            "replay shard moved from %s to %s; sampling there", self._puller.address, address
        )
        self._puller.abandon()  # its thread may stay blocked on the old server
        self._abandoned = [p for p in self._abandoned if p.is_alive()] + [self._puller]
        self._puller = None

    def close(self, deadline: float) -> None:
        """Ends its dataset's thread and waits for it, until `deadline` (time.monotonic())
        at most; rows pulled but not taken are dropped.

        Call it while the shard's server still serves: the thread then ends
        within about the rate limiter's timeout. A thread left waiting on a
        server that stops never ends: Reverb's reconnect attempts in it keep
        costing CPU, and one that returns while the interpreter finalizes
        aborts the process (see `learner.DevicePrefetcher.close`).
        """
        current = [self._puller] if self._puller is not None else []
        abandoned = self._abandoned
        self._puller, self._abandoned = None, []
        for puller in current + abandoned:
            puller.abandon()
        for puller in current + abandoned:
            remaining = max(0.0, deadline - time.monotonic())
            if puller in abandoned:  # on a server that moved away and may never answer again
                remaining = min(remaining, self._wait_s + 2.0)
            puller.join(remaining)
            if puller.is_alive():
                logging.warning(
                    "replay shard %s: sampling thread still running after close", puller.address
                )

    def _update_mass(self, info: Any, exponent: float | None) -> None:
        self.table_size = int(info.table_size[-1])
        if not self._estimate_mass:
            return
        if exponent is None:  # uniform or FIFO: every item weighs the same
            mass = float(self.table_size)
        else:
            sampled = info.probability > 0
            masses = info.priority[sampled] ** exponent / info.probability[sampled]
            mass = float(np.mean(masses)) if masses.size else 0.0
        if mass > 0 and math.isfinite(mass):
            self.mass = mass

    def take(self, count: int) -> _Rows:
        """The `count` oldest buffered rows (`fill` first)."""
        parts = []
        while count:
            oldest = self._rows[0]
            size = len(oldest.keys)
            start = self._offset
            stop = min(size, start + count)
            whole = start == 0 and stop == size
            parts.append(oldest if whole else _slice(oldest, start, stop))
            count -= stop - start
            self.buffered -= stop - start
            if stop == size:
                self._rows.popleft()
                self._offset = 0
            else:
                self._offset = stop
        return _concatenate(parts)


class ShardedSampler:
    """Batches drawn across replay shards as from one prioritized replay.

    Each batch's B rows are split over the shards by a multinomial draw with
    probabilities M_k / sum(M) (the shards' latest mass estimates); a
    shard's rows come from its own Reverb dataset, pulled in chunks of
    ceil(B / K) rows, and rows pulled but not yet used wait for the next
    batch. Every row's probability becomes global, p_within * M_k / sum(M)
    (= priority**alpha / sum(M) for a prioritized table, 1 / total size for
    a uniform one), and its table size the total over shards, so that
    importance weights N * P come out as for one replay. A batch carries the
    shard of each row (`sampling.Batch.shards`), for priority updates.

    A shard's rate limiter may hold samples back: each shard enforces the
    samples-per-insert ratio on its own share, so a shard whose mass share
    stays above its share of inserts slows sampling to its insert rate.

    Each shard's dataset is read in a thread of its own (a `_Puller`), so
    that one stuck on a vanished server can be left behind: when a shard
    brings nothing for `probe_after_s`, its node is asked where it serves,
    and if that changed (restarted elsewhere) sampling moves there.

    Args:
      nodes: clients of the shards' replay nodes, in shard order (their
        `address()` is asked each time a shard's dataset is built).
      table: the table to sample.
      codec: unpacks the items (None: items are not packed).
      seed: of the multinomial draws.
      stop: set when sampling ends (the learner stopping): the shards'
        threads end then; `close` ends them too.
      probe_after_s: see above.
      prefetch, rate_limiter_timeout_ms, num_workers: each shard's dataset's,
        as for `sampling.batches`.
    """

    def __init__(
        self,
        nodes: Sequence[Any],
        table: str,
        codec: codec.ItemCodec | None = None,
        seed: int | None = None,
        stop: threading.Event | None = None,
        probe_after_s: float = 10.0,
        prefetch: int = 4,
        rate_limiter_timeout_ms: int = 1000,
        num_workers: int = 2,
    ):
        self._nodes, self._table, self._codec = list(nodes), table, codec
        self._stop = stop or threading.Event()
        self._probe_after_s = probe_after_s
        self._settings = dict(
            prefetch=prefetch,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            num_workers=num_workers,
        )
        self._rng = np.random.default_rng(seed)
        self._streams: list[_ShardStream] = []
        self._batch_size = 0  # the batch size the streams' chunks are cut for

    @property
    def num_shards(self) -> int:
        return len(self._nodes)

    def batches(self, batch_size: int) -> Iterator[sampling.Batch]:
        """Batches of `batch_size` rows; as `sampling.batches`, the iterator ends when a
        shard's rate limiter holds samples back longer than the timeout (call again to go
        on: rows already pulled are kept, ended shard datasets are rebuilt).

        Raises:
          sampling.CONNECTION_ERRORS: a shard is unreachable (call again to retry).
        """
        if batch_size != self._batch_size:
            self.close()
            chunk_rows = -(-batch_size // self.num_shards)
            estimate = self.num_shards > 1
            self._streams = [
                _ShardStream(
                    node,
                    self._table,
                    chunk_rows,
                    estimate,
                    self._settings,
                    self._stop,
                    self._probe_after_s,
                )
                for node in self._nodes
            ]
            self._batch_size = batch_size
        if self.num_shards > 1:
            # Every shard's mass is known before the first split.
            for stream in self._streams:
                if stream.mass is None and not stream.fill(1):
                    return
        while True:
            counts = self._split(batch_size)
            for stream, count in zip(self._streams, counts):
                if not stream.fill(count):
                    return
            yield self._assemble(counts)

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """Ends the shards' dataset threads and waits for them, `timeout_s` in all at most
        (a later `batches` builds new ones).

        Close it before the shards' servers stop (`with ShardedSampler(...)`).
        """
        deadline = time.monotonic() + timeout_s
        for stream in self._streams:
            stream.close(deadline)
        self._streams, self._batch_size = [], 0

    def __enter__(self) -> "ShardedSampler":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _masses(self) -> np.ndarray:
        known = [stream.mass for stream in self._streams if stream.mass is not None]
        prior = float(np.mean(known)) if known else 1.0
        return np.array([prior if s.mass is None else s.mass for s in self._streams])

    def _split(self, batch_size: int) -> list[int]:
        if self.num_shards == 1:
            return [batch_size]
        masses = self._masses()
        return self._rng.multinomial(batch_size, masses / masses.sum()).tolist()

    def _assemble(self, counts: list[int]) -> sampling.Batch:
        rows = _concatenate(
            [stream.take(count) for stream, count in zip(self._streams, counts) if count]
        )
        data = rows.data if self._codec is None else self._codec.decode(rows.data, self._table)
        sources = None if self._codec is None else self._codec.sources(rows.data, self._table)
        if self.num_shards == 1:  # Reverb's probabilities and sizes are the replay's own
            return sampling.Batch(
                rows.keys, rows.probabilities, rows.table_size, data, sources=sources
            )
        shards = np.repeat(np.arange(self.num_shards, dtype=np.int32), counts)
        masses = self._masses()
        sizes = np.array([stream.table_size for stream in self._streams], np.int64)
        return sampling.Batch(
            keys=rows.keys,
            probabilities=rows.probabilities * (masses / masses.sum())[shards],
            table_size=rows.table_size + (sizes.sum() - sizes)[shards],
            data=data,
            shards=shards,
            sources=sources,
        )
