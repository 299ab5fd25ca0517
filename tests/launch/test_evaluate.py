"""`python -m launch.evaluate`: greedy returns of a run's saved parameters, a GIF, clear errors."""

import dataclasses
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from agents import dqn
from gorila_jax import envs
from gorila_jax.acting import evaluation
from gorila_jax.learning import checkpoint
from gorila_jax.learning import config_record
from gorila_jax.run import experiment

from tests import REPO

SPEC = envs.env_spec("CartPole-v1")
CONFIG = dataclasses.replace(dqn.DQNConfig(), hidden_sizes=(32, 32))
SAVED_STEP, EVAL_SEED = 123, 5


def _evaluate(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.evaluate", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _saved_params(key: int):
    state = dqn.DQNBuilder(CONFIG).init_train_state(jax.random.PRNGKey(key), SPEC)
    return jax.device_get(state)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A logdir as training leaves it: config.json and a checkpoint of the learner."""
    logdir = str(tmp_path_factory.mktemp("run"))
    builder = dqn.DQNBuilder(CONFIG)
    config_record.write_config(logdir, builder, experiment.ExperimentConfig(logdir=logdir))
    saver = checkpoint.LearnerCheckpoints(checkpoint.learner_dir(logdir))
    counters = {"actor/0": {"env_steps": 4_000}, "actor/1": {"env_steps": 2_500}}
    # Parameters from a key other than any the evaluator would draw itself.
    saver.save(SAVED_STEP, _saved_params(7), {"node_counters": counters})
    return logdir


def test_reports_greedy_returns_of_the_saved_parameters(run_dir, tmp_path):
    gif = tmp_path / "episode.gif"
    result = _evaluate(
        f"--logdir={run_dir}",
        "--episodes=4",
        "--epsilon=0",
        f"--seed={EVAL_SEED}",
        f"--video={gif}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # Library log lines (XLA's backend probe, for one) stay off the console.
    assert result.stderr == "", result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["learner_step"] == SAVED_STEP
    assert report["env_steps"] == 6_500
    assert report["epsilon"] == 0.0
    assert report["episodes"] == len(report["returns"]) == 4

    # The returns are those of the saved parameters, not of a freshly built network.
    builder = dqn.DQNBuilder(dataclasses.replace(CONFIG, eval_epsilon=0.0))
    saved = evaluation.evaluate(builder, SPEC, _saved_params(7).params, 4, EVAL_SEED)
    fresh = evaluation.evaluate(builder, SPEC, _saved_params(0).params, 4, EVAL_SEED)
    assert not np.array_equal(saved, fresh), "pick another key: these two policies tie"
    np.testing.assert_allclose(report["returns"], saved)
    assert report["mean_return"] == pytest.approx(saved.mean())

    # One episode, rendered by envpool: a frame per step and one for the reset.
    with Image.open(gif) as image:
        assert image.size == (600, 400)
        assert 2 <= image.n_frames <= report["video"]["frames"]


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--logdir=/nonexistent/run"], "config.json not found"),
        (["--logdir={empty}"], "no checkpoint in"),
        (["--logdir={run}", "--video=episode.mp4"], "only .gif"),
    ],
)
def test_bad_input_fails_with_one_error_line(run_dir, tmp_path, flags, message):
    empty = tmp_path / "empty"
    config_record.write_config(str(empty), dqn.DQNBuilder(CONFIG), experiment.ExperimentConfig())
    result = _evaluate(*(f.format(run=run_dir, empty=empty) for f in flags))
    assert result.returncode != 0
    errors = _error_lines(result)
    assert len(errors) == 1, result.stderr[-2000:]
    assert message in errors[0]
    assert "Traceback" not in result.stderr
