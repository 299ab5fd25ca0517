"""The cold tier of a tiered replay: items that left the in-memory Reverb table, on local disk.

A replay keeps its newest items in a Reverb table (the hot tier). Items that
leave it move here with their priorities, so that a replay can hold more
items than RAM. Insertion index k is an item's key, and its record in RAM
(key, priority, content hash, where its bytes are) is slot k % capacity. A
sum tree over priority**alpha samples the items by prioritized experience
replay's rule (Schaul et al. 2016), as Reverb's `Prioritized(alpha)`
selector does: P(i) = p_i**alpha / sum_j p_j**alpha; without an exponent
every item weighs 1 (Reverb's `Uniform`). The bytes are a ring on disk (`cold_ring`).

A checkpoint holds everything but the items' bytes: each slot's key,
position, stored length, priority and hash, and the counters. Copying the
bytes of a replay of millions of items at every checkpoint is the cost this
tier is there to avoid; they stay in the ring, flushed when the checkpoint
is taken. The tier goes on after a checkpoint, though, and writes over old
bytes: `restore` keeps an item only if the ring on disk is the one the
checkpoint was taken of and no byte was written over it since, and drops the
others with a warning that counts them. A restored replay therefore loses
the items written over after its checkpoint, never serves another item's
bytes under a key. Items added after a restore take keys past the highest
one ever written to the directory.
"""

import logging
import threading
from typing import NamedTuple

import numpy as np

from gorila_jax.replay import cold_ring
from gorila_jax.replay.sum_tree import SumTree

_EMPTY = -1
_EVICTION_CHUNK = 4096


class ColdRows(NamedTuple):
    """Rows sampled from a `ColdStore`.

    Attributes:
      keys: [n] uint64 the items' keys (their insertion indices).
      probabilities: [n] float64 each row's probability within the cold
        tier: p**alpha / mass (1 / size for a uniform store).
      priorities: [n] float64 the items' stored priorities.
      table_size: [n] int64 the tier's size when it was sampled.
      data: [n, item_bytes] uint8 the items' bytes (a copy).
    """

    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    table_size: np.ndarray
    data: np.ndarray


