"""Gorila mode (Nair et al., 2015): asynchronous gradient workers and parameter-server shards.

Instead of one synchronous learner, `num_learners` gradient workers each
sample replay, compute gradients on their own (possibly stale) copy of the
parameters, and push one compressed slice to each shard. Shards apply slices
as they arrive with their own optimizer state; nobody waits for anybody.
Two rules from the paper keep this stable: gradients computed on parameters
too many versions old are dropped (at the shard), and gradients whose loss is
an outlier for that worker are dropped (at the worker).

This module puts Gorila mode into a program (`add_nodes`) and sums its run-wide
figures; `workers` and `shard_node` hold the nodes.
"""

from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.distributed import program
from gorila_jax.gorila import shard_node, workers
from gorila_jax.health import monitor as monitor_lib
from gorila_jax.learning import sync_learner


def summarize(metrics: dict[str, float]) -> dict[str, float]:
    """Run-wide Gorila figures from what workers report (`GradientWorkerNode._metrics`).

    Sums the per-worker counters over workers: gradients applied and dropped
    (stale, outlier, non-finite), mean staleness and bytes per pushed update.
    """
    totals: dict[str, float] = {}
    for key, value in metrics.items():
        worker, _, name = key.partition("/")
        if worker.startswith("worker") and name:
            totals[name] = totals.get(name, 0) + value
    if not totals:
        return {}
    pushed = max(totals.get("pushed", 0), 1)
    return {
        "gradients_applied": totals.get("applied", 0),
        "dropped_stale": totals.get("dropped_stale", 0),
        "dropped_outlier": totals.get("dropped_outlier", 0),
        "dropped_nonfinite": totals.get("dropped_nonfinite", 0),
        "mean_staleness": totals.get("staleness_sum", 0) / pushed,
        "bytes_per_update": totals.get("bytes_sent", 0) / pushed,
    }


def progress_suffix(row: dict[str, float]) -> str:
    """The progress line's Gorila part: applied/dropped, staleness, bytes, shard rates."""
    if "gradients_applied" not in row:
        return ""
    shard_rates = sorted(
        (key, value) for key, value in row.items() if key.endswith("/updates_per_s")
    )
    rates = ", ".join(f"{value:.1f}" for _, value in shard_rates)
    return (
        f" | applied {row['gradients_applied']:,.0f} dropped "
        f"{row['dropped_stale']:,.0f}/{row['dropped_outlier']:,.0f}/"
        f"{row['dropped_nonfinite']:,.0f} (stale/outlier/nonfinite) | staleness "
        f"{row['mean_staleness']:.2f} | {row['bytes_per_update'] / 1024:,.1f} KiB/update"
        f" | shard updates/s {rates}"
    )


def check_agent(builder: builder_lib.AgentBuilder, spec: types.EnvSpec) -> None:
    """Raises ValueError if the agent's update is not one gradient that shards can apply."""
    update_fns = builder.update_fns(spec)
    if (
        not isinstance(builder, builder_lib.GorilaCapable)
        or update_fns.compute_grads is None
        or update_fns.apply_grads is None
    ):
        raise ValueError(
            f"learner_mode=gorila needs an agent whose update is one gradient "
            f"(UpdateFns.compute_grads and apply_grads) that shards can apply "
            f"(builder.GorilaCapable); {type(builder).__name__} gives only a whole update "
            "step: use learner_mode=sync"
        )
    if builder.batch_plan.updates_per_dispatch != 1:
        raise ValueError(
            f"learner_mode=gorila pushes one gradient per worker call; "
            f"config.updates_per_dispatch={builder.batch_plan.updates_per_dispatch} runs on "
            "the one-host sync learner only: set it to 1"
        )


def add_nodes(
    graph: program.Program,
    builder: builder_lib.AgentBuilder,
    cfg: Any,
    spec: types.EnvSpec,
    replay_node: program.Handle,
    monitor_node: program.Handle,
    checkpoint_dir: str | None = None,
    restore_step: int | None = None,
    restored_counters: dict[str, dict[str, float]] | None = None,
    role: str | None = None,
) -> list[program.Handle]:
    """The parameter-server and gradient-worker groups of an ExperimentConfig `cfg`.

    Args:
      checkpoint_dir: where worker 0 saves Gorila checkpoints; None: none.
      restore_step: shards start from this checkpoint (a resume).
      restored_counters: each node's counters from that checkpoint.
      role: the role these groups serve in a program of role groups
        ("parameter_server@<role>", "gradient_worker@<role>"); None: the only ones.

    Returns:
      The shard handles: what actors and the evaluator read parameters from.
    """
    check_agent(builder, spec)
    shards = _add_shards(
        graph, builder, cfg, spec, monitor_node, checkpoint_dir, restore_step, role
    )
    _add_workers(
        graph,
        builder,
        cfg,
        spec,
        replay_node,
        shards,
        monitor_node,
        checkpoint_dir,
        restored_counters or {},
        role,
    )
    return shards


def _add_shards(
    graph: program.Program,
    builder: builder_lib.AgentBuilder,
    cfg: Any,
    spec: types.EnvSpec,
    monitor_node: program.Handle,
    checkpoint_dir: str | None,
    restore_step: int | None,
    role: str | None,
) -> list[program.Handle]:
    """The parameter-server group: `cfg.num_ps_shards` shards, each holding one slice."""
    group = program.role_group("parameter_server", role)
    with graph.group(group, program.Resources(cfg.ps_cpus)):
        shards = [
            graph.add_node(
                shard_node.ParameterShardNode,
                builder,
                spec,
                cfg.seed,
                index,
                cfg.num_ps_shards,
                cfg.shard_settings(),
                monitor_node,
                checkpoint_dir=checkpoint_dir,
                restore_step=restore_step,
                group=group,
            )
            for index in range(cfg.num_ps_shards)
        ]
    if checkpoint_dir is not None:
        # A replacement shard starts from the newest checkpoint; without
        # checkpoints its slice would be lost, so it is not restartable then.
        for shard in shards:
            graph.node(shard.name).restartable(
                lambda counters: {"restore_step": sync_learner.NEWEST}
            )
    return shards


def _add_workers(
    graph: program.Program,
    builder: builder_lib.AgentBuilder,
    cfg: Any,
    spec: types.EnvSpec,
    replay_node: program.Handle,
    shards: list[program.Handle],
    monitor_node: program.Handle,
    checkpoint_dir: str | None,
    restored_counters: dict[str, dict[str, float]],
    role: str | None,
) -> None:
    """The gradient-worker group: `cfg.num_learners` workers; worker 0 saves checkpoints."""
    resources = program.Resources(cfg.learner_cpus, cfg.learner_gpus)
    group = program.role_group("gradient_worker", role)
    with graph.group(group, resources):
        for index in range(cfg.num_learners):
            worker = graph.add_node(
                workers.GradientWorkerNode,
                builder,
                spec,
                replay_node,
                shards,
                monitor_node,
                cfg.seed,
                index,
                cfg.learner_settings(),
                cfg.worker_settings(),
                checkpoint_dir=checkpoint_dir if index == 0 else None,
                restored_counters=restored_counters.get(f"{group}/{index}"),
                group=group,
            )
            # A replacement pulls the shards' parameters and continues its counters.
            graph.node(worker.name).restartable(monitor_lib.continue_counters)
