"""QR-DQN's loss and update: hand computations, quantile regression on a fixed sample,
the greedy policy, device-count invariance and one compile of the skeleton's learner step,
the numeric guard's learning-rate scale, Gorila mode's contract."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents import qrdqn
from agents.qrdqn import learning
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, types
from gorila_jax.gorila import mode
from gorila_jax.learning import step as step_lib

SPEC = envs.env_spec("CartPole-v1")
TINY = dataclasses.replace(
    qrdqn.QRDQNConfig(),
    num_quantiles=8,
    hidden_sizes=(32, 32),
    batch_size=64,
    learning_rate=1e-3,
    target_update_period=2,
    importance_exponent_anneal_steps=100,
)


def test_quantile_huber_loss_matches_hand_computation():
    loss = learning.quantile_huber_loss(
        predicted=jnp.array([0.0, 1.0]),
        target=jnp.array([0.5, 3.0]),
        taus=jnp.array([0.25, 0.75]),
        kappa=1.0,
    )
    # u = target_j - predicted_i; Huber(0.5) = Huber(-0.5) = 0.125, Huber(3) = 2.5, Huber(2) = 1.5.
    # tau 0.25: both u >= 0, weight 0.25:            0.25 * (0.125 + 2.5) / 2 = 0.328125
    # tau 0.75: u = -0.5 weighs 0.25, u = 2 weighs 0.75: (0.25 * 0.125 + 0.75 * 1.5) / 2 = 0.578125
    assert float(loss) == pytest.approx(0.328125 + 0.578125)


def test_quantile_midpoints_are_the_centres_of_n_equal_bins():
    np.testing.assert_allclose(learning.quantile_midpoints(4), [0.125, 0.375, 0.625, 0.875])


def test_quantile_regression_moves_quantiles_to_the_sample_quantiles():
    # A skewed, bimodal sample whose spread (tens) dwarfs kappa = 1, where the
    # Huber part barely moves the minimizer off the plain quantile.
    rng = np.random.default_rng(0)
    sample = np.concatenate([rng.normal(0, 10, 3000), rng.normal(60, 5, 1000)]).astype(np.float32)
    taus = learning.quantile_midpoints(5)
    loss_fn = jax.jit(jax.grad(lambda q: learning.quantile_huber_loss(q, sample, taus, 1.0)))
    optimizer = optax.adam(0.5)
    quantiles = jnp.zeros(5)
    opt_state = optimizer.init(quantiles)
    for _ in range(2000):
        updates, opt_state = optimizer.update(loss_fn(quantiles), opt_state)
        quantiles = optax.apply_updates(quantiles, updates)
    expected = np.quantile(sample, np.asarray(taus))
    np.testing.assert_allclose(quantiles, expected, atol=0.5)


def test_double_q_target_takes_the_action_of_the_best_online_mean():
    target = learning.double_q_quantile_target(
        r_t=1.0,
        discount_t=0.5,
        # Action 0 has the higher mean (3 > 2.5) though action 1 has the highest quantile.
        quantiles_t_target=jnp.array([[10.0, 20.0], [30.0, 40.0]]),
        quantiles_t_online=jnp.array([[2.0, 4.0], [0.0, 5.0]]),
    )
    np.testing.assert_allclose(target, [1 + 0.5 * 10, 1 + 0.5 * 20])


def test_greedy_policy_takes_the_argmax_of_the_quantile_mean():
    builder = qrdqn.QRDQNBuilder(dataclasses.replace(TINY, eval_epsilon=0.0))
    params = builder.init_train_state(jax.random.PRNGKey(0), SPEC).params
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    quantiles = builder._network(SPEC).apply(params, obs)
    assert quantiles.shape == (256, SPEC.num_actions, TINY.num_quantiles)
    greedy = builder.make_policy(SPEC, 0, 1, evaluation=True)
    actions = greedy(params, obs, jax.random.PRNGKey(1), 0)
    np.testing.assert_array_equal(actions, jnp.argmax(quantiles.mean(-1), -1))


def _random_batch(seed: int, size: int = 64) -> builder_lib.SampledBatch:
    rng = np.random.default_rng(seed)
    data = types.Transition(
        observation=rng.normal(size=(size, 4)).astype(np.float32),
        action=rng.integers(0, 2, size).astype(np.int32),
        reward=rng.normal(size=size).astype(np.float32),
        discount=rng.choice([0.0, 0.99**3], size).astype(np.float32),
        next_observation=rng.normal(size=(size, 4)).astype(np.float32),
    )
    probabilities = rng.uniform(0.5, 2.0, size) / (size * 10)
    return builder_lib.SampledBatch(data, probabilities, np.full(size, size * 10, np.int64))


def _train(num_devices: int, batches, cfg=TINY, lr_scale: float = 1.0):
    """The skeleton's learner step (`step_lib.make_step`) pmapped over `num_devices`."""
    builder = qrdqn.QRDQNBuilder(cfg)
    devices = jax.devices()[:num_devices]
    step = parallel.pmap_step(step_lib.make_step(builder, SPEC), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), devices)
    guard = parallel.replicate(step_lib.init_guard(lr_scale=lr_scale), devices)
    infos = []
    for batch in batches:
        state, guard, info, _ = step(state, guard, parallel.shard(batch, num_devices))
        infos.append(info)
    return parallel.unreplicate(state), infos


