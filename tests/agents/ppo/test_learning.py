"""PPO math and the pmapped learner step: GAE and V-trace against hand computations,
importance weights, device-count invariance, KL early stop, per-actor KL, observation
statistics, the Gaussian policy, and config errors."""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import ppo
from agents.ppo import learning, networks, normalization
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, types
from gorila_jax.gorila import mode
from gorila_jax.learning import step as step_lib

CARTPOLE = envs.env_spec("CartPole-v1")
PENDULUM = envs.env_spec("Pendulum-v1")
TINY = dataclasses.replace(
    ppo.PPOConfig(),
    torso="mlp",
    hidden_sizes=(32, 32),
    trajectory_length=8,
    batch_size=4,
    num_actors=2,
    num_epochs=2,
    num_minibatches=2,
)


def _targets(values, rewards, terminated, truncated, rhos=None, cs=None, discount=0.5, lam=0.5):
    length = len(rewards)
    ones = jnp.ones(length)
    rhos = ones if rhos is None else jnp.asarray(rhos, jnp.float32)
    cs = ones if cs is None else jnp.asarray(cs, jnp.float32)
    terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
    return learning.vtrace_gae(
        jnp.asarray(values, jnp.float32),
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(terminated),
        jnp.asarray(terminated | truncated),
        rhos,
        cs,
        rhos,
        discount,
        lam,
    )


# gamma = lambda = 0.5, so gamma * lambda = 0.25; V = [1, 2, 3, 4, 5] (V[4] is the value
# of the observation after the last step). Hand computations in the comments.
@pytest.mark.parametrize(
    "case, rewards, terminated, truncated, advantages",
    [
        # deltas r + 0.5 V' - V = [1, 0.5, 0, -0.5]; A_t = delta_t + 0.25 A_{t+1}.
        ("no episode end", [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0],
         [1 + 0.25 * (0.5 + 0.25 * (0 + 0.25 * -0.5)), 0.5 + 0.25 * (0.25 * -0.5), 0.25 * -0.5,
          -0.5]),
        # Terminated at t=1: delta_1 = 1 - 2 (no bootstrap), the trace stops there.
        # t=2 is the reset step; truncated at t=3: it bootstraps from V[4] = 5:
        # deltas [1, -1, 0 + 2 - 3, 1 + 2.5 - 4] = [1, -1, -1, -0.5].
        ("terminated, then truncated", [1, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1],
         [1 + 0.25 * -1, -1, -1 + 0.25 * -0.5, -0.5]),
        # Truncated at t=1: delta_1 = 1 + 0.5 * V[2] - 2 = 0.5 bootstraps from the
        # episode's last observation, but the trace is cut: A_1 = delta_1.
        ("truncated mid-chunk", [1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0],
         [1 + 0.25 * 0.5, 0.5, -1 + 0.25 * -0.5, -0.5]),
    ],
)  # fmt: skip
def test_gae_matches_hand_computation(case, rewards, terminated, truncated, advantages):
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    targets, pg_advantages = _targets(values, rewards, terminated, truncated)
    np.testing.assert_allclose(pg_advantages, advantages, rtol=1e-6, err_msg=case)
    np.testing.assert_allclose(targets, np.add(values[:-1], advantages), rtol=1e-6, err_msg=case)


