"""A 2-D convolution whose gradients stay on XLA:CPU's fast (Eigen) path inside loops.

XLA:CPU runs a convolution with Eigen only in the canonical form
NHWC x HWIO -> NHWC. Autodiff writes the two backward convolutions in other
forms (the input gradient with the kernel's I/O swapped, the kernel gradient
with batch and features exchanged), and the CPU compiler's
`ConvCanonicalization` pass, which rewrites them with transposes, visits only
the entry computation. Inside a `lax.scan`, `lax.fori_loop` or `lax.while_loop`
body they stay as they are and are emitted as naive loops: PPO's epochs of
minibatch updates (a scan) on the Nature torso ran about 40x slower per
sample-gradient than the same gradient outside a loop (bench/ppo_vs_dqn_update.py).

`conv_general_dilated` is `lax.conv_general_dilated` with a custom VJP that
writes both backward convolutions in canonical form with explicit
transposes, so that they compile to Eigen calls wherever they sit. It has the
signature of `lax.conv_general_dilated` (Flax's `nn.Conv(conv_general_dilated=...)`
passes it); anything other than a plain 2-D NHWC/HWIO convolution (dilation,
feature groups, another layout), and any backend but CPU, uses
`lax.conv_general_dilated` as it is. (XLA may still rewrite a convolution by
its shapes, e.g. swap the operands of one whose kernel outgrows its input;
bench/ppo_vs_dqn_update.py counts the non-canonical convolutions of a compiled
step: none for the Nature torso on Atari frames.)
"""

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

# What Flax's nn.Conv passes for 2-D NHWC inputs and HWIO kernels.
_CANONICAL = lax.ConvDimensionNumbers(
    lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2)
)
_NHWC = ("NHWC", "HWIO", "NHWC")


def conv_general_dilated(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """`lax.conv_general_dilated`, with canonical backward convolutions on CPU (see the module)."""
    plain = (
        lhs.ndim == 4
        and all(d == 1 for d in (lhs_dilation or (1, 1)))
        and all(d == 1 for d in (rhs_dilation or (1, 1)))
        and feature_group_count == 1
        and batch_group_count == 1
        and preferred_element_type is None
        and lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) == _CANONICAL
        and jax.default_backend() == "cpu"
    )
    if not plain:
        return lax.conv_general_dilated(
            lhs,
            rhs,
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            dimension_numbers,
            feature_group_count,
            batch_group_count,
            precision,
            preferred_element_type,
        )
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
    return _conv(tuple(window_strides), tuple(map(tuple, padding)), precision, lhs, rhs)


def _forward(strides, padding, precision, lhs, rhs):
    return lax.conv_general_dilated(
        lhs, rhs, strides, padding, dimension_numbers=_NHWC, precision=precision
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _conv(strides, padding, precision, lhs, rhs):
    return _forward(strides, padding, precision, lhs, rhs)


def _conv_fwd(strides, padding, precision, lhs, rhs):
    return _forward(strides, padding, precision, lhs, rhs), (lhs, rhs)


def _conv_bwd(strides, padding, precision, residuals, grad_out):
    """(d lhs, d rhs), each one NHWC x HWIO -> NHWC convolution.

    Per spatial dimension: input size n, kernel k, stride s, padding (lo, hi),
    output size m = (n + lo + hi - k) // s + 1.
      d lhs = conv(grad_out dilated by s, the kernel flipped with I/O swapped),
              padded (k - 1 - lo, n + lo - (m - 1) s - 1) so that its size is n;
      d rhs = conv(lhs with batch and channels exchanged [C, H, W, N],
              grad_out as the kernel [Ho, Wo, N, O] dilated by s),
              padded (lo, k + (m - 1) s - n - lo) so that its size is k,
              then [C, kh, kw, O] -> [kh, kw, C, O].
    """
    lhs, rhs = residuals
    sizes, kernel, out = lhs.shape[1:3], rhs.shape[:2], grad_out.shape[1:3]
    lhs_pad = [
        (k - 1 - lo, n + lo - (m - 1) * s - 1)
        for n, k, m, s, (lo, _) in zip(sizes, kernel, out, strides, padding)
    ]
    flipped = jnp.transpose(jnp.flip(rhs, (0, 1)), (0, 1, 3, 2))
    grad_lhs = lax.conv_general_dilated(
        grad_out,
        flipped,
        (1, 1),
        lhs_pad,
        lhs_dilation=strides,
        dimension_numbers=_NHWC,
        precision=precision,
    )
    rhs_pad = [
        (lo, k + (m - 1) * s - n - lo)
        for n, k, m, s, (lo, _) in zip(sizes, kernel, out, strides, padding)
    ]
    grad_rhs = lax.conv_general_dilated(
        jnp.transpose(lhs, (3, 1, 2, 0)),
        jnp.transpose(grad_out, (1, 2, 0, 3)),
        (1, 1),
        rhs_pad,
        rhs_dilation=strides,
        dimension_numbers=_NHWC,
        precision=precision,
    )
    return grad_lhs.astype(lhs.dtype), jnp.transpose(grad_rhs, (1, 2, 0, 3)).astype(rhs.dtype)


_conv.defvjp(_conv_fwd, _conv_bwd)
