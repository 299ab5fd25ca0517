"""The cold tier of a tiered replay: items that left the in-memory Reverb table, on local disk.

A replay keeps its newest items in a Reverb table (the hot tier). Items that
leave it move here with their priorities, so that a replay can hold more
items than RAM. The tier is a FIFO ring of `capacity` slots: insertion
index k goes to slot k % capacity, over the oldest item, and k is the
item's key. A sum tree over priority**alpha samples it by prioritized
experience replay's rule (Schaul et al. 2016), as Reverb's
`Prioritized(alpha)` selector does: P(i) = p_i**alpha / sum_j p_j**alpha;
without an exponent every item weighs 1 (Reverb's `Uniform`).

Why a numpy memmap: items are fixed-width packed rows (`ItemCodec`), so a
slot's bytes are at slot * item_bytes, with no index to keep; the kernel's
page cache keeps the pages that are read often in RAM and drops the others;
it needs no package beyond numpy; and a sampled batch is one fancy-indexed
read of rows, in slot order so that neighbouring rows share pages. The
items live in `items.u8` ([capacity, item_bytes] uint8) and, beside them,
`slots.i64` ([capacity] int64) names the insertion index whose bytes each
slot holds (-1: none). Keys, priorities and content hashes live in RAM (24
bytes a slot), and so does the sum tree (16 bytes a slot, padded to a power
of two).

A checkpoint holds everything but the items' bytes: the slots' insertion
indices, priorities and content hashes, and the counters. Copying the
bytes of a replay of millions of items at every checkpoint is the cost
this tier is there to avoid; they stay in `items.u8`, flushed when the
checkpoint is taken. The tier goes on after a checkpoint, though, and
overwrites slots: `restore` keeps a slot only if `slots.i64` still names the
insertion index the checkpoint holds there, and drops the others with a
warning that counts them. A restored replay therefore loses the items that
were overwritten after its checkpoint, never serves another item's bytes
under a key. For that, an insertion index is written to a directory once
only: a store opened on a used directory, or restored from a checkpoint
older than the directory's newest items, numbers its items on past the
highest index on disk.
"""

import logging
import os
import tempfile
import threading
from typing import NamedTuple

import numpy as np

_ITEMS_FILE = "items.u8"
_SLOTS_FILE = "slots.i64"
_EMPTY = -1


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


