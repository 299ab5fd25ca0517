"""The Gorila program graph for any agent, and the driver loop that runs and reports it."""

import contextlib
import dataclasses
import functools
import json
import math
import os
import signal
import threading
import time
from typing import Any, Iterator

import portpicker


from gorila_jax import actor, checkpoint, envs, evaluation, launchers, learner, metrics, monitor
from gorila_jax import builder as builder_lib
from gorila_jax import program as program_lib
from gorila_jax import compression, gorila, multihost, parameter_server, replay, types


LEARNER_MODES = ("sync", "gorila")


@dataclasses.dataclass
class ExperimentConfig:
    """Settings of one run that are not the agent's hyperparameters.

    Attributes:
      env_id: envpool task id.
      num_actors: actor nodes.
      num_envs_per_actor: envs in each actor's envpool.
      env_threads_per_actor: envpool worker threads in each actor.
      param_pull_interval: actor steps between parameter pulls from the learner.
      total_env_steps: the run stops once actors have taken this many env steps.
      seed: root seed; every node's key and env seed derive from it.
      logdir: where metrics.csv, TensorBoard events and summary.json go.
      launcher: "local" (threads in one process) or "ray" (a process per node).
      ray_address: an existing Ray cluster to join; None starts a private one.
      num_learner_devices: local devices the learner pmaps over; 0 takes all.
      learner_gpus: GPUs the learner node asks Ray for.
      learner_cpus, replay_cpus, cpus_per_actor: CPUs each node asks Ray for;
        fractions let more nodes than cores share one machine.
      eval_episodes: greedy episodes per evaluation, and for the final one.
      eval_interval_s: seconds between evaluations during training; 0 disables them.
      stop_at_eval_return: end the run early once an evaluation reaches this mean return.
      max_wall_time_s: end the run after this many seconds; 0 means no limit.
      log_interval_s: seconds between progress lines and metric rows.
      checkpoint_interval_steps: learner steps between checkpoints of learner
        and replay (in `<logdir>/checkpoints`); one more is taken when the run
        stops. 0 disables checkpoints. It bounds what a crash loses: a
        restarted replay node restores the newest replay checkpoint, so the
        items written since it (about this many learner steps' worth) are lost.
      max_checkpoints_to_keep: older checkpoints are deleted. A replay
        checkpoint holds the whole buffer (gigabytes for Atari).
      resume: continue the run in `logdir` from its newest usable checkpoint.
        Without it, a run in a logdir that has checkpoints deletes them.
      tf32: TensorFloat-32 matmuls in the learner (GPUs only; CPUs ignore it).
      learner_mode: "sync" (one pmapped learner) or "gorila" (asynchronous
        gradient workers and parameter-server shards; gorila_jax/gorila.py).
      num_learners: Gorila gradient workers.
      num_ps_shards: Gorila parameter-server shards.
      max_staleness: a shard drops gradients computed on parameters more than
        this many of its versions old; negative accepts any.
      staleness_lr_scaling: shards scale each update by 1 / (1 + its staleness).
      async_update: a gradient worker pulls fresh parameters every this many gradients.
      compression: how gradients travel to the shards (compression.GRADIENT_SCHEMES).
      outlier_stds: a worker drops gradients whose loss is more than this many
        standard deviations above its running mean; 0 disables the rule.
      ps_cpus: CPUs each parameter-server shard asks Ray for.
      heartbeat_interval_s: seconds between the heartbeats (counters) that
        actors and learner send the monitor.
      heartbeat_timeout_s: a node that sent no heartbeat for this long is
        declared dead and restarted; 0 only watches processes.
      stall_timeout_s: a node that heartbeats but whose counters did not move
        for this long (a hung environment) is restarted; 0 disables.
      startup_timeout_s: how long a (re)started node may take to be built and
        to make its first progress.
      max_restarts: restarts allowed per node (the ray launcher replaces a
        faulty node's process); one fault more, or any fault under the local
        launcher, fails the run with the reason. 0 fails at the first fault.
      max_nonfinite_steps: the learner skips updates with a non-finite loss or
        gradient; after this many in a row it rolls back to its newest
        checkpoint (0: skips only, never rolls back).
      rollback_lr_factor: each rollback multiplies the learner's learning-rate
        scale by this (`learner.scale_update`).
      rollback_param_noise: standard deviation of Gaussian noise added to the
        trainable parameters after a rollback (the brief suggests 0.01); 0: none.
      num_learner_hosts: learner processes, one per host, that run every update
        together over all their devices (`jax.distributed`; the learner
        group's nodes learner/0 .. learner/H-1, spread over Ray nodes). Needs
        launcher=ray, learner_mode=sync and (for now) checkpoint_interval_steps=0
        when above 1. Such a learner is not restarted: losing one of its
        processes fails the run.
      replay_port: the Reverb server's port; 0 picks a free one at launch. The
        port stays the same when the replay node is restarted, so writers and
        samplers find it again. Reverb listens on every interface of its host.
    """

    env_id: str = "CartPole-v1"
    num_actors: int = 2
    num_envs_per_actor: int = 8
    env_threads_per_actor: int = 1
    param_pull_interval: int = 5
    total_env_steps: int = 100_000
    seed: int = 0
    logdir: str = "runs/latest"
    launcher: str = "ray"
    ray_address: str | None = None
    num_learner_devices: int = 0
    learner_gpus: float = 0.0
    learner_cpus: float = 1.0
    replay_cpus: float = 1.0
    cpus_per_actor: float = 1.0
    eval_episodes: int = 10
    eval_interval_s: float = 5.0
    stop_at_eval_return: float | None = None
    max_wall_time_s: float = 0.0
    log_interval_s: float = 2.0
    checkpoint_interval_steps: int = 5000
    max_checkpoints_to_keep: int = 2
    resume: bool = False
    tf32: bool = False
    learner_mode: str = "sync"
    num_learners: int = 2
    num_ps_shards: int = 2
    max_staleness: int = 8
    staleness_lr_scaling: bool = False
    async_update: int = 1
    compression: str = "none"
    outlier_stds: float = 4.0
    ps_cpus: float = 0.5
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    stall_timeout_s: float = 300.0
    startup_timeout_s: float = 300.0
    max_restarts: int = 3
    max_nonfinite_steps: int = 10
    rollback_lr_factor: float = 0.5
    rollback_param_noise: float = 0.0
    replay_port: int = 0
    num_learner_hosts: int = 1

    @property
    def saves_checkpoints(self) -> bool:
        return self.checkpoint_interval_steps > 0

    def validate(self) -> None:
        """Raises ValueError naming the first setting that cannot work."""
        for name in (
            "num_actors",
            "num_envs_per_actor",
            "env_threads_per_actor",
            "param_pull_interval",
            "total_env_steps",
            "eval_episodes",
            "log_interval_s",
            "max_checkpoints_to_keep",
            "num_learners",
            "num_ps_shards",
            "async_update",
            "heartbeat_interval_s",
            "startup_timeout_s",
            "num_learner_hosts",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "num_learner_devices",
            "learner_gpus",
            "learner_cpus",
            "replay_cpus",
            "cpus_per_actor",
            "eval_interval_s",
            "max_wall_time_s",
            "checkpoint_interval_steps",
            "outlier_stds",
            "ps_cpus",
            "heartbeat_timeout_s",
            "stall_timeout_s",
            "max_restarts",
            "max_nonfinite_steps",
            "rollback_param_noise",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.launcher not in launchers.LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {launchers.LAUNCHERS}, got {self.launcher!r}"
            )
        envs.check_env_id(self.env_id)
        if self.learner_mode not in LEARNER_MODES:
            raise ValueError(
                f"learner_mode must be one of {LEARNER_MODES}, got {self.learner_mode!r}"
            )
        if self.compression not in compression.GRADIENT_SCHEMES:
            raise ValueError(
                f"compression must be one of {compression.GRADIENT_SCHEMES}, "
                f"got {self.compression!r}"
            )
        if self.heartbeat_timeout_s and self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s}) must exceed twice "
                f"heartbeat_interval_s ({self.heartbeat_interval_s}), or one late beat kills a node"
            )
        if self.num_learner_hosts > 1 and self.launcher != "ray":
            raise ValueError(
                f"num_learner_hosts={self.num_learner_hosts} needs launcher=ray (a process per "
                f"learner host), got launcher={self.launcher!r}"
            )
        if self.num_learner_hosts > 1 and self.learner_mode != "sync":
            raise ValueError(
                f"num_learner_hosts={self.num_learner_hosts} needs learner_mode=sync, "
                f"got learner_mode={self.learner_mode!r}"
            )
        if self.num_learner_hosts > 1 and self.checkpoint_interval_steps:
            raise ValueError(
                f"num_learner_hosts={self.num_learner_hosts}: {learner.MULTIHOST_CHECKPOINTS}"
            )
        if not 0 <= self.replay_port < 65536:
            raise ValueError(f"replay_port must be in 0..65535, got {self.replay_port}")
        if not 0 < self.rollback_lr_factor <= 1:
            raise ValueError(f"rollback_lr_factor must be in (0, 1], got {self.rollback_lr_factor}")
        if self.resume and not self.checkpoint_interval_steps:
            raise ValueError("resume needs checkpoints, but checkpoint_interval_steps is 0")
        if self.resume and not checkpoint.saved_steps(self.logdir):
            raise ValueError(
                f"resume: no checkpoint in {checkpoint.learner_dir(self.logdir)} "
                "(is --logdir the one of the run to continue?)"
            )


