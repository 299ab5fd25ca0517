"""DQN learning: the double-Q TD error, PER importance weights, and the update step.

The update is split in two per-device functions (`UpdateFns`): `compute_grads`
(loss, device-averaged and globally clipped gradients, new priorities) and
`apply_grads` (Adam, target copy), which is elementwise over parameters so
that a parameter-server shard could apply it to its slice.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from agents.dqn import config as config_lib
from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types


class TrainState(NamedTuple):
    params: types.Params
    target_params: types.Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: updates applied so far
    key: jax.Array


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
    return optax.adam(schedule, eps=cfg.adam_eps)


def init_train_state(key, apply_init: Callable, optimizer, dummy_obs) -> TrainState:
    init_key, state_key = jax.random.split(key)
    params = apply_init(init_key, dummy_obs)
    return TrainState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32), state_key)


def make_update_fns(
    apply_fn: Callable, optimizer: optax.GradientTransformation, cfg: config_lib.DQNConfig
) -> builder_lib.UpdateFns:
    """Returns (compute_grads, apply_grads); both run per device under the learner's pmap."""

    def loss_fn(params, state: TrainState, batch: builder_lib.SampledBatch):
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
        return loss, (td, q_tm1, beta)

    def compute_grads(state: TrainState, batch: builder_lib.SampledBatch):
        (loss, (td, q_tm1, beta)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state, batch
        )
        grads = parallel.pmean(grads)
        # Clip whole gradients here: a parameter-server shard would only see a slice.
        grad_norm = optax.global_norm(grads)
        grads, _ = optax.clip_by_global_norm(cfg.max_grad_norm).update(grads, optax.EmptyState())
        metrics = parallel.pmean(
            {
                "loss": loss,
                "abs_td": jnp.mean(jnp.abs(td)),
                "q_mean": jnp.mean(q_tm1),
                "grad_norm": grad_norm,
                "importance_exponent": beta,
            }
        )
        priorities = jnp.abs(td) + cfg.priority_epsilon
        return grads, builder_lib.StepInfo(priorities=priorities, metrics=metrics)

    def apply_grads(state: TrainState, grads: Any) -> TrainState:
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        target_params = optax.periodic_update(
            params, state.target_params, step, cfg.target_update_period
        )
        key, _ = jax.random.split(state.key)
        return TrainState(params, target_params, opt_state, step, key)

    return builder_lib.UpdateFns(compute_grads, apply_grads)
