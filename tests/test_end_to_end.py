"""DQN learns CartPole-v1 through the whole program: actors, replay, learner, evaluator.

These are the slow tests that prove the core claim; each has a fixed seed, runs a
bounded budget to its end (no `stop_at_eval_return`: a run that solves and
collapses later must fail) and asserts a return threshold from the final greedy
evaluation (10 episodes after the whole budget).
"""

import csv
import dataclasses
import glob
import json
import os

import pytest
from matplotlib import image

from agents import dqn
from gorila_jax import curves, envs
from gorila_jax.gorila import parameter_server
from gorila_jax.run import experiment
from agents.dqn import presets as dqn_presets
from tests.backends import BACKENDS


def _cartpole(
    tmp_path, preset=dqn_presets.dqn_preset, **overrides
) -> tuple[dqn.DQNBuilder, experiment.ExperimentConfig]:
    config, settings = preset("cartpole")
    settings = {**settings, **overrides}
    # One learner device: the 4-device update is checked against 1 device in
    # tests/agents/dqn/test_learning.py; here it would only cost time.
    exp = experiment.ExperimentConfig(
        logdir=str(tmp_path), seed=0, num_learner_devices=1, **settings
    )
    return dqn.DQNBuilder(config), exp


@pytest.mark.slow
@pytest.mark.parametrize("replay_backend", BACKENDS)
def test_dqn_solves_cartpole_and_holds_it_to_the_end_of_its_budget(tmp_path, replay_backend):
    # The whole preset budget, no early stop: a policy that reaches 475 and
    # falls back later (the late collapses before LayerNorm) fails here. On both replay
    # backends (Reverb's on the DeepMind set): every other learning test runs on the set's
    # default one.
    # 50 final episodes: in a clean-clone CI run the 10-episode final mean was 469.5 (an
    # evaluation at 118k: 477.8), where one episode cut short moves a 10-episode mean by
    # up to 50; 50 episodes judge the policy rather than one episode.
    builder, exp = _cartpole(
        tmp_path, launcher="local", replay_backend=replay_backend, eval_episodes=50
    )
    summary = experiment.run_experiment(builder, exp)
    _assert_solved_at_the_end(summary, exp)
    _assert_run_files(tmp_path, summary)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    _assert_q_within_the_largest_return(rows, builder.config.discount)


@pytest.mark.slow
def test_dqn_solves_cartpole_with_most_of_its_replay_on_disk(tmp_path):
    """A tiered replay: 10k items in memory, the rest of the preset's 120k on disk.

    It solves CartPole (a greedy evaluation reaches 475) and ends the whole budget far
    above a collapsed policy. The stricter end-of-budget claim (final greedy return 475)
    is the in-memory test's above: with tiers, seed 0 ended at 446.3 in a CI run
    (evaluations 500 from 50k to 107k env steps) and at 319.5 in one of four repeats of
    seeds 0-3 run here, whose other three and all four in memory ended at 500. The cold
    tier's sampling is the in-memory table's (tests/gorila_jax/replay/test_tiered_replay.py
    checks probabilities and importance weights), so what varies is DQN's late
    oscillation, which the in-memory test bounds."""
    builder, exp = _cartpole(tmp_path, launcher="local")
    builder = dqn.DQNBuilder(dataclasses.replace(builder.config, hot_replay_size=10_000))
    summary = experiment.run_experiment(builder, exp)
    _assert_solved_then_held_above(summary, exp, floor=200.0)
    last = list(csv.DictReader(open(tmp_path / "metrics.csv")))[-1]
    assert float(last["replay/hot_items"]) == 10_000
    assert float(last["replay/cold_items"]) > 3 * 10_000, "most items moved to disk"
    assert float(last["replay/cold_bytes"]) > 0
    # Sampled by mass: the cold tier holds most of it, and gives most rows.
    assert float(last["replay/cold_share"]) > 0.5
    assert os.path.getsize(tmp_path / "replay_cold" / "ring.u8") > 0


def _assert_solved_at_the_end(summary, exp, threshold: float = 475.0) -> None:
    """The greedy return after the whole budget, not the best or the first crossing.

    The final evaluation (10 greedy episodes of the last parameters) reaches
    `threshold`: a run that solved CartPole and then collapsed ends below it.
    """
    assert summary["stop_reason"] == "total_env_steps reached", summary["stop_reason"]
    assert summary["env_steps"] >= exp.total_env_steps
    assert summary["final_eval_episodes"] >= 10
    assert summary["final_eval_return"] >= threshold, summary["evaluations"]


def _assert_solved_then_held_above(summary, exp, floor: float) -> None:
    """A greedy evaluation during the run reached 475, and the final one after the whole
    budget is at least `floor`: solved, and far above a collapsed policy at the end."""
    _assert_solved_at_the_end(summary, exp, threshold=floor)
    best = max(evaluation["eval_return"] for evaluation in summary["evaluations"])
    assert best >= 475.0, summary["evaluations"]


def _assert_q_within_the_largest_return(rows, discount: float) -> None:
    """No Q divergence: a CartPole return (reward 1 per step) is worth at most 1 / (1 - gamma).

    Every logged mean Q of every learner (Gorila: every worker) is checked;
    runaway Q came before the collapses the cartpole preset's LayerNorm fixed.
    """
    columns = [key for key in rows[0] if key.split("/")[-1] == "q_mean"]
    assert columns, list(rows[0])
    logged = [float(row[key]) for row in rows for key in columns if row[key]]
    assert logged and max(logged) < 1.0 / (1.0 - discount), max(logged)


