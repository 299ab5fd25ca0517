"""One run of a sweep: its record, its `python -m launch.train` process, its result."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

from gorila_jax import curves
from launch import stats

CONSOLE_LOG = "console.log"
TAIL_LINES = 15
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Run:
    """One training run of the sweep and, once it ended, what it left."""

    group: str
    seed: int
    logdir: str
    flags: list[str]
    status: str = "pending"
    returncode: int | None = None
    final_return: float | None = None
    wall_time_s: float | None = None
    env_steps: int | None = None
    threshold: dict[str, Any] | None = None
    process_start_unix: float | None = None
    process_wall_s: float | None = None
    console_tail: list[str] = dataclasses.field(default_factory=list)


def finished_summary(logdir: str) -> dict[str, Any] | None:
    """The summary of a run that ended (not interrupted) in `logdir`, or None."""
    path = os.path.join(logdir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    return summary if summary.get("stop_reason") != "interrupted" else None


def read_result(
    run: Run, summary: dict[str, Any], threshold: float | None, role: str | None = None
) -> None:
    """The run's result from its summary: `role`'s, in a run of role groups, with `role`."""
    if role is not None:
        summary = curves.role_summary(summary, role, os.path.join(run.logdir, "summary.json"))
    run.final_return = summary["final_eval_return"]
    run.wall_time_s = summary.get("wall_time_s")
    run.env_steps = summary.get("env_steps")
    if threshold is not None:
        run.threshold = stats.first_crossing(run.logdir, summary, threshold)


def _tail(path: str) -> list[str]:
    with open(path, errors="replace") as f:
        return [line.rstrip("\n") for line in f.readlines()[-TAIL_LINES:]]


def execute(
    run: Run,
    launcher: str,
    ray_address: str | None,
    threshold: float | None,
    role: str | None = None,
) -> Run:
    """Runs `run` as a `python -m launch.train` process, resuming it if it has a checkpoint."""
    from gorila_jax.learning import checkpoint

    command = [sys.executable, "-m", "launch.train", *run.flags, f"--seed={run.seed}"]
    command += [f"--logdir={run.logdir}", f"--launcher={launcher}"]
    if ray_address:
        command.append(f"--ray_address={ray_address}")
    if checkpoint.saved_steps(run.logdir):
        command.append("--resume")
    os.makedirs(run.logdir, exist_ok=True)
    console = os.path.join(run.logdir, CONSOLE_LOG)
    run.process_start_unix = time.time()
    with open(console, "a") as log:
        log.write(f"# launch.sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)}\n")
        log.flush()
        # Ctrl-C reaches the run too (same process group): it checkpoints and exits 130.
        run.returncode = subprocess.call(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    run.process_wall_s = time.time() - run.process_start_unix
    summary = finished_summary(run.logdir)
    if run.returncode == 0 and summary is not None:
        run.status = "finished"
        read_result(run, summary, threshold, role)
    else:
        # Ctrl-C or SIGTERM: as the shell codes them (128 + the signal), or as Python does.
        run.status = "interrupted" if run.returncode in (130, 143, -2, -15) else "failed"
        run.console_tail = _tail(console)
    return run
