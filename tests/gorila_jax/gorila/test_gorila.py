"""Gorila mode: workers and shards on a real Reverb replay, under the local launcher."""

import csv
import dataclasses
import functools
import os

import chex
import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel
from gorila_jax.distributed import launchers, program
from gorila_jax.gorila import compression, mode, parameter_server, shard_node, workers
from gorila_jax.learning import checkpoint, sync_learner
from gorila_jax.learning import step as step_lib
from gorila_jax.learning.settings import LearnerSettings
from gorila_jax.run import experiment
from tests.agents.dqn.test_learning import TINY, _random_batch
from tests.gorila_jax.learning.test_fault_numeric import _nan_batch
from tests.backends import DefaultReplayNode

SPEC = envs.env_spec("CartPole-v1")
SEED = 3
KEEP_ALL = shard_node.ShardSettings(max_staleness=-1)  # no gradient is too stale
CONFIG = dataclasses.replace(TINY, min_replay_size=100)


def _gorila_program(
    num_shards: int, max_staleness: int, config: dqn.DQNConfig = CONFIG, **worker_options
) -> program.Program:
    builder = dqn.DQNBuilder(config)
    graph = program.Program("gorila-test")
    with graph.group("replay"):
        replay_node = graph.add_node(
            DefaultReplayNode, functools.partial(builder_lib.replay_tables, builder, SPEC)
        )
    with graph.group("parameter_server"):
        shards = [
            graph.add_node(
                shard_node.ParameterShardNode,
                builder,
                SPEC,
                SEED,
                index,
                num_shards,
                shard_node.ShardSettings(max_staleness=max_staleness),
            )
            for index in range(num_shards)
        ]
    with graph.group("gradient_worker"):
        graph.add_node(
            workers.GradientWorkerNode,
            builder,
            SPEC,
            replay_node,
            shards,
            None,
            SEED,
            0,
            LearnerSettings(num_devices=1),
            # No outlier filter unless a test asks for one: these tests count every push.
            workers.WorkerSettings(**{"outlier_stds": 0.0, **worker_options}),
        )
    graph.node("gradient_worker").disable_run()
    return graph


