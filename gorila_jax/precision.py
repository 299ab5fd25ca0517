"""Mixed precision shared by all agents: float32 master parameters, a compute dtype per mode.

Also the agent-independent pieces of a mixed-precision update: dynamic loss
scaling for float16 (Micikevicius et al., 2018, sec. 3.2), skipping a step
without touching the state, per-layer gradient clipping, and casting
parameters to a compact dtype for the trip to actors.
"""

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from gorila_jax import parallel

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
TRANSPORT_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(precision: str):
    """The activation and matmul dtype of `precision` ("fp32", "bf16" or "fp16")."""
    try:
        return COMPUTE_DTYPES[precision]
    except KeyError:
        raise ValueError(
            f"precision must be one of {tuple(COMPUTE_DTYPES)}, got {precision!r}"
        ) from None


class LossScale(NamedTuple):
    """Dynamic loss-scale state; a pytree of scalars, replicated on every learner device.

    Attributes:
      scale: [] float32 factor the loss is multiplied by before differentiation.
      finite_steps: [] int32 finite steps since the scale last changed.
      skipped_steps: [] int32 steps skipped for non-finite gradients, in total.
    """

    scale: jax.Array
    finite_steps: jax.Array
    skipped_steps: jax.Array


def init_loss_scale(scale: float) -> LossScale:
    """A loss scale of `scale` (>= 1; the brief suggests 128-512 for float16), no steps yet."""
    if not scale >= 1.0:
        raise ValueError(f"the initial loss scale must be >= 1, got {scale}")
    return LossScale(
        jnp.asarray(scale, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
    )


def scale_loss(loss: jax.Array, loss_scale: LossScale) -> jax.Array:
    """The loss to differentiate: small float16 gradients stay above float16's underflow."""
    return loss * loss_scale.scale.astype(loss.dtype)


def unscale_grads(grads: Any, loss_scale: LossScale) -> Any:
    """Gradients of the unscaled loss, from those of `scale_loss`."""
    return jax.tree.map(lambda g: g / loss_scale.scale.astype(g.dtype), grads)


def all_finite(tree: Any) -> jax.Array:
    """[] bool: no NaN or inf in any leaf on any learner device.

    Call inside the pmapped step. Reducing over devices makes every device
    take the same skip decision, so replicated state never diverges, even
    when the check runs on per-device values that were not averaged.
    """
    leaves = jax.tree.leaves(tree)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
    return parallel.pmax(jnp.logical_not(finite).astype(jnp.int32)) == 0


def update_loss_scale(loss_scale: LossScale, finite: jax.Array, period: int) -> LossScale:
    """Halves the scale after an overflow (never below 1); doubles it after `period` finite steps.

    Halving right away and growing slowly keeps the scale just under the
    largest value whose gradients fit in float16.
    """
    finite_steps = jnp.where(finite, loss_scale.finite_steps + 1, 0)
    grow = finite_steps >= period
    scale = jnp.where(
        finite,
        jnp.where(grow, loss_scale.scale * 2.0, loss_scale.scale),
        jnp.maximum(loss_scale.scale / 2.0, 1.0),
    )
    return LossScale(
        scale,
        jnp.where(grow, 0, finite_steps).astype(jnp.int32),
        loss_scale.skipped_steps + jnp.logical_not(finite).astype(jnp.int32),
    )


class CheckedGrads(NamedTuple):
    """Gradients and the step's skip decision, on their way from compute to apply.

    The flag travels with the gradients so that applying them stays a
    function of (state, gradients) alone: a parameter-server shard holding a
    slice of the parameters would get its slice of `grads` and the same flag.

    Attributes:
      grads: the gradient pytree, shaped like the parameters.
      finite: [] bool, the same on every device; False means skip this step.
    """

    grads: Any
    finite: jax.Array


def select_tree(pred: jax.Array, new: Any, old: Any) -> Any:
    """`new` where the scalar `pred` is true, else `old`, leaf by leaf.

    A select, not a branch: both trees are computed, and NaNs in the one not
    taken do not leak into the result.
    """
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def _map_layers(fn, tree: Any, path: tuple[str, ...] = ()) -> Any:
    """Applies `fn(path, leaves: dict)` to each dict that owns leaves (one Flax layer).

    A Flax layer is the dict that holds its arrays, e.g. {'kernel', 'bias'}
    of one Dense or Conv. Nested module dicts are walked; a dict holding both
    arrays and submodules is a layer for its own arrays only.
    """
    if not isinstance(tree, Mapping):
        raise ValueError(f"layer-wise clipping needs nested dicts of parameters, got {type(tree)}")
    leaves = {k: v for k, v in tree.items() if not isinstance(v, Mapping)}
    out = dict(fn(path, leaves)) if leaves else {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out[k] = _map_layers(fn, v, path + (str(k),))
    return out if isinstance(tree, dict) else type(tree)(out)


def layer_norms(grads: Any) -> dict[str, jax.Array]:
    """{'Dense_0': norm, 'NatureTorso_0/Conv_1': norm, ...}: the L2 norm of each layer."""
    norms: dict[str, jax.Array] = {}

    def record(path, leaves):
        norms["/".join(p for p in path if p != "params")] = optax.tree.norm(leaves)
        return leaves

    _map_layers(record, grads)
    return norms


def clip_by_layer_norm(grads: Any, max_norm: float) -> Any:
    """Scales each layer's gradient so its own L2 norm is at most `max_norm`.

    Unlike a global clip, one layer with a large gradient (often the first
    conv, or the head early in training) does not shrink the others' steps.
    """
    if not max_norm > 0:
        raise ValueError(f"the per-layer gradient norm limit must be positive, got {max_norm}")

    def clip(path, leaves):
        factor = jnp.minimum(1.0, max_norm / jnp.maximum(optax.tree.norm(leaves), 1e-12))
        return {k: (g * factor).astype(g.dtype) for k, g in leaves.items()}

    return _map_layers(clip, grads)


def cast_floats(tree: Any, dtype_name: str) -> Any:
    """`tree` with its floating leaves cast to `dtype_name` ("float32" or "bfloat16").

    For parameters on their way to actors: bfloat16 halves the bytes, and
    Flax layers promote them back to their compute dtype. Integer leaves are
    left alone.
    """
    try:
        dtype = TRANSPORT_DTYPES[dtype_name]
    except KeyError:
        raise ValueError(
            f"parameter transport dtype must be one of {tuple(TRANSPORT_DTYPES)}, "
            f"got {dtype_name!r}"
        ) from None

    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def use_tf32(enabled: bool) -> None:
    """Float32 matmuls and convolutions in TensorFloat-32 (on GPUs), or in full float32.

    A process-wide JAX setting: learner processes call it before compiling.
    JAX's own default lets GPUs pick TF32; this makes the choice explicit.
    """
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if enabled else "float32")
