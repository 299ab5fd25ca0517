"""Teardown (issue 14): a run leaves no thread behind and exits 0, also on a busy CPU.

A Python thread still inside Reverb's or TensorFlow's native code (a
sampler's `next`, a priority update) when its replay server stops never
returns; one that returns while the interpreter finalizes is ended by
CPython 3.11 with `pthread_exit`, whose forced unwind through C++ frames
aborts the process (SIGABRT, "FATAL: exception not rethrown"), and exiting
with such threads can also hang. Every node therefore joins the threads it
started before the servers it uses stop (`prefetch.DevicePrefetcher.close`,
`launchers.base.close_stages`). The race needs a loaded machine to show,
hence the CPU burner.
"""

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading

import pytest

from agents import dqn
from gorila_jax.run import experiment

from tests import REPO


CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=100,
    max_replay_size=5_000,
    samples_per_insert=2.0,
)

# The teardown paths of a run: one replay, a sharded replay (a sampling
# thread per shard), Gorila gradient workers and parameter shards.
VARIANTS = {
    "replay": {},
    "sharded_replay": {"num_replay_shards": 2, "num_actors": 2},
    "gorila": {"learner_mode": "gorila", "num_learners": 2, "num_ps_shards": 2},
}
LOOP_RUNS = 9  # run_experiment teardowns in one process, every variant three times
TRAIN_RUNS = 3  # whole `launch.train` processes, each ending with an interpreter exit


def _experiment(logdir: str, **overrides) -> experiment.ExperimentConfig:
    settings = dict(
        launcher="local",
        logdir=logdir,
        num_actors=1,
        num_envs_per_actor=4,
        num_learner_devices=1,
        total_env_steps=800,
        eval_interval_s=0,
        eval_episodes=1,
        log_interval_s=0.5,
        checkpoint_interval_steps=0,
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


def run_and_check_threads(logdir: str, **overrides) -> None:
    """One short run under the local launcher; fails if a thread it started is still alive."""
    before = set(threading.enumerate())
    summary = experiment.run_experiment(dqn.DQNBuilder(CONFIG), _experiment(logdir, **overrides))
    assert summary["learner_steps"] > 0, summary  # sampling and priority updates ran
    left = sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())
    assert not left, f"threads still running after run_experiment returned: {left}"


def teardown_loop(root: str, runs: int) -> None:
    """`runs` runs in this process, cycling through VARIANTS (the stress test's subprocess)."""
    names = list(VARIANTS)
    for index in range(runs):
        name = names[index % len(names)]
        run_and_check_threads(os.path.join(root, f"{index}-{name}"), **VARIANTS[name])
        print(f"teardown {index} ({name}): no thread left", flush=True)


@pytest.mark.slow
def test_no_thread_of_the_program_outlives_run_experiment(tmp_path):
    run_and_check_threads(str(tmp_path), **VARIANTS["sharded_replay"])


@contextlib.contextmanager
def _busy_cpu():
    """Another process spinning on one core, as other jobs do on a CI machine."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def _python(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )


def _launch_train(logdir) -> subprocess.CompletedProcess:
    flags = [
        "--agent=dqn",
        "--env=CartPole-v1",
        "--launcher=local",
        "--total_env_steps=2000",
        "--num_learner_devices=1",
        "--eval_interval_s=0",
        "--eval_episodes=2",
        "--checkpoint_interval_steps=0",
        f"--logdir={logdir}",
    ]
    return _python(["-m", "launch.train", *flags], timeout_s=300)


@pytest.mark.slow
def test_runs_tear_down_and_exit_cleanly_while_another_process_keeps_the_cpu_busy(tmp_path):
    loop_code = (
        "from tests.gorila_jax.run import test_teardown as t; "
        f"t.teardown_loop({str(tmp_path / 'loop')!r}, {LOOP_RUNS})"
    )
    with _busy_cpu():
        loop = _python(["-c", loop_code], timeout_s=600)
        trains = [_launch_train(tmp_path / f"train{i}") for i in range(TRAIN_RUNS)]
    # -6 (SIGABRT) was the abort at exit; a timeout, the hang.
    assert loop.returncode == 0, loop.stdout[-2000:] + loop.stderr[-4000:]
    assert loop.stdout.count("no thread left") == LOOP_RUNS, loop.stdout[-2000:]
    for index, train in enumerate(trains):
        assert train.returncode == 0, f"launch.train run {index}: {train.stderr[-4000:]}"
        assert "done:" in train.stdout
