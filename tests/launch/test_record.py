"""`python -m launch.record`: demonstrations from a run's checkpoint, in the documented format,
and one clear error line for what cannot be recorded."""

import json
import subprocess
import sys

import numpy as np

from gorila_jax import demonstrations
from tests.launch.test_evaluate import REPO, SAVED_STEP, SPEC, run_dir  # noqa: F401  a fixture


def _record(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.record", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_records_whole_episodes_of_the_saved_policy(run_dir, tmp_path):  # noqa: F811
    out = tmp_path / "demos"
    result = _record(f"--logdir={run_dir}", "--episodes=3", f"--out={out}", "--epsilon=0")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["learner_step"] == SAVED_STEP and report["episodes"] == 3
    episodes = demonstrations.read(str(out), SPEC)
    np.testing.assert_allclose(report["returns"], [e.rewards.sum() for e in episodes])
    assert report["steps"] == sum(e.steps for e in episodes)
    # Whole episodes: each ends in a terminal state (an untrained CartPole policy falls)
    # or at the time limit.
    assert all(e.terminated or e.steps == 500 for e in episodes)


def test_what_cannot_be_recorded_fails_with_one_error_line(run_dir, tmp_path):  # noqa: F811
    out = tmp_path / "demos"
    # The saved parameters are untrained: no CartPole episode of theirs reaches 10,000.
    unreachable = _record(
        f"--logdir={run_dir}", "--episodes=2", f"--out={out}", "--min_return=10000"
    )
    assert unreachable.returncode == 1
    assert "reached --min_return=10000.0" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    # A directory that holds episodes already is never written into.
    taken = tmp_path / "taken"
    episode = demonstrations.Episode(
        np.zeros((2, 4), np.float32), np.zeros(1, np.int32), np.ones(1), True
    )
    demonstrations.write(str(taken), [episode], SPEC.env_id, "test")
    again = _record(f"--logdir={run_dir}", "--episodes=1", f"--out={taken}")
    assert again.returncode == 1 and "already holds episodes" in again.stderr
