"""Gradient and parameter compression on the wire (Gorila mode).

Everything here works on flat float32 vectors (a shard's slice of the
parameters or gradients) on the host, where the bytes are sent. Each
encoding reports its size in bytes, so every scheme's saving is measured
on the real payload, not estimated.

Schemes for gradients (worker -> parameter server):
  none    float32 as is.
  bf16    bfloat16 cast: 2 bytes per value, about 3 significant digits.
  fp16    float16 cast, saturated at float16's range: 2 bytes per value.
  onebit  the sign of each value plus one float32 scale (mean |value|) per
          block of `BLOCK` values: about 1/8 + 4/BLOCK bytes per value. The
          worker keeps what the signs lost (error feedback, Seide et al.,
          2014) and adds it to its next gradient, so no update is lost, only
          delayed.
  sparse  values with |g| >= threshold, with their int32 indices or, when
          more than 1 in 32 values are kept, a 1-bit mask of where they are
          (cheaper then); smaller values are dropped.

Parameters (parameter server -> actors) travel as deltas: see `DeltaEncoder`.
"""

from typing import NamedTuple

import ml_dtypes
import numpy as np

GRADIENT_SCHEMES = ("none", "bf16", "fp16", "onebit", "sparse")
BLOCK = 256
_FP16_MAX = float(np.finfo(np.float16).max)


class Encoded(NamedTuple):
    """A compressed flat vector: what goes on the wire.

    Attributes:
      scheme: how `arrays` encode the vector.
      size: number of values of the decoded vector.
      arrays: the payload.
    """

    scheme: str
    size: int
    arrays: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.arrays)


def _check_vector(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype != np.float32:
        raise ValueError(f"expected a flat float32 vector, got {values.dtype}{list(values.shape)}")
    return values


def _block_starts(size: int) -> np.ndarray:
    return np.arange(0, size, BLOCK)


def _onebit(values: np.ndarray) -> Encoded:
    starts = _block_starts(values.size)
    lengths = np.diff(np.append(starts, values.size))
    scales = (np.add.reduceat(np.abs(values), starts) / lengths).astype(np.float32)
    return Encoded("onebit", values.size, (np.packbits(values >= 0), scales))


def _sparse(values: np.ndarray, threshold: float) -> Encoded:
    """Kept values plus where they are: as int32 indices when few are kept
    (4 bytes each), else as a 1-bit mask (size / 8 bytes), whichever is smaller."""
    kept = np.abs(values) >= threshold
    indices = np.flatnonzero(kept).astype(np.int32)
    if indices.nbytes <= values.size // 8:
        return Encoded("sparse", values.size, (indices, values[indices]))
    return Encoded("sparse-mask", values.size, (np.packbits(kept), values[kept]))


def decode(encoded: Encoded) -> np.ndarray:
    """The float32 vector `encoded` stands for."""
    scheme, size, arrays = encoded
    if scheme in ("none", "bf16", "fp16"):
        return arrays[0].astype(np.float32)
    if scheme == "onebit":
        signs, scales = arrays
        magnitudes = np.repeat(scales, BLOCK)[:size]
        return np.where(np.unpackbits(signs, count=size), magnitudes, -magnitudes)
    if scheme in ("sparse", "sparse-mask"):
        where, values = arrays
        if scheme == "sparse-mask":
            where = np.unpackbits(where, count=size).astype(bool)
        dense = np.zeros(size, np.float32)
        dense[where] = values
        return dense
    raise ValueError(f"unknown encoding {scheme!r}")


class GradientCompressor:
    """A worker's encoder of one flat gradient slice; keeps the 1-bit residual.

    Args:
      scheme: one of GRADIENT_SCHEMES.
      threshold: the sparse scheme drops values with smaller magnitude.
    """

    def __init__(self, scheme: str, threshold: float = 1e-4):
        if scheme not in GRADIENT_SCHEMES:
            raise ValueError(f"compression must be one of {GRADIENT_SCHEMES}, got {scheme!r}")
        if threshold < 0:
            raise ValueError(f"sparsification threshold must not be negative, got {threshold}")
        self.scheme, self._threshold = scheme, threshold
        self._residual: np.ndarray | None = None

    def encode(self, gradient: np.ndarray) -> Encoded:
        gradient = _check_vector(gradient)
        if self.scheme == "none":
            return Encoded("none", gradient.size, (gradient,))
        if self.scheme == "bf16":
            return Encoded("bf16", gradient.size, (gradient.astype(ml_dtypes.bfloat16),))
        if self.scheme == "fp16":
            clipped = np.clip(gradient, -_FP16_MAX, _FP16_MAX)
            return Encoded("fp16", gradient.size, (clipped.astype(np.float16),))
        if self.scheme == "sparse":
            return _sparse(gradient, self._threshold)
        if self._residual is None or self._residual.size != gradient.size:
            self._residual = np.zeros_like(gradient)
        corrected = gradient + self._residual
        encoded = _onebit(corrected)
        self._residual = corrected - decode(encoded)
        return encoded


class DeltaEncoder:
    """Sends parameters to one receiver as changes against the copy it holds.

    The encoder mirrors the receiver's copy, so what a lossy delta misses is
    sent with the next one instead of piling up: the receiver's copy is never
    further from the truth than one delta's rounding. A delta goes as sparse
    (index, value) pairs when few values moved by more than `threshold`, else
    as a dense bfloat16 vector (half of float32's bytes). The first message
    is the full float32 vector.
    """

    def __init__(self, threshold: float = 0.0):
        self._threshold = threshold
        self._mirror: np.ndarray | None = None

    def encode(self, params: np.ndarray) -> Encoded:
        params = _check_vector(params)
        if self._mirror is None or self._mirror.size != params.size:
            self._mirror = params.copy()
            return Encoded("none", params.size, (params.copy(),))
        delta = params - self._mirror
        sparse = _sparse(delta, max(self._threshold, np.finfo(np.float32).tiny))
        dense = Encoded("bf16", delta.size, (delta.astype(ml_dtypes.bfloat16),))
        encoded = sparse if sparse.nbytes < dense.nbytes else dense
        self._mirror += decode(encoded)
        return Encoded("delta-" + encoded.scheme, encoded.size, encoded.arrays)


class DeltaDecoder:
    """The receiver's side of `DeltaEncoder`: holds the current parameter copy."""

    def __init__(self):
        self.params: np.ndarray | None = None

    def apply(self, encoded: Encoded) -> np.ndarray:
        if encoded.scheme.startswith("delta-"):
            if self.params is None:
                raise ValueError("a parameter delta arrived before the full parameters")
            self.params = self.params + decode(encoded._replace(scheme=encoded.scheme[6:]))
        else:
            self.params = decode(encoded).copy()
        return self.params