def test_vtrace_targets_match_hand_computation():
    # Espeholt et al. (2018) eq. 1 with lambda = 1, gamma = 0.5, V = [1, 2, 3, 4]:
    # truncated weights rho = [1, 0.5, 0.25], c = [0.5, 1, 1]; r = 1 everywhere.
    # rho-weighted TD errors: d0 = 1 * (1 + 1 - 1) = 1, d1 = 0.5 * (1 + 1.5 - 2) = 0.25,
    # d2 = 0.25 * (1 + 2 - 3) = 0.
    # v_2 = 3 + d2 = 3; v_1 = 2 + d1 + 0.5 * c1 * d2 = 2.25;
    # v_0 = 1 + d0 + 0.5 * c0 * d1 + 0.25 * c0 * c1 * d2 = 2.0625.
    # Policy-gradient advantages rho_s (r_s + gamma v_{s+1} - V_s), v_3 = V_3 = 4:
    # [1 * (1 + 1.125 - 1), 0.5 * (1 + 1.5 - 2), 0.25 * (1 + 2 - 3)].
    targets, pg_advantages = _targets(
        [1.0, 2.0, 3.0, 4.0],
        [1, 1, 1],
        [0, 0, 0],
        [0, 0, 0],
        rhos=[1.0, 0.5, 0.25],
        cs=[0.5, 1.0, 1.0],
        lam=1.0,
    )
    np.testing.assert_allclose(targets, [2.0625, 2.25, 3.0], rtol=1e-6)
    np.testing.assert_allclose(pg_advantages, [1.125, 0.25, 0.0], rtol=1e-6)


def test_importance_weights_are_one_for_the_behaviour_policy_and_truncated_above():
    log_probs = jnp.array([-0.1, -2.3, -7.0, 0.0])
    np.testing.assert_array_equal(learning.importance_weights(log_probs, log_probs, 1.0), 1.0)
    # pi/mu = e^1 is cut to rho-bar = 1; e^-1 is kept.
    weights = learning.importance_weights(jnp.array([-1.0, -3.0]), jnp.array([-2.0, -2.0]), 1.0)
    np.testing.assert_allclose(weights, [1.0, np.exp(-1.0)], rtol=1e-6)


def _batch(
    builder: ppo.PPOBuilder,
    spec: types.EnvSpec,
    params,
    seed: int,
    actors=(0, 1),
    behaviour_shift: dict[int, float] | None = None,
) -> builder_lib.SampledBatch:
    """A batch of chunks acted by `params` itself: behaviour log-probs are its own,
    plus `behaviour_shift[actor]` for chunks of those actors."""
    cfg = builder.config
    chunks, length = cfg.global_batch_size, cfg.trajectory_length
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(chunks, length + 1, *spec.observation_shape)).astype(np.float32)
    policy = builder.make_policy(spec, 0, cfg.num_actors, evaluation=False)
    stats = normalization.init_stats(spec.observation_shape)
    keys = jax.random.split(jax.random.PRNGKey(seed), chunks)
    actions, extras = jax.vmap(lambda o, k: policy(learning.ActorParams(params, stats), o, k, 0))(
        obs[:, :length], keys
    )
    actor_index = np.asarray([actors[i % len(actors)] for i in range(chunks)], np.int32)
    log_prob = np.array(extras.log_prob)
    for actor, shift in (behaviour_shift or {}).items():
        log_prob[actor_index == actor] += shift
    ended = rng.random((chunks, length)) < 0.1
    terminated = ended & (rng.random((chunks, length)) < 0.5)
    valid = np.ones((chunks, length), bool)
    valid[:, 1:] = ~ended[:, :-1]  # the step after an episode end is envpool's reset step
    traj = types.Trajectory(
        observation=obs,
        action=np.asarray(actions),
        reward=np.where(valid, 1.0, 0.0).astype(np.float32),
        terminated=terminated,
        truncated=ended & ~terminated,
        valid=valid,
        extras=learning.PolicyExtras(
            jnp.asarray(log_prob), extras.value, np.asarray(extras.raw_action)
        ),
        param_version=np.zeros((chunks, length), np.int32),
        actor_index=actor_index,
    )
    # Through the codec, as the learner receives it from Reverb.
    data = builder.replay_layout(spec).codec.decode(builder.replay_layout(spec).codec.encode(traj))
    return builder_lib.SampledBatch(data, np.ones(chunks), np.full(chunks, chunks))


