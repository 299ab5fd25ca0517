"""Demonstration rows mixed into every sampled batch at a fixed share (DQfD's replay, brief 4.1).

Demonstrations live in a table of their own on the first replay shard
(`DEMO_TABLE`): uniform, never evicted, loaded once when the shard starts
(`gorila_jax.demonstrations`). A learner whose agent takes demonstrations
samples through `MixedSampler`: of every R rows, round(f * R) come from the
demonstration table, spread evenly over the batch (`demo_rows`), so that any
contiguous block of it (one device's share, one update of a multi-update
dispatch) holds its share within one row. The rest come from the agent's own
replay, by its own rule. Demonstration rows carry `Batch.demo`; their new
priorities are not sent (the demonstration table has none), and their
importance weight N * P is 1 (uniform: P = 1 / N).
"""

from typing import Any, Iterator

import jax
import numpy as np

from gorila_jax import config_checks
from gorila_jax.replay import api

DEMO_TABLE = "demonstrations"
# The source actor that demonstration items carry (`ItemCodec.sources`): no actor's
# index, and apart from UNKNOWN_SOURCE (-1), so that sampled rows count as "demo".
DEMO_SOURCE = -2
# The demonstration table never evicts; backends allocate per item, not up front.
_DEMO_CAPACITY = 100_000_000


def demo_table(item_bytes: int) -> api.TableSpec:
    """The demonstration table: uniform sampling, nothing removed, sampled once it holds one item.

    Its items are the agent's (`item_bytes` wide, the sampled table's), so the
    learner decodes both tables' rows with one codec.
    """
    return api.TableSpec(
        DEMO_TABLE, api.UNIFORM, _DEMO_CAPACITY, item_bytes, rate_limit=api.RateLimit(1), grows=True
    )


def demo_rows(rows: int, fraction: float) -> np.ndarray:
    """[rows] bool: which rows of a batch are demonstrations, `config_checks.demo_row_count`
    of them, evenly spread (row i is one where (i + 1) f, rounded half up, passes an integer)."""
    taken = np.floor(np.arange(rows + 1) * fraction + 0.5)
    return np.diff(taken) > 0


class MixedSampler:
    """Batches whose rows are `fraction` demonstrations and the rest the agent's replay.

    Args:
      replay: the sampler of the agent's replay (its batches and close).
      demos: the sampler of the demonstration table.
      fraction: the share of every batch's rows that are demonstrations.
    """

    def __init__(self, replay: Any, demos: Any, fraction: float):
        if not fraction:
            raise ValueError("a MixedSampler needs a demonstration share above 0")
        self._replay, self._demos, self._fraction = replay, demos, fraction
        self.connection_errors = replay.connection_errors + demos.connection_errors

    def batches(self, batch_size: int) -> Iterator[api.Batch]:
        """As a replay sampler's `batches`: ends when either table holds samples back.

        Raises:
          ValueError: a share that leaves a batch of `batch_size` rows without a row of
            either kind (`config_checks.check_demo_fraction`).
        """
        config_checks.check_demo_fraction(self._fraction, batch_size)
        demo = demo_rows(batch_size, self._fraction)
        count = int(demo.sum())
        own, demos = self._replay.batches(batch_size - count), self._demos.batches(count)
        for replay_batch in own:
            demo_batch = next(demos, None)
            if demo_batch is None:
                return
            yield interleave(replay_batch, demo_batch, demo)

    def close(self) -> None:
        try:
            self._replay.close()
        finally:
            self._demos.close()


def interleave(replay_batch: api.Batch, demo_batch: api.Batch, demo: np.ndarray):
    """One batch: `demo_batch`'s rows where `demo` is True, `replay_batch`'s elsewhere."""

    def place(own: Any, demonstrated: Any) -> Any:
        own, demonstrated = np.asarray(own), np.asarray(demonstrated)
        rows = np.empty((demo.size,) + own.shape[1:], np.result_type(own, demonstrated))
        rows[~demo], rows[demo] = own, demonstrated
        return rows

    def optional(own: Any, demonstrated: Any, fill: int) -> np.ndarray | None:
        if own is None and demonstrated is None:
            return None  # a field neither batch has (shards of a single replay)
        if own is None:
            own = np.full(int((~demo).sum()), fill, np.asarray(demonstrated).dtype)
        if demonstrated is None:
            demonstrated = np.full(int(demo.sum()), fill, np.asarray(own).dtype)
        return place(own, demonstrated)

    return api.Batch(
        keys=place(replay_batch.keys, demo_batch.keys),
        probabilities=place(replay_batch.probabilities, demo_batch.probabilities),
        table_size=place(replay_batch.table_size, demo_batch.table_size),
        data=jax.tree.map(place, replay_batch.data, demo_batch.data),
        # Demonstrations sit on the first shard; their rows' priorities are never sent.
        shards=optional(replay_batch.shards, None, 0),
        sources=optional(replay_batch.sources, demo_batch.sources, DEMO_SOURCE),
        hashes=optional(replay_batch.hashes, demo_batch.hashes, 0),
        demo=demo.copy(),
    )
