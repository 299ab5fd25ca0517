"""The driver loop that runs a Gorila program for any agent and reports it.

The run's settings are `ExperimentConfig` (experiment_config.py); its
nodes and their wiring are `wiring.make_program` (wiring.py, with the learning
nodes of the run's mode from learning_modes.py). Both are re-exported here, the
one module experiment scripts import.
"""

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import metrics, tracking, xla_cpu
from gorila_jax.anakin import node as anakin_node
from gorila_jax.distributed import launchers
from gorila_jax.learning import checkpoint
from gorila_jax.run import driver, resume, signals, stopping, tasks
from gorila_jax.run import logdir as logdir_lib
from gorila_jax.run.driver import NODE_STATUS_FILE
from gorila_jax.run.experiment_config import LEARNER_MODES, ExperimentConfig
from gorila_jax.run.wiring import make_program
from gorila_jax.run.signals import Terminated
from gorila_jax.run.live_actors import add_actor, remove_actor, set_sample_weights

__all__ = [
    "LEARNER_MODES",
    "NODE_STATUS_FILE",
    "NO_UPDATE",
    "ExperimentConfig",
    "Terminated",
    "CheckedRun",
    "add_actor",
    "make_program",
    "remove_actor",
    "set_sample_weights",
    "check_run",
    "run_checked",
    "run_experiment",
]


NO_UPDATE = "the learner made no update in the whole run"


def _set_launcher_options(cfg: ExperimentConfig, launcher_options: dict[str, Any]) -> None:
    """Fills the launcher's options from `cfg` where the caller did not set them."""
    if cfg.launcher == "launchpad":
        print(launchers.LAUNCHPAD_LIMITS, flush=True)
        launcher_options.setdefault("launch_type", cfg.launchpad_launch_type)
        launcher_options.setdefault("log_dir", os.path.join(cfg.logdir, "launchpad"))
    if cfg.launcher == "ray" and cfg.ray_address:
        launcher_options.setdefault("address", cfg.ray_address)
    if cfg.launcher == "ray" and cfg.max_restarts:
        # Callers of a restarted node wait for its replacement instead of failing.
        launcher_options.setdefault(
            "reconnect_timeout_s", cfg.startup_timeout_s + cfg.heartbeat_timeout_s
        )


def _write_curves(logdir: str) -> None:
    """curves.png of the run; a figure that cannot be drawn never costs the run's results."""
    # Imported here: matplotlib and scipy.stats are about 0.7 s of every run's start-up,
    # and only the end of a run draws.
    from gorila_jax import plots

    try:
        plots.write_run_curves(logdir)
    except ValueError as error:  # a run stopped before it logged anything to draw
        logging.warning("curves.png not written into %s: %s", logdir, error)
    except Exception:  # noqa: BLE001  the summary and checkpoints are already written
        logging.warning("curves.png not written into %s", logdir, exc_info=True)


@dataclasses.dataclass(frozen=True)
class CheckedRun:
    """A run whose settings `check_run` accepted: what `run_checked` runs, so that a
    caller that refuses bad input before it does anything else (launch/train.py) and
    the run check once."""

    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder]
    cfg: ExperimentConfig


def check_run(
    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    agents_taking_demos: tuple[str, ...] = (),
) -> CheckedRun:
    """Everything a run checks before it changes its logdir or starts a node.

    Args:
      agents_taking_demos: the agents a refused `--demos` names as those that take
        them (the registry is launch/'s, above this layer).

    Raises:
      ValueError: naming the setting at fault.
    """
    cfg.validate()
    tasks.task_of(builder, cfg).check(agents_taking_demos)
    return CheckedRun(builder, cfg)


def run_experiment(
    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    **launcher_options: Any,
) -> dict[str, Any]:
    """`run_checked(check_run(builder, cfg))`: checks the settings, then runs.

    Raises:
      ValueError: a setting that cannot work (`check_run`), before anything changes.
    """
    return run_checked(check_run(builder, cfg), **launcher_options)


