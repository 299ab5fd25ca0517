"""Float observations kept compact in replay: bfloat16, or float8 (e4m3) with a per-feature scale.

The brief's FP8 experience cache (section 4.2). Writers encode observations
on the host, replay holds 2 (bfloat16) or 1 (float8) byte per number instead
of 4, and the learner's step decodes them on its device, inside the jitted
update (`ItemCodec.expand`), so host->device copies shrink too.

float8 e4m3 has 3 mantissa bits (a relative error of at most 2^-4 for values
in its normal range) and a largest finite value of 448; beyond it a cast
gives NaN, so values are scaled per feature and saturated. The scale is fixed
once per environment from a uniform random policy's first observations
(`gorila_jax.envs.random_policy_absmax`, seeded, so every process of a run
derives the same one): a feature's largest magnitude there maps to
448 / FLOAT8_HEADROOM, which leaves room for the larger values a learned
policy reaches. bfloat16 keeps float32's range and needs no scale.
"""

import dataclasses

import ml_dtypes
import numpy as np

from gorila_jax import config_checks, envs, types

STORAGE_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
}
# How many times a random policy's largest magnitude a feature may reach before it saturates.
FLOAT8_HEADROOM = 32.0
_MANTISSA_BITS = {"bfloat16": 7, "float8_e4m3": 3}
_FLOAT8_MAX = float(ml_dtypes.finfo(STORAGE_DTYPES["float8_e4m3"]).max)  # 448


def check_storage_dtype(name: str) -> None:
    """Raises ValueError unless `name` is a storage dtype here."""
    config_checks.check_one_of("config.replay_obs_dtype", name, tuple(STORAGE_DTYPES))


@dataclasses.dataclass(frozen=True, eq=False)
class CompactFloats:
    """How one float leaf is stored: its storage dtype and the per-feature scale.

    Attributes:
      dtype_name: "bfloat16" or "float8_e4m3" (a key of STORAGE_DTYPES).
      scale: float32, broadcastable to one item of the leaf (one per feature);
        stored = value / scale, decoded = stored * scale.
    """

    dtype_name: str
    scale: np.ndarray

    def __post_init__(self):
        check_storage_dtype(self.dtype_name)
        scale = np.asarray(self.scale, np.float32)
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"a {self.dtype_name} scale must be finite and positive, got {scale}")
        object.__setattr__(self, "scale", scale)

    @property
    def storage_dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.dtype_name]

    @property
    def largest(self) -> np.ndarray:
        """The largest magnitude a stored number holds, in the leaf's own units (per feature)."""
        return float(ml_dtypes.finfo(self.storage_dtype).max) * self.scale.astype(np.float64)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Host values -> storage dtype; float8 saturates at +-`largest` (a cast gives NaN)."""
        scaled = np.asarray(values, np.float32) / self.scale
        if self.dtype_name == "float8_e4m3":
            scaled = np.clip(scaled, -_FLOAT8_MAX, _FLOAT8_MAX)
        return scaled.astype(self.storage_dtype)

    def decode(self, stored):
        """Stored values (numpy or, inside a jitted step, jax arrays) -> float32 values."""
        return stored.astype(np.float32) * self.scale

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        """The most |decode(encode(x)) - x| can be, elementwise, for x within +-`largest`:
        half a unit in the last place (relative) plus half the smallest subnormal (absolute)."""
        relative = 2.0 ** -(_MANTISSA_BITS[self.dtype_name] + 1)
        tiny = float(ml_dtypes.finfo(self.storage_dtype).smallest_subnormal)
        return relative * np.abs(values) + 0.5 * tiny * self.scale


def float8_scale(absmax: np.ndarray) -> np.ndarray:
    """Per-feature scale mapping `absmax` (a random policy's largest magnitudes) to 448 / headroom.

    A feature that stayed at 0 gets the scale of magnitude 1.
    """
    absmax = np.asarray(absmax, np.float32)
    absmax = np.where(np.isfinite(absmax) & (absmax > 0), absmax, 1.0)
    return (absmax * FLOAT8_HEADROOM / _FLOAT8_MAX).astype(np.float32)


def observation_storage(dtype_name: str, spec: types.EnvSpec) -> CompactFloats | None:
    """How replay stores `spec`'s observations for `config.replay_obs_dtype=dtype_name`:
    None for float32 (as they come).

    Raises:
      ValueError: an unknown dtype, or a compact one for observations that are not floats
        (Atari's uint8 frames already take one byte).
    """
    check_storage_dtype(dtype_name)
    if dtype_name == "float32":
        return None
    if not np.issubdtype(np.dtype(spec.observation_dtype), np.floating):
        raise ValueError(
            f"config.replay_obs_dtype={dtype_name!r} stores float observations compactly; "
            f"{spec.env_id} observes {spec.observation_dtype}, kept as it is: use 'float32'"
        )
    if dtype_name == "bfloat16":
        return CompactFloats(dtype_name, np.ones((), np.float32))
    return CompactFloats(dtype_name, float8_scale(envs.random_policy_absmax(spec.env_id)))
