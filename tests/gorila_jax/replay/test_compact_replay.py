"""Observations stored in replay as bfloat16 or float8 (`--config.replay_obs_dtype`): error
bounds, bytes per item, the scale every process derives alike, the learner's update on
decoded observations against float32, and a round trip through each replay backend."""

import dataclasses

import jax
import numpy as np
import pytest

from agents import dqn, sac
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, replay, types
from gorila_jax.learning import step as step_lib
from tests.backends import BACKENDS

COMPACT = ("bfloat16", "float8_e4m3")


@pytest.mark.parametrize("dtype_name", COMPACT)
def test_decoded_values_stay_within_the_dtypes_error_bound(dtype_name):
    scale = np.array([1e-3, 0.05, 1.0, 30.0], np.float32)
    how = replay.CompactFloats(dtype_name, scale)
    rng = np.random.default_rng(0)
    # Magnitudes over six decades per feature, all within what the format holds.
    values = scale * 10.0 ** rng.uniform(-3, 2.3, (4096, 4)) * rng.choice([-1, 1], (4096, 4))
    values = values.astype(np.float32)
    assert (np.abs(values) <= how.largest).all()
    decoded = how.decode(how.encode(values))
    assert decoded.dtype == np.float32
    error = np.abs(decoded - values)
    assert (error <= how.error_bound(values)).all(), error.max()
    # The bound is tight enough to mean something: float8 is within 1/16 of each value
    # in its normal range, bfloat16 within 1/256.
    normal = np.abs(values) > 0.02 * scale
    relative = {"bfloat16": 2.0**-8, "float8_e4m3": 2.0**-4}[dtype_name]
    assert (error[normal] <= relative * np.abs(values[normal]) * 1.0001).all()


def test_float8_saturates_beyond_its_range_instead_of_turning_to_nan():
    how = replay.CompactFloats("float8_e4m3", np.float32(0.5))
    decoded = how.decode(how.encode(np.array([1e6, -1e6, 64.0], np.float32)))
    np.testing.assert_array_equal(decoded, [how.largest, -how.largest, 64.0])


def test_bad_dtypes_and_scales_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match=r"config.replay_obs_dtype must be one of .*'float16'"):
        dqn.DQNConfig(replay_obs_dtype="float16").validate(1)
    with pytest.raises(ValueError, match=r"config.replay_obs_dtype must be one of"):
        sac.SACConfig(replay_obs_dtype="fp8").validate(1)
    with pytest.raises(ValueError, match="finite and positive"):
        replay.CompactFloats("float8_e4m3", np.array([1.0, 0.0]))


def test_atari_frames_are_not_compacted_further():
    spec = envs.env_spec("Pong-v5")
    with pytest.raises(ValueError, match="Pong-v5 observes uint8.*use 'float32'"):
        replay.observation_storage("float8_e4m3", spec)
    assert replay.observation_storage("float32", spec) is None


def test_the_float8_scale_is_the_same_in_every_process_and_fits_a_random_policy():
    # Each actor and learner derives the scale itself: it must come out the same.
    spec = envs.env_spec("HalfCheetah-v4")
    first = replay.observation_storage("float8_e4m3", spec).scale
    envs.random_policy_absmax.cache_clear()
    again = replay.observation_storage("float8_e4m3", spec).scale
    np.testing.assert_array_equal(first, again)
    assert first.shape == spec.observation_shape
    # Observations of another random rollout sit well inside the range (no saturation).
    env = envs.make_env("HalfCheetah-v4", 4, seed=7)
    obs, _ = env.reset()
    rng = np.random.default_rng(7)
    for _ in range(100):
        obs = env.step(rng.uniform(-1, 1, (4, 6)).astype(np.float32))[0]
        assert (np.abs(obs) < 0.25 * replay.CompactFloats("float8_e4m3", first).largest).all()
    env.close()


@pytest.mark.parametrize(
    ("dtype_name", "obs_bytes"), [("float32", 17 * 4), ("bfloat16", 17 * 2), ("float8_e4m3", 17)]
)
def test_bytes_per_item_shrink_with_the_dtype(dtype_name, obs_bytes):
    spec = envs.env_spec("HalfCheetah-v4")
    codec = sac.SACBuilder(sac.SACConfig(replay_obs_dtype=dtype_name)).replay_layout(spec).codec
    # Two observations, 6 actions, reward and discount (float32), the source trailer.
    assert codec.num_bytes == 2 * obs_bytes + 6 * 4 + 2 * 4 + replay.SOURCE_BYTES


