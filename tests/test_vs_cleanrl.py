"""bench/vs_cleanrl.py reads both programs' output right: the lines it times by, recorded
from real runs, and the windows it averages over. No CleanRL run here (see the script)."""

import importlib.util
import math
import pathlib
import signal
import subprocess
import sys

import pytest

from gorila_jax import metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("vs_cleanrl", REPO / "bench" / "vs_cleanrl.py")
vs_cleanrl = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vs_cleanrl)

# Recorded from `cleanrl/dqn_jax.py --seed=1` (CleanRL fe8d8a03, gymnasium 0.29.1).
CLEANRL_LINES = [
    "global_step=28, episodic_return=[29.]\n",
    "SPS: 866\n",
    "global_step=27808, episodic_return=[21.]\n",
]
# Recorded from `python -m launch.train --launcher=local --log_interval_s=1` (piped); the
# lines of a run that learns are made by the same formatter below.
OURS_LINES = [
    "[    1.1s] env steps         0 | episodes      0 | return      nan | eval      nan | "
    "       0 env steps/s |    0.0 updates/s\n",
]


def _episode(step: int, ret: float) -> str:
    return f"global_step={step}, episodic_return=[{ret:.0f}.]\n"


def test_cleanrl_episode_lines_give_env_steps_and_return():
    assert vs_cleanrl.parse_cleanrl_episode(CLEANRL_LINES[0]) == (29, 29.0)  # steps from 0
    assert vs_cleanrl.parse_cleanrl_episode(CLEANRL_LINES[1]) is None
    assert vs_cleanrl.parse_cleanrl_episode(CLEANRL_LINES[2]) == (27809, 21.0)
    # a gymnasium that prints a float, not an array
    assert vs_cleanrl.parse_cleanrl_episode("global_step=9, episodic_return=500.0") == (10, 500.0)


def test_cleanrl_needs_a_full_window_of_20_episodes():
    watch = vs_cleanrl.CleanRLWatch()
    for i in range(19):
        assert not watch.feed(float(i), _episode(500 * i, 500))
    assert watch.feed(19.0, _episode(500 * 19, 500))
    assert watch.reached == {
        "seconds": 19.0,
        "env_steps": 9501,
        "train_mean": 500.0,
        "episodes": 20,
    }


def test_cleanrl_is_timed_at_the_first_20_episode_mean_at_475():
    # Episodes 1-10 return 500, 11-20 return 400, then 500: the 20-episode mean is 450 until
    # the 400s leave the window; with 5 of them left (episode 35) it is exactly 475.
    watch = vs_cleanrl.CleanRLWatch()
    returns = [500] * 10 + [400] * 10 + [500] * 20
    reached_at = [watch.feed(100.0 + i, _episode(1000 * i, r)) for i, r in enumerate(returns)]
    assert reached_at.index(True) == 34
    assert watch.reached == {
        "seconds": 134.0,
        "env_steps": 34_001,
        "train_mean": 475.0,
        "episodes": 35,
    }


def test_our_progress_lines_round_trip_through_the_parser():
    recorded = vs_cleanrl.parse_progress_line(OURS_LINES[0])
    assert recorded["wall_time_s"] == 1.1 and recorded["env_steps"] == 0
    assert recorded["episodes"] == 0
    assert math.isnan(recorded["mean_return"]) and math.isnan(recorded["eval_return"])
    row = {
        "wall_time_s": 61.26,
        "env_steps": 75_776,
        "episodes": 1_203,
        "mean_return": 475.0,
        "eval_return": 481.3,
        "env_steps_per_s": 1712.0,
        "learner_steps_per_s": 201.5,
    }
    parsed = vs_cleanrl.parse_progress_line(metrics.progress_line(row) + " | gorila ...\n")
    assert parsed == {
        "wall_time_s": 61.3,
        "env_steps": 75_776,
        "episodes": 1_203,
        "mean_return": 475.0,
        "eval_return": 481.3,
    }
    assert vs_cleanrl.parse_progress_line("stopping: interrupted\n") is None


def _ours(wall: float, steps: int, episodes: int, mean: float, evaluation: float) -> str:
    row = dict(
        wall_time_s=wall,
        env_steps=steps,
        episodes=episodes,
        mean_return=mean,
        eval_return=evaluation,
        env_steps_per_s=0.0,
        learner_steps_per_s=0.0,
    )
    return metrics.progress_line(row) + "\n"


