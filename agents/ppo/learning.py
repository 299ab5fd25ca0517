"""PPO learning: V-trace-corrected GAE, the clipped surrogate, and the learner step.

One learner step (`make_update_fns(...).update`, run per device under the
learner's pmap) on a batch of trajectory chunks:
1. values and log-probabilities of the current ("start") policy for every step;
2. truncated importance weights between the start policy and the behaviour
   policy that acted (the actor may be a few parameter versions behind), and
   with them V-trace targets and advantages in GAE form (`vtrace_gae`);
3. `num_epochs` passes of `num_minibatches` shuffled minibatches of the
   clipped-surrogate loss with value clipping and an entropy bonus, each
   gradient summed over devices (the loss is a mean over the *global*
   minibatch, so the update does not depend on the device count);
4. per-actor KL between each actor's behaviour policy and the updated policy.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from agents.ppo import config as config_lib
from agents.ppo import networks, normalization
from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types


class ActorParams(NamedTuple):
    """What actors act with: the network and the observation statistics."""

    params: types.Params
    obs_stats: normalization.RunningStats


class PolicyExtras(NamedTuple):
    """What the acting policy records with each step ([E] or [E, D] per leaf)."""

    log_prob: jax.Array  # behaviour log-probability of raw_action
    value: jax.Array  # the behaviour policy's value estimate (reported, not learned from)
    raw_action: jax.Array  # the sampled action before clipping to the env's bounds


class TrainState(NamedTuple):
    params: types.Params
    opt_state: optax.OptState
    obs_stats: normalization.RunningStats
    step: jax.Array  # int32: learner steps so far (= the version actors record)
    key: jax.Array


def importance_weights(target_log_prob: jax.Array, behaviour_log_prob: jax.Array, bar: float):
    """min(bar, pi(a|s) / mu(a|s)): V-trace's truncated importance weights."""
    return jnp.minimum(bar, jnp.exp(target_log_prob - behaviour_log_prob))


def vtrace_gae(
    values: jax.Array,
    rewards: jax.Array,
    terminated: jax.Array,
    ended: jax.Array,
    rhos: jax.Array,
    cs: jax.Array,
    pg_rhos: jax.Array,
    discount: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """V-trace value targets and policy-gradient advantages of one chunk, in GAE form.

    With all weights 1 (on-policy data) the advantages are GAE(lambda)
    (Schulman et al., 2016) and the targets GAE + V, the lambda-returns. With
    weights, they are V-trace's (Espeholt et al., 2018, eq. 1, with lambda as
    in rlax.vtrace_td_error_and_advantage):
      delta_t = rho_t (r_t + g_t V_{t+1} - V_t),  g_t = discount * (1 - terminated_t)
      A_t = delta_t + discount * lambda * (1 - ended_t) c_t A_{t+1},  A_T = 0
      target_t = V_t + A_t
      pg_advantage_t = pg_rho_t (r_t + g_t (V_{t+1} + lambda (1 - ended_t) A_{t+1}) - V_t)
    A truncated step (ended, not terminated) bootstraps from V_{t+1}, the value
    of its episode's last observation, and cuts the trace there.

    Args:
      values: [T + 1] V of each step's observation and of the one after the last.
      rewards, terminated, ended: [T]; ended = terminated or truncated.
      rhos, cs, pg_rhos: [T] truncated importance weights (rho-bar, c-bar, the
        policy-gradient weights).

    Returns:
      (targets [T], pg_advantages [T]).
    """
    terminated = terminated.astype(jnp.float32)
    continues = 1.0 - ended.astype(jnp.float32)
    bootstrap = discount * (1.0 - terminated)
    deltas = rhos * (rewards + bootstrap * values[1:] - values[:-1])
    trace = discount * lam * continues * cs

    def backward(advantage_next, step):
        delta, trace_t = step
        advantage = delta + trace_t * advantage_next
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.float32(0.0), (deltas, trace), reverse=True)
    next_advantages = jnp.concatenate([advantages[1:], jnp.zeros(1, advantages.dtype)])
    q = rewards + bootstrap * (values[1:] + lam * continues * next_advantages)
    return values[:-1] + advantages, pg_rhos * (q - values[:-1])


