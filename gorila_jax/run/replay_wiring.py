"""The replay group of a run's graph: one node per shard, its tables, tiers, checkpoints
and ports, and how a failed shard restarts."""

import functools
from typing import Any, Callable

import portpicker

from gorila_jax import builder as builder_lib
from gorila_jax import demonstrations, replay, types
from gorila_jax.distributed import program as program_lib
from gorila_jax.learning import checkpoint
from gorila_jax.run import learning_modes
from gorila_jax.run.experiment_config import ExperimentConfig


def check_replay_tables(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> None:
    """Refuses replay tables that their backend cannot hold, and native ones larger than
    this host's available memory where every shard runs on this host (not a Ray cluster
    of others: there each node checks its own host as it starts).

    Raises:
      ValueError: the size and the backend's limit, or the GiB needed and available;
        and what to lower.
    """
    make_tables, tiers = _replay_shard_tables(builder, cfg, spec)
    specs = [table for tiering in tiers for table in replay.node_specs(make_tables, tiering)]
    replay.check_table_sizes(cfg.replay_backend, specs)
    if cfg.replay_backend != replay.NATIVE or cfg.ray_address:
        return
    specs *= learning_modes.of(cfg).replay_copies(cfg)  # federated: one for each client
    try:
        replay.check_memory(specs)
    except MemoryError as error:
        raise ValueError(str(error)) from None


def add_replay_shards(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    restore_step: int | None,
    role: str | None = None,
) -> list[program_lib.Handle]:
    """The replay group: one node of the run's replay backend per shard (replay/0 ..
    replay/K-1), each restartable, with its own checkpoint directory (and Reverb's, port).

    Returns the shards' handles in shard order. Actors and learners get the
    whole list: an actor writes to its assigned shard, learners sample them all.
    With `role`, the group of that role ("replay@<role>"), checkpointing under
    `checkpoint.role_logdir`.
    """
    num_shards = cfg.num_replay_shards
    # A federated run has a replay of its own for each client (of one shard: its settings
    # check refuses more); node n is shard n % num_shards of replay n // num_shards.
    mode = learning_modes.of(cfg)
    num_nodes = mode.replay_copies(cfg) * num_shards
    make_tables, tiers = _replay_shard_tables(builder, cfg, spec)
    # Demonstrations sit on the first shard only: a table of their own, filled when it starts.
    first_tables, preload = make_tables, None
    if cfg.demos:
        first_tables, preload = demonstrations.first_shard(make_tables, cfg.demos, builder, spec)
    if cfg.replay_backend == replay.NATIVE:
        # Each shard draws from its own seed: shards' samples are independent.
        node_options = [{"seed": cfg.seed * num_nodes + node} for node in range(num_nodes)]
    else:
        ports = reverb_ports(cfg, num_nodes)
        node_options = [{"port": port, "any_port_if_taken": not cfg.replay_port} for port in ports]
    handles = []
    with program.group(
        program_lib.role_group("replay", role), program_lib.Resources(cfg.replay_cpus)
    ):
        for node, options in enumerate(node_options):
            shard = node % num_shards
            # A federated client's replay keeps its checkpoints beside its learner's.
            logdir, restores = mode.replay_checkpoints(
                checkpoint.role_logdir(cfg.logdir, role), node // num_shards, restore_step
            )
            handle = program.add_node(
                replay.node_class(cfg.replay_backend),
                first_tables if node == 0 else make_tables,
                checkpoint_dir=(
                    checkpoint.replay_dir(logdir, shard, num_shards)
                    if cfg.saves_checkpoints
                    else None
                ),
                restore_step=restores,
                preload=preload if node == 0 else None,
                tiering=tiers[shard],
                **options,
            )
            handles.append(handle)
    restart = functools.partial(restart_replay, cfg.saves_checkpoints)
    for handle in handles:
        program.node(handle.name).restartable(restart)
    return handles


def _replay_shard_tables(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> tuple[Callable[[], Any], list[Any]]:
    """What each replay shard holds: its tables (the agent's, split over the shards) and
    its part of a tiered replay (None each where there is none)."""
    num_shards = cfg.num_replay_shards
    make_tables = functools.partial(builder_lib.replay_tables, builder, spec)
    if num_shards > 1:
        make_tables = functools.partial(replay.shard_tables, make_tables, num_shards)
    tiering = cfg.replay_tiering(builder, spec)
    tiers = [tiering and tiering.for_shard(shard, num_shards) for shard in range(num_shards)]
    return make_tables, tiers


def reverb_ports(cfg: ExperimentConfig, num_shards: int) -> list[int]:
    """One port per Reverb node for the whole run: a restarted shard serves at the same
    address, and Reverb's clients reconnect to it by themselves."""
    ports = [cfg.replay_port + shard for shard in range(num_shards)] if cfg.replay_port else []
    while len(ports) < num_shards:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


def restart_replay(saving: bool, counters: dict[str, float]) -> dict[str, Any]:
    """A replacement replay restores its newest intact checkpoint (or starts empty).

    It loses the items written since that checkpoint: at most
    `checkpoint_interval_steps` learner steps' worth of inserts.
    """
    del counters  # the replay sends no heartbeats: its state is its checkpoint
    return {"restore_step": replay.NEWEST if saving else None}