@pytest.mark.parametrize("layer_norm", [False, True])
def test_sharded_update_equals_single_device_update(layer_norm):
    cfg = dataclasses.replace(TINY, layer_norm=layer_norm)
    batches = [_random_batch(seed) for seed in range(3)]
    one, infos_one = _train(1, batches, cfg)
    four, infos_four = _train(4, batches, cfg)
    chex.assert_trees_all_close(one.params, four.params, atol=1e-5)
    chex.assert_trees_all_close(one.target_params, four.target_params, atol=1e-5)
    np.testing.assert_allclose(
        parallel.unshard(infos_one[-1].priorities),
        parallel.unshard(infos_four[-1].priorities),
        atol=1e-5,
    )


def test_update_compiles_once():
    builder = qrdqn.QRDQNBuilder(TINY)
    step_fn = step_lib.make_step(builder, SPEC)
    chex.clear_trace_counter()
    step = parallel.pmap_step(
        chex.assert_max_traces(step_fn, n=1), jax.devices(), out_axes=step_lib.OUT_AXES
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), jax.devices())
    guard = parallel.replicate(step_lib.init_guard(), jax.devices())
    for seed in range(3):
        state, guard, _, _ = step(state, guard, parallel.shard(_random_batch(seed), 4))


def test_update_lowers_the_loss_and_prioritizes_by_the_mean_td_error():
    batch = _random_batch(0)
    cfg = dataclasses.replace(TINY, target_update_period=1000, learning_rate=1e-2)
    _, infos = _train(4, [batch] * 30, cfg)
    first, last = (float(infos[i].metrics["loss"][0]) for i in (0, -1))
    assert last < 0.5 * first
    assert np.isfinite(float(infos[-1].metrics["q_mean"][0]))
    # Priorities are |mean target - mean predicted| of the sampled action, as recomputed here.
    builder = qrdqn.QRDQNBuilder(cfg)
    apply = builder._network(SPEC).apply
    data = batch.data
    before_last = _train(4, [batch] * 29, cfg)[0]
    target = jax.vmap(learning.double_q_quantile_target)(
        data.reward,
        data.discount,
        apply(before_last.target_params, data.next_observation),
        apply(before_last.params, data.next_observation),
    )
    chosen = np.asarray(apply(before_last.params, data.observation))[np.arange(64), data.action]
    expected = np.abs(target.mean(-1) - chosen.mean(-1)) + cfg.priority_epsilon
    np.testing.assert_allclose(parallel.unshard(infos[-1].priorities), expected, atol=1e-4)


