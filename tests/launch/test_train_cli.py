"""`python -m launch.train` with bad input: one error line, non-zero exit, nothing left running."""

import os
import subprocess
import sys

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.train", *flags, "--logdir=/tmp/gorila-bad-input"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env=CartPol-v1"], "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
        (["--env=Pong-v4"], "did you mean Pong-v5"),
        (["--agent=dqnn"], "--agent"),
        (["--num_actors=0"], "--num_actors"),
        (["--total_env_steps=-5"], "--total_env_steps"),
        (["--config.no_such_field=1"], "no_such_field"),
        (["--config.batch_size=abc"], "batch_size"),
        (["--config.batch_size=0"], "config.batch_size must be positive"),
        (["--config.discount=1.5"], "config.discount must lie in [0, 1]"),
        (["--config.adam_b1=1.0"], "config.adam_b1 must lie in [0, 1)"),
        (["stray_argument"], "unexpected arguments"),
        (["--preset=nosuch"], "unknown preset 'nosuch'"),
        (["--preset=/tmp/gorila-no-such-preset.yaml"], "does not exist"),
        (["--precision=fp8"], "--precision"),
        (["--config.precision=fp8"], "config.precision must be one of"),
        (["--config.torso=nature"], "nature torso needs image stacks"),
        (["--learner_mode=hogwild"], "--learner_mode"),
        (["--compression=twobit"], "--compression"),
        (["--num_ps_shards=0"], "--num_ps_shards"),
        (["--num_learner_hosts=0"], "--num_learner_hosts"),
        (["--num_learner_hosts=2", "--launcher=local"], "num_learner_hosts=2 needs launcher=ray"),
        (
            ["--num_learner_hosts=2", "--learner_mode=gorila"],
            "num_learner_hosts=2 needs learner_mode=sync",
        ),
        (["--num_learner_hosts=2"], "set checkpoint_interval_steps=0"),
        (["--agent=ppo", "--learner_mode=gorila"], "learner_mode=gorila needs an agent"),
        (
            ["--agent=sac", "--env=Pendulum-v1", "--learner_mode=gorila"],
            "learner_mode=gorila needs an agent",
        ),
    ],
)
def test_bad_input_fails_with_one_line_and_nonzero_exit(flags, message):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = _train(*flags)
    assert result.returncode != 0
    errors = _error_lines(result)
    assert len(errors) == 1, result.stderr[-2000:]
    assert message in errors[0]
    assert "Traceback" not in result.stderr
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not (after - before), "a bad input left processes running"
