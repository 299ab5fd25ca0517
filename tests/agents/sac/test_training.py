"""SAC through the whole program: `launch.train` on MuJoCo, and learning Pendulum-v1."""

import csv
import json
import math
import subprocess
import sys

import pytest

from agents import sac
from gorila_jax.run import experiment
from launch import presets

from tests import REPO


def test_launch_train_runs_sac_on_a_mujoco_env(tmp_path):
    # The entry point every agent shares, on a MuJoCo task through envpool:
    # replay fills, the learner updates, losses stay finite.
    command = [
        sys.executable,
        "-m",
        "launch.train",
        "--agent=sac",
        "--env=HalfCheetah-v5",
        "--launcher=local",
        "--num_actors=1",
        "--num_envs_per_actor=4",
        "--total_env_steps=600",
        "--num_learner_devices=1",
        "--eval_interval_s=0",
        "--eval_episodes=1",
        "--checkpoint_interval_steps=0",
        "--config.batch_size=32",
        "--config.samples_per_insert=32",
        "--config.min_replay_size=200",
        "--config.random_steps=200",
        f"--logdir={tmp_path}",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] >= 600 and summary["learner_steps"] > 0
    assert summary["agent_config"]["batch_size"] == 32  # the flag reached SAC's config
    assert math.isfinite(summary["final_eval_return"])
    rows = [row for row in csv.DictReader(open(tmp_path / "metrics.csv")) if row.get("loss")]
    assert rows, "no learner metrics were logged"
    for name in ("loss", "policy_loss", "alpha", "entropy", "q_mean"):
        assert math.isfinite(float(rows[-1][name])), (name, rows[-1])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])
def test_sac_reaches_minus_200_on_pendulum_under_the_local_launcher(tmp_path, seed):
    config, settings = presets.load("auto", "sac", "Pendulum-v1", set())
    exp = experiment.ExperimentConfig(
        env_id="Pendulum-v1",
        launcher="local",
        logdir=str(tmp_path),
        seed=seed,
        # One learner device: the 4-device update is checked against 1 device
        # in test_learning.py; here it would only cost time.
        num_learner_devices=1,
        checkpoint_interval_steps=0,
        **settings,
    )
    summary = experiment.run_experiment(sac.SACBuilder(config), exp)
    # The end of the preset's whole budget (no early stop), over its 50
    # evaluation episodes; the first evaluations, before learning, score
    # below -1000.
    assert summary["env_steps"] >= exp.total_env_steps, summary["stop_reason"]
    assert summary["final_eval_episodes"] == settings["eval_episodes"]
    assert summary["final_eval_return"] >= -200, summary["evaluations"]