def _train(cfg, batches_fn, num_devices: int, spec=CARTPOLE, steps: int = 1):
    builder = ppo.PPOBuilder(cfg)
    devices = jax.devices()[:num_devices]
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    infos = []
    for index in range(steps):
        params = parallel.unreplicate(state).params
        batch = batches_fn(builder, params, index)
        state, guard, info, _ = step(state, guard, parallel.shard(batch, num_devices))
        infos.append({k: float(np.asarray(v)[0]) for k, v in info.metrics.items()})
    return parallel.unreplicate(state), infos


def test_learner_weights_are_one_on_data_from_its_own_policy():
    # The actor's jitted policy and the learner's step compute the same
    # log-probabilities (different batch shapes: equal to float rounding).
    _, infos = _train(TINY, lambda b, p, i: _batch(b, CARTPOLE, p, seed=i), num_devices=1)
    assert infos[0]["importance_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert infos[0]["policy_lag_mean"] == 0.0


def test_sharded_update_equals_single_device_update():
    # One minibatch per epoch: a 4-device step then sees the same global
    # minibatches as a 1-device step (only the shuffling order differs).
    cfg = dataclasses.replace(
        TINY, num_minibatches=1, num_epochs=3, normalize_observations=True, learning_rate=1e-3
    )
    batches = lambda builder, params, index: _batch(builder, CARTPOLE, params, seed=index)  # noqa: E731
    one, infos_one = _train(cfg, batches, num_devices=1, steps=2)
    four, infos_four = _train(cfg, batches, num_devices=4, steps=2)
    chex.assert_trees_all_close(one.params, four.params, atol=2e-5)
    chex.assert_trees_all_close(one.obs_stats, four.obs_stats, atol=1e-5)
    for name in ("loss", "value_loss", "kl/actor_0", "kl/actor_1"):
        assert infos_four[-1][name] == pytest.approx(infos_one[-1][name], rel=1e-3, abs=1e-6)


def test_per_actor_kl_is_reported_for_every_actor():
    # A learning rate of ~0 leaves the policy where the batch was acted: actor
    # 0's behaviour is the current policy (KL 0); actor 1's log-probs are 0.1
    # lower, so log(pi/mu) = 0.1 and the k3 estimate is e^0.1 - 1 - 0.1;
    # actor 2 has no chunk in the batch.
    cfg = dataclasses.replace(TINY, num_actors=3, batch_size=2, learning_rate=1e-12)
    batches = lambda builder, params, index: _batch(  # noqa: E731
        builder, CARTPOLE, params, seed=0, actors=(0, 1), behaviour_shift={1: -0.1}
    )
    _, infos = _train(cfg, batches, num_devices=2)
    assert infos[0]["kl/actor_0"] == pytest.approx(0.0, abs=1e-6)
    assert infos[0]["kl/actor_1"] == pytest.approx(np.expm1(0.1) - 0.1, rel=1e-4)
    assert np.isnan(infos[0]["kl/actor_2"])


def test_kl_target_stops_the_epochs_early():
    cfg = dataclasses.replace(TINY, learning_rate=3e-2, num_epochs=4, num_minibatches=4)
    batches = lambda builder, params, index: _batch(builder, CARTPOLE, params, seed=0)  # noqa: E731
    _, without = _train(cfg, batches, num_devices=1)
    _, with_target = _train(dataclasses.replace(cfg, kl_target=1e-3), batches, num_devices=1)
    assert without[0]["minibatch_updates"] == 16
    assert 1 <= with_target[0]["minibatch_updates"] < 16
    assert with_target[0]["approx_kl"] < without[0]["approx_kl"]


def test_updates_make_the_rewarded_action_likely():
    # A one-step bandit on CartPole observations: action 1 pays 1, action 0
    # pays 0, every step ends its episode. Each update learns from fresh
    # actions of the current policy, so this checks the sign of the whole
    # surrogate, advantage and value pipeline.
    cfg = dataclasses.replace(TINY, learning_rate=1e-2, entropy_coef=0.0)

    def bandit(builder, params, index):
        batch = _batch(builder, CARTPOLE, params, seed=index)
        data = batch.data._replace(
            reward=(batch.data.action == 1).astype(np.float32),
            terminated=np.ones_like(batch.data.terminated),
            truncated=np.zeros_like(batch.data.truncated),
            valid=np.ones_like(batch.data.valid),
        )
        return batch._replace(data=data)

    state, infos = _train(cfg, bandit, num_devices=2, steps=25)
    obs = np.random.default_rng(99).normal(size=(256, 4)).astype(np.float32)
    inputs, values = networks.make_network(CARTPOLE, cfg.hidden_sizes, "mlp").apply(
        state.params, obs
    )
    assert float(jnp.mean(jax.nn.softmax(inputs.loc)[:, 1])) > 0.9
    assert float(jnp.mean(values)) == pytest.approx(1.0, abs=0.2)  # it learned E[r] under pi
    assert infos[-1]["value_loss"] < infos[0]["value_loss"]


def test_observation_statistics_merge_like_numpy():
    rng = np.random.default_rng(0)
    first, second = rng.normal(3, 2, (50, 3)), rng.normal(-1, 5, (70, 3))
    stats = normalization.RunningStats(jnp.float32(0.0), jnp.zeros(3), jnp.zeros(3))
    for part in (first, second):
        stats = normalization.merge_stats(stats, len(part), part.mean(0), part.var(0))
    both = np.concatenate([first, second])
    np.testing.assert_allclose(stats.mean, both.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var, both.var(0), rtol=1e-4)
    assert float(stats.count) == 120


def test_gaussian_policy_clips_for_the_env_and_scores_the_raw_sample():
    cfg = dataclasses.replace(TINY, init_log_std=0.5, normalize_observations=True)
    builder = ppo.PPOBuilder(cfg)
    state = builder.init_train_state(jax.random.PRNGKey(0), PENDULUM)
    obs = np.random.default_rng(0).normal(size=(512, 3)).astype(np.float32)
    acting = builder.make_policy(PENDULUM, 0, cfg.num_actors, evaluation=False)
    action, extras = acting(builder.state_access.actor_params(state), obs, jax.random.PRNGKey(1), 0)
    assert action.shape == (512, 1) and np.all(np.abs(action) <= 2.0)
    raw = np.asarray(extras.raw_action)
    assert np.any(np.abs(raw) > 2.0)  # std e^0.5 around a near-zero mean: some samples clip
    np.testing.assert_allclose(action, np.clip(raw, -2.0, 2.0))
    # The first network's mean is ~0 (policy head initialized at scale 0.01).
    inputs, _ = builder._network(PENDULUM).apply(
        state.params, normalization.normalize(obs, state.obs_stats, cfg.observation_clip)
    )
    z = (raw - np.asarray(inputs.loc)) / np.exp(0.5)
    expected = -0.5 * z[:, 0] ** 2 - 0.5 - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(extras.log_prob, expected, rtol=1e-5, atol=1e-5)
    greedy = builder.make_policy(PENDULUM, 0, 1, evaluation=True)
    np.testing.assert_allclose(
        greedy(builder.state_access.actor_params(state), obs, jax.random.PRNGKey(1), 0),
        inputs.loc,
        atol=1e-6,
    )


def test_continuous_update_normalizes_observations_by_the_batch():
    cfg = dataclasses.replace(TINY, normalize_observations=True)
    state, infos = _train(
        cfg, lambda b, p, i: _batch(b, PENDULUM, p, seed=i), num_devices=2, spec=PENDULUM
    )
    assert all(np.isfinite(v) for k, v in infos[0].items() if not k.startswith("kl/"))
    # The statistics are those of the batch's observations (the bootstrap
    # observation of each chunk excluded: it is the next chunk's first), merged
    # into a start whose weight is 1e-4 of one observation.
    length = cfg.trajectory_length
    shape = (cfg.global_batch_size, length + 1, 3)
    observed = np.random.default_rng(0).normal(size=shape).astype(np.float32)[:, :length]
    observed = observed.reshape(-1, 3)
    np.testing.assert_allclose(state.obs_stats.mean, observed.mean(0), atol=1e-4)
    np.testing.assert_allclose(state.obs_stats.var, observed.var(0), rtol=1e-3)
    assert float(state.obs_stats.count) == pytest.approx(len(observed) + 1e-4)


def _rewards_times(batch: builder_lib.SampledBatch, factor: float) -> builder_lib.SampledBatch:
    return batch._replace(data=batch.data._replace(reward=batch.data.reward * factor))


def test_a_reward_scale_trains_as_rewards_multiplied_by_it():
    # The config's scale and the same scale applied to the data give one update; with
    # rewards of 1 per step, a scale of 0.05 changes the value network's update.
    scaled = dataclasses.replace(TINY, reward_scale=0.05)
    by_config, _ = _train(scaled, lambda b, p, i: _batch(b, CARTPOLE, p, seed=i), num_devices=1)
    by_data, _ = _train(
        TINY, lambda b, p, i: _rewards_times(_batch(b, CARTPOLE, p, seed=i), 0.05), num_devices=1
    )
    unscaled, _ = _train(TINY, lambda b, p, i: _batch(b, CARTPOLE, p, seed=i), num_devices=1)
    chex.assert_trees_all_close(by_config.params, by_data.params, atol=1e-6)
    value_changes = jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a - b))),
        by_config.params["params"]["value_mlp"],
        unscaled.params["params"]["value_mlp"],
    )
    assert max(jax.tree.leaves(value_changes)) > 1e-4


