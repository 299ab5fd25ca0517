"""QR-DQN solves CartPole-v1 and holds it to the end of its preset's budget, under both
launchers and in Gorila mode, on the path `launch.train` runs: the `auto` preset, then
`run_experiment`.

Each asserts the final greedy evaluation (10 episodes after the whole budget),
not a first crossing of the threshold.
"""

import csv
import dataclasses

import pytest

from agents import registry
from gorila_jax.run import experiment
from launch import presets

EXPERIMENT_FIELDS = {field.name for field in dataclasses.fields(experiment.ExperimentConfig)}


def _cartpole(tmp_path, learner_mode: str = "sync", **overrides):
    config, settings = presets.load("auto", "qrdqn", "CartPole-v1", EXPERIMENT_FIELDS, learner_mode)
    exp = experiment.ExperimentConfig(
        logdir=str(tmp_path),
        env_id="CartPole-v1",
        seed=0,
        # One learner device: 1 vs 4 devices is checked in test_learning.py.
        num_learner_devices=1,
        learner_mode=learner_mode,
        **{**settings, **overrides},
    )
    return registry.AGENTS["qrdqn"].builder(config), exp


def _assert_solved_at_the_end(summary, exp) -> None:
    assert summary["env_steps"] >= exp.total_env_steps, summary["stop_reason"]
    assert summary["final_eval_episodes"] == 10
    assert summary["final_eval_return"] >= 475, summary["evaluations"]


@pytest.mark.slow
def test_qrdqn_solves_cartpole_under_the_local_launcher(tmp_path):
    builder, exp = _cartpole(tmp_path, launcher="local")
    assert builder.config.num_quantiles > 1  # the auto preset picked the cartpole one
    summary = experiment.run_experiment(builder, exp)
    _assert_solved_at_the_end(summary, exp)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    # The mean over quantiles stays below the most a CartPole return is worth.
    q_means = [float(row["q_mean"]) for row in rows if row.get("q_mean")]
    assert q_means and max(q_means) < 1.0 / (1.0 - builder.config.discount), max(q_means)


@pytest.mark.slow
@pytest.mark.extended  # the local test above proves the learning claim in CI
def test_qrdqn_solves_cartpole_under_the_ray_launcher(tmp_path, ray_options):
    # 2 actors, the learner and replay share the test cluster's 2 logical CPUs.
    builder, exp = _cartpole(
        tmp_path, launcher="ray", learner_cpus=0.5, replay_cpus=0.5, cpus_per_actor=0.5
    )
    summary = experiment.run_experiment(builder, exp, **ray_options)
    _assert_solved_at_the_end(summary, exp)


@pytest.mark.slow
@pytest.mark.extended
def test_qrdqn_solves_cartpole_in_gorila_mode(tmp_path, ray_options):
    # Replay, 2 workers, 2 shards and 2 actors take a quarter CPU each.
    builder, exp = _cartpole(
        tmp_path,
        learner_mode="gorila",
        launcher="ray",
        num_learners=2,
        num_ps_shards=2,
        outlier_stds=0.0,
        learner_cpus=0.25,
        replay_cpus=0.25,
        cpus_per_actor=0.25,
        ps_cpus=0.25,
    )
    assert builder.config.adam_b1 == 0.0  # the Gorila preset
    summary = experiment.run_experiment(builder, exp, **ray_options)
    _assert_solved_at_the_end(summary, exp)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert float(rows[-1]["shard0/applied"]) > 0 and float(rows[-1]["shard1/applied"]) > 0
