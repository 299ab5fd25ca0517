"""The driver loop that runs a Gorila program for any agent and reports it.

The run's settings are `ExperimentConfig` (experiment_config.py); its
nodes and their wiring are `programs.make_program` (programs.py). Both are
re-exported here, the one module experiment scripts import.
"""

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

from gorila_jax import builder as builder_lib
from gorila_jax import console, envs, metrics, multiagent, text, tracking, types
from gorila_jax.acting import evaluation
from gorila_jax.distributed import launchers
from gorila_jax.distributed import program as program_lib
from gorila_jax.federated import nodes as federated_nodes
from gorila_jax.gorila import mode, parameter_server
from gorila_jax.health import balance
from gorila_jax.health import supervisor as supervisor_lib
from gorila_jax.learning import checkpoint
from gorila_jax.run import budget, elastic, role_program, wiring
from gorila_jax.run.programs import make_program
from gorila_jax.run import logdir as logdir_lib
from gorila_jax.run.experiment_config import LEARNER_MODES, ExperimentConfig
from gorila_jax.run.wiring import add_actor, remove_actor, set_sample_weights

__all__ = [
    "LEARNER_MODES",
    "NO_UPDATE",
    "ExperimentConfig",
    "Terminated",
    "CheckedRun",
    "add_actor",
    "make_program",
    "remove_actor",
    "check_run",
    "run_checked",
    "run_experiment",
]


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


NO_UPDATE = "the learner made no update in the whole run"


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


def _totals(snapshot: dict[str, Any], wall_time: float) -> dict[str, Any]:
    """The summary's counters and whole-run rates (a resumed run's wall time includes before)."""
    return {
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "learner_steps": snapshot["learner_steps"],
        "wall_time_s": wall_time,
        "env_steps_per_s": snapshot["env_steps"] / wall_time,
        "learner_steps_per_s": snapshot["learner_steps"] / wall_time,
        "mean_train_return": _finite_or_none(snapshot["mean_return"]),
    }


def _done(cfg: ExperimentConfig, snapshot: dict[str, Any], elapsed: float) -> str | None:
    if snapshot["env_steps"] >= cfg.total_env_steps:
        return "total_env_steps reached"
    target = cfg.stop_at_eval_return
    if target is not None and snapshot["eval_return"] >= target:
        return f"evaluation return reached {target}"
    if cfg.max_wall_time_s and elapsed >= cfg.max_wall_time_s:
        return "max_wall_time_s reached"
    rounds = snapshot["metrics"].get(federated_nodes.ROUNDS_METRIC, 0)
    if cfg.learner_mode == "federated" and cfg.federated_rounds and rounds >= cfg.federated_rounds:
        return "federated_rounds reached"
    return None


class Terminated(KeyboardInterrupt):
    """The run was stopped by SIGTERM: as by Ctrl-C, but the CLI exits 143 (128 + 15)."""


class _Signals:
    """Ctrl-C and SIGTERM while the run is on: the first asks the driver to stop the run
    (`requested`, seen at its next poll). One more of either, or the first once the run
    stops by itself (`stopping`), is said and ignored (a key pressed twice), so the final
    checkpoint and the summary are still written; the next one aborts them, as
    KeyboardInterrupt (SIGTERM as `Terminated`).

    The first does not raise: an exception at whatever point the main thread was (inside
    a client call, holding a lock of a thread pool) could leave that state half done; a
    run stopped so once wrote its summary and then never exited.
    """

    def __init__(self):
        self.received: list[int] = []
        self.stopping = False
        self._ignored = False

    @property
    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return bool(self.received)

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if len(self.received) == 1 and not self.stopping:
            return
        if not self._ignored:
            self._ignored = True
            print(
                "stopping already: the final checkpoint and summary come first "
                "(one more Ctrl-C aborts them)",
                file=sys.stderr,
                flush=True,
            )
            return
        if signum == signal.SIGTERM:
            raise Terminated(f"signal {signum}")
        raise KeyboardInterrupt(f"signal {signum}")

    @property
    def terminated(self) -> bool:
        """Whether the run was stopped by SIGTERM (the CLI then exits 143, not 130)."""
        return bool(self.received) and self.received[0] == signal.SIGTERM


