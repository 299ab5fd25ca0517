"""DQN learning: the double-Q TD error, PER importance weights, and the update step.

The update is split in two per-device functions (`UpdateFns`): `compute_grads`
(loss, device-averaged and clipped gradients, new priorities) and
`apply_grads` (Adam, target copy), which is elementwise over parameters so
that a parameter-server shard could apply it to its slice.

Precision (`cfg.precision`): the network computes in bfloat16 or float16
while parameters, optimizer state, the loss and TD errors stay float32. In
fp16 the loss is scaled before differentiation; a step whose gradients
overflow is skipped (the state is left as it was, `step` included) and the
scale is halved (`gorila_jax.precision`).
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from agents.dqn import config as config_lib
from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision, types


class TrainState(NamedTuple):
    params: types.Params
    target_params: types.Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: updates applied so far; skipped fp16 steps do not count
    key: jax.Array
    loss_scale: precision.LossScale  # fp16's dynamic loss scale; stays 1 in fp32 and bf16


def double_q_td_error(q_tm1, a_tm1, r_t, discount_t, q_t_target, q_t_online) -> jax.Array:
    """Double Q-learning TD error of one transition (van Hasselt et al., 2016, eq. 4).

    Args:
      q_tm1: [A] online Q-values at the start state.
      a_tm1: [] action taken.
      r_t: [] (n-step) return.
      discount_t: [] bootstrap discount (0 at termination).
      q_t_target: [A] target-network Q-values at the bootstrap state.
      q_t_online: [A] online Q-values at the bootstrap state, which pick the action.
    """
    a_t = jnp.argmax(q_t_online)
    target_tm1 = jax.lax.stop_gradient(r_t + discount_t * q_t_target[a_t])
    return target_tm1 - q_tm1[a_tm1]


def importance_exponent(step: jax.Array, cfg: config_lib.DQNConfig) -> jax.Array:
    """PER beta: linear from `importance_exponent_start` to 1 (Schaul et al., 2016, sec. 3.4)."""
    fraction = jnp.clip(step / cfg.importance_exponent_anneal_steps, 0.0, 1.0)
    return cfg.importance_exponent_start + fraction * (1.0 - cfg.importance_exponent_start)


def importance_weights(probabilities, table_size, exponent) -> jax.Array:
    """(N * P(i))**-beta, normalised by the largest weight over *all* devices.

    A per-shard maximum would change the loss with the number of devices.
    """
    weights = (table_size.astype(jnp.float32) * probabilities.astype(jnp.float32)) ** -exponent
    return weights / parallel.pmax(jnp.max(weights))


def make_optimizer(cfg: config_lib.DQNConfig) -> optax.GradientTransformation:
    """Adam on a cosine learning-rate schedule; clipping happens in `compute_grads`."""
    schedule = optax.cosine_decay_schedule(
        cfg.learning_rate, cfg.learning_rate_decay_steps, alpha=cfg.learning_rate_final_fraction
    )
    return optax.adam(schedule, b1=cfg.adam_b1, eps=cfg.adam_eps)


def init_train_state(
    key, apply_init: Callable, optimizer, dummy_obs, cfg: config_lib.DQNConfig
) -> TrainState:
    init_key, state_key = jax.random.split(key)
    params = apply_init(init_key, dummy_obs)
    # Present in every mode, so the state (and a checkpoint of it) has one structure.
    loss_scale = precision.init_loss_scale(cfg.loss_scale_init if cfg.precision == "fp16" else 1.0)
    step = jnp.zeros((), jnp.int32)
    return TrainState(params, params, optimizer.init(params), step, state_key, loss_scale)


def clip_grads(grads: Any, cfg: config_lib.DQNConfig) -> Any:
    """Global-norm clip to `max_grad_norm`, or each layer to `layer_grad_norm` (`clip_mode`).

    Either needs whole gradients (a whole layer at least), so it happens in
    `compute_grads`: a parameter-server shard would only see a slice.
    """
    if cfg.clip_mode == "layer":
        return precision.clip_by_layer_norm(grads, cfg.layer_grad_norm)
    if cfg.clip_mode == "global":
        grads, _ = optax.clip_by_global_norm(cfg.max_grad_norm).update(grads, optax.EmptyState())
        return grads
    raise ValueError(f"config.clip_mode must be 'global' or 'layer', got {cfg.clip_mode!r}")


def _double_q_loss(apply_fn: Callable, cfg: config_lib.DQNConfig, params, state, batch):
    """The loss to differentiate (scaled in fp16), and (loss, td, q_tm1, beta)."""
    data: types.Transition = batch.data
    q_tm1 = apply_fn(params, data.observation)  # [B/D, A]
    q_t_target = apply_fn(state.target_params, data.next_observation)
    q_t_online = jax.lax.stop_gradient(apply_fn(params, data.next_observation))
    td = jax.vmap(double_q_td_error)(
        q_tm1, data.action, data.reward, data.discount, q_t_target, q_t_online
    )
    beta = importance_exponent(state.step, cfg)
    weights = importance_weights(batch.probabilities, batch.table_size, beta)
    loss = jnp.mean(weights * optax.huber_loss(td, delta=cfg.huber_delta))
    scaled = precision.scale_loss(loss, state.loss_scale) if cfg.precision == "fp16" else loss
    return scaled, (loss, td, q_tm1, beta)


def demo_margin_loss(q: jax.Array, action: jax.Array, demo: jax.Array, margin: float) -> jax.Array:
    """DQfD's large-margin loss (Hester et al., 2018), averaged over the demonstration rows:
    max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E), a_E the demonstrated action.

    It is 0 where a_E leads every other action by at least `margin`; it pushes the
    others below a_E, so that the greedy policy imitates the demonstrator where
    the TD loss alone says little (actions the demonstrator never took).

    Args:
      q: [B, A] action values; action: [B] demonstrated actions; demo: [B] bool
        the demonstration rows (the rest do not count).
    """
    penalty = margin * (1.0 - jax.nn.one_hot(action, q.shape[-1], dtype=q.dtype))
    taken = jnp.take_along_axis(q, action[:, None].astype(jnp.int32), axis=-1)[:, 0]
    per_row = jnp.max(q + penalty, axis=-1) - taken
    rows = demo.astype(q.dtype)
    return jnp.sum(rows * per_row) / jnp.maximum(jnp.sum(rows), 1.0)


def with_demo_margin(loss_fn: Callable, cfg: config_lib.DQNConfig) -> Callable:
    """`loss_fn` plus `cfg.demo_margin_weight` times DQfD's margin loss on the batch's
    demonstration rows (none without them), on the action values the loss returns."""

    def loss(params, state, batch):
        scaled, (value, td, q_tm1, beta) = loss_fn(params, state, batch)
        if batch.demo is None:
            return scaled, (value, td, q_tm1, beta)
        margin = cfg.demo_margin_weight * demo_margin_loss(
            q_tm1, batch.data.action, batch.demo, cfg.demo_margin
        )
        if cfg.precision == "fp16":
            scaled = scaled + precision.scale_loss(margin, state.loss_scale)
        else:
            scaled = scaled + margin
        return scaled, (value + margin, td, q_tm1, beta)

    return loss


def _compute_grads(loss_fn: Callable, cfg: config_lib.DQNConfig, state: TrainState, batch):
    """Device-averaged, clipped gradients with their finiteness, and the new priorities."""
    dynamic_scale = cfg.precision == "fp16"
    (_, (loss, td, q_tm1, beta)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state, batch
    )
    grads = parallel.pmean(grads)
    finite = jnp.array(True)
    if dynamic_scale:
        grads = precision.unscale_grads(grads, state.loss_scale)
        finite = precision.all_finite(grads)
    grad_norm = optax.tree.norm(grads)
    metrics = {
        "loss": loss,
        "abs_td": jnp.mean(jnp.abs(td)),
        "q_mean": jnp.mean(q_tm1),
        "grad_norm": grad_norm,
        "importance_exponent": beta,
    }
    if batch.demo is not None:
        metrics["demo_margin_loss"] = demo_margin_loss(
            q_tm1, batch.data.action, batch.demo, cfg.demo_margin
        )
    if dynamic_scale:
        skipped = jnp.logical_not(finite).astype(jnp.float32)
        metrics["loss_scale"] = state.loss_scale.scale
        metrics["skipped"] = skipped
        metrics["skipped_steps"] = state.loss_scale.skipped_steps + skipped
    priorities = jnp.abs(td) + cfg.priority_epsilon
    grads = precision.CheckedGrads(clip_grads(grads, cfg), finite)
    return grads, builder_lib.StepInfo(priorities=priorities, metrics=parallel.pmean(metrics))


def _apply_grads(
    optimizer: optax.GradientTransformation,
    cfg: config_lib.DQNConfig,
    state: TrainState,
    grads: precision.CheckedGrads,
) -> TrainState:
    """Adam, then the periodic target copy; in fp16 a step with overflowed gradients is skipped."""
    updates, opt_state = optimizer.update(grads.grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step = state.step + 1
    target_params = optax.periodic_update(
        params, state.target_params, step, cfg.target_update_period
    )
    key, _ = jax.random.split(state.key)
    new = TrainState(params, target_params, opt_state, step, key, state.loss_scale)
    if cfg.precision != "fp16":
        return new
    # A skipped step leaves `step` too, so the importance-exponent anneal and
    # the target period count applied updates, as Adam's own step count does.
    new = precision.select_tree(grads.finite, new, state)
    loss_scale = precision.update_loss_scale(state.loss_scale, grads.finite, cfg.loss_scale_period)
    return new._replace(loss_scale=loss_scale)


def _track_grads(
    cfg: config_lib.DQNConfig, state: TrainState, grads: precision.CheckedGrads
) -> TrainState:
    # A Gorila worker's loss scale follows its own gradients, as a learner's does.
    loss_scale = precision.update_loss_scale(state.loss_scale, grads.finite, cfg.loss_scale_period)
    return state._replace(loss_scale=loss_scale)


def make_update_fns(
    apply_fn: Callable,
    optimizer: optax.GradientTransformation,
    cfg: config_lib.DQNConfig,
    loss: Callable = _double_q_loss,
) -> builder_lib.UpdateFns:
    """Returns (compute_grads, apply_grads); both run per device under the learner's pmap.

    `compute_grads` returns `precision.CheckedGrads`: the gradients and whether
    they are finite on all devices. Only fp16 ever skips a step.

    Args:
      loss: `loss(apply_fn, cfg, params, state, batch) -> (loss to differentiate,
        (loss, td [B], q values, importance exponent))`, double DQN's by default;
        a variant of DQN (QR-DQN) passes its own and keeps the rest of the update.
    """
    loss_fn = functools.partial(loss, apply_fn, cfg)
    if cfg.demo_margin_weight:
        loss_fn = with_demo_margin(loss_fn, cfg)
    track_grads = functools.partial(_track_grads, cfg) if cfg.precision == "fp16" else None
    return builder_lib.UpdateFns(
        functools.partial(_compute_grads, loss_fn, cfg),
        functools.partial(_apply_grads, optimizer, cfg),
        track_grads=track_grads,
    )


def with_shard_params(
    state: TrainState, params: types.Params, step: int, target_update_period: int
) -> TrainState:
    """A Gorila worker's state on parameters pulled from the shards at global `step`.

    The target copy follows the same rule as `apply_grads`: it takes the
    parameters of every step that is a multiple of the period. A worker that
    skipped past such a step (it pulls every few updates) copies at the first
    pull after it, so the target is never more than one period old.
    """
    crossed = step // target_update_period > int(state.step) // target_update_period
    target_params = params if crossed or step == 0 else state.target_params
    return state._replace(params=params, target_params=target_params, step=jnp.int32(step))