def approx_kl(log_ratio: jax.Array) -> jax.Array:
    """KL(mu || pi) per sample a ~ mu, from log(pi(a) / mu(a)): (r - 1) - log r (Schulman's k3).

    Unbiased, never negative, and exact to second order; needs only the two
    log-probabilities an actor and the learner have for each step.
    """
    return jnp.expm1(log_ratio) - log_ratio


def _masked_mean(x: jax.Array, mask: jax.Array, global_count: jax.Array) -> jax.Array:
    """This device's share of the mean over all devices' valid entries (psum to finish)."""
    return jnp.sum(jnp.where(mask, x, 0.0)) / global_count


def learning_rate(step: jax.Array, cfg: config_lib.PPOConfig) -> jax.Array:
    if not cfg.learning_rate_decay_updates:
        return jnp.float32(cfg.learning_rate)
    remaining = 1.0 - step.astype(jnp.float32) / cfg.learning_rate_decay_updates
    return cfg.learning_rate * jnp.clip(remaining, 0.0, 1.0)


def make_optimizer(cfg: config_lib.PPOConfig) -> optax.GradientTransformation:
    """Clip, then Adam's direction; the step size (which may decay) is applied in the update."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm), optax.scale_by_adam(eps=cfg.adam_eps)
    )


def init_train_state(
    key: jax.Array,
    init_fn: Callable,
    spec: types.EnvSpec,
    cfg: config_lib.PPOConfig,
) -> TrainState:
    init_key, state_key = jax.random.split(key)
    params = init_fn(init_key, jnp.asarray(spec.zeros_observation(1)))
    return TrainState(
        params=params,
        opt_state=make_optimizer(cfg).init(params),
        obs_stats=normalization.init_stats(spec.observation_shape),
        step=jnp.zeros((), jnp.int32),
        key=state_key,
    )


class _Steps(NamedTuple):
    """The batch flattened to steps [N, ...], with what the epochs learn from."""

    observation: jax.Array
    raw_action: jax.Array
    start_log_prob: jax.Array
    start_value: jax.Array
    target: jax.Array
    advantage: jax.Array
    valid: jax.Array


def _flat(x: jax.Array) -> jax.Array:
    return x.reshape((-1,) + x.shape[2:])


def _tree_where(condition, new, old):
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), new, old)


def _normalized_advantages(advantage: jax.Array, valid: jax.Array, global_count: jax.Array):
    """`advantage` standardized with the mean and variance of the global minibatch's valid steps."""
    mean = parallel.psum(_masked_mean(advantage, valid, global_count))
    var = parallel.psum(_masked_mean((advantage - mean) ** 2, valid, global_count))
    return (advantage - mean) / (jnp.sqrt(var) + 1e-8)


def _surrogate_loss(
    network, distribution, cfg: config_lib.PPOConfig, params, steps: _Steps, global_count
):
    """This device's share of the global minibatch's loss, and of its metrics' means.

    The clipped surrogate with value clipping and an entropy bonus; each share
    is a sum over this device's valid steps divided by `global_count`, so that
    psum-ing the shares (and the gradients) gives global means.
    """
    inputs, values = network.apply(params, steps.observation)
    log_prob = distribution.log_prob(inputs, steps.raw_action)
    log_ratio = log_prob - steps.start_log_prob
    ratio = jnp.exp(log_ratio)
    advantage = steps.advantage
    if cfg.normalize_advantages:
        advantage = _normalized_advantages(advantage, steps.valid, global_count)
    clipped_ratio = jnp.clip(ratio, 1.0 - cfg.clip_epsilon, 1.0 + cfg.clip_epsilon)
    pg_loss = -jnp.minimum(ratio * advantage, clipped_ratio * advantage)
    value_loss = (values - steps.target) ** 2
    if cfg.value_clip_epsilon:
        clipped = steps.start_value + jnp.clip(
            values - steps.start_value, -cfg.value_clip_epsilon, cfg.value_clip_epsilon
        )
        value_loss = jnp.maximum(value_loss, (clipped - steps.target) ** 2)
    value_loss = 0.5 * value_loss
    entropy = distribution.entropy(inputs)
    total = pg_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
    parts = {
        "pg_loss": pg_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl(log_ratio),
        "clip_fraction": (jnp.abs(ratio - 1.0) > cfg.clip_epsilon).astype(jnp.float32),
    }
    shares = {name: _masked_mean(x, steps.valid, global_count) for name, x in parts.items()}
    return _masked_mean(total, steps.valid, global_count), shares