def make_program(
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    resume: checkpoint.Restored | None = None,
) -> program_lib.Program:
    """The Gorila graph: replay, monitor, learner, actors and an evaluator.

    With `resume`, every node starts from that checkpoint: learner state and
    replay from its step, counters, returns and evaluations from its meta.
    """
    program = program_lib.Program("gorila")
    no_cpu = program_lib.Resources(num_cpus=0)
    saving = cfg.saves_checkpoints
    restore_step = resume.step if resume else None
    meta = resume.meta if resume else {}
    with program.group("replay", program_lib.Resources(cfg.replay_cpus)):
        replay_node = program.add_node(
            replay.ReplayNode,
            functools.partial(builder.replay_tables, spec),
            # One port for the whole run: a restarted replay serves at the same
            # address, and Reverb's clients reconnect to it by themselves.
            port=cfg.replay_port or portpicker.pick_unused_port(),
            checkpoint_dir=checkpoint.replay_dir(cfg.logdir) if saving else None,
            restore_step=restore_step,
        )
    program.node(replay_node.name).restartable(functools.partial(_restart_replay, saving))
    with program.group("monitor", no_cpu):
        monitor_node = program.add_node(monitor.MonitorNode, restored=meta)
    restored_counters = meta.get("node_counters", {})
    if cfg.learner_mode == "gorila":
        shards = gorila.add_nodes(
            program,
            builder,
            cfg,
            spec,
            replay_node,
            monitor_node,
            checkpoint_dir=checkpoint.learner_dir(cfg.logdir) if saving else None,
            restore_step=restore_step,
            restored_counters=restored_counters,
        )
        _add_actors_and_evaluator(
            program, builder, cfg, spec, replay_node, shards, monitor_node, restored_counters
        )
        return program
    multihost_kwargs = [{}]
    if cfg.num_learner_hosts > 1:
        with program.group("learner_rendezvous", no_cpu):
            rendezvous = program.add_node(multihost.Rendezvous)
        multihost_kwargs = [
            dict(
                num_learner_hosts=cfg.num_learner_hosts,
                learner_process_id=process_id,
                rendezvous=rendezvous,
            )
            for process_id in range(cfg.num_learner_hosts)
        ]
    with program.group("learner", program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
        learner_nodes = [
            program.add_node(
                learner.LearnerNode,
                builder,
                spec,
                replay_node,
                monitor_node,
                cfg.seed,
                num_devices=cfg.num_learner_devices,
                checkpoint_dir=checkpoint.learner_dir(cfg.logdir) if saving else None,
                checkpoint_interval_steps=cfg.checkpoint_interval_steps,
                max_checkpoints_to_keep=cfg.max_checkpoints_to_keep,
                restore_step=restore_step,
                tf32=cfg.tf32,
                report_interval_s=cfg.heartbeat_interval_s,
                max_nonfinite_steps=cfg.max_nonfinite_steps,
                rollback_lr_factor=cfg.rollback_lr_factor,
                rollback_param_noise=cfg.rollback_param_noise,
                **kwargs,
            )
            for kwargs in multihost_kwargs
        ]
    learner_node = learner_nodes[0]  # the chief: actors and evaluator read its parameters
    if cfg.num_learner_hosts == 1:
        # A multi-host learner is not restarted: one replaced process cannot rejoin
        # the others' jax.distributed job, so losing one fails the run.
        program.node(learner_node.name).restartable(functools.partial(_restart_learner, saving))
    _add_actors_and_evaluator(
        program,
        builder,
        cfg,
        spec,
        replay_node,
        learner_node,
        monitor_node,
        restored_counters,
    )
    return program


def _add_actors_and_evaluator(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    replay_node: program_lib.Handle,
    params_from: program_lib.Handle | list[program_lib.Handle],
    monitor_node: program_lib.Handle,
    restored_counters: dict[str, dict[str, int]] | None = None,
) -> None:
    """Actors, and the evaluator if evaluations are on; both read parameters
    from `params_from`: the learner, or the list of Gorila shards."""
    if cfg.eval_interval_s > 0:
        with program.group("evaluator", program_lib.Resources(num_cpus=0)):
            program.add_node(
                evaluation.EvaluatorNode,
                builder,
                spec,
                params_from,
                monitor_node,
                cfg.seed,
                cfg.eval_episodes,
                cfg.eval_interval_s,
            )
    nodes = (replay_node, params_from, monitor_node)
    restored_counters = restored_counters or {}
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            handle = program.add_node(
                actor.ActorNode,
                builder,
                spec,
                index,
                cfg.num_actors,
                *nodes,
                cfg.seed,
                cfg.num_envs_per_actor,
                cfg.param_pull_interval,
                env_threads=cfg.env_threads_per_actor,
                restored_counters=restored_counters.get(f"actor/{index}"),
                report_interval_s=cfg.heartbeat_interval_s,
            )
            # A replacement acts with the same index (seed offset) and config,
            # and continues the counters (and exploration schedule) it reported last.
            program.node(handle.name).restartable(monitor.continue_counters)


def _restart_replay(saving: bool, counters: dict[str, float]) -> dict[str, Any]:
    """A replacement replay restores its newest intact checkpoint (or starts empty).

    It loses the items written since that checkpoint: at most
    `checkpoint_interval_steps` learner steps' worth of inserts.
    """
    del counters  # the replay sends no heartbeats: its state is its checkpoint
    return {"restore_step": replay.NEWEST if saving else None}


def _restart_learner(saving: bool, counters: dict[str, float]) -> dict[str, Any]:
    """A replacement learner resumes from its newest checkpoint; its step count goes on."""
    return {
        "restore_step": learner.NEWEST if saving else None,
        "restored_counters": counters,
    }


def _finite_or_none(value: Any) -> Any:
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
        **gorila.summarize(snapshot["metrics"]),
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
    return None


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler, `kill`) stops the run like Ctrl-C: cleanly, after a checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drive(running: Any, cfg: ExperimentConfig, logger: metrics.MetricsLogger, start: float) -> str:
    """Polls the monitor, logs rows, until a stop condition (or an interrupt); returns why.

    Each poll the supervisor restarts dead, silent and stalled nodes.

    Raises:
      monitor.RunFailed: a node failed and may not be restarted (again).
    """
    monitor_client = running.client("monitor")
    supervisor = monitor.Supervisor(
        running,
        monitor_client,
        cfg.heartbeat_timeout_s,
        cfg.stall_timeout_s,
        cfg.max_restarts,
        cfg.startup_timeout_s,
    )
    previous = logger.last_row or {"wall_time_s": 0.0, "env_steps": 0, "learner_steps": 0}
    reason = None
    try:
        while reason is None:
            time.sleep(min(0.25, cfg.log_interval_s))
            for line in supervisor.check():
                print(line, flush=True)
            elapsed = time.monotonic() - start
            snapshot = monitor_client.snapshot()
            reason = _done(cfg, snapshot, elapsed)
            if reason or elapsed - previous["wall_time_s"] >= cfg.log_interval_s:
                _write_node_status(
                    cfg.logdir,
                    monitor_client.node_status(),
                    supervisor.restarts,
                    running.process_ids(),
                )
                row = _row(snapshot, previous, elapsed)
                logger.write(row)
                print(metrics.progress_line(row) + gorila.progress_suffix(row), flush=True)
                previous = row
    except KeyboardInterrupt:
        return "interrupted"
    return reason


