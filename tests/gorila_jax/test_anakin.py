"""Anakin runs (`--launcher=anakin`): a learner acting in its own gymnax envs inside its
compiled loop, through the production path (`experiment.run_experiment`)."""

import csv
import dataclasses
import math
import os
import subprocess
import sys

import jax
import pytest

from agents import dqn, ppo, sac
from agents.dqn import presets as dqn_presets
from agents.ppo import presets as ppo_presets
from agents.sac import presets as sac_presets
from gorila_jax import xla_cpu
from gorila_jax.run import experiment

ENV = "gymnax/CartPole-v1"


def _ppo_cartpole(tmp_path, **overrides) -> tuple[ppo.PPOBuilder, experiment.ExperimentConfig]:
    config, settings = ppo_presets.ppo_preset("cartpole")
    settings = {
        **settings,
        "env_id": ENV,
        "launcher": "anakin",
        # Two devices of the four tests/conftest.py makes: one actor's envs on each, so the
        # per-device policies (a switch on the device index) run as a GPU pair would.
        "num_learner_devices": 2,
        **overrides,
    }
    return ppo.PPOBuilder(config), experiment.ExperimentConfig(
        logdir=str(tmp_path), seed=0, **settings
    )


def test_ppo_solves_gymnax_cartpole_in_one_compiled_loop(tmp_path):
    builder, cfg = _ppo_cartpole(tmp_path, total_env_steps=100_000, eval_episodes=20)
    summary = experiment.run_experiment(builder, cfg)
    assert summary["stop_reason"] == "total_env_steps reached"
    # The learner stops its own envs at the budget, less than one iteration (every env's
    # 64 steps) past it.
    per_iteration = cfg.num_actors * cfg.num_envs_per_actor * builder.config.trajectory_length
    assert cfg.total_env_steps <= summary["env_steps"] < cfg.total_env_steps + per_iteration
    # Final greedy return after the whole budget; a random policy scores about 22.
    assert summary["final_eval_return"] >= 475, summary["evaluations"]
    assert summary["final_eval_episodes"] == 20
    assert summary["episodes"] > 0 and math.isfinite(summary["mean_train_return"])
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    # Its actors act inside the loop, and the metrics count them as acting.
    assert {float(row["num_actors"]) for row in rows} == {cfg.num_actors}
    # Each actor's envs act with that actor's policy and carry its index into the batch.
    for index in range(cfg.num_actors):
        kls = [float(row[f"kl/actor_{index}"]) for row in rows if row.get(f"kl/actor_{index}")]
        assert any(math.isfinite(kl) and kl >= 0 for kl in kls), (index, kls)
    assert (tmp_path / "curves.png").exists()
    # The compiled loop's own rate leaves out compilation, the run's start and its final
    # evaluation, which the whole run's env steps/s counts.
    assert summary["loop_env_steps_per_s"] > summary["env_steps_per_s"] > 0
    assert any(
        float(row["loop_env_steps_per_s"]) > 0 for row in rows if row.get("loop_env_steps_per_s")
    )


def test_a_resumed_anakin_run_goes_on_from_its_checkpoint(tmp_path):
    builder, cfg = _ppo_cartpole(tmp_path, total_env_steps=20_000, eval_interval_s=0)
    first = experiment.run_experiment(builder, cfg)
    longer = dataclasses.replace(cfg, total_env_steps=40_000, resume=True)
    second = experiment.run_experiment(builder, longer)
    assert second["resumed_from_learner_step"] == first["learner_steps"]
    assert second["learner_steps"] > first["learner_steps"]
    assert second["env_steps"] >= 40_000 and second["episodes"] > first["episodes"]
    # The whole run's rows, the first part's kept.
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert float(rows[0]["env_steps"]) <= first["env_steps"] < float(rows[-1]["env_steps"])


def _refusal(builder, cfg) -> str:
    with pytest.raises(ValueError) as raised:
        experiment.check_run(builder, cfg)
    return str(raised.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"env_id": "CartPole-v1"}, "try --env=gymnax/CartPole-v1"),
        ({"env_id": "gymnax/CartPol-v1"}, "gymnax/CartPole-v1"),
        ({"num_envs_per_actor": 4}, "set --num_envs_per_actor=8"),
        ({"num_learner_devices": 0}, "num_actors=2 must be a multiple of it"),
        ({"learner_mode": "gorila"}, "launcher=anakin does not take learner_mode=gorila"),
        ({"num_replay_shards": 2}, "does not take num_replay_shards > 1"),
        ({"launcher": "local", "anakin_iterations_per_call": 4}, "is for launcher=anakin"),
        ({"launcher": "local", "xla_cpu_threads": 1}, "is for launcher=anakin"),
    ],
)
def test_what_anakin_cannot_run_is_refused_with_what_would(tmp_path, overrides, message):
    assert message in _refusal(*_ppo_cartpole(tmp_path, **overrides))