def test_ours_needs_both_criteria_and_a_full_100_episode_window():
    watch = vs_cleanrl.OursWatch()
    assert not watch.feed(9.0, _ours(1.0, 500, 99, 500.0, math.nan))  # 99 episodes only
    assert not watch.feed(10.2, _ours(2.0, 900, 120, 480.0, 200.0))
    assert watch.train == {
        "seconds": 10.2,
        "env_steps": 900,
        "train_mean": 480.0,
        "wall_time_s": 2.0,
    }
    assert watch.eval_seen is None
    assert watch.feed(11.5, _ours(3.0, 1300, 130, 470.0, 475.0))
    assert watch.eval_seen["seconds"] == 11.5 and watch.eval_seen["env_steps"] == 1300
    assert watch.train["seconds"] == 10.2  # the first crossing stays
    assert watch.startup_s == pytest.approx(8.0)  # least arrival - wall time


def test_the_evaluation_is_timed_by_its_own_unix_time_from_the_command_start():
    summary = {
        "evaluations": [
            {"eval_return": 474.9, "unix_time": 1030.0, "env_steps": 40_000, "num_episodes": 10},
            {"eval_return": 500.0, "unix_time": 1052.5, "env_steps": 66_000, "num_episodes": 10},
            {"eval_return": 490.0, "unix_time": 1060.0, "env_steps": 70_000, "num_episodes": 10},
        ]
    }
    first = vs_cleanrl.first_evaluation(summary, start_unix=1000.0)
    assert first == {"seconds": 52.5, "env_steps": 66_000, "eval_return": 500.0, "episodes": 10}
    assert vs_cleanrl.first_evaluation({"evaluations": summary["evaluations"][:1]}, 0.0) is None


def _fake_checkout(path: pathlib.Path) -> pathlib.Path:
    (path / "cleanrl").mkdir()
    (path / "cleanrl" / "dqn_jax.py").write_text("")
    return path


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "must be a CleanRL checkout with cleanrl/dqn_jax.py"),
        (["checkout", "--seeds=1,x"], "--seeds must be integers"),
        (["checkout", "--cleanrl_python=/no/python"], "--cleanrl_python: no such file"),
    ],
    ids=["no dqn_jax.py", "bad seeds", "no interpreter"],
)
def test_bad_flags_are_refused_before_any_run(tmp_path, flags, message):
    """Each within seconds, with what is wrong; the first says how to get a checkout."""
    directory = _fake_checkout(tmp_path) if flags[:1] == ["checkout"] else tmp_path
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "vs_cleanrl.py"), f"--cleanrl_dir={directory}"]
        + flags[1:],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


# A program that prints a line a tenth of a second, forever.
_TICKER = (
    "import itertools, time\n"
    "for i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.1)\n"
)


def _stream(tmp_path, feed, max_seconds: float, ignore_sigint: bool = False) -> dict:
    command = [sys.executable, "-u", "-c", _TICKER]
    log = tmp_path / "run.log"
    # A child that ignores SIGINT from its first instruction: it inherits the ignored
    # disposition (Python keeps it). Ignoring it in the child's own code raced the cap
    # on a loaded CI machine, where the interpreter took over a second to get there.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore_sigint else None
    try:
        run = vs_cleanrl.stream(
            command, str(tmp_path), {}, feed, signal.SIGINT, str(log), max_seconds
        )
    finally:
        if ignore_sigint:
            signal.signal(signal.SIGINT, previous)
    run["log"] = log.read_text().splitlines()
    return run


def test_a_run_is_stopped_once_its_criteria_are_met(tmp_path):
    run = _stream(tmp_path, lambda seconds, line: line.strip() == "3", max_seconds=60)
    assert run["stop"] == "reached"
    assert run["exit_code"] != 0  # SIGINT (2) ended it: KeyboardInterrupt
    assert run["log"][3].endswith("] 3")  # each line with its arrival time
    assert len(run["log"]) < 30  # stopped at once, not at the cap


def test_a_run_that_never_gets_there_is_stopped_at_the_cap_and_killed_if_it_ignores(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(vs_cleanrl, "STOP_GRACE_S", 1.0)
    run = _stream(tmp_path, lambda seconds, line: False, max_seconds=2.0, ignore_sigint=True)
    assert run["stop"] == "max_seconds"
    assert run["exit_code"] == -9  # SIGKILL after the grace
    arrivals = [float(line[1:].split("]")[0]) for line in run["log"]]
    assert 2.0 <= arrivals[-1] < 11.0  # the cap plus the grace, with a loaded machine's slack