class _SumTree:
    """Sums of leaf weights, to draw leaves in proportion to their weight.

    Node 1 is the root, node i's children are 2i and 2i + 1, and leaf j is
    node P + j, with P the capacity padded to a power of two (the padding
    weighs 0). Parents are recomputed from their children, never adjusted
    by differences, so rounding does not build up over millions of updates.
    """

    def __init__(self, capacity: int):
        self._leaves = 1 << max(0, (capacity - 1).bit_length())
        self._depth = self._leaves.bit_length() - 1
        self._nodes = np.zeros(2 * self._leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self._nodes[1])

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Leaves `indices` weigh `values` (the last of repeated indices wins)."""
        if len(indices) == 0:
            return
        nodes = np.asarray(indices, np.int64) + self._leaves
        self._nodes[nodes] = values
        for _ in range(self._depth):
            nodes = np.unique(nodes >> 1)
            self._nodes[nodes] = self._nodes[2 * nodes] + self._nodes[2 * nodes + 1]

    def set_all(self, values: np.ndarray) -> None:
        """Every leaf at once (padding 0), the sums level by level."""
        self._nodes[:] = 0.0
        self._nodes[self._leaves : self._leaves + len(values)] = values
        level = self._leaves
        while level > 1:
            children = self._nodes[level : 2 * level]
            self._nodes[level // 2 : level] = children[0::2] + children[1::2]
            level //= 2

    def find(self, targets: np.ndarray) -> np.ndarray:
        """[n] the leaf whose interval of the cumulative weights holds each target.

        Targets are in [0, total). Rounding can leave a target at or past the
        sum of the subtree it descends into (a total drawn as total * u with
        u near 1, sums that differ in their last bit); such a target would
        land on a leaf of weight 0, a slot that holds nothing. The descent
        never enters a subtree of weight 0 instead, and one clamped to the
        left stays within its weight: every leaf found weighs more than 0
        while the total does.
        """
        nodes = np.ones(len(targets), np.int64)
        remaining = np.asarray(targets, np.float64).copy()
        for _ in range(self._depth):
            left = 2 * nodes
            left_sum = self._nodes[left]
            right_sum = self._nodes[left + 1]
            right = ((remaining >= left_sum) & (right_sum > 0)) | (left_sum <= 0)
            remaining = np.where(right, remaining - left_sum, np.minimum(remaining, left_sum))
            nodes = np.where(right, left + 1, left)
        return nodes - self._leaves


class ColdStore:
    """A FIFO ring of packed items on disk, sampled by priority.

    Thread safe: a mover thread adds while RPC handlers sample, update and
    checkpoint; one lock guards the state, and a sample reads its rows under
    it, so that no add overwrites a row between its draw and its read.

    Args:
      directory: holds `items.u8` and `slots.i64`; created if missing. A
        directory used before must hold a store of the same shape; the store
        starts empty (`restore` brings a checkpoint's items back).
      capacity: slots (items held at most).
      item_bytes: the width of a packed item.
      priority_exponent: alpha, >= 0; None samples uniformly (priorities are
        still kept and returned).
    """

    def __init__(
        self,
        directory: str,
        capacity: int,
        item_bytes: int,
        priority_exponent: float | None,
    ):
        if capacity < 1:
            raise ValueError(f"a cold replay's capacity must be >= 1, got {capacity}")
        if item_bytes < 1:
            raise ValueError(f"a cold replay's item_bytes must be >= 1, got {item_bytes}")
        if priority_exponent is not None and not priority_exponent >= 0:  # NaN too
            raise ValueError(
                f"a cold replay's priority exponent must be >= 0 (or None: uniform), "
                f"got {priority_exponent}"
            )
        self.capacity, self.item_bytes = int(capacity), int(item_bytes)
        self._exponent = None if priority_exponent is None else float(priority_exponent)
        self._directory = directory
        os.makedirs(directory, exist_ok=True)
        self._items, self._slots = self._open_files()
        # Which insertion index each slot holds for this store, -1 none. `slots.i64`
        # says whose bytes are on disk, held or not (a used directory opened afresh).
        self._keys = np.full(self.capacity, _EMPTY, np.int64)
        self._priorities = np.zeros(self.capacity, np.float64)
        self._hashes = np.zeros(self.capacity, np.uint64)
        self._tree = _SumTree(self.capacity)
        self._size = 0
        self._inserted = self._next_unwritten_index()
        self._reads = 0
        self._lock = threading.Lock()

    def _open_files(self) -> tuple[np.memmap, np.memmap]:
        items_path = os.path.join(self._directory, _ITEMS_FILE)
        slots_path = os.path.join(self._directory, _SLOTS_FILE)
        found = [os.path.exists(path) for path in (items_path, slots_path)]
        if any(found):
            items_size = os.path.getsize(items_path) if found[0] else None
            slots_size = os.path.getsize(slots_path) if found[1] else None
            if items_size not in (None, self.capacity * self.item_bytes) or slots_size not in (
                None,
                self.capacity * 8,
            ):
                raise ValueError(
                    f"cold replay directory {self._directory} holds a store of shape "
                    f"{_shape_on_disk(items_size, slots_size)}, not [{self.capacity}, "
                    f"{self.item_bytes}] (capacity, item_bytes): give it the same shape "
                    "or another directory"
                )
        shape = (self.capacity, self.item_bytes)
        items = np.memmap(items_path, np.uint8, "r+" if found[0] else "w+", shape=shape)
        if found[0] and found[1]:
            slots = np.memmap(slots_path, np.int64, "r+", shape=(self.capacity,))
        else:
            # Bytes without their indices (or indices without their bytes) tell nothing
            # a checkpoint could trust.
            slots = np.memmap(slots_path, np.int64, "w+", shape=(self.capacity,))
            slots[:] = _EMPTY
            slots.flush()
        return items, slots

    def _next_unwritten_index(self) -> int:
        # An index written once only: an older checkpoint restored later must not take
        # new bytes for those of its own item with the same index.
        return int(max(self._slots.max(), _EMPTY)) + 1

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
        """Bytes of the items held on disk."""
        with self._lock:
            return self._size * self.item_bytes

    @property
    def inserted(self) -> int:
        """The next insertion index: the items ever added, or more where the store numbers
        on past the indices on disk (a used directory opened afresh, a restore of a
        checkpoint older than the newest items: see the module's docstring)."""
        with self._lock:
            return self._inserted

    @property
    def reads(self) -> int:
        """Rows ever returned by `sample` (for a read rate)."""
        with self._lock:
            return self._reads

    def add(self, items: np.ndarray, priorities: np.ndarray, hashes: np.ndarray | None = None):
        """Adds items in order, each over the oldest item once the ring is full.

        Args:
          items: [n, item_bytes] uint8 packed items; n may exceed the
            capacity (only the last `capacity` are kept).
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
        with self._lock:
            self._check_open()
            first = self._inserted
            self._inserted += count
            if count > self.capacity:  # the first ones would be overwritten at once
                items, priorities, hashes = (
                    items[-self.capacity :],
                    priorities[-self.capacity :],
                    hashes[-self.capacity :],
                )
                first += count - self.capacity
                count = self.capacity
            keys = np.arange(first, first + count, dtype=np.int64)
            slots = keys % self.capacity
            self._size += int(np.count_nonzero(self._keys[slots] == _EMPTY))
            # A process killed in the middle leaves slots that name no index, never
            # an index beside another item's bytes.
            for start, source, length in _runs(int(slots[0]), count, self.capacity):
                self._slots[start : start + length] = _EMPTY
                self._items[start : start + length] = items[source : source + length]
                self._slots[start : start + length] = keys[source : source + length]
            self._keys[slots] = keys
            self._priorities[slots] = priorities
            self._hashes[slots] = hashes
            self._tree.set(slots, self._weights(priorities))

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
                return self._rows(np.zeros(0, np.int64), total)
            slots = self._tree.find(rng.random(count) * total)
            rows = self._rows(slots, total)
            self._reads += count
            return rows

    def _rows(self, slots: np.ndarray, total: float) -> ColdRows:
        data = np.empty((len(slots), self.item_bytes), np.uint8)
        # In slot order, so that rows on one page are read together.
        order = np.argsort(slots, kind="stable")
        data[order] = self._items[slots[order]]
        priorities = self._priorities[slots]
        weights = self._weights(priorities)
        return ColdRows(
            keys=self._keys[slots].astype(np.uint64),
            probabilities=weights / total if len(slots) else weights,
            priorities=priorities,
            table_size=np.full(len(slots), self._size, np.int64),
            data=data,
        )

    def update(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """New priorities for the items `keys` name; returns how many items took one.

        A key whose item was evicted (its slot holds a later one) or never
        added is skipped, as is a priority that is negative or not finite: a
        learner's batch of updates goes through for the items still held.
        Of the same key twice, the last priority counts.
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

    def checkpoint(self, path: str) -> None:
        """Flushes the items to disk and writes their record to `path` (see the module's
        docstring); a partly written file never stands at `path`."""
        with self._lock:
            self._check_open()
            files = (self._items, self._slots)
            record = dict(
                capacity=self.capacity,
                item_bytes=self.item_bytes,
                exponent=np.nan if self._exponent is None else self._exponent,
                inserted=self._inserted,
                reads=self._reads,
                slots=self._keys.copy(),
                priorities=self._priorities.copy(),
                hashes=self._hashes.copy(),
            )
        # Flushed and written outside the lock: the copies are the checkpoint, and a flush of
        # gigabytes of new items would stall sampling. A slot overwritten meanwhile reaches
        # `slots.i64` with its new index, so `restore` drops it.
        for mapped in files:
            mapped.flush()
        directory = os.path.dirname(os.path.abspath(path))
        handle, temporary = tempfile.mkstemp(
            dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp"
        )
        try:
            with os.fdopen(handle, "wb") as file:
                np.savez(file, **record)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise

    def restore(self, path: str) -> None:
        """Makes this store the one `checkpoint(path)` recorded, less the items whose slots
        were overwritten since (dropped, with a warning that counts them).

        Weights are computed with this store's exponent from the recorded
        priorities. Insertion numbering goes on from the checkpoint's, or past
        the highest index on disk if items were added after it.

        Raises:
          ValueError: the checkpoint is of a store of another shape.
        """
        with np.load(path) as record:
            capacity, item_bytes = int(record["capacity"]), int(record["item_bytes"])
            if (capacity, item_bytes) != (self.capacity, self.item_bytes):
                raise ValueError(
                    f"cold replay checkpoint {path} is of a store of shape [{capacity}, "
                    f"{item_bytes}] (capacity, item_bytes), this one's is "
                    f"[{self.capacity}, {self.item_bytes}]"
                )
            keys = record["slots"].astype(np.int64)
            priorities = record["priorities"].astype(np.float64)
            hashes = record["hashes"].astype(np.uint64)
            inserted, reads = int(record["inserted"]), int(record["reads"])
        with self._lock:
            self._check_open()
            recorded = keys != _EMPTY
            intact = recorded & (np.asarray(self._slots) == keys)
            dropped = int(np.count_nonzero(recorded & ~intact))
            self._keys = np.where(intact, keys, _EMPTY)
            self._priorities = np.where(intact, priorities, 0.0)
            self._hashes = np.where(intact, hashes, np.uint64(0))
            self._tree.set_all(np.where(intact, self._weights(self._priorities), 0.0))
            self._size = int(np.count_nonzero(intact))
            self._inserted = max(inserted, self._next_unwritten_index())
            self._reads = reads
        if dropped:
            logging.warning(
                "cold replay %s: %d of the %d items of checkpoint %s were overwritten after "
                "it was taken; restored without them",
                self._directory,
                dropped,
                int(np.count_nonzero(recorded)),
                path,
            )

    def close(self) -> None:
        """Flushes the items and lets go of the files (again: nothing)."""
        with self._lock:
            if self._items is None:
                return
            self._items.flush()
            self._slots.flush()
            # Rows handed out are copies: nothing else holds the maps.
            self._items = self._slots = None

    def _check_open(self) -> None:
        if self._items is None:
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


def _runs(start: int, count: int, capacity: int) -> list[tuple[int, int, int]]:
    """(slot, source row, length) of the contiguous stretches that `count` items written
    from slot `start` of a ring of `capacity` fill: one, or two where it wraps."""
    first = min(count, capacity - start)
    runs = [(start, 0, first)]
    if first < count:
        runs.append((0, first, count - first))
    return runs


def _shape_on_disk(items_size: int | None, slots_size: int | None) -> str:
    """The shape of the store whose files are that large, as best they tell."""
    if slots_size is None:
        return f"unknown ({_ITEMS_FILE}: {items_size} bytes, no {_SLOTS_FILE})"
    capacity = slots_size // 8
    if items_size is None:
        return f"[{capacity}, unknown] ({_ITEMS_FILE} missing)"
    if capacity and items_size % capacity == 0:
        return f"[{capacity}, {items_size // capacity}]"
    return f"unknown ({_ITEMS_FILE}: {items_size} bytes, {_SLOTS_FILE}: {slots_size} bytes)"