NODE_STATUS_FILE = "nodes.json"


def _write_node_status(
    logdir: str, status: dict[str, Any], restarts: dict[str, int], pids: dict[str, int]
) -> None:
    """`<logdir>/nodes.json`: each node's pid, heartbeat age, counters and restarts.

    For operators (which process is actor/3, is it beating), fault tests and
    memory benchmarks. Nodes without heartbeats (replay, monitor) get their
    pid from the launcher.
    """
    record = {
        name: {
            **status.get(name, {}),
            "pid": status.get(name, {}).get("pid") or pids.get(name),
            "restarts": count,
        }
        for name, count in restarts.items()
    }
    path = os.path.join(logdir, NODE_STATUS_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def _stop_in_order(running: Any, cfg: ExperimentConfig) -> None:
    """Stops actors and evaluator, then the learner (or the Gorila workers), whose `run`
    ends with the final checkpoint.

    Stopped actors insert nothing more and have reported their last counters,
    so the final replay checkpoint and the counters saved with it agree.
    """
    actors = [running.client(f"actor/{index}") for index in range(cfg.num_actors)]
    for node in actors:
        node.stop()
    if cfg.eval_interval_s > 0:
        running.client("evaluator").stop()
    for node in actors:
        _wait_finished(running, node)
    if cfg.learner_mode == "gorila":
        learners = [running.client(f"gradient_worker/{i}") for i in range(cfg.num_learners)]
    else:
        learners = [running.client(spec.name) for spec in running.program.groups["learner"]]
    for node in learners:
        node.stop()
    for node in learners:
        _wait_finished(running, node)


def _final_params(
    running: Any, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> tuple[int, Any]:
    """(version, parameters) at the end: the learner's, or assembled from the Gorila shards."""
    if cfg.learner_mode == "gorila":
        shards = [running.client(f"parameter_server/{i}") for i in range(cfg.num_ps_shards)]
        return parameter_server.sharded_parameters(
            shards, builder, spec, cfg.seed, "driver"
        ).get_params()
    return running.client("learner/0").get_params()  # the chief of a multi-host learner


def _wait_finished(running: Any, node: program_lib.Client) -> None:
    while not node.wait_finished(1.0):
        running.check()  # a node that died instead of stopping raises here
    running.check()


def run_experiment(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, **launcher_options: Any
) -> dict[str, Any]:
    """Runs the program until a stop condition, evaluates, and writes summary.json.

    Ctrl-C or SIGTERM stop the run the same way (final checkpoint included),
    skip the final evaluation and then raise KeyboardInterrupt.

    Returns:
      The summary: counters, rates, final greedy evaluation, evaluation history.
    """
    cfg.validate()
    spec = envs.env_spec(cfg.env_id)
    builder.validate(cfg.num_learner_devices or 1, spec)
    if cfg.learner_mode == "gorila":
        template = lambda: gorila.checkpoint_template(builder, spec, cfg.seed, cfg.num_ps_shards)  # noqa: E731
    else:
        template = lambda: builder_lib.initial_train_state(builder, spec, cfg.seed)  # noqa: E731
    resume = checkpoint.prepare_logdir(cfg.logdir, cfg.resume, builder, cfg, template)
    program = make_program(builder, cfg, spec, resume)
    if cfg.launcher == "ray" and cfg.ray_address:
        launcher_options.setdefault("address", cfg.ray_address)
    if cfg.launcher == "ray" and cfg.max_restarts:
        # Callers of a restarted node wait for its replacement instead of failing.
        launcher_options.setdefault(
            "reconnect_timeout_s", cfg.startup_timeout_s + cfg.heartbeat_timeout_s
        )
    resume_env_steps = checkpoint.total(resume.meta, "env_steps") if resume else None
    logger = metrics.MetricsLogger(cfg.logdir, resume_env_steps)
    # A resumed run's clock goes on from the last row kept: wall time stays the x-axis.
    start = time.monotonic() - (logger.last_row or {"wall_time_s": 0.0})["wall_time_s"]
    # The SIGTERM handler goes in after the launch: `ray.init` installs one of its own
    # (sys.exit), which would otherwise end the run without its final checkpoint.
    with (
        launchers.launch(program, cfg.launcher, **launcher_options) as running,
        _sigterm_as_interrupt(),
    ):
        reason = _drive(running, cfg, logger, start)
        print(f"stopping: {reason}", flush=True)
        _stop_in_order(running, cfg)
        params_version, params = _final_params(running, builder, cfg, spec)
        snapshot = running.client("monitor").snapshot()
        evaluations = running.client("monitor").evaluations()
        restarts = running.client("monitor").restarts()
    wall_time = time.monotonic() - start
    logger.close()
    if cfg.saves_checkpoints:
        where = checkpoint.checkpoint_root(cfg.logdir)
        print(f"checkpoint: learner step {params_version:,} in {where}", flush=True)
    final_returns = None
    if reason != "interrupted":
        final_returns = evaluation.evaluate(builder, spec, params, cfg.eval_episodes, cfg.seed + 1)
    summary = {
        "env_id": cfg.env_id,
        "stop_reason": reason,
        **_totals(snapshot, wall_time),
        "params_version": params_version,
        "final_eval_return": None if final_returns is None else float(final_returns.mean()),
        "final_eval_episodes": 0 if final_returns is None else len(final_returns),
        "evaluations": evaluations,
        "restarts": restarts,
        "resumed_from_learner_step": resume.step if resume else None,
        "experiment": dataclasses.asdict(cfg),
        "agent_config": dataclasses.asdict(builder.config),
    }
    with open(os.path.join(cfg.logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if reason == "interrupted":
        print("interrupted: final evaluation skipped; --resume continues the run", flush=True)
        raise KeyboardInterrupt
    return summary