def test_an_xla_thread_count_that_jax_already_runs_otherwise_is_refused(tmp_path):
    jax.devices()  # JAX runs in this process: its pool cannot change now
    running = xla_cpu.worker_threads()
    assert running >= 1
    logdir = tmp_path / "run"
    builder, cfg = _ppo_cartpole(logdir, xla_cpu_threads=running + 1)
    with pytest.raises(ValueError) as raised:
        experiment.run_experiment(builder, cfg)
    assert f"already runs {running} XLA:CPU worker threads" in str(raised.value)
    assert "before any JAX computation" in str(raised.value)
    assert not logdir.exists() or not any(logdir.iterdir())  # refused before it wrote


def _dqn_cartpole(tmp_path, **overrides) -> tuple[dqn.DQNBuilder, experiment.ExperimentConfig]:
    config, settings = dqn_presets.dqn_preset("cartpole")
    settings = {**settings, "env_id": ENV, "launcher": "anakin", **overrides}
    return dqn.DQNBuilder(config), experiment.ExperimentConfig(
        logdir=str(tmp_path), **{"seed": 0, **settings}
    )


def test_dqn_solves_gymnax_cartpole_from_a_replay_on_two_devices(tmp_path):
    # The preset and budget of the actors' CartPole test (tests/test_end_to_end.py): its
    # prioritized replay, rate and n-step returns, each device keeping its shard.
    # Seed 1: seeds 1 and 2 ended at 500.0 here, seed 0 at 464.8 (its evaluations on the
    # way 467 and 453; on one device seed 0 ended at 500.0).
    builder, cfg = _dqn_cartpole(tmp_path, num_learner_devices=2, eval_episodes=20, seed=1)
    summary = experiment.run_experiment(builder, cfg)
    assert summary["stop_reason"] == "total_env_steps reached"
    assert summary["final_eval_return"] >= 475, summary["evaluations"]
    # The replay ratio held: one update per `samples_per_insert / batch` of the items
    # inserted after the minimum, as the rate limiter holds actors and learner.
    config = builder.config
    owed = (summary["env_steps"] - config.min_replay_size) * config.samples_per_insert
    assert summary["learner_steps"] == pytest.approx(owed / config.batch_size, rel=0.1)


def test_sac_learns_gymnax_pendulum_in_one_compiled_loop(tmp_path):
    config, settings = sac_presets.sac_preset("pendulum")
    cfg = experiment.ExperimentConfig(
        logdir=str(tmp_path),
        seed=0,
        **{**settings, "env_id": "gymnax/Pendulum-v1", "launcher": "anakin", "eval_episodes": 20},
        num_learner_devices=1,
    )
    summary = experiment.run_experiment(sac.SACBuilder(config), cfg)
    # RL Zoo's SAC: -157 at 20k env steps; a random policy about -1,200.
    assert summary["final_eval_return"] >= -250, summary["evaluations"]


def test_a_batch_that_grows_is_refused_with_the_reason(tmp_path):
    builder, cfg = _dqn_cartpole(tmp_path, num_learner_devices=1)
    growing = dataclasses.replace(
        builder.config, batch_size_max=4 * builder.config.batch_size, batch_growth_steps=1000
    )
    assert "its batch grows" in _refusal(dqn.DQNBuilder(growing), cfg)


def test_a_resumed_off_policy_run_keeps_its_device_replay(tmp_path):
    # A large minimum, so that a replay that had to fill again shows as missing updates.
    config, settings = dqn_presets.dqn_preset("cartpole")
    config = dataclasses.replace(config, min_replay_size=4_000)
    builder = dqn.DQNBuilder(config)
    cfg = experiment.ExperimentConfig(
        logdir=str(tmp_path),
        **{
            **settings,
            "env_id": ENV,
            "launcher": "anakin",
            "num_learner_devices": 2,
            "total_env_steps": 10_000,
            "eval_interval_s": 0,
        },
    )
    per_step = config.samples_per_insert / config.batch_size  # updates per env step
    first = experiment.run_experiment(builder, cfg)
    second = experiment.run_experiment(
        builder, dataclasses.replace(cfg, total_env_steps=16_000, resume=True)
    )
    made = second["learner_steps"] - first["learner_steps"]
    steps = second["env_steps"] - first["env_steps"]
    assert made == pytest.approx(steps * per_step, rel=0.15)  # learning went straight on
    # A checkpoint whose device replay is damaged resumes with an empty one, which fills
    # to the minimum again before learning goes on.
    newest = max((tmp_path / "checkpoints" / "learner").iterdir(), key=lambda p: int(p.name))
    (newest / "device_replay.npz").write_bytes(b"damaged")
    third = experiment.run_experiment(
        builder, dataclasses.replace(cfg, total_env_steps=22_000, resume=True)
    )
    made = third["learner_steps"] - second["learner_steps"]
    steps = third["env_steps"] - second["env_steps"]
    assert made == pytest.approx((steps - config.min_replay_size) * per_step, rel=0.15)


def test_one_xla_worker_for_four_cpu_devices_is_refused_by_the_cli_with_the_reason():
    # XLA:CPU keeps a worker per CPU device: tests/conftest.py's XLA_FLAGS make 4.
    result = subprocess.run(
        [sys.executable, "-m", "launch.train", "--agent=ppo", f"--env={ENV}"]
        + ["--launcher=anakin", "--xla_cpu_threads=1", "--total_env_steps=1000"],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "started 4 worker threads instead: it keeps one per CPU device" in errors[0]
