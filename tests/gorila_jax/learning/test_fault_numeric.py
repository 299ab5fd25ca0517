"""Numerical faults in the synchronous learner: skipped updates, rollback, lower learning rate."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from agents import dqn, ppo, sac
from gorila_jax import builder as builder_lib
from gorila_jax import parallel, replay
from gorila_jax.learning import learner, prefetch, sync_learner
from gorila_jax.learning import step as step_lib
from gorila_jax.learning.settings import LearnerSettings
from tests.agents.dqn.test_learning import SPEC, TINY, _random_batch
from tests.agents.ppo import test_learning as ppo_test
from tests.agents.sac import test_learning as sac_test
from tests.backends import BACKENDS, DefaultReplayNode, first_batch, sampled_items


def _guarded(num_devices: int, cfg=TINY):
    builder = dqn.DQNBuilder(cfg)
    devices = jax.devices()[:num_devices]
    step = parallel.pmap_step(
        step_lib.make_step(builder, SPEC),
        devices,
        out_axes=step_lib.OUT_AXES,
        donate_state=False,  # the test compares the old state with the new one
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), devices)
    return step, state, parallel.replicate(step_lib.init_guard(), devices)


def _nan_batch(seed: int) -> builder_lib.SampledBatch:
    batch = _random_batch(seed)
    reward = batch.data.reward.copy()
    reward[3] = np.nan  # one corrupted item poisons the whole loss
    return batch._replace(data=batch.data._replace(reward=reward))


def _bits(tree) -> list[bytes]:
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("num_devices", [1, 4])
def test_a_nan_batch_is_skipped_with_the_state_bit_identical(num_devices):
    step, state, guard = _guarded(num_devices)
    state, guard, _, _ = step(state, guard, parallel.shard(_random_batch(0), num_devices))
    before = jax.device_get(state)

    state, guard, info, _ = step(state, guard, parallel.shard(_nan_batch(1), num_devices))
    assert _bits(jax.device_get(state)) == _bits(before), "a skipped update changed the state"
    assert int(guard.skipped_steps[0]) == 1 and int(guard.streak[0]) == 1
    assert float(info.metrics["nonfinite_skipped_steps"][0]) == 1.0
    assert np.isnan(np.asarray(info.priorities)).all(), "its priorities must not reach replay"

    state, guard, info, _ = step(state, guard, parallel.shard(_random_batch(2), num_devices))
    assert _bits(jax.device_get(state)) != _bits(before), "a finite update after it applies"
    assert int(guard.skipped_steps[0]) == 1 and int(guard.streak[0]) == 0
    assert np.isfinite(np.asarray(info.priorities)).all()


def test_the_learning_rate_scale_shortens_each_parameter_step():
    step, state, guard = _guarded(1)
    batch = parallel.shard(_random_batch(0), 1)
    full, _, _, _ = step(state, guard, batch)
    half, _, _, _ = step(state, guard._replace(lr_scale=guard.lr_scale * 0.5), batch)
    start = jax.device_get(state.params)
    moved_full = jax.tree.map(lambda new, old: new - old, jax.device_get(full.params), start)
    moved_half = jax.tree.map(lambda new, old: new - old, jax.device_get(half.params), start)
    for a, b in zip(jax.tree.leaves(moved_half), jax.tree.leaves(moved_full)):
        np.testing.assert_allclose(a, 0.5 * b, rtol=1e-4, atol=1e-7)
    assert any(np.abs(b).max() > 0 for b in jax.tree.leaves(moved_full))


def _full_and_scaled_step(builder, spec, batch, scale: float = 0.5):
    """(start, after a full step, after a step at learning-rate scale `scale`) on one device."""
    devices = jax.devices()[:1]
    step = parallel.pmap_step(
        step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES, donate_state=False
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    batch = parallel.shard(batch, 1)
    full = step(state, guard, batch)[0]
    scaled = step(state, guard._replace(lr_scale=guard.lr_scale * scale), batch)[0]
    return [jax.device_get(parallel.unreplicate(tree)) for tree in (state, full, scaled)]


def _assert_params_moved_by(scale, start, full, scaled):
    for old, new, part in zip(*(jax.tree.leaves(tree) for tree in (start, full, scaled))):
        np.testing.assert_allclose(part - old, scale * (new - old), rtol=1e-4, atol=1e-7)
    assert any(
        np.abs(new - old).max() > 0 for old, new in zip(*map(jax.tree.leaves, (start, full)))
    )


def test_the_scale_leaves_the_fp16_loss_scale_as_an_unscaled_step_does():
    cfg = dataclasses.replace(TINY, precision="fp16", loss_scale_period=1)
    start, full, scaled = _full_and_scaled_step(dqn.DQNBuilder(cfg), SPEC, _random_batch(0))
    assert float(full.loss_scale.scale) == 2 * float(start.loss_scale.scale)  # it grew
    assert _bits(scaled.loss_scale) == _bits(full.loss_scale)
    assert _bits(scaled.step) == _bits(full.step)
    _assert_params_moved_by(0.5, start.params, full.params, scaled.params)


def test_the_scale_leaves_ppo_observation_statistics_as_an_unscaled_step_does():
    cfg = dataclasses.replace(
        ppo_test.TINY, normalize_observations=True, num_minibatches=1, learning_rate=1e-3
    )
    builder = ppo.PPOBuilder(cfg)
    params = builder.init_train_state(jax.random.PRNGKey(0), ppo_test.CARTPOLE).params
    batch = ppo_test._batch(builder, ppo_test.CARTPOLE, params, seed=0)
    start, full, scaled = _full_and_scaled_step(builder, ppo_test.CARTPOLE, batch)
    assert _bits(full.obs_stats) != _bits(start.obs_stats)  # the step updated them
    assert _bits(scaled.obs_stats) == _bits(full.obs_stats)
    _assert_params_moved_by(0.5, start.params, full.params, scaled.params)


def test_the_scale_moves_sacs_trainable_params_and_not_its_target_critics():
    start, full, scaled = _full_and_scaled_step(
        sac.SACBuilder(sac_test.TINY), sac_test.SPEC, sac_test._random_batch(0)
    )
    assert _bits(scaled.target_critic_params) == _bits(full.target_critic_params)
    for name in ("policy_params", "critic_params", "log_alpha"):
        _assert_params_moved_by(0.5, *(getattr(tree, name) for tree in (start, full, scaled)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_priorities_are_dropped_and_the_items_keep_their_old_ones(backend):
    def tables():
        return [replay.prioritized_table("t", 10, 1.0, replay.RateLimit(1), 4)]

    node = replay.node_class(backend)(tables)
    try:
        writer = replay.connect(node).writer("t")
        writer.write(np.arange(8, dtype=np.uint8).reshape(2, 4), np.ones(2))
        writer.close()
        # uint64 keys, as the learner holds them.
        keys = np.unique(first_batch(node, "t", 50).keys)
        assert keys.size == 2 and keys.dtype == np.uint64
        updater = replay.ReplayShards(node).priority_updater("t")
        updater.submit(keys, np.array([np.nan, 5.0]))
        updater.close()
        sampled = sampled_items(node, "t", 400, exponent=1.0)
        priorities = {key: priority for key, (_, priority) in sampled.items()}
        assert priorities == pytest.approx({int(keys[0]): 1.0, int(keys[1]): 5.0})
    finally:
        node.close()


# ---------------------------------------------------------------- rollback on a real learner

CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=64,
    max_replay_size=5_000,
    samples_per_insert=2.0,
)


class _NanBatches:
    """Stands in for the learner's prefetcher: real sampled batches with one NaN reward."""

    def __init__(self, real: prefetch.DevicePrefetcher, devices):
        self._real, self._devices = real, devices

    def get(self, timeout: float):
        item = self._real.get(timeout)
        if item is None:
            return None
        keys, on_device = item
        batch = jax.device_get(parallel.unshard(on_device))
        reward = np.array(batch.data.reward)
        reward[0] = np.nan
        batch = batch._replace(data=batch.data._replace(reward=reward))
        return keys, parallel.shard_to_devices(batch, self._devices)

    def close(self) -> None:
        self._real.close()


