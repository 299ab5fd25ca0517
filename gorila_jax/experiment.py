"""The Gorila program graph for any agent, and the driver loop that runs and reports it."""

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any

from gorila_jax import actor, envs, evaluation, launchers, learner, metrics, monitor, replay
from gorila_jax import builder as builder_lib
from gorila_jax import program as program_lib
from gorila_jax import types


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
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.launcher not in launchers.LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {launchers.LAUNCHERS}, got {self.launcher!r}"
            )
        envs.check_env_id(self.env_id)


def make_program(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> program_lib.Program:
    """The Gorila graph: replay, monitor, learner, actors and an evaluator."""
    program = program_lib.Program("gorila")
    no_cpu = program_lib.Resources(num_cpus=0)
    with program.group("replay", program_lib.Resources(cfg.replay_cpus)):
        replay_node = program.add_node(
            replay.ReplayNode, functools.partial(builder.replay_tables, spec)
        )
    with program.group("monitor", no_cpu):
        monitor_node = program.add_node(monitor.MonitorNode)
    with program.group("learner", program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
        learner_node = program.add_node(
            learner.LearnerNode,
            builder,
            spec,
            replay_node,
            monitor_node,
            cfg.seed,
            num_devices=cfg.num_learner_devices,
        )
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            program.add_node(
                actor.ActorNode,
                builder,
                spec,
                index,
                cfg.num_actors,
                replay_node,
                learner_node,
                monitor_node,
                cfg.seed,
                cfg.num_envs_per_actor,
                cfg.param_pull_interval,
                env_threads=cfg.env_threads_per_actor,
            )
    if cfg.eval_interval_s > 0:
        with program.group("evaluator", no_cpu):
            program.add_node(
                evaluation.EvaluatorNode,
                builder,
                spec,
                learner_node,
                monitor_node,
                cfg.seed,
                cfg.eval_episodes,
                cfg.eval_interval_s,
            )
    return program


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


def run_experiment(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, **launcher_options: Any
) -> dict[str, Any]:
    """Runs the program until a stop condition, evaluates, and writes summary.json.

    Returns:
      The summary: counters, rates, final greedy evaluation, evaluation history.
    """
    cfg.validate()
    builder.validate(cfg.num_learner_devices or 1)
    spec = envs.env_spec(cfg.env_id)
    program = make_program(builder, cfg, spec)
    if cfg.launcher == "ray" and cfg.ray_address:
        launcher_options.setdefault("address", cfg.ray_address)
    logger = metrics.MetricsLogger(cfg.logdir)
    start = time.monotonic()
    previous = {"wall_time_s": 0.0, "env_steps": 0, "learner_steps": 0}
    with launchers.launch(program, cfg.launcher, **launcher_options) as running:
        monitor_client = running.client("monitor")
        while True:
            time.sleep(min(0.25, cfg.log_interval_s))
            running.check()
            elapsed = time.monotonic() - start
            snapshot = monitor_client.snapshot()
            reason = _done(cfg, snapshot, elapsed)
            if reason or elapsed - previous["wall_time_s"] >= cfg.log_interval_s:
                row = _row(snapshot, previous, elapsed)
                logger.write(row)
                print(metrics.progress_line(row), flush=True)
                previous = row
            if reason:
                print(f"stopping: {reason}", flush=True)
                break
        params_version, params = running.client("learner").get_params()
        evaluations = monitor_client.evaluations()
    wall_time = time.monotonic() - start
    logger.close()
    final_returns = evaluation.evaluate(builder, spec, params, cfg.eval_episodes, cfg.seed + 1)
    summary = {
        "env_id": cfg.env_id,
        "stop_reason": reason,
        "env_steps": snapshot["env_steps"],
        "episodes": snapshot["episodes"],
        "learner_steps": snapshot["learner_steps"],
        "params_version": params_version,
        "wall_time_s": wall_time,
        "env_steps_per_s": snapshot["env_steps"] / wall_time,
        "learner_steps_per_s": snapshot["learner_steps"] / wall_time,
        "mean_train_return": _finite_or_none(snapshot["mean_return"]),
        "final_eval_return": float(final_returns.mean()),
        "final_eval_episodes": len(final_returns),
        "evaluations": evaluations,
        "experiment": dataclasses.asdict(cfg),
        "agent_config": dataclasses.asdict(builder.config),
    }
    with open(os.path.join(cfg.logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary
