"""Batches sampled from native replay shards as from one replay.

A batch's B rows are split over the K shards by a multinomial draw in
proportion to each shard's sampling mass M_k (sum of priority ** alpha for a
prioritized table, its size otherwise), which every sample reports exactly;
a row's probability becomes p_within * M_k / sum(M) and its table size the
total, so that importance weights come out as for one replay holding every
item (the same rule as the Reverb backend's `sharded.ShardedSampler`). With
one shard a batch is one call of the node's `sample`.
"""

import threading
from typing import Any, Iterator, Sequence

import numpy as np

from gorila_jax.replay import api
from gorila_jax.replay import codec as codec_lib


class NativeSampler:
    """Batches of one table across native replay nodes (`api.Batch`es).

    Args:
      nodes: the shards' nodes (or program clients of them), in shard order.
      table: the table to sample.
      codec: unpacks the items (None: batches carry the packed rows).
      seed: of the multinomial split.
      stop: set when sampling should end.
      timeout_s: how long one shard's rate limiter may hold a sample back before
        `batches` ends (the caller calls it again to go on, as with Reverb's).
      content_hashes: batches carry their items' content hashes (needs `codec`).
      cold_shards: the shards whose table is tiered, in order: a row shard k drew from its
        cold tier is labelled K + (k's place here), as the Reverb backend's cold streams
        are (`tiering.TierMetrics` counts them; their priorities go to that shard's node).
    """

    # A node in another process is reached through a `RayClient`, which waits out the
    # node's restart itself (under Launchpad a dead node ends the run): no error here is
    # a lost connection for the prefetcher to sample again after.
    connection_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        nodes: Sequence[Any],
        table: str,
        codec: codec_lib.ItemCodec | None = None,
        seed: int | None = None,
        stop: threading.Event | None = None,
        timeout_s: float = 1.0,
        content_hashes: bool = False,
        cold_shards: Sequence[int] = (),
    ):
        if content_hashes and codec is None:
            raise ValueError("content hashes need packed items: give the sampler their codec")
        self._nodes, self._table, self._codec = list(nodes), table, codec
        self._stop = stop or threading.Event()
        self._timeout_s, self._content_hashes = timeout_s, content_hashes
        self._rng = np.random.default_rng(seed)
        self._cold_label = {shard: len(self._nodes) + i for i, shard in enumerate(cold_shards)}
        self._masses: list[float | None] = [None] * len(self._nodes)
        self._sizes = [0] * len(self._nodes)
        # Rows a shard gave for a batch that another shard then held back: the next one's.
        self._left: list[list[api.Sample]] = [[] for _ in self._nodes]

    @property
    def num_shards(self) -> int:
        return len(self._nodes)

    def batches(self, batch_size: int) -> Iterator[api.Batch]:
        """Batches of `batch_size` rows until a shard holds its rows back for `timeout_s`
        (or `stop` is set); call again to go on."""
        if self.num_shards > 1:
            for shard in range(self.num_shards):
                if self._masses[shard] is None and not self._fill(shard, 1):
                    return
        while not self._stop.is_set():
            counts = self._split(batch_size)
            for shard, count in enumerate(counts):
                if not self._fill(shard, count):
                    return
            yield self._assemble(counts)

    def _split(self, batch_size: int) -> list[int]:
        if self.num_shards == 1:
            return [batch_size]
        masses = np.asarray(self._masses, np.float64)
        return self._rng.multinomial(batch_size, masses / masses.sum()).tolist()

    def _held(self, shard: int) -> int:
        return sum(len(part.keys) for part in self._left[shard])

    def _fill(self, shard: int, count: int) -> bool:
        """Samples shard `shard` until it holds `count` rows; False if it held them back."""
        missing = count - self._held(shard)
        if missing <= 0:
            return True
        sample = self._nodes[shard].sample(self._table, missing, self._timeout_s)
        if sample is None:
            return False
        self._left[shard].append(sample)
        self._masses[shard] = sample.mass if sample.mass > 0 else self._masses[shard] or 1.0
        self._sizes[shard] = sample.table_size
        return True

    def _take(self, shard: int, count: int) -> list[api.Sample]:
        parts, taken = [], 0
        while taken < count:
            part = self._left[shard][0]
            wanted = count - taken
            if len(part.keys) <= wanted:
                parts.append(self._left[shard].pop(0))
                taken += len(part.keys)
            else:
                head = api.Sample(
                    part.keys[:wanted],
                    part.probabilities[:wanted],
                    part.table_size,
                    part.data[:wanted],
                    part.mass,
                )
                self._left[shard][0] = part._replace(
                    keys=part.keys[wanted:],
                    probabilities=part.probabilities[wanted:],
                    data=part.data[wanted:],
                )
                parts.append(head)
                taken = count
        return parts

    def _assemble(self, counts: list[int]) -> api.Batch:
        keys, probabilities, data, shards = [], [], [], []
        total_mass = float(np.sum(self._masses)) if self.num_shards > 1 else None
        for shard, count in enumerate(counts):
            for part in self._take(shard, count):
                keys.append(part.keys)
                share = 1.0 if total_mass is None else self._masses[shard] / total_mass
                probabilities.append(part.probabilities * share)
                data.append(part.data)
                labels = np.full(len(part.keys), shard, np.int32)
                if part.cold is not None and shard in self._cold_label:
                    labels[part.cold] = self._cold_label[shard]
                shards.append(labels)
        rows = np.concatenate(data) if len(data) > 1 else data[0]
        count = len(rows)
        codec = self._codec
        return api.Batch(
            keys=np.concatenate(keys),
            probabilities=np.concatenate(probabilities),
            table_size=np.full(count, sum(self._sizes), np.int64),
            data=rows if codec is None else codec.decode(rows, self._table),
            shards=np.concatenate(shards) if self.num_shards > 1 or self._cold_label else None,
            sources=None if codec is None else codec.sources(rows, self._table),
            hashes=codec.content_hashes(rows, self._table) if self._content_hashes else None,
        )

    def close(self, timeout_s: float = 0.0) -> None:
        """Drops the rows held for the next batch (no threads to end)."""
        del timeout_s
        self._left = [[] for _ in self._nodes]

    def __enter__(self) -> "NativeSampler":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _rows(sample: api.Sample, rows: slice) -> api.Sample:
    return sample._replace(
        keys=sample.keys[rows],
        probabilities=sample.probabilities[rows],
        data=sample.data[rows],
        cold=None if sample.cold is None else sample.cold[rows],
    )