def _minibatch_step(loss_fn: Callable, optimizer, kl_target: float, carry, minibatch: _Steps):
    """One gradient step on a minibatch (a `lax.scan` body over an epoch's minibatches)."""
    params, opt_state, lr, keep_going = carry
    global_count = jnp.maximum(parallel.psum(jnp.sum(minibatch.valid)), 1)
    (loss, shares), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, minibatch, global_count
    )
    loss, shares, grads = parallel.psum((loss, shares, grads))
    # SB3's rule: a minibatch whose policy has drifted too far from the
    # start policy is not learned from, and neither is anything after it.
    if kl_target:
        keep_going = keep_going & (shares["approx_kl"] <= 1.5 * kl_target)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    params = _tree_where(keep_going, new_params, params)
    opt_state = _tree_where(keep_going, new_opt_state, opt_state)
    metrics = {"loss": loss, **shares, "applied": keep_going.astype(jnp.float32)}
    return (params, opt_state, lr, keep_going), metrics


def _epoch(minibatch_step: Callable, num_minibatches: int, carry, key: jax.Array):
    """One pass over this device's steps in shuffled minibatches (a `lax.scan` body over epochs)."""
    params, opt_state, lr, keep_going, steps = carry
    order = jax.random.permutation(key, steps.valid.shape[0])
    minibatches = jax.tree.map(
        lambda x: x[order].reshape((num_minibatches, -1) + x.shape[1:]), steps
    )
    (params, opt_state, lr, keep_going), metrics = jax.lax.scan(
        minibatch_step, (params, opt_state, lr, keep_going), minibatches
    )
    return (params, opt_state, lr, keep_going, steps), metrics


def _learning_steps(
    network, distribution, cfg: config_lib.PPOConfig, state: TrainState, traj: types.Trajectory
) -> tuple[normalization.RunningStats, _Steps, jax.Array]:
    """What the epochs learn from: the batch's steps with their V-trace targets and advantages.

    Returns:
      (observation statistics merged with the batch's if the config normalizes
      observations, the steps [N, ...], the start policy's log-probabilities
      of the actions [b, T]).
    """
    extras: PolicyExtras = traj.extras
    length = traj.reward.shape[1]
    obs_stats = state.obs_stats
    if cfg.normalize_observations:
        obs_stats = normalization.updated_stats(obs_stats, traj.observation[:, :length])
    # [b, T + 1, ...]
    observations = normalization.prepare_observations(traj.observation, obs_stats, cfg)
    values, start_log_prob = evaluate_chunks(
        network, distribution, state.params, observations, extras.raw_action
    )
    rhos = importance_weights(start_log_prob, extras.log_prob, cfg.rho_bar)
    cs = importance_weights(start_log_prob, extras.log_prob, cfg.c_bar)
    ended = traj.terminated | traj.truncated
    chunk_targets = functools.partial(vtrace_gae, discount=cfg.discount, lam=cfg.gae_lambda)
    targets, advantages = jax.vmap(chunk_targets)(
        values, traj.reward * cfg.reward_scale, traj.terminated, ended, rhos, cs, rhos
    )
    steps = _Steps(
        observation=_flat(observations[:, :length]),
        raw_action=_flat(extras.raw_action),
        start_log_prob=_flat(start_log_prob),
        start_value=_flat(values[:, :length]),
        target=_flat(targets),
        advantage=_flat(advantages),
        valid=_flat(traj.valid),
    )
    return obs_stats, steps, start_log_prob