def _assert_run_files(logdir, summary) -> None:
    """What a user gets on disk: the summary, one CSV row per log interval, TensorBoard
    events, and a picture of the run whose greedy curve ends at the final evaluation."""
    on_disk = json.loads((logdir / "summary.json").read_text())
    for key in ("learner_steps", "wall_time_s", "env_steps_per_s", "final_eval_return"):
        assert on_disk[key] == summary[key]
    rows = list(csv.DictReader(open(logdir / "metrics.csv")))
    assert len(rows) >= 3 and float(rows[-1]["learner_steps"]) > 0
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert image.imread(logdir / "curves.png").ndim == 3
    _, greedy = curves.series(curves.read_run(str(logdir)), "eval_return", "env_steps")
    assert greedy[-1] == summary["final_eval_return"]


@pytest.mark.slow
@pytest.mark.extended  # CI proves learning under ray with Gorila mode and PPO
def test_dqn_learns_under_the_ray_launcher_with_two_actors(tmp_path, ray_options):
    builder, exp = _cartpole(
        tmp_path,
        launcher="ray",
        num_actors=2,
        # A bounded budget, half the preset's, whose end is asserted.
        total_env_steps=60_000,
        # 4 nodes that need a CPU share the 2 logical CPUs of the test cluster.
        learner_cpus=0.5,
        replay_cpus=0.5,
        cpus_per_actor=0.5,
    )
    summary = experiment.run_experiment(builder, exp, **ray_options)
    # The untrained network's evaluations score about 10.
    _assert_solved_at_the_end(summary, exp, threshold=150.0)


# CI's Gorila learning test: half the preset's 120k env steps, with the learning-rate and
# importance schedules ending there as the whole budget ends them. CI's one-at-a-time
# tests have no room for the whole budget beside the rest of the suite (734 s of a
# 28-minute clean-clone run). At 60k seed 0 ended at 475+ on JAX 0.4.34, and at 454.4
# alone and 420.6 beside the suite on JAX 0.11, and at 287.2 in a clean-clone CI run of
# 2026-12-07 (greedy evaluations 280-330 from 40k env steps on): Gorila's asynchronous
# runs differ from one to the next, so this test asks for learning (200, twenty times
# what an untrained network scores, about 10) and the extended one below for the solve
# over the whole budget.
GORILA_TEST_ENV_STEPS = 60_000


def _gorila_preset_over_the_test_budget(name: str):
    config, settings = dqn_presets.dqn_gorila_preset(name)
    return dqn_presets.schedules_over(config, GORILA_TEST_ENV_STEPS), settings


def _gorila_cartpole(tmp_path, preset=dqn_presets.dqn_gorila_preset, **overrides):
    # The cartpole preset as Gorila mode takes it (Adam's b1 lowered:
    # `dqn_presets.dqn_gorila_preset`). Every node that asks for a CPU takes a
    # quarter: replay, 2 workers, 2 shards and 2 actors fit the 2 logical CPUs.
    return _cartpole(
        tmp_path,
        preset=preset,
        launcher="ray",
        learner_mode="gorila",
        num_learners=2,
        num_ps_shards=2,
        outlier_stds=0.0,  # as measured (README, "Gorila mode")
        learner_cpus=0.25,
        replay_cpus=0.25,
        cpus_per_actor=0.25,
        ps_cpus=0.25,
        **overrides,
    )


@pytest.mark.slow
def test_gorila_dqn_learns_cartpole_with_two_workers_and_two_shards(tmp_path, ray_options):
    builder, exp = _gorila_cartpole(
        tmp_path,
        preset=_gorila_preset_over_the_test_budget,
        total_env_steps=GORILA_TEST_ENV_STEPS,
    )
    summary = experiment.run_experiment(builder, exp, **ray_options)
    _assert_solved_at_the_end(summary, exp, threshold=200.0)
    _assert_asynchronous_through_both_shards(tmp_path, builder)


@pytest.mark.slow
@pytest.mark.extended  # CI: the test above, over half the budget (learning, not the solve)
def test_gorila_dqn_solves_cartpole_with_two_workers_and_two_shards(tmp_path, ray_options):
    # The preset's whole 120k env steps, as the README's sweep (5 of 5 seeds at 500).
    builder, exp = _gorila_cartpole(tmp_path)
    summary = experiment.run_experiment(builder, exp, **ray_options)
    _assert_solved_at_the_end(summary, exp)
    _assert_asynchronous_through_both_shards(tmp_path, builder)


def _assert_asynchronous_through_both_shards(tmp_path, builder) -> None:
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    # Asynchronous for real: gradients landed on parameters that had moved on.
    assert float(rows[-1]["mean_staleness"]) > 0.5
    assert float(rows[-1]["shard0/applied"]) > 0 and float(rows[-1]["shard1/applied"]) > 0
    _assert_q_within_the_largest_return(rows, builder.config.discount)


@pytest.mark.slow
@pytest.mark.extended  # CI: 1-bit error feedback converges (test_compression.py) and Gorila learns
def test_gorila_dqn_learns_cartpole_with_one_bit_gradients_two_workers_two_shards(
    tmp_path, ray_options
):
    builder, exp = _gorila_cartpole(tmp_path, compression="onebit")
    summary = experiment.run_experiment(builder, exp, **ray_options)
    # The preset's whole 120k env steps (extended: too long for CI).
    _assert_solved_at_the_end(summary, exp, threshold=300.0)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    # The updates went through both shards.
    assert float(rows[-1]["shard0/applied"]) > 0 and float(rows[-1]["shard1/applied"]) > 0
    num_params = parameter_server.initial_layout(builder, envs.env_spec(exp.env_id), 0, 2)[0].size
    # A sign bit per value plus a float32 scale per 256: ~28x fewer bytes than float32.
    assert float(rows[-1]["bytes_per_update"]) < 4 * num_params / 20
