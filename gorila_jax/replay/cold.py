"""The cold tier of a tiered replay: items that left the in-memory Reverb table, on local disk.

A replay keeps its newest items in a Reverb table (the hot tier). Items that
leave it move here with their priorities, so that a replay can hold more
items than RAM. Insertion index k is an item's key, and its record in RAM
(key, priority, content hash, where its bytes are) is slot k % capacity. A
sum tree over priority**alpha samples the items by prioritized experience
replay's rule (Schaul et al. 2016), as Reverb's `Prioritized(alpha)`
selector does: P(i) = p_i**alpha / sum_j p_j**alpha; without an exponent
every item weighs 1 (Reverb's `Uniform`).

The bytes are a ring on disk, `ring.u8`, `ring_bytes` long. Items are
written one after another at a position that only grows (`head`: the bytes
ever written), at position % ring_bytes; one that would run past the end of
the file starts at its start instead. An item is held while its slot is its
own and nothing was written over its bytes (position >= head - ring_bytes),
so the tier is FIFO and holds at most `capacity` items within `ring_bytes`
of disk, whichever binds first. Without a disk budget the ring has room for
`capacity` items of `item_bytes`.

Compression (`compression="zlib"`): each item is compressed on its own, at
zlib's level 1, by the thread that adds it. Atari transitions (56 KB, eight
84x84 frames) compress about 60x there, at about 15k items/s a core each
way (bench/tiered_replay.py), so a disk holds tens of times as many items;
CartPole's 48-byte rows do not compress. An item stored in fewer bytes than
`item_bytes` is compressed and one of `item_bytes` is raw (an item that
does not compress is kept raw), so reading needs no setting, and a store
may be reopened with the other one.

Why a numpy memmap of one file: the kernel's page cache keeps the pages read
often in RAM and drops the others; it needs no package beyond numpy and the
standard library; and uncompressed items of a ring that is a whole number of
items are read as one fancy-indexed read of rows, in file order so that
neighbouring rows share pages.

`head.i64` holds the head, the next key, a random identity of the ring and
its layout (capacity, item_bytes, ring_bytes). The head and the next key are
written before the bytes they cover: a process killed while writing leaves a
head that disowns whatever the write may have reached, and keys that no
later item reuses.

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
import os
import secrets
import shutil
import tempfile
import threading
import zlib
from typing import NamedTuple

import numpy as np

from gorila_jax.replay.sum_tree import SumTree

COMPRESSIONS = ("none", "zlib")
_ZLIB_LEVEL = 1  # level 6 compresses Atari items 1.8x smaller, at a third of the speed
_RING_FILE = "ring.u8"
_HEAD_FILE = "head.i64"
# head.i64: [head, next key, ring id, capacity, item_bytes, ring_bytes]
_HEAD, _NEXT_KEY, _RING_ID, _LAYOUT = 0, 1, 2, slice(3, 6)
_HEAD_FIELDS = 6
_EARLIER_LAYOUT_FILES = ("items.u8", "slots.i64")  # a fixed-width ring, before compression
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
      compression: "none" or "zlib" (see the module's docstring).
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
        if capacity < 1:
            raise ValueError(f"a cold replay's capacity must be >= 1, got {capacity}")
        if item_bytes < 1:
            raise ValueError(f"a cold replay's item_bytes must be >= 1, got {item_bytes}")
        if priority_exponent is not None and not priority_exponent >= 0:  # NaN too
            raise ValueError(
                f"a cold replay's priority exponent must be >= 0 (or None: uniform), "
                f"got {priority_exponent}"
            )
        ring_bytes = int(ring_bytes) or int(capacity) * int(item_bytes)
        if ring_bytes < item_bytes:
            raise ValueError(
                f"a cold replay's disk budget of {ring_bytes} bytes cannot hold one item of "
                f"{item_bytes} bytes"
            )
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"unknown cold replay compression {compression!r}; choose one of {COMPRESSIONS}"
            )
        self.capacity, self.item_bytes = int(capacity), int(item_bytes)
        self.ring_bytes, self.compression = ring_bytes, compression
        self._exponent = None if priority_exponent is None else float(priority_exponent)
        self._directory = directory
        os.makedirs(directory, exist_ok=True)
        self._ring, self._head = self._open_files()
        whole_items = self.ring_bytes % self.item_bytes == 0
        self._fixed_rows = self._ring.reshape(-1, self.item_bytes) if whole_items else None
        self._keys = np.full(self.capacity, _EMPTY, np.int64)
        self._positions = np.zeros(self.capacity, np.int64)
        self._lengths = np.zeros(self.capacity, np.int64)
        self._priorities = np.zeros(self.capacity, np.float64)
        self._hashes = np.zeros(self.capacity, np.uint64)
        self._tree = SumTree(self.capacity)
        self._size = self._held_bytes = 0
        self._inserted = int(self._head[_NEXT_KEY])
        self._oldest = self._inserted  # no key below it is held
        self._reads = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ files

    def _open_files(self) -> tuple[np.memmap, np.memmap]:
        earlier = [
            name
            for name in _EARLIER_LAYOUT_FILES
            if os.path.exists(os.path.join(self._directory, name))
        ]
        if earlier:
            raise ValueError(
                f"cold replay directory {self._directory} holds a cold tier of an earlier "
                f"layout ({', '.join(earlier)}): give another directory (--replay_cold_dir) "
                "or remove it"
            )
        ring_path = os.path.join(self._directory, _RING_FILE)
        head_path = os.path.join(self._directory, _HEAD_FILE)
        layout = (self.capacity, self.item_bytes, self.ring_bytes)
        if os.path.exists(ring_path) and os.path.exists(head_path):
            found = _layout_on_disk(ring_path, head_path)
            if found != layout:
                raise ValueError(
                    f"cold replay directory {self._directory} holds a store of "
                    f"{_describe(found)}, not {_describe(layout)}: give it the same shape "
                    "or another directory"
                )
            ring = np.memmap(ring_path, np.uint8, "r+", shape=(self.ring_bytes,))
            return ring, np.memmap(head_path, np.int64, "r+", shape=(_HEAD_FIELDS,))
        # A ring without its head (or a head without its ring) tells nothing a checkpoint
        # could trust: both start anew, under a new identity.
        self._check_disk_space(ring_path)
        ring = np.memmap(ring_path, np.uint8, "w+", shape=(self.ring_bytes,))
        head = np.memmap(head_path, np.int64, "w+", shape=(_HEAD_FIELDS,))
        head[:] = [0, 0, secrets.randbits(63), *layout]
        head.flush()
        return ring, head

    def _check_disk_space(self, ring_path: str) -> None:
        # The ring is a sparse file: a disk that fills up under it would kill the process
        # with SIGBUS on a write to the map, long after the start.
        free = shutil.disk_usage(self._directory).free
        if os.path.exists(ring_path):
            free += os.stat(ring_path).st_blocks * 512  # "w+" gives those back
        if self.ring_bytes > free:
            raise ValueError(
                f"cold replay {self._directory} needs {self.ring_bytes / 2**30:.2f} GiB of disk "
                f"({self.capacity} items of {self.item_bytes} bytes, or the budget given), and "
                f"{free / 2**30:.2f} GiB are free: give a smaller --replay_cold_gb or "
                "config.cold_replay_size, or another --replay_cold_dir"
            )

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
        stored = self._encode(items)
        lengths = np.array([len(row) for row in stored], np.int64)
        with self._lock:
            self._check_open()
            first = self._inserted + skipped
            self._inserted += count
            positions, head = _place(int(self._head[_HEAD]), lengths, self.ring_bytes)
            self._head[_HEAD], self._head[_NEXT_KEY] = head, self._inserted
            oldest_position = head - self.ring_bytes
            self._evict(self._inserted - self.capacity, oldest_position, stop=first)
            kept = positions >= oldest_position
            for index in np.flatnonzero(kept).tolist():
                start = int(positions[index]) % self.ring_bytes
                self._ring[start : start + lengths[index]] = stored[index]
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

    def _encode(self, items: np.ndarray) -> list[np.ndarray]:
        """Each item as it is stored: compressed where that makes it smaller, else raw."""
        if self.compression == "none":
            return list(items)
        stored = []
        for row in items:
            packed = zlib.compress(row, _ZLIB_LEVEL)
            stored.append(np.frombuffer(packed, np.uint8) if len(packed) < len(row) else row)
        return stored

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
            data, compressed = self._read(slots)
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
            unpacked = zlib.decompress(blob)
            if len(unpacked) != self.item_bytes:
                raise ValueError(
                    f"cold replay {self._directory}: item {int(rows.keys[row])} unpacked to "
                    f"{len(unpacked)} bytes, not {self.item_bytes}: the ring is damaged"
                )
            data[row] = np.frombuffer(unpacked, np.uint8)
        return rows

    def _read(self, slots: np.ndarray) -> tuple[np.ndarray, list[tuple[int, bytes]]]:
        """[n, item_bytes] the rows of `slots` stored raw, and (row, stored bytes) of those
        stored compressed; in file order, so that rows on one page are read together."""
        data = np.empty((len(slots), self.item_bytes), np.uint8)
        starts = self._positions[slots] % self.ring_bytes
        lengths = self._lengths[slots]
        order = np.argsort(starts, kind="stable")
        if (
            self._fixed_rows is not None
            and np.all(lengths == self.item_bytes)
            and np.all(starts % self.item_bytes == 0)
        ):
            data[order] = self._fixed_rows[starts[order] // self.item_bytes]
            return data, []
        compressed = []
        for row in order.tolist():
            start, length = int(starts[row]), int(lengths[row])
            if length == self.item_bytes:
                data[row] = self._ring[start : start + length]
            else:
                compressed.append((row, self._ring[start : start + length].tobytes()))
        return data, compressed

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
            files = (self._ring, self._head)
            record = dict(
                capacity=self.capacity,
                item_bytes=self.item_bytes,
                ring_bytes=self.ring_bytes,
                ring_id=int(self._head[_RING_ID]),
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
        """Makes this store the one `checkpoint(path)` recorded, less the items written
        over since (dropped, with a warning that counts them).

        Weights are computed with this store's exponent from the recorded
        priorities. Insertion numbering goes on past every key ever written
        to the directory.

        Raises:
          ValueError: the checkpoint is of a store of another shape.
        """
        with np.load(path) as record:
            layout = tuple(int(record[name]) for name in ("capacity", "item_bytes", "ring_bytes"))
            if layout != (self.capacity, self.item_bytes, self.ring_bytes):
                raise ValueError(
                    f"cold replay checkpoint {path} is of a store of {_describe(layout)}, this "
                    f"one's is {_describe((self.capacity, self.item_bytes, self.ring_bytes))}"
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
            same_ring = ring_id == int(self._head[_RING_ID])
            unwritten = positions >= int(self._head[_HEAD]) - self.ring_bytes
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
            self._inserted = max(inserted, int(self._head[_NEXT_KEY]))
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
            if self._ring is None:
                return
            self._ring.flush()
            self._head.flush()
            # Rows handed out are copies: nothing else holds the maps.
            self._ring = self._head = self._fixed_rows = None

    def _check_open(self) -> None:
        if self._ring is None:
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


def _place(head: int, lengths: np.ndarray, ring_bytes: int) -> tuple[np.ndarray, int]:
    """Where items of `lengths` go, written from `head` on, and the head after them: each
    one after the other, or at the ring's start where one would run past its end."""
    positions = np.empty(len(lengths), np.int64)
    for index, length in enumerate(lengths.tolist()):
        start = head % ring_bytes
        if start + length > ring_bytes:
            head += ring_bytes - start
        positions[index] = head
        head += length
    return positions, head


def _layout_on_disk(ring_path: str, head_path: str) -> tuple[int, ...] | None:
    """(capacity, item_bytes, ring_bytes) of the store in those files; None if they
    do not agree with each other."""
    if os.path.getsize(head_path) != _HEAD_FIELDS * 8:
        return None
    layout = tuple(int(value) for value in np.fromfile(head_path, np.int64)[_LAYOUT])
    return layout if os.path.getsize(ring_path) == layout[2] else None


def _describe(layout: tuple[int, ...] | None) -> str:
    if layout is None:
        return "unknown shape (its ring and head files do not agree)"
    capacity, item_bytes, ring_bytes = layout
    return f"shape [{capacity}, {item_bytes}] (capacity, item_bytes) in {ring_bytes} bytes of disk"