def run_checked(checked: CheckedRun, **launcher_options: Any) -> dict[str, Any]:
    """Runs the program until a stop condition, evaluates, and writes summary.json.

    Ctrl-C or SIGTERM stop the run the same way (final checkpoint included),
    skip the final evaluations (the evaluator's last one and the driver's)
    and then raise KeyboardInterrupt (`Terminated`, a KeyboardInterrupt, for SIGTERM).

    On a multi-agent task with several roles, `builder` may be a dict role ->
    builder (one agent per role; one builder: the same agent for every role);
    the program is then one of role groups (`role_program`), and the summary's
    `roles` has each role's final greedy return and training figures.

    The run holds its logdir (`logdir.hold`: a second run there is refused). A new run
    (not `cfg.resume`) sets an earlier run there aside and deletes it only once it has
    saved a checkpoint or its summary; a run that saved neither puts it back.

    Returns:
      The summary: counters, rates, final greedy evaluation, evaluation history.

    Raises:
      logdir.LogdirInUse: another run holds `cfg.logdir`.
      ValueError: `cfg.xla_cpu_threads` asks for another XLA:CPU pool than the one JAX
        already runs in this process (`xla_cpu.limit_worker_threads`); nothing written.
    """
    cfg = checked.cfg
    if cfg.xla_cpu_threads:
        # Sized when JAX starts its backends: launch/train.py does it before anything
        # starts them (importing gymnax does); here it is the same count or refused.
        xla_cpu.limit_worker_threads(cfg.xla_cpu_threads)
    task = tasks.task_of(checked.builder, cfg)
    with logdir_lib.hold(cfg.logdir):
        previous = None if cfg.resume else logdir_lib.set_aside(cfg.logdir)
        tracker = None
        try:
            if cfg.wandb_project:
                tracker = tracking.WandbTracker(cfg, task.agent_configs())
            return _run(task, cfg, previous, launcher_options, tracker)
        except BaseException:
            if tracker is not None and not tracker.finished:
                tracker.finish(None, None)  # a run that failed before its summary
            raise
        finally:
            if previous is not None:
                previous.settle(driver.saved_anything(cfg.logdir))


def _run(
    task: tasks.Task,
    cfg: ExperimentConfig,
    previous: logdir_lib.PreviousRun | None,
    launcher_options: dict[str, Any],
    tracker: tracking.WandbTracker | None,
) -> dict[str, Any]:
    if cfg.resume:
        resume.check_resumable(cfg)
    program = task.prepare()
    _set_launcher_options(cfg, launcher_options)
    resume_env_steps = checkpoint.total(task.resume_meta(), "env_steps") if cfg.resume else None
    logger = metrics.MetricsLogger(cfg.logdir, resume_env_steps, also=tracker and tracker.log)
    # Closed on every way out: left to tensorboardX's atexit hook, a failed run's writer
    # starts a thread at interpreter shutdown, which Python 3.12 refuses with a traceback
    # that buries the run's own error at the end of its console.log.
    try:
        # A resumed run's clock goes on from the last row kept: wall time stays the x-axis.
        start = time.monotonic() - (logger.last_row or {"wall_time_s": 0.0})["wall_time_s"]
        # The SIGTERM handler goes in after the launch: `ray.init` installs one of its own
        # (sys.exit), which would otherwise end the run without its final checkpoint.
        with (
            launchers.launch(program, cfg.launcher, **launcher_options) as running,
            signals.run_signals() as received,
        ):
            scaler = task.actor_scaler(running)
            reason = driver.drive(
                running, cfg, logger, start, scaler, previous, lambda: received.requested
            )
            received.stopping = True
            print(f"stopping: {reason}", flush=True)
            stop_failure = stopping.stop(running, cfg, reason)
            task.fetch_final_params(running)
            monitor = running.client("monitor")
            snapshot, evaluations = monitor.snapshot(), monitor.evaluations()
            restarts = monitor.restarts()
    finally:
        logger.close()
    summary = {
        "env_id": cfg.env_id,
        "stop_reason": reason,
        **driver.totals(snapshot, time.monotonic() - start),
        **task.outcome(reason, stop_failure, snapshot),
        "evaluations": evaluations,
        "restarts": restarts,
        "resumed_from_learner_step": task.resumed_from(),
        "experiment": dataclasses.asdict(cfg),
    }
    if cfg.launcher == "anakin":
        # This process is where an Anakin run computes; other launchers' nodes have theirs.
        summary["xla_cpu_worker_threads"] = xla_cpu.worker_threads()
        summary[anakin_node.LOOP_RATE] = driver.finite_or_none(
            snapshot["metrics"].get(anakin_node.LOOP_RATE, math.nan)
        )
    # Said in the summary, and the CLI exits non-zero: a run that never trained is not a
    # result, whatever its final return; nor is one that could not save its end.
    if stop_failure:
        summary["problem"] = stop_failure
    elif summary["learner_steps"] == 0 and reason != "interrupted":
        summary["problem"] = NO_UPDATE
    _write_summary(cfg.logdir, summary, tracker)
    if reason == "interrupted":
        print("interrupted: final evaluation skipped; --resume continues the run", flush=True)
        raise signals.Terminated() if received.terminated else KeyboardInterrupt()
    return summary


def _write_summary(
    logdir: str, summary: dict[str, Any], tracker: tracking.WandbTracker | None
) -> None:
    """summary.json, curves.png, and the tracker's end of the run."""
    with open(os.path.join(logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    _write_curves(logdir)
    if tracker is not None:
        tracker.finish(summary, os.path.join(logdir, "curves.png"))
