"""How replay items are packed: every item one uint8 vector with its source actor."""

import hashlib
from typing import Any

import jax
import numpy as np

from gorila_jax import types

# The source of an item written without one (tests, tools): counted apart, never as an actor.
UNKNOWN_SOURCE = -1
_SOURCE_DTYPE = np.dtype(np.int32)
SOURCE_BYTES = _SOURCE_DTYPE.itemsize


class ItemCodec:
    """Packs each item (a pytree of fixed-shape arrays) into one uint8 vector, and back.

    Reverb keeps every leaf of an item in a column of its own, and it pays per
    column on insert (a chunk to build and compress) and on sample (a chunk to
    find and decompress). One column instead of five doubles both rates for
    CartPole transitions: about 7.6k -> 14.8k inserts/s and 36k -> 82k sampled
    items/s on 2 cores (bench/learner_throughput.py measures the result).
    Batches are packed and unpacked with a few vectorized numpy calls.

    Every packed item ends with a trailer of SOURCE_BYTES: the index of the
    actor that wrote it (int32, `UNKNOWN_SOURCE` if the writer named none).
    The learners read it (`sources`) to count each actor's share of what
    they sample (gorila_jax/health/balance.py) and to scale the priorities of a
    dominant actor's items; agents never see it (`decode` drops it). It
    rides inside the one column, so it costs no extra Reverb column.

    Float leaves may be stored compactly (`compact`: bfloat16 or float8, see
    gorila_jax/replay/compact.py): `encode` converts them, `decode` hands them
    out in their storage dtype, and `expand`, run inside the learner's jitted
    step, turns them back into float32 on the device.

    Args:
      example: one item, without a batch axis (e.g. a `types.Transition`).
      compact: None, or `example`'s structure with a `compact.CompactFloats`
        where a leaf is stored compactly and None where it is kept as it is.
    """

    def __init__(self, example: types.PyTree, compact: types.PyTree | None = None):
        leaves = [np.asarray(x) for x in jax.tree.leaves(example)]
        self._compact: list[Any] = [None] * len(leaves)
        if compact is not None:
            # None marks a leaf kept as it is: a leaf here, not an empty subtree.
            compact_leaves, compact_structure = jax.tree.flatten(compact, is_leaf=_is_none)
            if compact_structure != jax.tree.structure(example) or len(compact_leaves) != len(
                leaves
            ):
                raise ValueError(
                    f"the compact structure {compact_structure} is not the item's "
                    f"{jax.tree.structure(example)}"
                )
            self._compact = compact_leaves
        self._structure = jax.tree.structure(example)
        self._names = [
            "/".join(str(_path_part(part)) for part in path) or "item"
            for path, _ in jax.tree_util.tree_flatten_with_path(example)[0]
        ]
        self._shapes = [leaf.shape for leaf in leaves]
        self._dtypes = [
            leaf.dtype if how is None else how.storage_dtype
            for leaf, how in zip(leaves, self._compact)
        ]
        sizes = [
            int(np.prod(shape)) * dtype.itemsize for shape, dtype in zip(self._shapes, self._dtypes)
        ]
        self._bounds = np.cumsum([0, *sizes]).tolist()
        self.payload_bytes = self._bounds[-1]  # the item's own data, without the trailer
        self.num_bytes = self.payload_bytes + SOURCE_BYTES  # one packed item

    def encode(self, batch: types.PyTree, source: int | np.ndarray = UNKNOWN_SOURCE) -> np.ndarray:
        """[K, ...] leaves -> [K, num_bytes] uint8.

        Args:
          batch: items with a leading batch axis.
          source: the index of the actor that wrote them (one for all, or [K]).

        Raises:
          ValueError: a field of another structure, shape or kind of dtype than the
            codec's example, naming the field: packed as it is, it would shift every
            field after it and the replay would hold garbage.
        """
        leaves = self._checked_leaves(batch)
        count = len(leaves[0])
        parts = [
            np.ascontiguousarray(leaf if how is None else how.encode(leaf), dtype)
            .reshape(count, -1)
            .view(np.uint8)
            for leaf, dtype, how in zip(leaves, self._dtypes, self._compact)
        ]
        sources = np.broadcast_to(np.asarray(source, _SOURCE_DTYPE), (count,))
        parts.append(np.ascontiguousarray(sources).reshape(count, 1).view(np.uint8))
        return np.concatenate(parts, axis=1)

    def _checked_leaves(self, batch: types.PyTree) -> list[np.ndarray]:
        leaves, structure = jax.tree.flatten(batch)
        if structure != self._structure:
            raise ValueError(
                f"replay item has another structure than the codec's: {structure} "
                f"against {self._structure}"
            )
        leaves = [np.asarray(leaf) for leaf in leaves]
        count = len(leaves[0]) if leaves[0].ndim else None
        for name, leaf, shape, dtype, how in zip(
            self._names, leaves, self._shapes, self._dtypes, self._compact
        ):
            if leaf.ndim == 0 or leaf.shape[1:] != shape or len(leaf) != count:
                raise ValueError(
                    f"replay item field {name!r}: expected {[count, *shape]} (a batch of "
                    f"{list(shape)}), got {list(leaf.shape)}"
                )
            wanted = np.float32 if how is not None else dtype
            if not np.can_cast(leaf.dtype, wanted, casting="same_kind"):
                raise ValueError(
                    f"replay item field {name!r}: expected {np.dtype(wanted)} values, got "
                    f"{leaf.dtype}"
                )
        return leaves

    def describe(self) -> str:
        """The leaves' shapes and dtypes, for error messages."""
        leaves = ", ".join(
            f"{dtype}{list(shape)}" for shape, dtype in zip(self._shapes, self._dtypes)
        )
        return f"{leaves}, {SOURCE_BYTES}-byte source actor"

    def _check(self, packed: np.ndarray, table: str | None) -> np.ndarray:
        packed = np.asarray(packed)
        if packed.ndim != 2 or packed.shape[1] != self.num_bytes or packed.dtype != np.uint8:
            where = f"replay table {table!r}: " if table else ""
            if packed.ndim == 2 and packed.shape[1] == self.payload_bytes:
                why = (
                    "these items lack the source-actor trailer: they were written by an "
                    "older gorila-jax (a replay checkpoint from before items named their actor?)"
                )
            else:
                why = (
                    "the table holds items of another agent config or environment "
                    "(a replay checkpoint of another run?)"
                )
            raise ValueError(
                f"{where}packed items must be [B, {self.num_bytes}] uint8 ({self.describe()}), "
                f"got {packed.dtype}{list(packed.shape)}; {why}"
            )
        return packed

    def decode(self, packed: np.ndarray, table: str | None = None) -> types.PyTree:
        """[B, num_bytes] uint8 -> the item structure with [B, ...] leaves (no trailer).

        Raises:
          ValueError: packed items of another width or dtype, naming `table` and
            both layouts: bytes decoded with the wrong layout would be silent garbage.
        """
        packed = self._check(packed, table)
        count = packed.shape[0]
        leaves = [
            np.ascontiguousarray(packed[:, start:stop]).view(dtype).reshape(count, *shape)
            for start, stop, dtype, shape in zip(
                self._bounds[:-1], self._bounds[1:], self._dtypes, self._shapes
            )
        ]
        return jax.tree.unflatten(self._structure, leaves)

    def expand(self, data: types.PyTree) -> types.PyTree:
        """`decode`'s leaves (numpy, or jax arrays inside a jitted step) with the compact ones
        back in float32; the rest as they are. The identity for a codec without compact leaves."""
        if not any(self._compact):
            return data
        leaves = [
            leaf if how is None else how.decode(leaf)
            for leaf, how in zip(jax.tree.leaves(data), self._compact)
        ]
        return jax.tree.unflatten(self._structure, leaves)

    def sources(self, packed: np.ndarray, table: str | None = None) -> np.ndarray:
        """[B, num_bytes] uint8 -> [B] int32, the actor that wrote each item.

        Raises:
          ValueError: as `decode`.
        """
        return packed_sources(self._check(packed, table))

    def content_hashes(self, packed: np.ndarray, table: str | None = None) -> np.ndarray:
        """[B, num_bytes] uint8 -> [B] uint64, a hash of each item's content (the source
        trailer left out): two actors' copies of one transition hash alike.

        BLAKE2b, 8 bytes: about 1e-19 chance that two distinct items share a hash.
        About 0.5 us a row for CartPole items and 54 us for Atari's 56 KB ones on
        this 2-core machine (bench/duplicate_priority.py).

        Raises:
          ValueError: as `decode`.
        """
        return packed_hashes(self._check(packed, table))


