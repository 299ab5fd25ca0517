"""The replay interface that agents, actors and learners see, whatever backend serves it.

An agent declares its tables as `TableSpec`s (kind, capacity, priority
exponent, rate limit, item width) and writes through the `Connection` its
adder is handed; learners sample through `replay.ReplayShards`. Two backends
implement it: the native one (gorila_jax/replay/native_table.py and
native_node.py, numpy in the replay node's process) and Reverb
(gorila_jax/replay/server.py and the modules it uses). Nothing here imports
either backend's libraries.

Items are packed uint8 rows (`codec.ItemCodec`): a table is declared by the
width of its rows, and every backend stores and returns rows of that width.
"""

import dataclasses
import math
import threading
from typing import NamedTuple, Protocol

import numpy as np

from gorila_jax import types

NATIVE, REVERB = "native", "reverb"
BACKENDS = (NATIVE, REVERB)

PRIORITIZED, UNIFORM, QUEUE = "prioritized", "uniform", "queue"
KINDS = (PRIORITIZED, UNIFORM, QUEUE)


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """When items may be sampled and inserted (Reverb's SampleToInsertRatio and MinSize).

    Sampling waits until the table holds `min_size` items. With a
    `samples_per_insert` ratio, d = inserts * samples_per_insert - samples
    must stay within [min_diff, max_diff] = min_size * samples_per_insert
    -+ error_buffer: an insert that would pass max_diff waits for samples, a
    sample that would pass min_diff waits for inserts (inserts below
    min_size never wait). Without a ratio only the minimum size holds.
    """

    min_size: int
    samples_per_insert: float | None = None
    error_buffer: float = math.inf

    def __post_init__(self):
        if self.min_size < 1:
            raise ValueError(f"min_replay_size must be positive, got {self.min_size}")
        if self.samples_per_insert is not None and self.samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be positive, got {self.samples_per_insert}")

    @property
    def min_diff(self) -> float:
        if self.samples_per_insert is None:
            return -math.inf
        return self.min_size * self.samples_per_insert - self.error_buffer

    @property
    def max_diff(self) -> float:
        if self.samples_per_insert is None:
            return math.inf
        return self.min_size * self.samples_per_insert + self.error_buffer

    def for_shard(self, num_shards: int) -> "RateLimit":
        """The limit of one of `num_shards` shards: 1/K of the minimum size and of the
        allowed deviation, but at least 2 * max(1, samples_per_insert) of it (narrower can
        deadlock inserts against samples, as Reverb warns)."""
        if num_shards == 1:
            return self
        error_buffer = self.error_buffer
        if self.samples_per_insert is not None and math.isfinite(error_buffer):
            floor = max(1.0, self.samples_per_insert)
            error_buffer = max(error_buffer / num_shards, floor)
        return dataclasses.replace(
            self, min_size=max(1, math.ceil(self.min_size / num_shards)), error_buffer=error_buffer
        )


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One replay table, as an agent declares it for the whole replay.

    Attributes:
      name: what writers and samplers call it.
      kind: PRIORITIZED (sampled in proportion to priority ** priority_exponent,
        Schaul et al. 2016), UNIFORM, or QUEUE (each item sampled once, oldest
        first; inserts wait while it is full). The first two remove the oldest
        item when full (FIFO).
      max_size: items held at most.
      item_bytes: the width of its packed uint8 items (`ItemCodec.num_bytes`).
      priority_exponent: alpha of a PRIORITIZED table, applied by the backend
        and nowhere else; None for the other kinds.
      rate_limit: sampling and inserting bounds; None for a QUEUE.
      grows: the backend allocates as items arrive instead of `max_size` up
        front (a table whose capacity is a bound, not a size: demonstrations).
    """

    name: str
    kind: str
    max_size: int
    item_bytes: int
    priority_exponent: float | None = None
    rate_limit: RateLimit | None = None
    grows: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"table {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.max_size < 1:
            raise ValueError(f"replay max_size must be positive, got {self.max_size}")
        if self.item_bytes < 1:
            raise ValueError(f"table {self.name!r}: item_bytes must be positive")
        if (self.kind == PRIORITIZED) != (self.priority_exponent is not None):
            raise ValueError(
                f"table {self.name!r}: a priority_exponent goes with kind={PRIORITIZED!r} only"
            )
        if self.priority_exponent is not None and self.priority_exponent < 0:
            raise ValueError(f"priority_exponent must be >= 0, got {self.priority_exponent}")
        if (self.kind == QUEUE) != (self.rate_limit is None):
            raise ValueError(f"table {self.name!r}: a queue has no rate_limit, other kinds one")

    @property
    def prioritized(self) -> bool:
        return self.kind == PRIORITIZED

    def for_shard(self, num_shards: int) -> "TableSpec":
        """The table one of `num_shards` shards holds: 1/K of the capacity and of the rate
        limit (`RateLimit.for_shard`), so that K shards hold as many items and start
        sampling as early as one replay would."""
        if num_shards == 1:
            return self
        return dataclasses.replace(
            self,
            max_size=math.ceil(self.max_size / num_shards),
            rate_limit=self.rate_limit and self.rate_limit.for_shard(num_shards),
        )


class Endpoint(NamedTuple):
    """How to reach a replay node: its backend, and for Reverb the address its server
    listens at; for the native backend, whose clients call the node itself, the node's
    host and pid (`native_node.process_address`: is it in the caller's process?)."""

    backend: str
    address: str | None = None


class Writer(Protocol):
    """Inserts packed items with priorities into one table."""

    items_lost: int  # items given up after the node was restarted elsewhere

    def write(self, items: np.ndarray, priorities: np.ndarray) -> None:
        """[K, item_bytes] uint8 items with [K] priorities; may block (the rate limiter).

        Raises:
          Stopped: the writer's stop event was set while inserts were held back.
        """

    def flush(self) -> None:
        """Waits until every item written has been inserted."""

    def close(self) -> None:
        """Flushes (giving up once stopped), then releases the connection."""


class Connection(Protocol):
    """An actor's handle on one replay node: what an agent's adder writes through."""

    def writer(
        self, table: str, max_pending: int = 32, stop_event: threading.Event | None = None
    ) -> Writer:
        """A writer to `table` that holds at most `max_pending` items before it waits for
        them to be inserted."""

    def table_size(self, table: str) -> int:
        """Items `table` holds now."""


class Stopped(Exception):
    """Raised by a blocking write when its node was asked to stop."""


class Sample(NamedTuple):
    """Rows sampled from one table of one node.

    Attributes:
      keys: [n] uint64 item keys, for priority updates.
      probabilities: [n] float64 the probability each row had of being drawn.
      table_size: items the table held when they were drawn.
      data: [n, item_bytes] uint8 the packed items.
      mass: the table's sampling mass then: sum of priority ** alpha for a
        prioritized table, its size otherwise (what K shards are split by).
      cold: [n] bool the rows a tiered table drew from its cold tier; None: untiered.
    """

    keys: np.ndarray
    probabilities: np.ndarray
    table_size: int
    data: np.ndarray
    mass: float
    cold: np.ndarray | None = None


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