@contextlib.contextmanager
def _run_signals() -> Iterator[_Signals]:
    """`_Signals` handles SIGINT and SIGTERM for the block (from the main thread only:
    signal handlers cannot be installed from others)."""
    signals = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {
        number: signal.signal(number, signals) for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield signals
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _drive(
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
    supervisor = supervisor_lib.Supervisor(
        running,
        monitor_client,
        cfg.heartbeat_timeout_s,
        cfg.stall_timeout_s,
        cfg.max_restarts,
        cfg.startup_timeout_s,
    )
    previous_row = logger.last_row or {"wall_time_s": 0.0, "env_steps": 0, "learner_steps": 0}
    env_step_budget = budget.EnvStepBudget(
        cfg.total_env_steps,
        lambda: [(node.name, running.client(node.name)) for node in running.active_nodes("actor")],
        monitor_client.node_counters,
    )
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
                    logger.write(row)
                    roles = tuple(snapshot["roles"])
                    suffix = mode.progress_suffix(row) + role_program.progress_suffix(row, roles)
                    progress.row(row, suffix)
                    previous_row = row
                    if previous_run and previous_run.superseded(_saved_anything(cfg.logdir)):
                        previous_run = None
    except KeyboardInterrupt:
        return "interrupted"
    return reason


def _actor_scaler(
    running: Any, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> elastic.ActorScaler:
    """The driver's hand on the actor count: control file, elastic policy, data balance."""
    tracker = None
    if cfg.balance_interval_s:
        tracker = balance.BalanceTracker(cfg.balance_factor, cfg.balance_interval_s)
    return elastic.ActorScaler(
        cfg.logdir,
        functools.partial(add_actor, running, builder, cfg, spec),
        functools.partial(remove_actor, running),
        lambda: [node.name for node in running.active_nodes("actor")],
        cfg.actor_count_floor,
        cfg.max_actors,
        cfg.elastic_policy,
        tracker,
        cfg.balance_remedy == "replace",
        apply_existing=cfg.resume,
        sample_weights=(
            functools.partial(set_sample_weights, running)
            if cfg.balance_remedy == "downweight"
            else None
        ),
        balance_weight=cfg.balance_weight,
    )


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


def _stop_in_order(running: Any, cfg: ExperimentConfig, final_evaluation: bool = True) -> None:
    """Stops actors, then the evaluator, then the learner (or the Gorila workers, worker 0
    last), whose `run` ends with the final checkpoint.

    Stopped actors insert nothing more and have reported their last counters,
    so the final replay checkpoint and the counters saved with it agree. The
    evaluator, with `final_evaluation`, first evaluates the newest parameters
    (at the final env-step count) unless it has already: every run's history
    ends with an evaluation, and the final checkpoint holds it.
    """
    actors = [running.client(node.name) for node in running.active_nodes("actor")]
    for node in actors:
        node.stop()
    # An actor stops within one step of its envs. One that has not by a heartbeat timeout
    # is hung (in its environment, say; with stall_timeout_s off nobody replaced it): the
    # run ends without it, as it holds nothing the final checkpoint needs, and the
    # launcher's stop ends its process.
    actor_stop_timeout_s = cfg.heartbeat_timeout_s or cfg.startup_timeout_s
    for node in actors:
        if not _wait_finished(running, node, actor_stop_timeout_s):
            logging.warning(
                "%s did not stop within %.0f s (hung?); the run ends without it",
                node.node_name,
                actor_stop_timeout_s,
            )
    if cfg.eval_interval_s > 0:
        evaluator = running.client("evaluator")
        evaluator.stop(final_evaluation=final_evaluation)
        _wait_finished(running, evaluator)
    if cfg.learner_mode == "federated":
        # No round may start while clients stop.
        coordinator = running.client(f"{federated_nodes.GROUP}/0")
        coordinator.stop()
        _wait_finished(running, coordinator)
    if cfg.learner_mode == "gorila":
        # Worker 0 takes the final checkpoint (of each role's groups, in a program of
        # role groups), so the others stop first: a gradient they pushed after its
        # snapshot would be lost on resume.
        groups = [group for group in running.program.groups if _base(group) == "gradient_worker"]
        stages = [
            [
                running.client(f"{group}/{i}")
                for group in groups
                for i in range(1, cfg.num_learners)
            ],
            [running.client(f"{group}/0") for group in groups],
        ]
    else:
        # A multi-host learner's processes stop together (their stop votes agree); so do
        # the learners of the roles of a program of role groups.
        stages = [
            [
                running.client(spec.name)
                for group, specs in running.program.groups.items()
                if _base(group) == "learner"
                for spec in specs
            ]
        ]
    for learners in stages:
        for node in learners:
            node.stop()
        for node in learners:
            _wait_finished(running, node)


def _stop(running: Any, cfg: ExperimentConfig, reason: str) -> str | None:
    """`_stop_in_order`; what failed as the run stopped (its final checkpoint on a full
    disk, say), or None. A failure there still ends the run with its summary."""
    try:
        _stop_in_order(running, cfg, final_evaluation=reason != "interrupted")
    except Exception as error:  # noqa: BLE001  reported in the summary and the exit code
        # The traceback goes to the log file; the console gets the summary's one line.
        logging.info("the run failed as it stopped", exc_info=True)
        return (
            "the run failed as it stopped, its final checkpoint may be missing: "
            + text.first_line(error)
        )
    return None


def _base(group: str) -> str:
    """A group's kind, whatever role it serves: "learner@prey" -> "learner"."""
    return group.partition(program_lib.ROLE_MARK)[0]


def _final_params(
    running: Any, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> tuple[int, Any]:
    """(version, parameters) at the end: the learner's, assembled from the Gorila shards, or
    the federated coordinator's."""
    if cfg.learner_mode == "gorila":
        shards = [running.client(f"parameter_server/{i}") for i in range(cfg.num_ps_shards)]
        return parameter_server.sharded_parameters(
            shards, builder, spec, cfg.seed, "driver"
        ).get_params()
    if cfg.learner_mode == "federated":
        return running.client(f"{federated_nodes.GROUP}/0").get_params()  # the global model
    return running.client("learner/0").get_params()  # the chief of a multi-host learner


def _wait_finished(running: Any, node: program_lib.Client, timeout_s: float | None = None) -> bool:
    """Waits for `node`'s `run` to end, `timeout_s` at most; whether it did."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not node.wait_finished(1.0):
        running.check()  # a node that died instead of stopping raises here
        if deadline is not None and time.monotonic() >= deadline:
            return False
    running.check()
    return True


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


def _final_evaluation(
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    params: Any,
    reason: str,
) -> dict[str, Any]:
    """The summary's final greedy evaluation; None and 0 episodes for an interrupted run."""
    final_returns = None
    if reason != "interrupted":
        final_returns = evaluation.evaluate(builder, spec, params, cfg.eval_episodes, cfg.seed + 1)
    return {
        "final_eval_return": None if final_returns is None else float(final_returns.mean()),
        "final_eval_episodes": 0 if final_returns is None else len(final_returns),
    }


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
    roles = multiagent.roles_of(cfg.env_id)
    if roles:
        role_program.check_run(_role_builders(builder, roles), cfg)
    else:
        wiring.check_program(builder, cfg, envs.env_spec(cfg.env_id), agents_taking_demos)
    return CheckedRun(builder, cfg)


def _role_builders(
    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder], roles: Any
) -> dict[str, builder_lib.AgentBuilder]:
    """One builder per role: as given, or the one builder for every role."""
    return builder if isinstance(builder, dict) else dict.fromkeys(roles, builder)


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
    """
    builder, cfg = checked.builder, checked.cfg
    with logdir_lib.hold(cfg.logdir):
        previous = None if cfg.resume else logdir_lib.set_aside(cfg.logdir)
        try:
            return _run_in_held_logdir(builder, cfg, previous, launcher_options)
        finally:
            if previous is not None:
                previous.settle(_saved_anything(cfg.logdir))


def _saved_anything(logdir: str) -> bool:
    """Whether the run in `logdir` has saved what a run keeps: a checkpoint, or the summary
    of a run without a problem (a run that keeps no checkpoints)."""
    if checkpoint.any_saved(logdir):
        return True
    try:
        with open(os.path.join(logdir, "summary.json")) as f:
            return "problem" not in json.load(f)
    except (OSError, ValueError):
        return False


def _run_in_held_logdir(
    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    previous: logdir_lib.PreviousRun | None,
    launcher_options: dict[str, Any],
) -> dict[str, Any]:
    """The run, tracked with W&B where it asks (`--wandb_project`).

    Raises:
      tracking.TrackingError: W&B could not start, before any node has.
    """
    tracker = None
    if cfg.wandb_project:
        configs = (
            {role: b.config for role, b in builder.items()}
            if isinstance(builder, dict)
            else builder.config
        )
        tracker = tracking.WandbTracker(cfg, configs)
    try:
        return _run_tracked(builder, cfg, previous, launcher_options, tracker)
    except BaseException:
        if tracker is not None and not tracker.finished:
            tracker.finish(None, None)  # a run that failed before its summary
        raise


def _run_tracked(
    builder: builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    previous: logdir_lib.PreviousRun | None,
    launcher_options: dict[str, Any],
    tracker: tracking.WandbTracker | None,
) -> dict[str, Any]:
    roles = multiagent.roles_of(cfg.env_id)
    resume = role_resume = None
    if roles:
        builders = _role_builders(builder, roles)
        role_resume = role_program.prepare_logdir(builders, cfg)
        program = role_program.make_program(builders, cfg, role_resume)
        resume_meta = role_program.newest_meta(role_resume)
    else:
        spec = envs.env_spec(cfg.env_id)
        template = wiring.checkpoint_template(builder, cfg, spec)
        resume = checkpoint.prepare_logdir(cfg.logdir, cfg.resume, builder, cfg, template)
        program = make_program(builder, cfg, spec, resume)
        resume_meta = resume.meta if resume else {}
    _set_launcher_options(cfg, launcher_options)
    resume_env_steps = checkpoint.total(resume_meta, "env_steps") if cfg.resume else None
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
            _run_signals() as signals,
        ):
            if roles:
                scaler = _fixed_actors(running, cfg)
            else:
                scaler = _actor_scaler(running, builder, cfg, spec)
            reason = _drive(
                running, cfg, logger, start, scaler, previous, lambda: signals.requested
            )
            signals.stopping = True
            print(f"stopping: {reason}", flush=True)
            stop_failure = _stop(running, cfg, reason)
            if roles:
                role_params = role_program.final_params(running, builders, cfg)
            else:
                params_version, params = _final_params(running, builder, cfg, spec)
            snapshot = running.client("monitor").snapshot()
            evaluations = running.client("monitor").evaluations()
            restarts = running.client("monitor").restarts()
    finally:
        logger.close()
    wall_time = time.monotonic() - start
    if roles:
        final = role_program.final_evaluation(builders, cfg, role_params, reason)
        outcome = {
            "params_version": {role: version for role, (version, _) in role_params.items()},
            "final_eval_return": None,  # each role's is in "roles"
            "final_eval_episodes": 0,
            "roles": {role: {**snapshot["roles"][role], **final[role]} for role in roles},
            "agent_config": {role: dataclasses.asdict(b.config) for role, b in builders.items()},
        }
    else:
        if cfg.saves_checkpoints and not stop_failure:
            where = checkpoint.checkpoint_root(cfg.logdir)
            print(f"checkpoint: learner step {params_version:,} in {where}", flush=True)
        outcome = {
            "params_version": params_version,
            **_final_evaluation(builder, cfg, spec, params, reason),
            "agent_config": dataclasses.asdict(builder.config),
        }
    summary = {
        "env_id": cfg.env_id,
        "stop_reason": reason,
        **_totals(snapshot, wall_time),
        **outcome,
        "evaluations": evaluations,
        "restarts": restarts,
        "resumed_from_learner_step": (
            {role: restored.step for role, restored in role_resume.items()}
            if role_resume
            else resume.step
            if resume
            else None
        ),
        "experiment": dataclasses.asdict(cfg),
    }
    # Said in the summary, and the CLI exits non-zero: a run that never trained is not a
    # result, whatever its final return; nor is one that could not save its end.
    if stop_failure:
        summary["problem"] = stop_failure
    elif summary["learner_steps"] == 0 and reason != "interrupted":
        summary["problem"] = NO_UPDATE
    with open(os.path.join(cfg.logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    _write_curves(cfg.logdir)
    if tracker is not None:
        tracker.finish(summary, os.path.join(cfg.logdir, "curves.png"))
    if reason == "interrupted":
        print("interrupted: final evaluation skipped; --resume continues the run", flush=True)
        raise Terminated() if signals.terminated else KeyboardInterrupt()
    return summary


def _fixed_actors(running: Any, cfg: ExperimentConfig) -> elastic.ActorScaler:
    """The scaler of a run whose actor count cannot change (a run of role groups): a
    control file asking for another count is answered that it cannot."""

    def cannot(*_: Any) -> None:
        raise ValueError("a run of role groups cannot add or remove actors yet")

    return elastic.ActorScaler(
        cfg.logdir,
        cannot,
        cannot,
        lambda: [node.name for node in running.active_nodes("actor")],
        cfg.actor_count_floor,
        cfg.max_actors,
        cfg.elastic_policy,
        None,
        False,
    )
