"""How a replay is tiered (the design brief, 2.1): the newest items in memory, older ones on
local disk. Each backend keeps the tiers its own way (tiers.py for Reverb, native_table.py)."""

import dataclasses
import logging
import math
import os
import threading
import time
from typing import Any, Sequence

import numpy as np

from gorila_jax.replay import api, cold_ring, manifest

COLD_CHECKPOINT = "cold.npz"
_SPILL_SUFFIX = "/spill"


def spill_table(table: str) -> str:
    """The name of `table`'s spill queue."""
    return table + _SPILL_SUFFIX


@dataclasses.dataclass(frozen=True)
class Tiering:
    """How one replay (or one of its shards) is tiered.

    Args:
      table: the agent's sampled table, the one that is tiered.
      hot_size: items the hot tier (the table in memory) holds.
      cold_size: items the cold tier holds.
      cold_dir: the cold tier's directory on the replay node's host.
      cold_bytes: disk the cold tier's items may take; 0: `cold_size` items
        uncompressed.
      cold_compression: how cold items are stored, one of `cold_ring.COMPRESSIONS`.
    """

    table: str
    hot_size: int
    cold_size: int
    cold_dir: str
    cold_bytes: int = 0
    cold_compression: str = "none"

    def __post_init__(self):
        if self.hot_size < 1 or self.cold_size < 1:
            raise ValueError(
                f"a tiered replay needs hot and cold sizes >= 1, got {self.hot_size} and "
                f"{self.cold_size}"
            )
        if self.cold_bytes < 0:
            raise ValueError(f"a cold tier's disk budget must be >= 0, got {self.cold_bytes}")
        if self.cold_compression not in cold_ring.COMPRESSIONS:
            raise ValueError(
                f"unknown cold replay compression {self.cold_compression!r}; choose one of "
                f"{cold_ring.COMPRESSIONS}"
            )

    def for_shard(self, shard: int, num_shards: int) -> "Tiering":
        """Shard `shard`'s tiers: 1/K of each size, in a directory of its own."""
        if num_shards == 1:
            return self
        return Tiering(
            self.table,
            math.ceil(self.hot_size / num_shards),
            math.ceil(self.cold_size / num_shards),
            os.path.join(self.cold_dir, f"shard{shard}"),
            self.cold_bytes // num_shards,
            self.cold_compression,
        )

    def hot_spec(self, spec: api.TableSpec) -> api.TableSpec:
        """The tiered table `spec` cut to its hot tier, as the native backend keeps it;
        sampling starts once the hot tier holds the minimum size, or is full (Reverb's
        hot table, `tiers.reverb_tables`, also leaves inserts to its mover)."""
        limit = spec.rate_limit
        if limit is not None:
            limit = dataclasses.replace(limit, min_size=min(limit.min_size, self.hot_size))
        return dataclasses.replace(spec, max_size=self.hot_size, rate_limit=limit)

    def sampled_spec(self, tables: Sequence[api.TableSpec]) -> api.TableSpec:
        """The agent's table that is tiered.

        Raises:
          ValueError: it is missing, or is a queue (each item sampled once: an on-policy
            agent's, which has no old items to keep).
        """
        sampled = [table for table in tables if table.name == self.table]
        if not sampled:
            raise ValueError(
                f"a tiered replay needs table {self.table!r}; the agent declares "
                f"{[table.name for table in tables]}"
            )
        if sampled[0].kind == api.QUEUE:
            raise ValueError(
                f"table {self.table!r} samples each item once (an on-policy queue): it has no "
                "old items to keep on disk; a tiered replay is for off-policy agents"
            )
        return sampled[0]


def check_tiers_match(path: str, tiering: Tiering | None) -> None:
    """Raises IncompatibleCheckpoint if the checkpoint at `path` is tiered and the run is not,
    or the other way round: either would lose the items of one tier."""
    has_cold = os.path.exists(os.path.join(path, COLD_CHECKPOINT))
    if has_cold == (tiering is not None):
        return
    held, asked = ("a tiered", "without one") if has_cold else ("an in-memory", "with tiers")
    raise manifest.IncompatibleCheckpoint(
        f"replay checkpoint {path} holds {held} replay and this run asks {asked} "
        "(--replay_cold_dir, config.hot_replay_size): resume it as it was taken, or start "
        "the run afresh"
    )


class TierMetrics:
    """A learner's view of a tiered replay: the share of its rows each tier gave, and the
    replay nodes' items, bytes and cold reads (asked without waiting: a node's answer
    arrives by the next report).

    Args:
      nodes: the replay's nodes, in shard order (their `futures.tier_info`).
      tiered: the shards whose sampled table is tiered (`ReplayShards.cold_tiers`).
    """

    def __init__(self, nodes: Sequence[Any], tiered: Sequence[int]):
        self._nodes, self._tiered = list(nodes), list(tiered)
        self._rows = np.zeros(2, np.int64)  # hot, cold rows since the last report
        self._lock = threading.Lock()
        self._asked: dict[int, Any] = {}
        self._latest: dict[int, dict[str, float]] = {}
        self._last_reads: tuple[float, float] | None = None  # (time, cold reads)

    def count(self, shards: np.ndarray | None) -> None:
        """Counts a batch's rows by tier (`Batch.shards`: K and up are cold tiers)."""
        if shards is None:
            return
        cold = int(np.count_nonzero(np.asarray(shards) >= len(self._nodes)))
        with self._lock:
            self._rows += (np.size(shards) - cold, cold)

    def metrics(self) -> dict[str, float]:
        """replay/{hot,cold}_{items,bytes}, replay/cold_share (of the rows sampled since the
        last call), replay/cold_reads_per_s (every learner's, at the nodes)."""
        for shard in self._tiered:
            asked = self._asked.get(shard)
            if asked is not None and asked.done():
                try:
                    self._latest[shard] = asked.result()
                except Exception:  # noqa: BLE001  a restarting node: its next answer counts
                    logging.exception("replay shard %d: no tier info", shard)
                asked = None
            if asked is None:
                self._asked[shard] = self._nodes[shard].futures.tier_info()
        with self._lock:
            rows, self._rows = self._rows, np.zeros(2, np.int64)
        found = {}
        if rows.sum():
            found["replay/cold_share"] = float(rows[1] / rows.sum())
        if not self._latest:
            return found
        for name in ("hot_items", "hot_bytes", "cold_items", "cold_bytes"):
            found[f"replay/{name}"] = float(sum(info[name] for info in self._latest.values()))
        reads = float(sum(info["cold_reads"] for info in self._latest.values()))
        now = time.monotonic()
        if self._last_reads is not None and now > self._last_reads[0]:
            rate = (reads - self._last_reads[1]) / (now - self._last_reads[0])
            found["replay/cold_reads_per_s"] = max(rate, 0.0)
        self._last_reads = (now, reads)
        return found