def _table(codec):
    return replay.uniform_table("t", 100, replay.RateLimit(1), codec.num_bytes)


def _transitions(count: int, spec: types.EnvSpec, seed: int) -> types.Transition:
    env = envs.make_env(spec.env_id, count, seed=seed)
    obs, _ = env.reset()
    rng = np.random.default_rng(seed)
    for _ in range(20):  # away from the start state, where velocities are 0
        action = rng.uniform(-1, 1, (count, *spec.action_shape)).astype(np.float32)
        next_obs = env.step(action)[0]
        obs, last = next_obs, (obs, action)
    env.close()
    return types.Transition(
        np.asarray(last[0], np.float32),
        last[1],
        rng.normal(size=count).astype(np.float32),
        np.full(count, 0.99, np.float32),
        np.asarray(obs, np.float32),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_round_trip_keeps_compact_bytes_and_decodes_on_the_learners_device(backend):
    spec = envs.env_spec("HalfCheetah-v4")
    builder = sac.SACBuilder(sac.SACConfig(replay_obs_dtype="float8_e4m3"))
    codec = builder.replay_layout(spec).codec
    items = _transitions(8, spec, seed=0)
    node = replay.node_class(backend)(lambda: [_table(codec)])
    try:
        writer = replay.connect(node).writer("t")
        writer.write(codec.encode(items, source=2), np.ones(8))
        writer.flush()
        writer.close()
        sampler = replay.ReplayShards(node).sampler("t", codec)
        try:
            sample = next(iter(sampler.batches(8)))
        finally:
            sampler.close()
    finally:
        node.close()
    assert sample.data.observation.dtype == np.dtype(replay.STORAGE_DTYPES["float8_e4m3"])
    np.testing.assert_array_equal(sample.sources, 2)
    expanded = jax.jit(codec.expand)(sample.data)  # as the learner's step runs it
    assert expanded.observation.dtype == np.float32
    how = replay.observation_storage("float8_e4m3", spec)
    # Every sampled row is one of the written ones, within the float8 error bound.
    for row in np.asarray(expanded.observation):
        distance = np.abs(items.observation - row)
        assert (distance <= how.error_bound(items.observation) + 1e-6).all(axis=1).any()


def test_a_sac_update_on_float8_observations_stays_close_to_float32():
    spec = envs.env_spec("HalfCheetah-v4")
    tiny = dataclasses.replace(sac.SACConfig(), hidden_sizes=(64, 64), batch_size=64)
    items = _transitions(64, spec, seed=1)
    results = {}
    for dtype_name in ("float32", "float8_e4m3"):
        builder = sac.SACBuilder(dataclasses.replace(tiny, replay_obs_dtype=dtype_name))
        codec = builder.replay_layout(spec).codec
        data = codec.decode(codec.encode(items))  # what the learner samples
        batch = builder_lib.SampledBatch(data, np.full(64, 1 / 64), np.full(64, 64, np.int64))
        devices = jax.devices()[:1]
        step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
        state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
        guard = parallel.replicate(step_lib.init_guard(), devices)
        losses = []
        for _ in range(5):
            state, guard, info, _ = step(state, guard, parallel.shard(batch, 1))
            losses.append(float(info.metrics["loss"][0]))
        moved = jax.tree.map(
            lambda new, old: np.asarray(new) - np.asarray(old),
            parallel.unreplicate(state).policy_params,
            builder.init_train_state(jax.random.PRNGKey(0), spec).policy_params,
        )
        results[dtype_name] = (losses, np.concatenate([x.ravel() for x in jax.tree.leaves(moved)]))
    losses32, moved32 = results["float32"]
    losses8, moved8 = results["float8_e4m3"]
    # Stated tolerance: each of the five losses within 2 % of float32's, and the policy's
    # parameters moved the same way (cosine of the two moves >= 0.95; Adam's steps are
    # about the learning rate each whatever the gradient's size, so their lengths match).
    np.testing.assert_allclose(losses8, losses32, rtol=0.02)
    cosine = moved8 @ moved32 / (np.linalg.norm(moved8) * np.linalg.norm(moved32))
    assert cosine >= 0.95, cosine