def test_the_guards_lr_scale_moves_only_the_trainable_parameters_part_way():
    batch = _random_batch(0)
    init = qrdqn.QRDQNBuilder(TINY).init_train_state(jax.random.PRNGKey(0), SPEC)
    full, _ = _train(1, [batch], TINY)
    half, _ = _train(1, [batch], TINY, lr_scale=0.5)
    expected = jax.tree.map(lambda o, n: o + 0.5 * (n - o), init.params, full.params)
    chex.assert_trees_all_close(half.params, expected, atol=1e-6)
    chex.assert_trees_all_close(half.opt_state, full.opt_state)  # the optimizer's moments: as run
    assert int(half.step) == int(full.step) == 1


def test_dqfd_margin_loss_on_the_quantile_mean_makes_the_demonstrated_actions_greedy():
    # DQN's margin wrapper on QR-DQN's loss: the margin acts on the mean over quantiles,
    # which is what QR-DQN's greedy policy takes the argmax of.
    batch = _random_batch(0)
    data = batch.data._replace(reward=np.zeros(64, np.float32), discount=np.zeros(64, np.float32))
    demonstrated = (data.observation[:, 2] > 0).astype(np.int32)
    demo = np.arange(64) % 2 == 0
    data = data._replace(action=np.where(demo, demonstrated, data.action))
    cfg = dataclasses.replace(
        TINY,
        demo_fraction=0.5,
        demo_margin_weight=1.0,
        target_update_period=1000,
        eval_epsilon=0.0,
    )
    builder = qrdqn.QRDQNBuilder(cfg)
    greedy = builder.make_policy(SPEC, 0, 1, evaluation=True)

    def agreement(params) -> float:
        actions = np.asarray(greedy(params, data.observation, jax.random.PRNGKey(0), 0))
        return float(np.mean(actions[demo] == demonstrated[demo]))

    untrained = agreement(builder.init_train_state(jax.random.PRNGKey(0), SPEC).params)
    state, infos = _train(1, [batch._replace(data=data, demo=demo)] * 100, cfg)
    # Not every row: the quantile loss pulls the other rows' taken actions to 0 as well,
    # and a 32x32 network need not separate every demonstration row from its neighbours.
    assert agreement(state.params) >= max(0.9, untrained + 0.25), untrained
    assert float(infos[-1].metrics["demo_margin_loss"][0]) < float(
        infos[0].metrics["demo_margin_loss"][0]
    )


def test_target_network_is_copied_every_period():
    cfg = dataclasses.replace(TINY, target_update_period=2)
    initial = qrdqn.QRDQNBuilder(cfg).init_train_state(jax.random.PRNGKey(0), SPEC).params
    state, _ = _train(1, [_random_batch(0)], cfg)
    chex.assert_trees_all_close(state.target_params, initial)
    state, _ = _train(1, [_random_batch(0)] * 2, cfg)
    chex.assert_trees_all_close(state.target_params, state.params)


def test_gorila_mode_accepts_the_agent_and_its_shard_optimizer_is_elementwise():
    builder = qrdqn.QRDQNBuilder(TINY)
    mode.check_agent(builder, SPEC)  # raises for an agent with only a whole update step
    params = builder.init_train_state(jax.random.PRNGKey(0), SPEC).params
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
    optimizer = builder.shard_optimizer()
    whole, _ = optimizer.update(grads, optimizer.init(params), params)
    # A shard holding only the first layer's slice computes the same update for it.
    first = {"params": {"Dense_0": params["params"]["Dense_0"]}}
    first_grads = {"params": {"Dense_0": grads["params"]["Dense_0"]}}
    part, _ = optimizer.update(first_grads, optimizer.init(first), first)
    chex.assert_trees_all_close(part["params"]["Dense_0"], whole["params"]["Dense_0"])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_quantiles", 0, "config.num_quantiles must be >= 1"),
        ("huber_delta", 0.0, "config.huber_delta must be positive"),
        ("batch_size", 30, "config.batch_size=30 must be divisible by the 4"),
    ],
)
def test_a_config_that_cannot_work_is_rejected_with_its_field_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **{field: value}).validate(4)


def test_continuous_actions_are_rejected():
    with pytest.raises(ValueError, match="QR-DQN needs discrete actions"):
        qrdqn.QRDQNBuilder(TINY).validate(1, envs.env_spec("Pendulum-v1"))