def _sync_params(batches) -> tuple:
    builder = dqn.DQNBuilder(CONFIG)
    devices = jax.devices()[:1]
    step = parallel.pmap_step(step_lib.make_step(builder, SPEC), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder_lib.initial_train_state(builder, SPEC, SEED), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    for batch in batches:
        state, guard, _, _ = step(state, guard, parallel.shard_to_devices(batch, devices))
    state = parallel.unreplicate(state)
    return state.params, state.target_params


def test_one_worker_one_shard_fresh_gradients_equal_the_synchronous_learner():
    batches = [_random_batch(seed) for seed in range(5)]
    expected_params, expected_target = _sync_params(batches)
    with launchers.launch(_gorila_program(1, max_staleness=0), "local") as running:
        worker = running.client("gradient_worker")
        for batch in batches:
            assert worker.step_on(None, parallel.shard_to_devices(batch, jax.devices()[:1]))
        version, params = parameter_server.ShardedParameters(
            [running.client("parameter_server")],
            parameter_server.initial_layout(dqn.DQNBuilder(CONFIG), SPEC, SEED, 1)[0],
        ).get_params()
    assert version == len(batches)
    chex.assert_trees_all_close(params, expected_params, atol=1e-6)


def _shard_layout(num_shards: int):
    return parameter_server.initial_layout(dqn.DQNBuilder(CONFIG), SPEC, SEED, num_shards)[0]


def test_gradients_on_stale_parameters_are_dropped_and_counted():
    # The worker pulls every 3 steps; with max_staleness 0 only the first
    # gradient after each pull lands on the version it was computed on.
    devices = jax.devices()[:1]
    with launchers.launch(_gorila_program(2, 0, async_update=3), "local") as running:
        worker = running.client("gradient_worker")
        applied = [
            worker.step_on(None, parallel.shard_to_devices(_random_batch(seed), devices))
            for seed in range(6)
        ]
        shard_counters = [running.client(f"parameter_server/{i}").counters() for i in range(2)]
    assert applied == [True, False, False, True, False, False]
    assert all(c["applied"] == 2 and c["dropped_stale"] == 4 for c in shard_counters)


def test_a_workers_step_is_the_guarded_one_and_flags_a_nan_gradient():
    builder = dqn.DQNBuilder(CONFIG)
    devices = jax.devices()[:1]
    step = parallel.pmap_step(
        step_lib.make_step(builder, SPEC, gradient_worker=True), devices, step_lib.OUT_AXES
    )
    state = parallel.replicate(builder_lib.initial_train_state(builder, SPEC, SEED), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    state, guard, info, out = step(state, guard, parallel.shard(_random_batch(0), 1))
    assert bool(out.finite) and bool(out.pushable)
    _, guard, info, out = step(state, guard, parallel.shard(_nan_batch(1), 1))
    assert not bool(out.finite) and not bool(out.pushable)
    assert np.isnan(np.asarray(info.priorities)).all()
    assert int(guard.skipped_steps[0]) == 1


def test_a_nan_gradient_is_never_pushed_and_counts_as_nonfinite():
    devices = jax.devices()[:1]
    with launchers.launch(_gorila_program(1, max_staleness=-1), "local") as running:
        worker = running.client("gradient_worker")
        assert worker.step_on(None, parallel.shard_to_devices(_random_batch(0), devices))
        assert not worker.step_on(None, parallel.shard_to_devices(_nan_batch(1), devices))
        metrics = worker.latest_metrics()
        assert metrics["nonfinite_skipped_steps"] == 1.0
        assert running.client("parameter_server").get()[0] == 1  # the NaN never reached it
        assert worker.step_on(None, parallel.shard_to_devices(_random_batch(2), devices))
        assert running.client("parameter_server").get()[0] == 2


def test_loss_outliers_are_dropped_after_warmup_and_do_not_widen_the_band():
    rng = np.random.default_rng(0)
    losses = rng.normal(1.0, 0.1, 300)
    filter_ = workers.LossOutlierFilter(num_stds=4.0, warmup=100)
    assert all(filter_.accept(float(loss)) for loss in losses[:100])  # warm-up: all pass
    accepted_after = [filter_.accept(float(loss)) for loss in losses[100:]]
    assert sum(accepted_after) >= 198  # 4 stds: almost nothing normal is dropped
    assert not filter_.accept(10.0)
    assert not filter_.accept(10.0)  # rejected outliers did not move the statistics
    assert not filter_.accept(float("nan"))
    assert filter_.accept(1.05)


def test_two_shards_reassemble_into_the_parameters_actors_act_with():
    with launchers.launch(_gorila_program(2, -1), "local") as running:
        shards = [running.client(f"parameter_server/{i}") for i in range(2)]
        source = parameter_server.ShardedParameters(shards, _shard_layout(2))
        version, params = source.get_params()
        assert version == 0
        assert source.get_params(newer_than=0) is None
        running.client("gradient_worker").step_on(
            None, parallel.shard_to_devices(_random_batch(0), jax.devices()[:1])
        )
        version, moved = source.futures.get_params(0).result()
    assert version == 2  # each of the two shards applied its slice once
    expected_initial = builder_lib.initial_train_state(dqn.DQNBuilder(CONFIG), SPEC, SEED).params
    chex.assert_trees_all_close(params, expected_initial)
    assert not np.allclose(
        jax.tree_util.tree_leaves(moved)[0], jax.tree_util.tree_leaves(params)[0]
    )


class _Pusher:
    """Test node: pushes random gradient slices to one shard, from its own process."""

    def __init__(self, shard: program.Client, size: int, seed: int):
        self._shard, self._size, self._seed = shard, size, seed

    def push_many(self, count: int) -> int:
        rng = np.random.default_rng(self._seed)
        applied = 0
        for _ in range(count):
            gradient = rng.normal(size=self._size).astype(np.float32)
            encoded = compression.GradientCompressor("none").encode(gradient)
            applied += self._shard.push(encoded, 0).applied
        return applied


def test_versions_count_each_update_once_under_pushes_from_three_processes(ray_options):
    builder = dqn.DQNBuilder(CONFIG)
    size = _shard_layout(1).size
    graph = program.Program("shard-concurrency")
    with graph.group("parameter_server", program.Resources(num_cpus=0.5)):
        shard = graph.add_node(shard_node.ParameterShardNode, builder, SPEC, SEED, 0, 1, KEEP_ALL)
    with graph.group("pusher", program.Resources(num_cpus=0.5)):
        for seed in range(3):
            graph.add_node(_Pusher, shard, size, seed)
    with launchers.launch(graph, "ray", **ray_options) as running:
        pushes = [running.client(f"pusher/{i}").futures.push_many(40) for i in range(3)]
        applied = sum(push.result() for push in pushes)
        version, _ = running.client("parameter_server").get()
        counters = running.client("parameter_server").counters()
    assert applied == 120
    assert version == counters["applied"] == 120


def test_actors_receive_parameter_deltas_that_track_the_shards():
    devices = jax.devices()[:1]
    with launchers.launch(_gorila_program(2, -1), "local") as running:
        shards = [running.client(f"parameter_server/{i}") for i in range(2)]
        builder = dqn.DQNBuilder(CONFIG)
        actor_view = parameter_server.sharded_parameters(
            shards, builder, SPEC, SEED, receiver="actor/0"
        )
        exact_view = parameter_server.ShardedParameters(shards, _shard_layout(2))
        actor_view.get_params()
        full_bytes = actor_view.bytes_received
        for seed in range(3):
            running.client("gradient_worker").step_on(
                None, parallel.shard_to_devices(_random_batch(seed), devices)
            )
            _, received = actor_view.get_params()
            _, exact = exact_view.get_params()
            # Within one delta's bfloat16 rounding of the shards' float32 values.
            chex.assert_trees_all_close(received, exact, atol=1e-4)
        delta_bytes = actor_view.bytes_received - full_bytes
        # A restarted actor under the same name has no base: it gets full slices again.
        restarted = parameter_server.sharded_parameters(
            shards, builder, SPEC, SEED, receiver="actor/0"
        )
        _, fresh = restarted.get_params()
        chex.assert_trees_all_close(fresh, exact_view.get_params(-1)[1], atol=0)
    assert delta_bytes <= 3 * full_bytes / 2 + 1  # three deltas at bfloat16: half each


def _gorila_experiment(tmp_path, **overrides) -> experiment.ExperimentConfig:
    settings = dict(
        launcher="local",
        learner_mode="gorila",
        num_learners=2,
        num_ps_shards=2,
        num_actors=1,
        num_envs_per_actor=4,
        total_env_steps=3_000,
        num_learner_devices=1,
        eval_interval_s=0,
        eval_episodes=2,
        log_interval_s=0.5,
        checkpoint_interval_steps=50,
        logdir=str(tmp_path),
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


GORILA_RUN_CONFIG = dataclasses.replace(CONFIG, min_replay_size=500, samples_per_insert=2.0)


def test_a_gorila_run_applies_updates_through_the_shards_and_reports_them(tmp_path):
    summary = experiment.run_experiment(
        dqn.DQNBuilder(GORILA_RUN_CONFIG), _gorila_experiment(tmp_path)
    )
    assert summary["learner_steps"] > 0  # applied updates, summed over workers
    # Each applied update raised both shards' versions; actors read their sum.
    assert summary["params_version"] >= summary["learner_steps"]
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for column in (
        "gradients_applied",
        "dropped_stale",
        "dropped_outlier",
        "dropped_nonfinite",
        "mean_staleness",
        "bytes_per_update",
        "shard0/updates_per_s",
        "shard1/updates_per_s",
    ):
        assert column in rows[-1], column
    # The workers' applied gradients are the run's learner steps.
    assert float(rows[-1]["gradients_applied"]) == float(rows[-1]["learner_steps"]) > 0
    assert float(rows[-1]["bytes_per_update"]) > 0


def test_a_gorila_run_resumes_from_its_checkpoint_with_shards_and_counters_continued(tmp_path):
    builder = dqn.DQNBuilder(GORILA_RUN_CONFIG)
    first = experiment.run_experiment(builder, _gorila_experiment(tmp_path))
    steps = checkpoint.saved_steps(tmp_path)
    assert len(steps) >= 2  # periodic ones (every 50 global updates) and the final one
    final = steps[-1]
    # The final checkpoint comes after the workers stopped: the shards' last versions.
    assert final == round(first["params_version"] / 2)
    replay_steps = sorted(
        int(d) for d in os.listdir(checkpoint.replay_dir(tmp_path)) if d.isdigit()
    )
    assert replay_steps == steps  # each checkpoint has its replay beside it

    # A run passes its budget by what its actors do until they are stopped
    # (more on a fast machine), so the second budget counts from where the first ended.
    budget = first["env_steps"] + 2_000
    second = experiment.run_experiment(
        builder, _gorila_experiment(tmp_path, total_env_steps=budget, resume=True)
    )
    assert second["resumed_from_learner_step"] == final
    assert second["env_steps"] >= budget > first["env_steps"]
    assert second["learner_steps"] > first["learner_steps"]  # worker counters went on
    assert second["params_version"] > first["params_version"]  # shard versions went on
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for column in ("env_steps", "learner_steps", "gradients_applied"):
        values = [float(row[column]) for row in rows if row[column]]
        assert values == sorted(values), f"{column} goes backwards in metrics.csv"


def test_a_restored_shard_serves_the_checkpoint_even_to_readers_holding_newer_versions(tmp_path):
    layout = _shard_layout(2)
    builder = dqn.DQNBuilder(CONFIG)
    with launchers.launch(_gorila_program(2, -1), "local") as running:
        worker = running.client("gradient_worker")
        devices = jax.devices()[:1]
        for seed in range(2):
            worker.step_on(None, parallel.shard_to_devices(_random_batch(seed), devices))
        shards = [running.client(f"parameter_server/{i}") for i in range(2)]
        saved = {"shards": [shard.snapshot() for shard in shards]}
        checkpoints = checkpoint.LearnerCheckpoints(str(tmp_path))
        checkpoints.save(2, saved, {})
        for seed in range(2, 5):
            worker.step_on(None, parallel.shard_to_devices(_random_batch(seed), devices))
        reader = parameter_server.ShardedParameters(shards, layout, delta_receiver="actor/0")
        newer_version, _ = reader.get_params()
        assert newer_version == 2 * 5
        # A replacement shard 1 (restore_step NEWEST, as the supervisor starts one).
        replacement = program.Program("replacement")
        with replacement.group("parameter_server"):
            replacement.add_node(
                shard_node.ParameterShardNode,
                builder,
                SPEC,
                SEED,
                1,
                2,
                KEEP_ALL,
                checkpoint_dir=str(tmp_path),
                restore_step=sync_learner.NEWEST,
            )
        with launchers.launch(replacement, "local") as restarted:
            restored = restarted.client("parameter_server")
            assert restored.get(-1)[0] == 2
            np.testing.assert_array_equal(restored.get(-1)[1], saved["shards"][1]["params"])
            chex.assert_trees_all_equal(
                restored.snapshot()["opt_state"], saved["shards"][1]["opt_state"]
            )
            # A reader that held version 5 of that shard takes the restored
            # slice although its version is lower.
            reader._shards[1] = restored
            version, params = reader.get_params(newer_version)
    assert version == 5 + 2
    restored_slice = layout.flatten(params)[layout.slices[1]]
    np.testing.assert_array_equal(restored_slice, saved["shards"][1]["params"])


def test_a_restarted_shard_without_a_checkpoint_fails_instead_of_starting_over(tmp_path):
    builder = dqn.DQNBuilder(CONFIG)
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint to restore"):
        shard_node.ParameterShardNode(
            builder,
            SPEC,
            SEED,
            0,
            2,
            KEEP_ALL,
            checkpoint_dir=str(tmp_path),
            restore_step=sync_learner.NEWEST,
        )


def test_gorila_figures_sum_over_workers():
    reported = {
        "worker0/pushed": 10, "worker0/applied": 8, "worker0/dropped_stale": 2,
        "worker0/staleness_sum": 15, "worker0/bytes_sent": 1000, "worker0/dropped_outlier": 1,
        "worker1/pushed": 30, "worker1/applied": 30, "worker1/dropped_stale": 0,
        "worker1/staleness_sum": 25, "worker1/bytes_sent": 3000, "worker1/dropped_nonfinite": 4,
        "shard0/updates_per_s": 12.5, "loss": 0.3,
    }  # fmt: skip
    totals = mode.summarize(reported)
    assert totals["gradients_applied"] == 38
    assert totals["dropped_stale"] == 2
    assert totals["dropped_outlier"] == 1 and totals["dropped_nonfinite"] == 4
    assert totals["mean_staleness"] == 40 / 40
    assert totals["bytes_per_update"] == 4000 / 40
    line = mode.progress_suffix({**reported, **totals})
    assert "applied 38" in line and "12.5" in line
    assert mode.summarize({"loss": 0.3}) == {}  # sync mode: no Gorila columns


class _WholeStepOnly(dqn.DQNBuilder):
    """An agent whose step is not one gradient (as PPO's epochs are)."""

    def update_fns(self, spec):
        fns = super().update_fns(spec)
        return builder_lib.UpdateFns(None, None, update=fns.compute_grads)


def test_gorila_mode_refuses_an_agent_without_a_single_gradient():
    with pytest.raises(ValueError, match="learner_mode=gorila needs an agent"):
        mode.check_agent(_WholeStepOnly(CONFIG), SPEC)
    mode.check_agent(dqn.DQNBuilder(CONFIG), SPEC)  # DQN's update is one gradient


def test_a_workers_fp16_loss_scale_grows_after_finite_gradients_and_halves_on_overflow():
    config = dataclasses.replace(
        CONFIG, precision="fp16", loss_scale_init=256.0, loss_scale_period=2
    )
    devices = jax.devices()[:1]
    with launchers.launch(_gorila_program(2, -1, config=config), "local") as running:
        worker = running.client("gradient_worker")
        scales = []
        for seed in range(4):
            assert worker.step_on(None, parallel.shard_to_devices(_random_batch(seed), devices))
            scales.append(worker.latest_metrics()["loss_scale"])
        overflow = _random_batch(9)
        overflow.data.observation[5, 0] = np.inf
        assert not worker.step_on(None, parallel.shard_to_devices(overflow, devices))
        worker.step_on(None, parallel.shard_to_devices(_random_batch(10), devices))
        after_overflow = worker.latest_metrics()["loss_scale"]
        shard_versions = [running.client(f"parameter_server/{i}").get()[0] for i in range(2)]
    # The scale each gradient was computed with: doubled after every 2 finite ones.
    assert scales == [256.0, 256.0, 512.0, 512.0]
    assert after_overflow == 512.0  # 1024 after the 4th, halved by the overflow
    assert shard_versions == [5, 5]  # the overflowed gradient never reached a shard


def test_a_worker_copies_to_its_devices_only_the_leaves_it_replaced():
    devices = jax.devices()[:2]
    old = {"params": np.zeros(3, np.float32), "opt_state": np.ones(4, np.float32)}
    old_copies = parallel.replicate(old, devices)
    new = {**old, "params": np.full(3, 2.0, np.float32)}
    new_copies = parallel.replicate_changed(new, old, old_copies, devices)
    assert new_copies["opt_state"] is old_copies["opt_state"]  # not copied again
    np.testing.assert_array_equal(new_copies["params"], np.full((2, 3), 2.0))
    assert {d for d in new_copies["params"].devices()} == set(devices)
