"""SAC learning: the tanh-squashed Gaussian, the three losses and the update step.

One learner step (Haarnoja et al., 2018b, algorithm 1) runs per device under
the learner's pmap: the twin critics take a gradient step towards the soft
Bellman target, the policy a step on the updated critics, the temperature a
step towards the target entropy, then the target critics a Polyak step every
`target_update_period` updates. Every gradient, the temperature's included,
is averaged over all learner devices, so every device holds the same
parameters and the same global alpha.

Three optimizers make this one `update` function rather than SAC as a
(compute_grads, apply_grads) pair: the synchronous learner runs it; Gorila's
parameter-server mode needs the pair and does not run SAC.

Actions are handled in [-1, 1] (the tanh's range); replay holds env-scale
actions, mapped with `to_unit_interval`.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.sac import config as config_lib
from agents.sac import networks as networks_lib
from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types


class TrainState(NamedTuple):
    policy_params: types.Params
    critic_params: types.Params  # both critics
    target_critic_params: types.Params
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    log_alpha: jax.Array  # [] float32: log of the temperature, the same on every device
    alpha_opt_state: optax.OptState
    step: jax.Array  # [] int32: updates applied so far
    key: jax.Array


class Optimizers(NamedTuple):
    policy: optax.GradientTransformation
    critic: optax.GradientTransformation
    alpha: optax.GradientTransformation


def make_optimizers(cfg: config_lib.SACConfig) -> Optimizers:
    return Optimizers(
        optax.adam(cfg.actor_learning_rate),
        optax.adam(cfg.critic_learning_rate),
        optax.adam(cfg.alpha_learning_rate),
    )


def log_one_minus_tanh_squared(u: jax.Array) -> jax.Array:
    """log(1 - tanh(u)**2), stable where tanh(u) rounds to +-1 (SpinningUp's identity)."""
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


def tanh_gaussian_log_prob(u: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """log-density of the action tanh(u), where u ~ N(mean, exp(log_std)**2) per dimension.

    The change of variables (Haarnoja et al., 2018a, appendix C, eq. 21):
    log pi(a) = sum_i [log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)**2)].

    Args:
      u: [..., A] pre-tanh sample.
      mean, log_std: [..., A] parameters of the Gaussian.

    Returns:
      [...] log-density of tanh(u) in [-1, 1]^A.
    """
    z = (u - mean) * jnp.exp(-log_std)
    gaussian = -0.5 * z**2 - log_std - 0.5 * math.log(2.0 * math.pi)
    return jnp.sum(gaussian - log_one_minus_tanh_squared(u), axis=-1)


def sample_tanh_gaussian(mean, log_std, noise) -> tuple[jax.Array, jax.Array]:
    """Reparameterised action tanh(mean + std * noise) in [-1, 1] and its log-density.

    Args:
      mean, log_std, noise: [B, A]; noise is standard normal.

    Returns:
      (action [B, A], log_prob [B]).
    """
    u = mean + jnp.exp(log_std) * noise
    return jnp.tanh(u), tanh_gaussian_log_prob(u, mean, log_std)


def to_unit_interval(action, low, high):
    """Env-scale actions in [low, high] -> [-1, 1]."""
    return 2.0 * (action - low) / (high - low) - 1.0


def from_unit_interval(unit, low, high):
    """[-1, 1] -> env-scale actions in [low, high]."""
    return low + 0.5 * (unit + 1.0) * (high - low)


def shard_noise(key: jax.Array, local_shape: tuple[int, ...]) -> jax.Array:
    """Standard normal noise for this device's rows of the global batch.

    Drawn for the whole global batch from the (replicated) key, then sliced:
    item i gets the same noise whatever the number of learner devices, so a
    sharded update equals the one-device update on the full batch.
    """
    rows = local_shape[0]
    noise = jax.random.normal(key, (parallel.step_device_count() * rows, *local_shape[1:]))
    return jax.lax.dynamic_slice_in_dim(noise, parallel.device_index() * rows, rows)


def init_train_state(
    key: jax.Array,
    networks: networks_lib.SACNetworks,
    optimizers: Optimizers,
    spec: types.EnvSpec,
    cfg: config_lib.SACConfig,
) -> TrainState:
    policy_key, critic_key, state_key = jax.random.split(key, 3)
    obs = jnp.zeros((1, *spec.observation_shape), jnp.float32)
    action = jnp.zeros((1, *spec.action_shape), jnp.float32)
    policy_params = networks.policy.init(policy_key, obs)
    critic_params = networks.critic.init(critic_key, obs, action)
    log_alpha = jnp.asarray(math.log(cfg.initial_alpha), jnp.float32)
    return TrainState(
        policy_params=policy_params,
        critic_params=critic_params,
        target_critic_params=critic_params,
        policy_opt_state=optimizers.policy.init(policy_params),
        critic_opt_state=optimizers.critic.init(critic_params),
        log_alpha=log_alpha,
        alpha_opt_state=optimizers.alpha.init(log_alpha),
        step=jnp.zeros((), jnp.int32),
        key=state_key,
    )


def critic_loss(
    critic_params, state: TrainState, networks, data: types.Transition, action, alpha, noise
):
    """Soft Bellman residual of both critics (Haarnoja et al., 2018b, eqs. 5-6).

    y = r + discount * (min_k Q_target_k(s', a') - alpha * log pi(a'|s')), a' ~ pi(.|s').
    `data.reward` and `data.discount` are the n-step return and gamma**n (0 at a
    termination), as actors write them.
    """
    mean, log_std = networks.policy.apply(state.policy_params, data.next_observation)
    next_action, next_log_prob = sample_tanh_gaussian(mean, log_std, noise)
    q_target = networks.critic.apply(state.target_critic_params, data.next_observation, next_action)
    soft_value = jnp.min(q_target, axis=0) - alpha * next_log_prob  # [B/D]
    target = jax.lax.stop_gradient(data.reward + data.discount * soft_value)
    q = networks.critic.apply(critic_params, data.observation, action)  # [2, B/D]
    return jnp.mean(jnp.sum((q - target) ** 2, axis=0)), q


def policy_loss(policy_params, critic_params, networks, observation, alpha, noise):
    """E[alpha * log pi(a|s) - min_k Q_k(s, a)], a reparameterised (Haarnoja et al., 2018b, eq. 7).

    Returns:
      (loss, log pi(a|s) [B/D]); the temperature step reuses the log-probabilities.
    """
    mean, log_std = networks.policy.apply(policy_params, observation)
    action, log_prob = sample_tanh_gaussian(mean, log_std, noise)
    q = jnp.min(networks.critic.apply(critic_params, observation, action), axis=0)
    return jnp.mean(alpha * log_prob - q), log_prob


def alpha_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """alpha * E[-log pi - target entropy] (Haarnoja et al., 2018b, eq. 18), in log(alpha).

    Its gradient lowers alpha while the policy's entropy is above the target
    and raises it while it is below.
    """
    return jnp.exp(log_alpha) * jnp.mean(jax.lax.stop_gradient(-log_prob - target_entropy))


def _adam_step(optimizer, grads, opt_state, params):
    """One optimizer step on gradients already averaged over devices."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _critic_step(state: TrainState, networks, optimizer, data, action, alpha, key):
    """(critic params, their optimizer state, loss, Q-values [2, B/D]) after one step."""
    noise = shard_noise(key, action.shape)
    (loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(
        state.critic_params, state, networks, data, action, alpha, noise
    )
    params, opt_state = _adam_step(
        optimizer, parallel.pmean(grads), state.critic_opt_state, state.critic_params
    )
    return params, opt_state, loss, q


def _policy_step(state: TrainState, networks, optimizer, critic_params, obs, alpha, noise):
    """(policy params, their optimizer state, loss, log pi [B/D]) after one step."""
    (loss, log_prob), grads = jax.value_and_grad(policy_loss, has_aux=True)(
        state.policy_params, critic_params, networks, obs, alpha, noise
    )
    params, opt_state = _adam_step(
        optimizer, parallel.pmean(grads), state.policy_opt_state, state.policy_params
    )
    return params, opt_state, loss, log_prob


def temperature_step(state: TrainState, optimizer, log_prob, target_entropy):
    """(log alpha, its optimizer state, loss): one step on the global mean gradient.

    The gradient is averaged over all devices, so every device takes the same
    step and holds the same alpha: the temperature of the whole batch, not of a shard.
    """
    loss, grad = jax.value_and_grad(alpha_loss)(state.log_alpha, log_prob, target_entropy)
    log_alpha, opt_state = _adam_step(
        optimizer, parallel.pmean(grad), state.alpha_opt_state, state.log_alpha
    )
    return log_alpha, opt_state, loss


def _target_critics(critic_params, target_critic_params, step, cfg: config_lib.SACConfig):
    """Polyak-averaged target critics, moved every `target_update_period` steps."""
    return optax.periodic_update(
        optax.incremental_update(critic_params, target_critic_params, cfg.tau),
        target_critic_params,
        step,
        cfg.target_update_period,
    )


def make_update_fns(
    networks: networks_lib.SACNetworks,
    optimizers: Optimizers,
    spec: types.EnvSpec,
    cfg: config_lib.SACConfig,
) -> builder_lib.UpdateFns:
    """SAC's per-device `update(state, SampledBatch) -> (state, StepInfo)` (see module doc)."""
    low = np.asarray(spec.action_low, np.float32)
    high = np.asarray(spec.action_high, np.float32)
    target_entropy = cfg.target_entropy(spec.action_shape[0])

    def update(state: TrainState, batch: builder_lib.SampledBatch):
        data: types.Transition = batch.data
        key, critic_key, policy_key = jax.random.split(state.key, 3)
        action = to_unit_interval(data.action.astype(jnp.float32), low, high)  # [B/D, A]
        alpha = jnp.exp(state.log_alpha)
        critic_params, critic_opt_state, q_loss, q = _critic_step(
            state, networks, optimizers.critic, data, action, alpha, critic_key
        )
        # The policy follows the critics just updated (SpinningUp's order).
        policy_params, policy_opt_state, pi_loss, log_prob = _policy_step(
            state,
            networks,
            optimizers.policy,
            critic_params,
            data.observation,
            alpha,
            shard_noise(policy_key, action.shape),
        )
        log_alpha, alpha_opt_state, temperature_loss = temperature_step(
            state, optimizers.alpha, log_prob, target_entropy
        )
        step = state.step + 1
        target_critic_params = _target_critics(critic_params, state.target_critic_params, step, cfg)
        new_state = TrainState(
            policy_params,
            critic_params,
            target_critic_params,
            policy_opt_state,
            critic_opt_state,
            log_alpha,
            alpha_opt_state,
            step,
            key,
        )
        metrics = {
            "loss": q_loss,  # the critics' loss: what a diverging run shows first
            "policy_loss": pi_loss,
            "alpha_loss": temperature_loss,
            "alpha": alpha,
            "entropy": -jnp.mean(log_prob),
            "q_mean": jnp.mean(q),
        }
        return new_state, builder_lib.StepInfo(priorities=None, metrics=parallel.pmean(metrics))

    return builder_lib.UpdateFns(compute_grads=None, apply_grads=None, update=update)