def packed_sources(packed: np.ndarray) -> np.ndarray:
    """[B, num_bytes] packed items -> [B] int32, the actor that wrote each (`ItemCodec.sources`,
    for a holder of packed items without their codec)."""
    trailer = np.ascontiguousarray(np.asarray(packed)[:, -SOURCE_BYTES:])
    return trailer.view(_SOURCE_DTYPE).reshape(-1)


def packed_hashes(packed: np.ndarray) -> np.ndarray:
    """[B, num_bytes] packed items -> [B] uint64 hashes of their content, the source trailer
    left out (`ItemCodec.content_hashes`, for a holder of packed items without their codec)."""
    # Each row's payload is hashed where it lies (a row of a C-contiguous array is one
    # buffer): copying 56 KB Atari rows first took as long as the hashing.
    packed = np.ascontiguousarray(packed)
    digests = b"".join(
        hashlib.blake2b(row[:-SOURCE_BYTES], digest_size=8).digest() for row in packed
    )
    return np.frombuffer(digests, np.uint64).copy()


def transition_codec(
    observation: np.ndarray, action: Any, storage: types.PyTree | None = None
) -> ItemCodec:
    """The codec of one `types.Transition` with these example observation and action (no
    batch axis), both observations stored as `storage` says (a `compact.CompactFloats`,
    or None: as they are)."""
    zero = np.float32(0)
    return ItemCodec(
        types.Transition(observation, action, zero, zero, observation),
        compact=None if storage is None else types.Transition(storage, None, None, None, storage),
    )


def _is_none(node: Any) -> bool:
    return node is None


def _path_part(part: Any) -> Any:
    """A field name, dict key or index of a JAX key path entry, as the error messages name it."""
    for attribute in ("name", "key", "idx"):
        if hasattr(part, attribute):
            return getattr(part, attribute)
    return part
