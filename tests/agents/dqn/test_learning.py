"""DQN math and the pmapped update: hand computations, device-count invariance, no recompiles."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import dqn
from agents.dqn import learning, policy
from gorila_jax import builder as builder_lib
from gorila_jax import envs, learner, parallel, types

SPEC = envs.env_spec("CartPole-v1")
TINY = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=64,
    learning_rate=1e-3,
    target_update_period=2,
    importance_exponent_anneal_steps=100,
)


def test_double_q_td_error_matches_hand_computation():
    td = learning.double_q_td_error(
        q_tm1=jnp.array([1.0, 2.0]),
        a_tm1=1,
        r_t=1.0,
        discount_t=0.5,
        q_t_target=jnp.array([10.0, 20.0]),
        q_t_online=jnp.array([5.0, 3.0]),
    )
    # The online net picks action 0; the target net values it: 1 + 0.5 * 10 - 2.
    assert td == pytest.approx(4.0)


def test_importance_exponent_anneals_linearly_to_one():
    cfg = dataclasses.replace(
        TINY, importance_exponent_start=0.4, importance_exponent_anneal_steps=10
    )
    values = [float(learning.importance_exponent(jnp.array(s), cfg)) for s in (0, 5, 10, 20)]
    assert values == pytest.approx([0.4, 0.7, 1.0, 1.0])


def test_epsilon_falls_linearly_then_stays():
    eps = [float(policy.linear_epsilon(s, 1.0, 0.1, 100)) for s in (0, 50, 100, 1000)]
    assert eps == pytest.approx([1.0, 0.55, 0.1, 0.1])
    assert policy.actor_epsilon_end(0.1, 0.5, actor_index=3, num_actors=4) == pytest.approx(0.05)
    assert policy.actor_epsilon_end(0.1, 0.5, actor_index=0, num_actors=1) == pytest.approx(0.1)


def test_greedy_policy_takes_argmax_and_exploring_policy_explores():
    builder = dqn.DQNBuilder(dataclasses.replace(TINY, eval_epsilon=0.0, epsilon_decay_steps=10))
    params = builder.init_train_state(jax.random.PRNGKey(0), SPEC).params
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    q = builder._network(SPEC).apply(params, obs)
    greedy = builder.make_policy(SPEC, 0, 1, evaluation=True)
    np.testing.assert_array_equal(greedy(params, obs, jax.random.PRNGKey(1), 0), jnp.argmax(q, -1))
    acting = builder.make_policy(SPEC, 0, 1, evaluation=False)
    at_start = np.asarray(acting(params, obs, jax.random.PRNGKey(1), 0))  # epsilon 1
    assert 0.35 < np.mean(at_start != np.asarray(jnp.argmax(q, -1))) < 0.65


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


def _train(num_devices: int, batches, cfg=TINY):
    builder = dqn.DQNBuilder(cfg)
    devices = jax.devices()[:num_devices]
    step_fn = learner.make_learner_step(builder.update_fns(SPEC), builder.actor_params)
    step = parallel.pmap_step(step_fn, devices, out_axes=(0, 0, None))
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), devices)
    infos = []
    for batch in batches:
        state, info, _ = step(state, parallel.shard(batch, num_devices))
        infos.append(info)
    return parallel.unreplicate(state), infos


def test_sharded_update_equals_single_device_update():
    batches = [_random_batch(seed) for seed in range(3)]
    one, infos_one = _train(1, batches)
    four, infos_four = _train(4, batches)
    chex.assert_trees_all_close(one.params, four.params, atol=1e-5)
    chex.assert_trees_all_close(one.target_params, four.target_params, atol=1e-5)
    np.testing.assert_allclose(
        parallel.unshard(infos_one[-1].priorities),
        parallel.unshard(infos_four[-1].priorities),
        atol=1e-5,
    )


def test_update_lowers_the_loss_on_a_fixed_batch():
    batch = _random_batch(0)
    cfg = dataclasses.replace(TINY, target_update_period=1000, learning_rate=1e-2)
    _, infos = _train(4, [batch] * 20, cfg)
    first, last = (float(infos[i].metrics["loss"][0]) for i in (0, -1))
    assert last < 0.5 * first


def test_target_network_is_copied_every_period():
    state, _ = _train(1, [_random_batch(0)], dataclasses.replace(TINY, target_update_period=2))
    initial = dqn.DQNBuilder(TINY).init_train_state(jax.random.PRNGKey(0), SPEC).params
    chex.assert_trees_all_close(state.target_params, initial)  # after 1 step: still initial
    state, _ = _train(1, [_random_batch(0)] * 2, dataclasses.replace(TINY, target_update_period=2))
    chex.assert_trees_all_close(state.target_params, state.params)  # after 2: copied


def test_update_compiles_once():
    builder = dqn.DQNBuilder(TINY)
    step_fn = learner.make_learner_step(builder.update_fns(SPEC), builder.actor_params)
    chex.clear_trace_counter()
    step = parallel.pmap_step(
        chex.assert_max_traces(step_fn, n=1), jax.devices(), out_axes=(0, 0, None)
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), jax.devices())
    for seed in range(3):
        state, _, _ = step(state, parallel.shard(_random_batch(seed), 4))


def test_batch_that_does_not_split_over_devices_is_rejected():
    with pytest.raises(ValueError, match="batch_size=30 must be divisible by the 4"):
        dataclasses.replace(TINY, batch_size=30).validate(4)
    with pytest.raises(ValueError, match="does not split over 4"):
        parallel.shard(_random_batch(0, size=30), 4)
