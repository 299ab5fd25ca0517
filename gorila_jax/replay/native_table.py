"""One table of the native replay: packed rows in a ring, priorities in a sum tree.

The whole table is numpy arrays in the replay node's process: a [max_size,
item_bytes] uint8 ring of rows, their priorities, and for a prioritized
table a `sum_tree.SumTree` of priority ** alpha, updated and searched a
batch at a time. One lock guards it; writers and samplers that the rate
limiter holds back wait on its condition, with a timeout, so that a
stopping node is never stuck in it. BUILD_NOTES.md ("The native replay")
records why this structure and what it measured.
"""

import math
import threading
import time
from typing import Any

import numpy as np

from gorila_jax.replay import api, cold, sum_tree

# Keys are (nonce << _POSITION_BITS) + position: a node restarted from a checkpoint
# gives its items new keys, so a learner's update for an item the restart lost
# cannot land on another item that took its position.
_POSITION_BITS = 40
MAX_ITEMS = 1 << _POSITION_BITS  # a table's positions fit in its keys
_FIRST_ROWS = 1024  # what a growing table allocates first


class NativeTable:
    """A replay table as `api.TableSpec` declares it, in this process's memory.

    With a cold tier (a tiered replay, `tiering.Tiering`), the table is the hot
    tier: an item it evicts goes to `cold` with its current priority, in the
    insert that evicts it, and a sample draws from both tiers in proportion to
    their mass, as one replay holding every item: probabilities p**alpha /
    (M_hot + M_cold), the table size hot + cold, and the rate limiter counting
    the samples of both. Cold items' keys are the cold store's, below 2**40,
    apart from the hot items'.

    Args:
      spec: the table (for a hot tier: cut to the hot size).
      seed: of the sampling draws (None: from the OS).
      cold_tier: the cold tier; None: every item in memory.
    """

    def __init__(
        self,
        spec: api.TableSpec,
        seed: int | None = None,
        cold_tier: cold.ColdStore | None = None,
    ):
        self.spec = spec
        self.cold = cold_tier
        self.moved = 0  # items evicted into the cold tier
        self._rng = np.random.default_rng(seed)
        self._nonce = int(self._rng.integers(1, 1 << (64 - _POSITION_BITS - 1)))
        rows = min(spec.max_size, _FIRST_ROWS) if spec.grows else spec.max_size
        self._rows = np.zeros((rows, spec.item_bytes), np.uint8)  # pages are touched on write
        self._priorities = np.zeros(rows if spec.grows else spec.max_size, np.float64)
        self._tree = sum_tree.SumTree(spec.max_size) if spec.prioritized else None
        self._next = 0  # the position the next item takes; its slot is position % max_size
        self._size = 0
        self._inserts = 0  # rate-limiter counts, kept across a checkpoint
        self._samples = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = False

    # ------------------------------------------------------------ writing

    def insert(self, items: np.ndarray, priorities: np.ndarray, timeout_s: float) -> int:
        """Inserts the first items the rate limiter lets in within `timeout_s`; returns how
        many (the caller sends the rest again).

        Raises:
          ValueError: items that are not [K, item_bytes] uint8, or priorities that are not
            K finite non-negative numbers; nothing is inserted then.
        """
        items, priorities = self._checked(items, priorities)
        done, deadline = 0, time.monotonic() + timeout_s
        with self._changed:
            while done < len(items) and not self._closed:
                allowed = min(self._insertable(), len(items) - done)
                if allowed > 0:
                    self._put(items[done : done + allowed], priorities[done : done + allowed])
                    done += allowed
                    self._changed.notify_all()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        return done

    def _checked(self, items: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
        items = np.asarray(items)
        width = self.spec.item_bytes
        if items.ndim != 2 or items.shape[1] != width or items.dtype != np.uint8:
            raise ValueError(
                f"replay table {self.spec.name!r} holds [K, {width}] uint8 items, got "
                f"{items.dtype}{list(items.shape)}; nothing was inserted"
            )
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if priorities.shape != (len(items),):
            raise ValueError(
                f"replay table {self.spec.name!r}: {len(items)} items with "
                f"{priorities.size} priorities; nothing was inserted"
            )
        if not (np.isfinite(priorities).all() and (priorities >= 0).all()):
            raise ValueError(
                f"replay table {self.spec.name!r}: priorities must be finite and >= 0; "
                "nothing was inserted"
            )
        return items, priorities

    def _insertable(self) -> int:
        """How many items may go in now."""
        spec, limit = self.spec, self.spec.rate_limit
        if limit is None:  # a queue: while there is room
            return spec.max_size - self._size
        if limit.samples_per_insert is None:
            return 1 << 62
        below_min = limit.min_size - self._inserts
        by_ratio = math.floor((limit.max_diff + self._samples) / limit.samples_per_insert)
        return max(below_min, by_ratio - self._inserts, 0)

    def _put(self, items: np.ndarray, priorities: np.ndarray) -> None:
        # In pieces of at most the capacity: each piece evicts what the previous left.
        for start in range(0, len(items), self.spec.max_size):
            stop = start + self.spec.max_size
            self._put_piece(items[start:stop], priorities[start:stop])

    def _put_piece(self, items: np.ndarray, priorities: np.ndarray) -> None:
        count = len(items)
        if self.cold is not None:
            self._spill(count)
        self._grow(self._next + count)
        slots = (self._next + np.arange(count)) % self.spec.max_size
        self._rows[slots] = items
        self._priorities[slots] = priorities
        if self._tree is not None:
            self._tree.set(slots, priorities**self.spec.priority_exponent)
        self._next += count
        self._inserts += count
        self._size = min(self._size + count, self.spec.max_size)

    def _spill(self, count: int) -> None:
        """Moves the items that inserting `count` more will evict to the cold tier."""
        evicted = min(self._size + count - self.spec.max_size, self._size)
        if evicted <= 0:
            return
        slots = (self._oldest() + np.arange(evicted)) % self.spec.max_size
        self.cold.add(self._rows[slots], self._priorities[slots])
        self.moved += evicted

    def _grow(self, positions: int) -> None:
        """Allocates rows up to `positions` (doubling) for a table that grows."""
        have, wanted = len(self._rows), min(positions, self.spec.max_size)
        if wanted <= have:
            return
        rows = min(self.spec.max_size, max(wanted, 2 * have))
        grown = np.zeros((rows, self.spec.item_bytes), np.uint8)
        grown[:have] = self._rows
        priorities = np.zeros(rows, np.float64)
        priorities[:have] = self._priorities
        self._rows, self._priorities = grown, priorities

    # ------------------------------------------------------------ sampling

    def sample(self, count: int, timeout_s: float) -> api.Sample | None:
        """`count` rows drawn by the table's rule once the rate limiter allows all of them;
        None if it did not within `timeout_s` (or the table was closed)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not self._sampleable(count):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return None
                self._changed.wait(remaining)
            sample = self._draw(count)
            self._samples += count
            self._changed.notify_all()
            return sample

    def _sampleable(self, count: int) -> bool:
        limit = self.spec.rate_limit
        if limit is None:
            return self._size >= count
        if self._size < limit.min_size or self._size == 0:
            return False
        if limit.samples_per_insert is None:
            return True
        return self._inserts * limit.samples_per_insert - (self._samples + count) >= limit.min_diff

    def _oldest(self) -> int:
        return self._next - self._size

    def _draw(self, count: int) -> api.Sample:
        if self.cold is None or self.cold.size == 0:
            return self._draw_hot(count)
        hot_mass, cold_mass = self._hot_mass(), self.cold.mass
        from_cold = int(self._rng.binomial(count, cold_mass / (hot_mass + cold_mass)))
        hot = self._draw_hot(count - from_cold)
        drawn = self.cold.sample(from_cold, self._rng)
        total = hot_mass + cold_mass
        return api.Sample(
            keys=np.concatenate([hot.keys, drawn.keys]),
            probabilities=np.concatenate(
                [hot.probabilities * (hot_mass / total), drawn.probabilities * (cold_mass / total)]
            ),
            table_size=hot.table_size + self.cold.size,
            data=np.concatenate([hot.data, drawn.data]),
            mass=total,
            cold=np.arange(len(hot.keys) + len(drawn.keys)) >= len(hot.keys),
        )

    def _hot_mass(self) -> float:
        if self._tree is not None and self._tree.total > 0:
            return self._tree.total
        return float(self._size)

    def _draw_hot(self, count: int) -> api.Sample:
        size, oldest = self._size, self._oldest()
        if self.spec.kind == api.QUEUE:
            positions = oldest + np.arange(count)
            probabilities = np.ones(count)
            self._size -= count  # each item is sampled once
            mass = float(size)
        elif self._tree is not None and self._tree.total > 0:
            mass = self._tree.total
            slots = self._tree.find(self._rng.random(count) * mass)
            positions = self._position_of(slots)
            probabilities = self._priorities[slots] ** self.spec.priority_exponent / mass
        else:  # uniform, or every priority 0: each held item alike
            positions = oldest + self._rng.integers(0, size, count)
            probabilities = np.full(count, 1.0 / size)
            mass = float(size)
        slots = positions % self.spec.max_size
        keys = (np.uint64(self._nonce) << np.uint64(_POSITION_BITS)) + positions.astype(np.uint64)
        return api.Sample(keys, probabilities, size, self._rows[slots], mass)

    def _position_of(self, slots: np.ndarray) -> np.ndarray:
        """The position of the item each slot holds (the newest to have taken it)."""
        newest_slot = (self._next - 1) % self.spec.max_size
        behind = (newest_slot - slots) % self.spec.max_size
        return self._next - 1 - behind

    # ------------------------------------------------------------ priorities, info

    def update(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """New priorities of the items `keys` still held; returns how many were.

        Items evicted since they were sampled, and keys of an earlier life of
        the node, are skipped; of repeated keys the last priority wins. Keys of
        the cold tier go to it.
        """
        if self._tree is None:
            return 0
        keys = np.asarray(keys, np.uint64).reshape(-1)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        with self._lock:
            nonce = keys >> np.uint64(_POSITION_BITS)
            cold_updated = 0
            if self.cold is not None and (nonce == 0).any():
                in_cold = nonce == 0
                cold_updated = self.cold.update(keys[in_cold], priorities[in_cold])
            positions = (keys & np.uint64((1 << _POSITION_BITS) - 1)).astype(np.int64)
            held = (nonce == self._nonce) & (positions >= self._oldest()) & (positions < self._next)
            held &= np.isfinite(priorities) & (priorities >= 0)
            slots = positions[held] % self.spec.max_size
            self._priorities[slots] = priorities[held]
            self._tree.set(slots, priorities[held] ** self.spec.priority_exponent)
            return int(held.sum()) + cold_updated

    def info(self) -> dict[str, float]:
        """What Reverb's server info gives of a table (`ReplayNode.table_info`)."""
        limit = self.spec.rate_limit
        with self._lock:
            return {
                "size": self._size,
                "inserts": self._inserts,
                "samples": self._samples,
                "samples_per_insert": (limit and limit.samples_per_insert) or 1.0,
                "slack": limit.error_buffer if limit else float(self.spec.max_size),
            }

    def close(self) -> None:
        """Wakes every writer and sampler waiting on the rate limiter; they return at once."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    # ------------------------------------------------------------ checkpoints

    def state(self, cold_path: str | None = None) -> dict[str, np.ndarray]:
        """The held items oldest first, their priorities and the rate limiter's counts; and
        the cold tier's record written to `cold_path`, at the same instant."""
        with self._lock:
            if self.cold is not None:
                self.cold.checkpoint(cold_path)
            slots = (self._oldest() + np.arange(self._size)) % self.spec.max_size
            return {
                "items": self._rows[slots],
                "priorities": self._priorities[slots],
                "counts": np.array([self._inserts, self._samples], np.int64),
            }

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Takes a `state` of a table with this spec (oldest items first)."""
        items, priorities = state["items"], state["priorities"]
        if items.ndim != 2 or items.shape[1] != self.spec.item_bytes:
            raise ValueError(
                f"table {self.spec.name!r} holds items of {self.spec.item_bytes} bytes, "
                f"the state {list(items.shape)}"
            )
        with self._lock:
            kept = min(len(items), self.spec.max_size)
            self._next = self._size = 0
            self._put(items[len(items) - kept :], priorities[len(items) - kept :])
            self._inserts, self._samples = (int(n) for n in state["counts"])
