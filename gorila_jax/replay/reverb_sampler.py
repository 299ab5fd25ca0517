"""The Reverb backend's sampler of K shards as one replay (`sharded.ReplayShards.sampler`).

Reverb does not report a table's mass, but its prioritized sampler gives each sampled
item `probability = priority**alpha / M_k`, so every sample of shard k tells M_k
exactly (priority**alpha / probability). The sampler keeps the estimate of each shard
from the latest rows it pulled from it. With one shard everything reduces to Reverb's
own sampling: the same datasets, batch for batch, and the probabilities and table
sizes Reverb gives.
"""

import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from gorila_jax.replay import api, codec, sampling, shard_streams, tiers


# How long `ShardedSampler.close` waits for the shards' dataset threads: each
# ends within its rate limiter's timeout on an idle machine, several times
# that on a loaded one.
_CLOSE_TIMEOUT_S = 30.0


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
    shard of each row (`api.Batch.shards`), for priority updates.

    A shard's rate limiter may hold samples back: each shard enforces the
    samples-per-insert ratio on its own share, so a shard whose mass share
    stays above its share of inserts slows sampling to its insert rate.

    Each shard's dataset is read in a thread of its own (`shard_streams`),
    so that one stuck on a vanished server can be left behind: when a shard
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
      content_hashes: each batch carries its items' content hashes
        (`api.Batch.hashes`; needs `codec`).
      cold_nodes: nodes whose cold tier is sampled as well (`tiers.ColdStream`), as
        streams K, K+1, ... after the K shards, in the mass split like a shard.
      hot_hashes: the content hashes of the shards' rows only (those of cold tiers' rows
        are 0): what priority notes need, at a fraction of the hashing (54 us a row for
        Atari's items).
    """

    connection_errors = sampling.CONNECTION_ERRORS

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
        content_hashes: bool = False,
        cold_nodes: Sequence[Any] = (),
        hot_hashes: bool = False,
    ):
        if (content_hashes or hot_hashes) and codec is None:
            raise ValueError("content hashes need packed items: give the sampler their codec")
        self._nodes, self._table, self._codec = list(nodes), table, codec
        self._cold_nodes = list(cold_nodes)
        self._content_hashes, self._hot_hashes = content_hashes, hot_hashes
        self._stop = stop or threading.Event()
        self._probe_after_s = probe_after_s
        self._settings = dict(
            prefetch=prefetch,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            num_workers=num_workers,
        )
        self._rng = np.random.default_rng(seed)
        self._streams: list[shard_streams.ShardStream | tiers.ColdStream] = []
        self._batch_size = 0  # the batch size the streams' chunks are cut for

    @property
    def num_shards(self) -> int:
        """Streams sampled: the shards, and their cold tiers after them."""
        return len(self._nodes) + len(self._cold_nodes)

    def batches(self, batch_size: int) -> Iterator[api.Batch]:
        """Batches of `batch_size` rows; as `sampling.batches`, the iterator ends when a
        shard's rate limiter holds samples back longer than the timeout (call again to go
        on: rows already pulled are kept, ended shard datasets are rebuilt).

        Raises:
          connection_errors: a shard is unreachable (call again to retry).
        """
        if batch_size != self._batch_size:
            self.close()
            chunk_rows = -(-batch_size // self.num_shards)
            estimate = self.num_shards > 1
            self._streams = [
                shard_streams.ShardStream(
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
            wait_s = self._settings["rate_limiter_timeout_ms"] / 1000
            self._streams += [
                tiers.ColdStream(node, chunk_rows, wait_s) for node in self._cold_nodes
            ]
            self._batch_size = batch_size
        if self.num_shards > 1:
            # Every shard's mass is known before the first split.
            for stream in self._streams:
                if not stream.know_mass():
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

    def _assemble(self, counts: list[int]) -> api.Batch:
        rows = shard_streams.concatenate(
            [stream.take(count) for stream, count in zip(self._streams, counts) if count]
        )
        data = rows.data if self._codec is None else self._codec.decode(rows.data, self._table)
        sources = None if self._codec is None else self._codec.sources(rows.data, self._table)
        shards = np.repeat(np.arange(self.num_shards, dtype=np.int32), counts)
        hashes = None
        if self._content_hashes:
            hashes = self._codec.content_hashes(rows.data, self._table)
        elif self._hot_hashes:
            hot = shards < len(self._nodes)
            hashes = np.zeros(len(shards), np.uint64)
            hashes[hot] = self._codec.content_hashes(rows.data[hot], self._table)
        if self.num_shards == 1:  # Reverb's probabilities and sizes are the replay's own
            return api.Batch(
                rows.keys, rows.probabilities, rows.table_size, data, sources=sources, hashes=hashes
            )
        masses = self._masses()
        sizes = np.array([stream.table_size for stream in self._streams], np.int64)
        return api.Batch(
            keys=rows.keys,
            probabilities=rows.probabilities * (masses / masses.sum())[shards],
            table_size=rows.table_size + (sizes.sum() - sizes)[shards],
            data=data,
            shards=shards,
            sources=sources,
            hashes=hashes,
        )