@pytest.mark.parametrize(
    "overrides, devices, message",
    [
        ({"batch_size": 3}, 4, "global batch of 6 chunks (config.batch_size=3 x config.num_act"),
        ({"num_minibatches": 3}, 1, "config.num_minibatches=3 must divide the 64 steps"),
        ({"clip_epsilon": 0.0}, 1, "config.clip_epsilon must be positive"),
        ({"gae_lambda": 1.5}, 1, "config.gae_lambda must lie in [0, 1]"),
        ({"precision": "fp16"}, 1, "config.precision must be one of"),
        ({"kl_target": -1.0}, 1, "config.kl_target must not be negative"),
        ({"reward_scale": 0.0}, 1, "config.reward_scale must be positive"),
    ],
)
def test_bad_configs_are_rejected_naming_the_setting(overrides, devices, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ppo.PPOBuilder(dataclasses.replace(TINY, **overrides)).validate(devices, CARTPOLE)


def test_batch_scales_with_the_number_of_actors_when_asked():
    scaled = dataclasses.replace(TINY, batch_size=8, num_actors=4, scale_batch_with_actors=True)
    fixed = dataclasses.replace(scaled, scale_batch_with_actors=False)
    assert ppo.PPOBuilder(scaled).batch_plan.batch_size == 32
    assert ppo.PPOBuilder(fixed).batch_plan.batch_size == 8
    assert ppo.PPOBuilder(scaled).batch_plan.schedule == ((0, 32),)


def test_actors_refuse_a_different_actor_count_and_gorila_mode_is_refused():
    builder = ppo.PPOBuilder(TINY)
    with pytest.raises(ValueError, match="config.num_actors=2 but the experiment runs 3 actors"):
        builder.make_policy(CARTPOLE, 0, 3, evaluation=False)
    builder.make_policy(CARTPOLE, 0, 1, evaluation=True)  # evaluation does not care
    assert not isinstance(builder, builder_lib.GorilaCapable)
    with pytest.raises(ValueError, match="PPOBuilder gives only a whole update step"):
        mode.check_agent(builder, CARTPOLE)
    assert builder.update_fns(CARTPOLE).compute_grads is None
