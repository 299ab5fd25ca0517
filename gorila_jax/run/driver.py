"""The driver's loop: polls the monitor, restarts failed nodes, scales actors and logs
rows until a stop condition; and what it writes beside (nodes.json, the summary's totals)."""

import json
import math
import os
import time
from typing import Any, Callable

from gorila_jax import console, metrics
from gorila_jax.distributed import program as program_lib
from gorila_jax.gorila import mode
from gorila_jax.health import supervisor as supervisor_lib
from gorila_jax.learning import checkpoint
from gorila_jax.run import budget, elastic, learning_modes, role_program
from gorila_jax.run import logdir as logdir_lib
from gorila_jax.run.experiment_config import ExperimentConfig


def finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _row(snapshot: dict[str, Any], previous: dict[str, Any], elapsed: float) -> dict[str, Any]:
    """One metrics row: totals, rates over the last interval, the latest learner metrics."""
    interval = max(elapsed - previous["wall_time_s"], 1e-9)
    return {
        "wall_time_s": elapsed,
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "learner_steps": snapshot["learner_steps"],
        "mean_return": snapshot["mean_return"],
        "eval_return": snapshot["eval_return"],
        "env_steps_per_s": (snapshot["env_steps"] - previous["env_steps"]) / interval,
        "learner_steps_per_s": (snapshot["learner_steps"] - previous["learner_steps"]) / interval,
        **snapshot["metrics"],
        **mode.summarize(snapshot["metrics"]),
        **role_program.row_fields(snapshot),
    }


def totals(snapshot: dict[str, Any], wall_time: float) -> dict[str, Any]:
    """The summary's counters and whole-run rates (a resumed run's wall time includes before)."""
    return {
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "learner_steps": snapshot["learner_steps"],
        "wall_time_s": wall_time,
        "env_steps_per_s": snapshot["env_steps"] / wall_time,
        "learner_steps_per_s": snapshot["learner_steps"] / wall_time,
        "mean_train_return": finite_or_none(snapshot["mean_return"]),
    }


def _done(cfg: ExperimentConfig, snapshot: dict[str, Any], elapsed: float) -> str | None:
    if snapshot["env_steps"] >= cfg.total_env_steps:
        return "total_env_steps reached"
    target = cfg.stop_at_eval_return
    if target is not None and snapshot["eval_return"] >= target:
        return f"evaluation return reached {target}"
    if cfg.max_wall_time_s and elapsed >= cfg.max_wall_time_s:
        return "max_wall_time_s reached"
    return learning_modes.of(cfg).stop_reason(cfg, snapshot)


def drive(
    running: Any,
    cfg: ExperimentConfig,
    logger: metrics.MetricsLogger,
    start: float,
    scaler: elastic.ActorScaler,
    previous_run: logdir_lib.PreviousRun | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> str:
    """Polls the monitor, logs rows, until a stop condition (or an interrupt: Ctrl-C or
    SIGTERM, `stop_requested`); returns why.

    Each poll the supervisor restarts dead, silent and stalled nodes, and
    the `scaler` adds or removes actors (control file, elastic policy, data balance).
    With each row, an earlier run set aside in the logdir is deleted once this run
    has a checkpoint.

    Raises:
      supervisor_lib.RunFailed: a node failed and may not be restarted (again).
    """
    monitor_client = running.client("monitor")
    supervisor, env_step_budget = _supervisor_and_budget(running, monitor_client, cfg)
    previous_row = logger.last_row or {"wall_time_s": 0.0, "env_steps": 0, "learner_steps": 0}
    reason = None
    try:
        with console.progress_reporter(cfg.total_env_steps) as progress:
            while reason is None:
                time.sleep(min(0.25, cfg.log_interval_s))
                if stop_requested():
                    return "interrupted"
                for line in supervisor.check():
                    progress.message(line)
                elapsed = time.monotonic() - start
                snapshot = monitor_client.snapshot()
                for line in scaler.poll(snapshot, monitor_client.node_counters):
                    progress.message(line)
                progress.poll(snapshot)
                reason = _done(cfg, snapshot, elapsed)
                if reason is None:
                    env_step_budget.poll(snapshot["env_steps"])
                if reason or elapsed - previous_row["wall_time_s"] >= cfg.log_interval_s:
                    _write_node_status(
                        cfg.logdir,
                        monitor_client.node_status(),
                        supervisor.restarts,
                        running.process_ids(),
                        _removed_counters(running, monitor_client),
                    )
                    row = {**_row(snapshot, previous_row, elapsed), **scaler.row_fields()}
                    _log_row(row, tuple(snapshot["roles"]), logger, progress)
                    previous_row = row
                    if previous_run and previous_run.superseded(saved_anything(cfg.logdir)):
                        previous_run = None
    except KeyboardInterrupt:
        return "interrupted"
    return reason


def _supervisor_and_budget(
    running: Any, monitor_client: Any, cfg: ExperimentConfig
) -> tuple[supervisor_lib.Supervisor, budget.EnvStepBudget]:
    """What keeps the nodes alive, and what holds the actors to the env-step budget."""
    supervisor = supervisor_lib.Supervisor(
        running,
        monitor_client,
        cfg.heartbeat_timeout_s,
        cfg.stall_timeout_s,
        cfg.max_restarts,
        cfg.startup_timeout_s,
    )
    env_step_budget = budget.EnvStepBudget(
        cfg.total_env_steps,
        lambda: [(node.name, running.client(node.name)) for node in running.active_nodes("actor")],
        monitor_client.node_counters,
    )
    return supervisor, env_step_budget


def _log_row(
    row: dict[str, Any], roles: tuple[str, ...], logger: metrics.MetricsLogger, progress: Any
) -> None:
    """One row to metrics.csv (and TensorBoard, a tracker) and to the console's progress."""
    logger.write(row)
    progress.row(row, mode.progress_suffix(row) + role_program.progress_suffix(row, roles))


def _removed_counters(running: Any, monitor_client: program_lib.Client) -> dict[str, dict]:
    """The final counters of every node removed from the run."""
    if not running.removed_nodes:
        return {}
    counters = monitor_client.node_counters()
    return {name: counters.get(name, {}) for name in running.removed_nodes}


NODE_STATUS_FILE = "nodes.json"


def _write_node_status(
    logdir: str,
    status: dict[str, Any],
    restarts: dict[str, int],
    pids: dict[str, int],
    removed: dict[str, dict[str, float]] | None = None,
) -> None:
    """`<logdir>/nodes.json`: each node's pid, heartbeat age, counters and restarts.

    For operators (which process is actor/3, is it beating), fault tests and
    memory benchmarks. Nodes without heartbeats (replay, monitor) get their
    pid from the launcher. Removed nodes keep their final counters, marked
    `"removed": true`.
    """
    record = {
        name: {
            **status.get(name, {}),
            "pid": status.get(name, {}).get("pid") or pids.get(name),
            "restarts": count,
        }
        for name, count in restarts.items()
    }
    for name, counters in (removed or {}).items():
        record[name] = {"counters": counters, "removed": True}
    path = os.path.join(logdir, NODE_STATUS_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def saved_anything(logdir: str) -> bool:
    """Whether the run in `logdir` has saved what a run keeps: a checkpoint, or the summary
    of a run without a problem (a run that keeps no checkpoints)."""
    if checkpoint.any_saved(logdir):
        return True
    try:
        with open(os.path.join(logdir, "summary.json")) as f:
            return "problem" not in json.load(f)
    except (OSError, ValueError):
        return False
