"""How replay items are packed: every item one uint8 vector with its source actor."""

import numpy as np
import tensorflow as tf
import tree

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

    Args:
      example: one item, without a batch axis (e.g. a `types.Transition`).
    """

    def __init__(self, example: types.PyTree):
        leaves = [np.asarray(x) for x in tree.flatten(example)]
        self._structure = example
        self._shapes = [leaf.shape for leaf in leaves]
        self._dtypes = [leaf.dtype for leaf in leaves]
        sizes = [leaf.nbytes for leaf in leaves]
        self._bounds = np.cumsum([0, *sizes]).tolist()
        self.payload_bytes = self._bounds[-1]  # the item's own data, without the trailer
        self.num_bytes = self.payload_bytes + SOURCE_BYTES  # one packed item

    def signature(self) -> tf.TensorSpec:
        """The table signature of packed items."""
        return tf.TensorSpec([self.num_bytes], tf.uint8)

    def encode(self, batch: types.PyTree, source: int | np.ndarray = UNKNOWN_SOURCE) -> np.ndarray:
        """[K, ...] leaves -> [K, num_bytes] uint8.

        Args:
          batch: items with a leading batch axis.
          source: the index of the actor that wrote them (one for all, or [K]).
        """
        leaves = tree.flatten(batch)
        count = len(leaves[0])
        parts = [
            np.ascontiguousarray(leaf, dtype).reshape(count, -1).view(np.uint8)
            for leaf, dtype in zip(leaves, self._dtypes)
        ]
        sources = np.broadcast_to(np.asarray(source, _SOURCE_DTYPE), (count,))
        parts.append(np.ascontiguousarray(sources).reshape(count, 1).view(np.uint8))
        return np.concatenate(parts, axis=1)

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
        return tree.unflatten_as(self._structure, leaves)

    def sources(self, packed: np.ndarray, table: str | None = None) -> np.ndarray:
        """[B, num_bytes] uint8 -> [B] int32, the actor that wrote each item.

        Raises:
          ValueError: as `decode`.
        """
        packed = self._check(packed, table)
        trailer = np.ascontiguousarray(packed[:, self.payload_bytes :])
        return trailer.view(_SOURCE_DTYPE).reshape(-1)