def _fill(replay_node, builder, count: int) -> None:
    codec = builder.replay_layout(SPEC).codec
    items = codec.encode(_random_batch(0, size=count).data)
    writer = replay.connect(replay_node).writer(dqn.builder.TABLE)
    writer.write(items, np.ones(count))
    writer.close()


def test_k_consecutive_nan_updates_roll_back_to_the_checkpoint_with_a_lower_rate(tmp_path):
    builder = dqn.DQNBuilder(CONFIG)
    replay_node = DefaultReplayNode(
        functools.partial(builder_lib.replay_tables, builder, SPEC),
        checkpoint_dir=str(tmp_path / "replay"),
    )
    node = learner.LearnerNode(
        builder,
        SPEC,
        replay_node,
        None,
        0,
        LearnerSettings(num_devices=2, max_nonfinite_steps=3, rollback_lr_factor=0.5),
        sync_learner.LearnerStart(str(tmp_path / "learner")),
    )
    try:
        _fill(replay_node, builder, 300)  # below the rate limiter's insert cap
        for _ in range(5):
            assert node.step(timeout=60)
        saved_at = node.save_checkpoint()
        saved_version, saved_params = node.get_params()
        for _ in range(3):
            assert node.step(timeout=60)
        assert _bits(node.get_params()[1]) != _bits(saved_params)
        node._prefetcher = _NanBatches(node._prefetcher, node._devices)
        steps_before = node.get_params()[0]
        for _ in range(3):  # three skips in a row; the third is seen one step late
            assert node.step(timeout=60)
        assert node.numeric_status()["rollbacks"] == 0
        assert node.step(timeout=60)
        status = node.numeric_status()
        assert status["rollbacks"] == 1 and status["lr_scale"] == 0.5
        assert status["streak"] == 0 and status["skipped_steps"] >= 3
        version, params = node.get_params()
        assert _bits(params) == _bits(saved_params), "not the checkpoint's parameters"
        assert version > steps_before > saved_version == saved_at, "learner steps went back"
    finally:
        node.stop()
        node.close()
        replay_node.close()


def test_without_a_checkpoint_the_rollback_fails_with_the_reason(tmp_path):
    builder = dqn.DQNBuilder(CONFIG)
    replay_node = DefaultReplayNode(functools.partial(builder_lib.replay_tables, builder, SPEC))
    node = learner.LearnerNode(
        builder, SPEC, replay_node, None, 0, LearnerSettings(num_devices=1, max_nonfinite_steps=2)
    )
    try:
        _fill(replay_node, builder, 300)
        assert node.step(timeout=60)
        node._prefetcher = _NanBatches(node._prefetcher, node._devices)
        with pytest.raises(
            sync_learner.NumericalFault, match="2 consecutive non-finite.*no checkpoint"
        ):
            for _ in range(4):
                node.step(timeout=60)
    finally:
        node.stop()
        node.close()
        replay_node.close()