def make_update_fns(
    network: networks.ActorCritic,
    distribution: Any,
    cfg: config_lib.PPOConfig,
) -> builder_lib.UpdateFns:
    """The PPO learner step as `UpdateFns.update` (several gradient steps: update-only)."""
    loss_fn = functools.partial(_surrogate_loss, network, distribution, cfg)
    minibatch_step = functools.partial(_minibatch_step, loss_fn, make_optimizer(cfg), cfg.kl_target)
    epoch = functools.partial(_epoch, minibatch_step, cfg.num_minibatches)

    def update(state: TrainState, batch: builder_lib.SampledBatch):
        traj: types.Trajectory = batch.data
        obs_stats, steps, start_log_prob = _learning_steps(network, distribution, cfg, state, traj)
        key, shuffle_key = jax.random.split(state.key)
        # Each device shuffles its own steps differently.
        shuffle_key = jax.random.fold_in(shuffle_key, parallel.device_index())
        lr = learning_rate(state.step, cfg)
        (params, opt_state, _, _, _), epoch_metrics = jax.lax.scan(
            epoch,
            (state.params, state.opt_state, lr, jnp.array(True), steps),
            jax.random.split(shuffle_key, cfg.num_epochs),
        )
        new_state = TrainState(params, opt_state, obs_stats, state.step + 1, key)
        raw_weights = jnp.exp(start_log_prob - traj.extras.log_prob)
        metrics = _step_metrics(epoch_metrics, traj, raw_weights, state, lr, cfg.rho_bar)
        metrics.update(_per_actor_kl(network, distribution, params, steps, traj, cfg.num_actors))
        return new_state, builder_lib.StepInfo(priorities=None, metrics=metrics)

    return builder_lib.UpdateFns(compute_grads=None, apply_grads=None, update=update)


def evaluate_chunks(network, distribution, params, observations, raw_actions):
    """(values [b, T + 1], log-probabilities of the actions [b, T]) of chunks under `params`.

    Args:
      observations: [b, T + 1, ...] as the network sees them (normalized if so configured).
      raw_actions: [b, T, ...] the sampled actions (before clipping).
    """
    chunks, length = raw_actions.shape[:2]
    inputs, values = network.apply(params, _flat(observations))
    inputs = jax.tree.map(lambda x: x.reshape((chunks, length + 1) + x.shape[1:]), inputs)
    inputs = jax.tree.map(lambda x: x[:, :length], inputs)
    return values.reshape(chunks, length + 1), distribution.log_prob(inputs, raw_actions)


def _step_metrics(epoch_metrics, traj: types.Trajectory, raw_weights, state, lr, rho_bar):
    """Means over the applied minibatch updates, and the step's lag and weights."""
    applied = epoch_metrics.pop("applied")  # [epochs, minibatches]
    num_applied = jnp.maximum(jnp.sum(applied), 1.0)
    metrics = {
        name: jnp.sum(values * applied) / num_applied for name, values in epoch_metrics.items()
    }
    valid = traj.valid
    global_valid = jnp.maximum(parallel.psum(jnp.sum(valid)), 1)
    lag = (state.step - traj.param_version).astype(jnp.float32)
    metrics.update(
        minibatch_updates=jnp.sum(applied),
        learning_rate=lr,
        policy_lag_mean=parallel.psum(_masked_mean(lag, valid, global_valid)),
        policy_lag_max=parallel.pmax(jnp.max(jnp.where(valid, lag, 0.0))),
        importance_weight_mean=parallel.psum(
            _masked_mean(jnp.minimum(raw_weights, rho_bar), valid, global_valid)
        ),
        # Steps whose pi/mu exceeded rho-bar, so that V-trace cut their weight.
        truncated_weight_fraction=parallel.psum(
            _masked_mean((raw_weights > rho_bar).astype(jnp.float32), valid, global_valid)
        ),
    )
    return metrics


def _per_actor_kl(network, distribution, params, steps: _Steps, traj, num_actors: int):
    """{"kl/actor_i": KL(behaviour policy of actor i || updated policy)} for every actor.

    Each actor's mean over its valid steps in this batch (all devices), with
    the k3 estimator; NaN for an actor with no step in the batch. The segment
    count is the config's actor count, so the shapes (and the compiled step)
    do not depend on which actors the batch holds.
    """
    inputs, _ = network.apply(params, steps.observation)
    log_prob = distribution.log_prob(inputs, steps.raw_action)
    behaviour = _flat(traj.extras.log_prob)
    kl = jnp.where(steps.valid, approx_kl(log_prob - behaviour), 0.0)
    actor = _flat(jnp.broadcast_to(traj.actor_index[:, None], traj.reward.shape))
    sums = parallel.psum(jax.ops.segment_sum(kl, actor, num_segments=num_actors))
    counts = parallel.psum(
        jax.ops.segment_sum(steps.valid.astype(jnp.float32), actor, num_segments=num_actors)
    )
    per_actor = jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), jnp.nan)
    return {f"kl/actor_{i}": per_actor[i] for i in range(num_actors)}