class ColdStore:
    """A FIFO ring of packed items on disk, sampled by priority.

    Thread safe: a mover thread adds while RPC handlers sample, update and
    checkpoint; one lock guards the state, and a sample copies its rows'
    stored bytes under it, so that no add overwrites a row between its draw
    and its read (rows are decompressed after).

    Args:
      directory: holds `ring.u8` and `head.i64`; created if missing. A
        directory used before must hold a store of the same layout; the
        store starts empty (`restore` brings a checkpoint's items back).
      capacity: items held at most.
      item_bytes: the width of a packed item.
      priority_exponent: alpha, >= 0; None samples uniformly (priorities are
        still kept and returned).
      ring_bytes: disk the items' bytes may take; 0: `capacity` items of
        `item_bytes` (raw).
      compression: "none" or "zlib" (`cold_ring`).
    """

    def __init__(
        self,
        directory: str,
        capacity: int,
        item_bytes: int,
        priority_exponent: float | None,
        ring_bytes: int = 0,
        compression: str = "none",
    ):
        if priority_exponent is not None and not priority_exponent >= 0:  # NaN too
            raise ValueError(
                f"a cold replay's priority exponent must be >= 0 (or None: uniform), "
                f"got {priority_exponent}"
            )
        self._ring = cold_ring.Ring(directory, capacity, item_bytes, ring_bytes, compression)
        self.capacity, self.item_bytes, self.ring_bytes = self._ring.layout
        self.compression = compression
        self._exponent = None if priority_exponent is None else float(priority_exponent)
        self._directory = directory
        self._keys = np.full(self.capacity, _EMPTY, np.int64)
        self._positions = np.zeros(self.capacity, np.int64)
        self._lengths = np.zeros(self.capacity, np.int64)
        self._priorities = np.zeros(self.capacity, np.float64)
        self._hashes = np.zeros(self.capacity, np.uint64)
        self._tree = SumTree(self.capacity)
        self._size = self._held_bytes = 0
        self._inserted = self._ring.next_key
        self._oldest = self._inserted  # no key below it is held
        self._reads = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ counters

    @property
    def size(self) -> int:
        """Items held."""
        with self._lock:
            return self._size

    @property
    def mass(self) -> float:
        """Sum of the items' weights, priority**alpha (uniform: 1 each, so the size)."""
        with self._lock:
            return self._tree.total

    @property
    def bytes(self) -> int:
        """Bytes of the items held, as stored on disk (compressed where they are)."""
        with self._lock:
            return self._held_bytes

    @property
    def inserted(self) -> int:
        """The next insertion index: the items ever added, or more where the store numbers
        on past the keys ever written to its directory (see the module's docstring)."""
        with self._lock:
            return self._inserted

    @property
    def reads(self) -> int:
        """Rows ever returned by `sample` (for a read rate)."""
        with self._lock:
            return self._reads

    # ------------------------------------------------------------ adding

    def add(self, items: np.ndarray, priorities: np.ndarray, hashes: np.ndarray | None = None):
        """Adds items in order, each over the oldest item once the ring is full.

        Args:
          items: [n, item_bytes] uint8 packed items; n may exceed what the
            store holds (only the newest that fit are kept).
          priorities: [n] their priorities, finite and >= 0.
          hashes: [n] uint64 their content hashes (`hashes_of`), or None.

        Raises:
          ValueError: items of another width or type, or priorities that are
            negative or not finite.
        """
        items = np.asarray(items)
        if items.dtype != np.uint8 or items.ndim != 2 or items.shape[1] != self.item_bytes:
            raise ValueError(
                f"cold replay items must be [n, {self.item_bytes}] uint8, "
                f"got {list(items.shape)} {items.dtype}"
            )
        count = len(items)
        priorities = self._check_column(priorities, count, "priorities", np.float64)
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            bad = priorities[~(np.isfinite(priorities) & (priorities >= 0))]
            raise ValueError(
                f"cold replay priorities must be finite and >= 0, got {bad[:5].tolist()}"
            )
        if hashes is None:
            hashes = np.zeros(count, np.uint64)
        hashes = self._check_column(hashes, count, "hashes", np.uint64)
        if count == 0:
            return
        skipped = max(count - self.capacity, 0)  # their slots would be taken at once
        items, priorities, hashes = items[skipped:], priorities[skipped:], hashes[skipped:]
        stored = self._ring.encode(items)
        lengths = np.array([len(row) for row in stored], np.int64)
        with self._lock:
            self._check_open()
            first = self._inserted + skipped
            self._inserted += count
            positions = self._ring.write(stored, next_key=self._inserted)
            oldest_position = self._ring.head - self.ring_bytes
            self._evict(self._inserted - self.capacity, oldest_position, stop=first)
            kept = positions >= oldest_position
            keys = np.arange(first, self._inserted, dtype=np.int64)[kept]
            positions, lengths = positions[kept], lengths[kept]
            slots = keys % self.capacity
            self._keys[slots], self._positions[slots], self._lengths[slots] = (
                keys,
                positions,
                lengths,
            )
            self._priorities[slots], self._hashes[slots] = priorities[kept], hashes[kept]
            self._tree.set(slots, self._weights(priorities[kept]))
            self._size += len(keys)
            self._held_bytes += int(lengths.sum())

    def _evict(self, key_bound: int, position_bound: int, stop: int) -> None:
        """Lets go of the oldest items, below `stop`, whose key is below `key_bound` (their
        slot is needed) or whose bytes start below `position_bound` (about to be written
        over). Both grow with the key, so these are the oldest held items."""
        while self._oldest < stop:
            keys = np.arange(self._oldest, min(stop, self._oldest + _EVICTION_CHUNK))
            slots = keys % self.capacity
            held = self._keys[slots] == keys
            gone = held & ((keys < key_bound) | (self._positions[slots] < position_bound))
            still_held = held & ~gone
            end = int(np.argmax(still_held)) if still_held.any() else len(keys)
            self._drop(slots[:end][gone[:end]])
            if end < len(keys):
                self._oldest = int(keys[end])
                return
            self._oldest = int(keys[-1]) + 1

    def _drop(self, slots: np.ndarray) -> None:
        self._size -= len(slots)
        self._held_bytes -= int(self._lengths[slots].sum())
        self._keys[slots] = _EMPTY
        self._priorities[slots] = 0.0
        self._hashes[slots] = 0
        self._tree.set(slots, np.zeros(len(slots)))

    # ------------------------------------------------------------ sampling

    def sample(self, count: int, rng: np.random.Generator) -> ColdRows:
        """`count` rows drawn independently, with replacement, by weight.

        An empty store, or one whose items all weigh 0, gives 0 rows.
        """
        if count < 0:
            raise ValueError(f"cannot sample {count} rows")
        with self._lock:
            self._check_open()
            total = self._tree.total
            if self._size == 0 or not total > 0:
                slots = np.zeros(0, np.int64)
            else:
                slots = self._tree.find(rng.random(count) * total)
                self._reads += count
            data, compressed = self._ring.read(self._positions[slots], self._lengths[slots])
            priorities = self._priorities[slots]
            weights = self._weights(priorities)
            rows = ColdRows(
                keys=self._keys[slots].astype(np.uint64),
                probabilities=weights / total if len(slots) else weights,
                priorities=priorities,
                table_size=np.full(len(slots), self._size, np.int64),
                data=data,
            )
        for row, blob in compressed:  # outside the lock: adds go on meanwhile
            data[row] = self._ring.decode(blob, item=str(rows.keys[row]))
        return rows

    # ------------------------------------------------------------ priorities

    def update(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """New priorities for the items `keys` name; returns how many items took one.

        A key whose item was evicted or never added is skipped, as is a
        priority that is negative or not finite: a learner's batch of updates
        goes through for the items still held. Of the same key twice, the
        last priority counts.
        """
        keys = np.asarray(keys).reshape(-1)
        priorities = self._check_column(priorities, len(keys), "priorities", np.float64)
        with self._lock:
            self._check_open()
            slots, held = self._held_slots(keys)
            held &= np.isfinite(priorities) & (priorities >= 0)
            slots, priorities = slots[held], priorities[held]
            # The last of each slot: np.unique finds the first, of the reversed order.
            _, last = np.unique(slots[::-1], return_index=True)
            slots, priorities = slots[::-1][last], priorities[::-1][last]
            self._priorities[slots] = priorities
            self._tree.set(slots, self._weights(priorities))
            return len(slots)

    def hashes_of(self, keys: np.ndarray) -> np.ndarray:
        """[n] uint64 the content hashes added with the items `keys` name (0: none, or
        the item was evicted)."""
        keys = np.asarray(keys).reshape(-1)
        with self._lock:
            self._check_open()
            slots, held = self._held_slots(keys)
            return np.where(held, self._hashes[slots], np.uint64(0))

    def _held_slots(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n] the slot of each key and [n] whether the slot still holds that key's item."""
        if keys.size and keys.dtype.kind not in "ui":
            raise ValueError(f"cold replay keys must be integers, got {keys.dtype}")
        keys = keys.astype(np.uint64)
        slots = (keys % np.uint64(self.capacity)).astype(np.int64)
        held = self._keys[slots]
        return slots, (held != _EMPTY) & (held.astype(np.uint64) == keys)

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, path: str) -> None:
        """Flushes the items to disk and writes their record to `path` (see the module's
        docstring); a partly written file never stands at `path`."""
        with self._lock:
            self._check_open()
            record = dict(
                capacity=self.capacity,
                item_bytes=self.item_bytes,
                ring_bytes=self.ring_bytes,
                ring_id=self._ring.identity,
                exponent=np.nan if self._exponent is None else self._exponent,
                inserted=self._inserted,
                reads=self._reads,
                keys=self._keys.copy(),
                positions=self._positions.copy(),
                lengths=self._lengths.copy(),
                priorities=self._priorities.copy(),
                hashes=self._hashes.copy(),
            )
        # Flushed and written outside the lock: the copies are the checkpoint, and a flush of
        # gigabytes of new items would stall sampling. Bytes written over meanwhile move the
        # head on disk past them, so `restore` drops their items.
        self._ring.flush()
        cold_ring.write_atomically(path, record)

    def restore(self, path: str) -> None:
        """Makes this store the one `checkpoint(path)` recorded, less the items written
        over since (dropped, with a warning that counts them).

        Weights are computed with this store's exponent from the recorded
        priorities; keys go on past every key ever written to the directory.

        Raises:
          ValueError: the checkpoint is of a store of another shape.
        """
        with np.load(path) as record:
            layout = tuple(int(record[name]) for name in ("capacity", "item_bytes", "ring_bytes"))
            if layout != self._ring.layout:
                raise ValueError(
                    f"cold replay checkpoint {path} is of a store of "
                    f"{cold_ring.describe(layout)}, this one's is "
                    f"{cold_ring.describe(self._ring.layout)}"
                )
            keys = record["keys"].astype(np.int64)
            positions, lengths = record["positions"], record["lengths"]
            priorities = record["priorities"].astype(np.float64)
            hashes = record["hashes"].astype(np.uint64)
            ring_id, inserted, reads = (
                int(record[name]) for name in ("ring_id", "inserted", "reads")
            )
        with self._lock:
            self._check_open()
            recorded = keys != _EMPTY
            same_ring = ring_id == self._ring.identity
            unwritten = positions >= self._ring.head - self.ring_bytes
            intact = recorded & same_ring & unwritten
            dropped = int(np.count_nonzero(recorded & ~intact))
            self._keys = np.where(intact, keys, _EMPTY)
            self._positions = np.where(intact, positions, 0).astype(np.int64)
            self._lengths = np.where(intact, lengths, 0).astype(np.int64)
            self._priorities = np.where(intact, priorities, 0.0)
            self._hashes = np.where(intact, hashes, np.uint64(0))
            self._tree.set_all(np.where(intact, self._weights(self._priorities), 0.0))
            self._size = int(np.count_nonzero(intact))
            self._held_bytes = int(self._lengths.sum())
            self._inserted = max(inserted, self._ring.next_key)
            self._oldest = int(self._keys[intact].min()) if self._size else self._inserted
            self._reads = reads
        if dropped:
            logging.warning(
                "cold replay %s: %d of the %d items of checkpoint %s were %s; restored "
                "without them",
                self._directory,
                dropped,
                int(np.count_nonzero(recorded)),
                path,
                "written over after it was taken" if same_ring else "in a ring made anew since",
            )

    def close(self) -> None:
        """Flushes the items and lets go of the files (again: nothing)."""
        with self._lock:
            self._ring.close()

    def _check_open(self) -> None:
        if not self._ring.is_open:
            raise ValueError(f"cold replay {self._directory} is closed")

    def _weights(self, priorities: np.ndarray) -> np.ndarray:
        if self._exponent is None:
            return np.ones(len(priorities), np.float64)
        return np.power(priorities, self._exponent)

    @staticmethod
    def _check_column(values, count: int, name: str, dtype) -> np.ndarray:
        values = np.asarray(values)
        if values.shape != (count,):
            raise ValueError(
                f"cold replay {name} must be one per item, [{count}], got {list(values.shape)}"
            )
        return values.astype(dtype, copy=False)
