"""Batch growth: the doubling schedule, its validation, and a learner that follows it."""

import dataclasses

import chex
import jax
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import parallel
from gorila_jax.distributed import launchers
from gorila_jax.learning import step as step_lib
from tests.agents.dqn.test_learning import SPEC, TINY, _random_batch
from tests.gorila_jax.acting import test_nodes


def test_the_batch_doubles_from_256_to_1024_in_even_steps():
    schedule = builder_lib.growing_batch_schedule(256, 1024, 1000)
    assert schedule == ((0, 256), (500, 512), (1000, 1024))
    sizes = [builder_lib.batch_size_at(schedule, step) for step in (0, 499, 500, 999, 1000, 10**6)]
    assert sizes == [256, 256, 512, 512, 1024, 1024]


def test_a_maximum_off_the_doubling_path_is_reached_last_and_no_growth_is_fixed():
    assert builder_lib.growing_batch_schedule(64, 200, 300) == ((0, 64), (150, 128), (300, 200))
    assert builder_lib.growing_batch_schedule(64, 0, 300) == ((0, 64),)


def test_the_rate_limiter_buffer_holds_the_largest_batch():
    config = dataclasses.replace(dqn.DQNConfig(), batch_size=256, batch_size_max=1024)
    assert max(size for _, size in dqn.DQNBuilder(config).batch_plan.schedule) == 1024


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"batch_size_max": 128}, "batch_size_max=128 is below config.batch_size=256"),
        ({"batch_size_max": 1026}, "batch_size_max=1026 must be divisible by the 4"),
    ],
)
def test_bad_growth_settings_are_rejected(overrides, message):
    config = dataclasses.replace(dqn.DQNConfig(), batch_size=256, **overrides)
    with pytest.raises(ValueError) as error:
        config.validate(num_devices=4)
    assert message in str(error.value)


def test_the_learner_follows_the_schedule_within_the_replay_ratio():
    config = dataclasses.replace(
        test_nodes.CONFIG,
        batch_size=32,
        batch_size_max=128,
        batch_growth_steps=10,
        samples_per_insert=2.0,
        min_replay_size=200,
    )
    with launchers.launch(test_nodes._program(0, config), "local") as running:
        learner_client = running.client("learner")
        sizes = []
        while len(sizes) < 20:
            if learner_client.step():
                sizes.append(learner_client.last_batch_size())
        info = running.client("replay").table_info()[dqn.builder.TABLE]
    # Sizes only grow, through every scheduled size; the device prefetcher may
    # hand over up to two batches sampled before a switch.
    assert sizes == sorted(sizes) and set(sizes) == {32, 64, 128}
    assert sizes[:5] == [32] * 5 and sizes[-5:] == [128] * 5
    # The limiter counts sampled items, so the ratio holds whatever the batch;
    # its slack fits 16 of the largest batches, so a big batch never deadlocks.
    assert info["samples_per_insert"] == 2.0 and info["slack"] >= 16 * 128
    assert info["samples"] <= 2.0 * (info["inserts"] - 200) + info["slack"]


def test_the_update_compiles_once_per_distinct_batch_size():
    builder = dqn.DQNBuilder(TINY)
    step_fn = step_lib.make_step(builder, SPEC)
    chex.clear_trace_counter()
    step = parallel.pmap_step(
        chex.assert_max_traces(step_fn, n=3), jax.devices(), out_axes=step_lib.OUT_AXES
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), SPEC), jax.devices())
    guard = parallel.replicate(step_lib.init_guard(), jax.devices())
    for seed, size in enumerate([32, 32, 64, 64, 128, 128, 128]):
        state, guard, _, _ = step(state, guard, parallel.shard(_random_batch(seed, size), 4))
