"""The one learner step: the agent's update under the numeric guard, for pmap.

The synchronous learner (on one host or several) and the Gorila gradient
workers all run `make_step`; they differ only in what the step hands back
beside the state (parameters to publish, or a gradient to push).
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision

# `parallel.pmap_step` out_axes of a `make_step` step: the state, the guard and
# the StepInfo per device; the last output, the same on every device, once.
OUT_AXES = (0, 0, 0, None)


class NumericGuard(NamedTuple):
    """The learner's numerical-fault state beside the agent's, replicated on every device.

    Attributes:
      skipped_steps: [] int32 updates skipped for a non-finite loss, gradient or state.
      streak: [] int32 consecutive skipped updates (0 after a finite one).
      lr_scale: [] float32 fraction of its full step that each update takes
        (lowered after a rollback; see `scale_trainable`).
    """

    skipped_steps: jax.Array
    streak: jax.Array
    lr_scale: jax.Array


def init_guard(skipped_steps: int = 0, lr_scale: float = 1.0) -> NumericGuard:
    return NumericGuard(
        jnp.asarray(skipped_steps, jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.asarray(lr_scale, jnp.float32),
    )


class GradientOut(NamedTuple):
    """What a gradient worker's step hands back beside the state, the same on every device.

    Attributes:
      grads: the gradient for the parameter-server shards (unwrapped from
        `precision.CheckedGrads`).
      loss: [] float32, for the worker's loss-outlier filter.
      finite: [] bool, the guard's verdict: False when the loss or gradient
        held a NaN or inf the agent did not flag itself; its priorities are NaN.
      pushable: [] bool, `finite` and not skipped by the agent (an fp16 overflow).
    """

    grads: Any
    loss: jax.Array
    finite: jax.Array
    pushable: jax.Array


def _all_finite(*trees: Any) -> jax.Array:
    """[] bool, the same on every device: no NaN or inf in the floating leaves of `trees`."""
    leaves = [x for x in jax.tree.leaves(trees) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return precision.all_finite(leaves) if leaves else jnp.array(True)


def scale_trainable(builder: builder_lib.AgentBuilder, old: Any, new: Any, scale: jax.Array) -> Any:
    """`new` with its trainable parameters moved only `scale` of the way from `old`'s.

    The skeleton's learning-rate knob, for any agent and optimizer: the
    parameters take `scale` of the step the optimizer computed (exactly a
    learning rate times `scale` for one update). The rest of the agent's state
    (observation statistics, a loss scale, optimizer moments, target
    networks) is what the unscaled update made it. `new` comes back bit for
    bit at 1.
    """

    def move(o, n):
        if not jnp.issubdtype(n.dtype, jnp.inexact):
            return n
        return jnp.where(scale == 1.0, n, (o + scale.astype(n.dtype) * (n - o)).astype(n.dtype))

    access = builder.state_access
    moved = jax.tree.map(move, access.trainable_params(old), access.trainable_params(new))
    return access.with_trainable_params(new, moved)


def _worker_state(update_fns: builder_lib.UpdateFns, state: Any, grads: Any) -> Any:
    """The part of an update a gradient worker keeps: the shards apply the gradient itself."""
    if update_fns.track_grads is not None:
        return update_fns.track_grads(state, grads)
    if isinstance(grads, precision.CheckedGrads):
        # Applying an overflowed gradient is the agent's skipped step: its
        # parameters stay, only its own skip bookkeeping moves.
        return precision.select_tree(grads.finite, state, update_fns.apply_grads(state, grads))
    return state


def _update(update_fns: builder_lib.UpdateFns, state: Any, batch: Any, gradient_worker: bool):
    """(new state, gradient or None, StepInfo, finite) of one unguarded update."""
    if update_fns.update is not None:
        new, info = update_fns.update(state, batch)
        return new, None, info, _all_finite(new, info.metrics.get("loss"))
    grads, info = update_fns.compute_grads(state, batch)
    if gradient_worker:
        new = _worker_state(update_fns, state, grads)
    else:
        new = update_fns.apply_grads(state, grads)
    loss = info.metrics.get("loss")
    if isinstance(grads, precision.CheckedGrads):
        # A step the agent skipped itself (an fp16 overflow, handled by its loss scale) passes.
        finite = jnp.logical_not(grads.finite) | _all_finite(grads.grads, loss)
    else:
        finite = _all_finite(grads, loss)
    return new, grads, info, finite


def make_step(
    builder: builder_lib.AgentBuilder,
    spec: Any,
    gradient_worker: bool = False,
    updates: int = 1,
    from_replay: bool = True,
) -> Callable:
    """The agent's update with numerical-fault protection, for `parallel.pmap_step(OUT_AXES)`.

    (state, guard, batch) -> (state, guard, info, out). An update whose loss
    or gradients (or, for an agent's whole `update`, new state) hold a NaN or
    inf is skipped: the state comes back bit for bit, the guard counts it, and
    its priorities are NaN (the priority updater drops them, so the items keep
    their old ones). A step that the agent skipped itself
    (`precision.CheckedGrads.finite` False) passes through. Metrics gain
    `nonfinite_skipped_steps`, `nonfinite_streak` and `lr_scale`.

    Args:
      builder: the agent.
      spec: the environment's spec.
      gradient_worker: False for a learner: the step applies the gradient,
        its trainable parameters moving `guard.lr_scale` of the way, and `out`
        is the parameters actors need, a buffer of its own that stays valid
        after the next step donates the state. True for a Gorila worker: the
        state keeps its parameters (the shards apply the gradient), and `out`
        is a `GradientOut`, whose scalars reach the host in one transfer.
      updates: a learner's updates per call (`BatchPlan.updates_per_dispatch`): the
        batch holds that many batches' rows, the guarded update runs on each in turn
        (`lax.scan`), priorities come back for every row in batch order, the metrics
        and parameters are the last update's.
      from_replay: the batch is the replay codec's decoded items, whose compact leaves
        (bfloat16 or float8 observations) become float32 here; False for a batch made on
        the device as the env gave it (an Anakin learner's rollout).
    """
    # Over 60 lines by its docstring, the step's contract, stated once here.
    if updates > 1 and gradient_worker:
        raise ValueError("a Gorila gradient worker pushes one gradient per call (updates=1)")
    update_fns = builder.update_fns(spec)
    # Observations replay keeps in bfloat16 or float8 become float32 here, on the
    # device, so that only the compact bytes cross from the host.
    expand = builder.replay_layout(spec).codec.expand if from_replay else lambda data: data

    def step(state, guard: NumericGuard, batch: builder_lib.SampledBatch):
        batch = batch._replace(data=expand(batch.data))
        new, grads, info, finite = _update(update_fns, state, batch, gradient_worker)
        if not gradient_worker:
            new = scale_trainable(builder, state, new, guard.lr_scale)
        new = precision.select_tree(finite, new, state)
        skipped = jnp.logical_not(finite).astype(jnp.int32)
        guard = NumericGuard(
            guard.skipped_steps + skipped, (guard.streak + 1) * skipped, guard.lr_scale
        )
        metrics = {
            **info.metrics,
            **demo_metrics(batch),
            "nonfinite_skipped_steps": guard.skipped_steps.astype(jnp.float32),
            "nonfinite_streak": guard.streak.astype(jnp.float32),
            "lr_scale": guard.lr_scale,
        }
        priorities = info.priorities
        if priorities is not None:
            priorities = jnp.where(finite, priorities, jnp.nan)
        info = builder_lib.StepInfo(priorities, metrics)
        if not gradient_worker:
            return new, guard, info, builder.state_access.actor_params(new)
        pushable = finite
        if isinstance(grads, precision.CheckedGrads):
            grads, pushable = grads.grads, finite & grads.finite
        return new, guard, info, GradientOut(grads, metrics["loss"], finite, pushable)

    return step if updates == 1 else _scanned(step, updates, builder)


def demo_metrics(batch: builder_lib.SampledBatch) -> dict[str, jax.Array]:
    """The share of the batch's rows that are demonstrations (`demo_share`), when it has any."""
    if batch.demo is None:
        return {}
    return {"demo_share": parallel.pmean(jnp.mean(batch.demo.astype(jnp.float32)))}


def _scanned(step: Callable, updates: int, builder: builder_lib.AgentBuilder) -> Callable:
    """`step` run `updates` times in one call, on consecutive slices of the batch's rows."""

    def multi_step(state, guard: NumericGuard, batch: builder_lib.SampledBatch):
        # This device's rows [i * b, (i + 1) * b) are its share of the i-th update's batch,
        # the order its priorities go back in.
        batches = jax.tree.map(lambda x: x.reshape((updates, -1) + x.shape[1:]), batch)

        def one(carry, one_batch):
            state, guard = carry
            state, guard, info, _ = step(state, guard, one_batch)
            return (state, guard), info

        (state, guard), infos = jax.lax.scan(one, (state, guard), batches)
        priorities = None if infos.priorities is None else infos.priorities.reshape(-1)
        metrics = jax.tree.map(lambda m: m[-1], infos.metrics)
        return (
            state,
            guard,
            builder_lib.StepInfo(priorities, metrics),
            builder.state_access.actor_params(state),
        )

    return multi_step
