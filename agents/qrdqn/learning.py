"""QR-DQN learning: the quantile Huber loss on double-DQN targets, and the update step.

Only the loss is QR-DQN's own. The train state, PER importance weights, the
optimizer, gradient clipping, the target copy and fp16's loss scaling are
DQN's (`agents.dqn.learning`): a quantile head changes what is regressed,
not how an update is applied, so the Gorila shards apply it as they apply DQN's.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from agents.dqn import learning as dqn_learning
from agents.qrdqn import config as config_lib
from gorila_jax import builder as builder_lib
from gorila_jax import precision, types

TrainState = dqn_learning.TrainState


def quantile_midpoints(num_quantiles: int) -> jax.Array:
    """tau_i = (2i + 1) / 2N: the quantile levels N equal-weight atoms minimize (Lemma 2)."""
    return (2.0 * jnp.arange(num_quantiles) + 1.0) / (2.0 * num_quantiles)


def quantile_huber_loss(
    predicted: jax.Array, target: jax.Array, taus: jax.Array, kappa: float
) -> jax.Array:
    """The quantile Huber loss of one distribution (Dabney et al., 2018, eq. 10).

    sum_i mean_j |tau_i - 1{u_ij < 0}| * L_kappa(u_ij) / kappa, u_ij = target_j - predicted_i.

    Args:
      predicted: [N] quantiles being learned, at levels `taus`.
      target: [M] samples of the target distribution (gradients do not flow into them).
      taus: [N] the quantile level of each prediction.
      kappa: the Huber threshold; the loss is quadratic for |u| <= kappa.
    """
    u = jax.lax.stop_gradient(target)[None, :] - predicted[:, None]  # [N, M]
    huber = optax.huber_loss(u, delta=kappa)
    # Over-estimates (u < 0) weigh 1 - tau, under-estimates tau: the minimizer is the tau-quantile.
    weight = jnp.abs(taus[:, None] - (u < 0).astype(u.dtype))
    return jnp.sum(jnp.mean(weight * huber / kappa, axis=1))


def double_q_quantile_target(r_t, discount_t, quantiles_t_target, quantiles_t_online):
    """[N] target quantiles: r + gamma * Z_target(s', a*), a* greedy for the online mean.

    Args:
      r_t: [] (n-step) return.
      discount_t: [] bootstrap discount (0 at termination).
      quantiles_t_target: [A, N] target-network quantiles at the bootstrap state.
      quantiles_t_online: [A, N] online quantiles there, which pick the action (double DQN).
    """
    a_t = jnp.argmax(quantiles_t_online.mean(axis=-1))
    return jax.lax.stop_gradient(r_t + discount_t * quantiles_t_target[a_t])


def _quantile_loss(apply_fn: Callable, cfg: config_lib.QRDQNConfig, params, state, batch):
    """The loss to differentiate (scaled in fp16), and (loss, td, q_tm1, beta)."""
    data: types.Transition = batch.data
    quantiles_tm1 = apply_fn(params, data.observation)  # [B/D, A, N]
    quantiles_t_target = apply_fn(state.target_params, data.next_observation)
    quantiles_t_online = jax.lax.stop_gradient(apply_fn(params, data.next_observation))
    target = jax.vmap(double_q_quantile_target)(
        data.reward, data.discount, quantiles_t_target, quantiles_t_online
    )  # [B/D, N]
    chosen = jnp.take_along_axis(quantiles_tm1, data.action[:, None, None], axis=1)[:, 0]
    taus = quantile_midpoints(cfg.num_quantiles)
    per_item = jax.vmap(quantile_huber_loss, in_axes=(0, 0, None, None))(
        chosen, target, taus, cfg.huber_delta
    )
    # The TD error of the means, what DQN's priorities and metrics read.
    td = target.mean(axis=-1) - chosen.mean(axis=-1)
    beta = dqn_learning.importance_exponent(state.step, cfg)
    weights = dqn_learning.importance_weights(batch.probabilities, batch.table_size, beta)
    loss = jnp.mean(weights * per_item)
    scaled = precision.scale_loss(loss, state.loss_scale) if cfg.precision == "fp16" else loss
    return scaled, (loss, td, quantiles_tm1.mean(axis=-1), beta)


def make_update_fns(
    apply_fn: Callable, optimizer: optax.GradientTransformation, cfg: config_lib.QRDQNConfig
) -> builder_lib.UpdateFns:
    """DQN's update functions on the quantile loss.

    Gradients, clipping, priorities, metrics, `apply_grads` (Adam, the target
    copy, fp16's skip) and `track_grads` are DQN's as they are: only the loss
    differs.
    """
    return dqn_learning.make_update_fns(apply_fn, optimizer, cfg, loss=_quantile_loss)
