"""The cold tier's items on disk (`cold.ColdStore`): a ring of bytes and its head.

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
"""

import os
import secrets
import shutil
import tempfile
import zlib

import numpy as np

COMPRESSIONS = ("none", "zlib")
_ZLIB_LEVEL = 1  # level 6 compresses Atari items 1.8x smaller, at a third of the speed
_RING_FILE = "ring.u8"
_HEAD_FILE = "head.i64"
# head.i64: [head, next key, ring id, capacity, item_bytes, ring_bytes]
_HEAD, _NEXT_KEY, _RING_ID, _LAYOUT = 0, 1, 2, slice(3, 6)
_HEAD_FIELDS = 6
_EARLIER_LAYOUT_FILES = ("items.u8", "slots.i64")  # a fixed-width ring, before compression


class Ring:
    """`ring.u8` and `head.i64` in `directory`, mapped; not thread safe (the store's lock
    guards it). `ring_bytes` 0: room for `capacity` items of `item_bytes`.

    A directory used before must hold a ring of the same layout (capacity,
    item_bytes, ring_bytes); a ring without its head, or a head without its ring,
    starts anew under a new identity.

    Raises:
      ValueError: a layout that holds no item, of another shape or of an earlier format
        in `directory`, a compression not in `COMPRESSIONS`, or too little free disk.
    """

    def __init__(
        self, directory: str, capacity: int, item_bytes: int, ring_bytes: int, compression: str
    ):
        capacity, item_bytes = int(capacity), int(item_bytes)
        if capacity < 1:
            raise ValueError(f"a cold replay's capacity must be >= 1, got {capacity}")
        if item_bytes < 1:
            raise ValueError(f"a cold replay's item_bytes must be >= 1, got {item_bytes}")
        ring_bytes = int(ring_bytes) or capacity * item_bytes
        if ring_bytes < item_bytes:
            raise ValueError(
                f"a cold replay's disk budget of {ring_bytes} bytes cannot hold one item of "
                f"{item_bytes} bytes"
            )
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"unknown cold replay compression {compression!r}; choose one of {COMPRESSIONS}"
            )
        self.directory, self.compression = directory, compression
        self.layout = (capacity, item_bytes, ring_bytes)
        self.item_bytes, self.ring_bytes = item_bytes, ring_bytes
        os.makedirs(directory, exist_ok=True)
        self._bytes, self._head = self._open()
        whole_items = ring_bytes % item_bytes == 0
        self._fixed_rows = self._bytes.reshape(-1, item_bytes) if whole_items else None

    def _open(self) -> tuple[np.memmap, np.memmap]:
        earlier = [
            name
            for name in _EARLIER_LAYOUT_FILES
            if os.path.exists(os.path.join(self.directory, name))
        ]
        if earlier:
            raise ValueError(
                f"cold replay directory {self.directory} holds a cold tier of an earlier "
                f"layout ({', '.join(earlier)}): give another directory (--replay_cold_dir) "
                "or remove it"
            )
        ring_path = os.path.join(self.directory, _RING_FILE)
        head_path = os.path.join(self.directory, _HEAD_FILE)
        if os.path.exists(ring_path) and os.path.exists(head_path):
            found = _layout_on_disk(ring_path, head_path)
            if found != self.layout:
                raise ValueError(
                    f"cold replay directory {self.directory} holds a store of "
                    f"{describe(found)}, not {describe(self.layout)}: give it the same shape "
                    "or another directory"
                )
            ring = np.memmap(ring_path, np.uint8, "r+", shape=(self.ring_bytes,))
            return ring, np.memmap(head_path, np.int64, "r+", shape=(_HEAD_FIELDS,))
        self._check_disk_space(ring_path)
        ring = np.memmap(ring_path, np.uint8, "w+", shape=(self.ring_bytes,))
        head = np.memmap(head_path, np.int64, "w+", shape=(_HEAD_FIELDS,))
        head[:] = [0, 0, secrets.randbits(63), *self.layout]
        head.flush()
        return ring, head

    def _check_disk_space(self, ring_path: str) -> None:
        # The ring is a sparse file: a disk that fills up under it would kill the process
        # with SIGBUS on a write to the map, long after the start.
        free = shutil.disk_usage(self.directory).free
        if os.path.exists(ring_path):
            free += os.stat(ring_path).st_blocks * 512  # "w+" gives those back
        if self.ring_bytes > free:
            capacity, item_bytes, _ = self.layout
            raise ValueError(
                f"cold replay {self.directory} needs {self.ring_bytes / 2**30:.2f} GiB of disk "
                f"({capacity} items of {item_bytes} bytes, or the budget given), and "
                f"{free / 2**30:.2f} GiB are free: give a smaller --replay_cold_gb or "
                "config.cold_replay_size, or another --replay_cold_dir"
            )

    @property
    def is_open(self) -> bool:
        return self._bytes is not None

    @property
    def head(self) -> int:
        """The bytes ever written."""
        return int(self._head[_HEAD])

    @property
    def next_key(self) -> int:
        """The key the next item takes: past every key ever written to the directory."""
        return int(self._head[_NEXT_KEY])

    @property
    def identity(self) -> int:
        """A random number drawn when the ring was made: a checkpoint of another ring
        holds none of this one's items."""
        return int(self._head[_RING_ID])

    def encode(self, items: np.ndarray) -> list[np.ndarray]:
        """Each item as it is stored: compressed where that makes it smaller, else raw."""
        if self.compression == "none":
            return list(items)
        stored = []
        for row in items:
            packed = zlib.compress(row, _ZLIB_LEVEL)
            stored.append(np.frombuffer(packed, np.uint8) if len(packed) < len(row) else row)
        return stored

    def write(self, stored: list[np.ndarray], next_key: int) -> np.ndarray:
        """Moves the head past `stored` (and the next key to `next_key`) before writing
        them; returns their positions. Items whose position ends up below the new head -
        ring_bytes (the ring wrapped within this one write) are not written."""
        lengths = np.array([len(row) for row in stored], np.int64)
        positions, head = _place(self.head, lengths, self.ring_bytes)
        self._head[_HEAD], self._head[_NEXT_KEY] = head, next_key
        for index in np.flatnonzero(positions >= head - self.ring_bytes).tolist():
            start = int(positions[index]) % self.ring_bytes
            self._bytes[start : start + lengths[index]] = stored[index]
        return positions

    def read(
        self, positions: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, list[tuple[int, bytes]]]:
        """[n, item_bytes] the items stored raw, and (row, stored bytes) of those stored
        compressed (`decode` them); in file order, so that rows on one page are read
        together."""
        data = np.empty((len(positions), self.item_bytes), np.uint8)
        starts = positions % self.ring_bytes
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
                data[row] = self._bytes[start : start + length]
            else:
                compressed.append((row, self._bytes[start : start + length].tobytes()))
        return data, compressed

    def decode(self, blob: bytes, item: str) -> np.ndarray:
        """The item `read` gave as compressed bytes.

        Raises:
          ValueError: it does not unpack to `item_bytes` (the ring is damaged), naming
            `item`.
        """
        unpacked = zlib.decompress(blob)
        if len(unpacked) != self.item_bytes:
            raise ValueError(
                f"cold replay {self.directory}: item {item} unpacked to {len(unpacked)} "
                f"bytes, not {self.item_bytes}: the ring is damaged"
            )
        return np.frombuffer(unpacked, np.uint8)

    def flush(self) -> None:
        self._bytes.flush()
        self._head.flush()

    def close(self) -> None:
        """Flushes and lets go of the files (rows handed out are copies)."""
        if self.is_open:
            self.flush()
            self._bytes = self._head = self._fixed_rows = None


def write_atomically(path: str, record: dict[str, np.ndarray]) -> None:
    """`record` as an .npz at `path`; a partly written file never stands there."""
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


def describe(layout: tuple[int, ...] | None) -> str:
    if layout is None:
        return "unknown shape (its ring and head files do not agree)"
    capacity, item_bytes, ring_bytes = layout
    return f"shape [{capacity}, {item_bytes}] (capacity, item_bytes) in {ring_bytes} bytes of disk"
