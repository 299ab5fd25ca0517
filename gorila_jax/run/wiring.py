"""The Gorila program graph of a run: which nodes, wired to which, restarted how.

`make_program` builds it at launch; `add_actor`/`remove_actor` change a
running one (elastic actors) with the same wiring.
"""

import functools
from typing import Any, Callable

import portpicker

from gorila_jax import builder as builder_lib
from gorila_jax import demonstrations, replay, types
from gorila_jax.acting import actor, evaluation, param_cache
from gorila_jax.distributed import multihost
from gorila_jax.distributed import program as program_lib
from gorila_jax.gorila import mode, shard_node
from gorila_jax.health import balance, monitor
from gorila_jax.learning import checkpoint, learner, multihost_learner, sync_learner
from gorila_jax.run import combinations
from gorila_jax.run.experiment_config import ExperimentConfig


def check_program(
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    agents_taking_demos: tuple[str, ...] = (),
) -> None:
    """What a program of one agent needs, checked before anything starts.

    Raises:
      ValueError: naming the setting at fault (`agents_taking_demos` are named to a
        `--demos` the agent cannot take).
    """
    builder.validate(cfg.num_learner_devices or 1, spec)
    cfg.check_budget(builder)
    if cfg.balance_interval_s:
        # "downweight" needs priorities in the sampled table.
        layout = builder.replay_layout(spec)
        balance.check_remedy(cfg.balance_remedy, layout.tables, layout.sample_table)
    demonstrations.check_run(cfg.demos, builder, spec, agents_taking_demos)
    if cfg.learner_mode == "gorila":
        mode.check_agent(builder, spec)
    combinations.check_agents(cfg, [builder])
    cfg.replay_tiering(builder, spec)  # raises for a table that cannot be tiered
    check_replay_tables(builder, cfg, spec)


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
    if cfg.learner_mode == "federated":  # a replay of its own for each client
        specs *= cfg.num_clients
    try:
        replay.check_memory(specs)
    except MemoryError as error:
        raise ValueError(str(error)) from None


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
    restore_step = resume.step if resume else None
    meta = resume.meta if resume else {}
    replay_nodes = add_replay_shards(program, builder, cfg, spec, restore_step)
    with program.group("monitor", program_lib.Resources(num_cpus=0)):
        monitor_node = program.add_node(monitor.MonitorNode, restored=meta)
    restored_counters = meta.get("node_counters", {})
    params_from = add_learning(
        program, builder, cfg, spec, (replay_nodes, monitor_node), restore_step, restored_counters
    )
    nodes = (replay_nodes, params_from, monitor_node)
    _add_actors_and_evaluator(program, builder, cfg, spec, nodes, restored_counters)
    return program


def add_learning(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    nodes: tuple[list[program_lib.Handle], program_lib.Handle],
    restore_step: int | None,
    restored_counters: dict[str, dict[str, float]],
    role: str | None = None,
) -> Any:
    """What learns from the replay shards in `nodes` = (replay shards, monitor): the
    learner group, or Gorila mode's workers and shards; returns what actors read
    parameters from (the learner's chief, or the shards). With `role`, that role's
    groups of a program of role groups, checkpointing under `checkpoint.role_logdir`."""
    replay_nodes, monitor_node = nodes
    checkpoint_dir = None
    if cfg.saves_checkpoints:
        checkpoint_dir = checkpoint.learner_dir(checkpoint.role_logdir(cfg.logdir, role))
    if cfg.learner_mode == "gorila":
        return mode.add_nodes(
            program,
            builder,
            cfg,
            spec,
            replay_nodes,
            monitor_node,
            checkpoint_dir=checkpoint_dir,
            restore_step=restore_step,
            restored_counters=restored_counters,
            role=role,
        )
    return _add_learners(
        program, builder, cfg, spec, replay_nodes, monitor_node, checkpoint_dir, restore_step, role
    )


def _add_learners(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    replay_nodes: list[program_lib.Handle],
    monitor_node: program_lib.Handle,
    checkpoint_dir: str | None,
    restore_step: int | None,
    role: str | None = None,
) -> program_lib.Handle:
    """The learner group: one process per learner host, joined by a rendezvous into one
    `jax.distributed` job when more than one; returns the chief, which actors read from.

    With `role`, the group of that role of a program of role groups ("learner@<role>")."""
    group = program_lib.role_group("learner", role)
    per_process: list[dict[str, Any]] = [{"name": f"{group}/0"}]
    node_class: type = learner.LearnerNode
    if cfg.num_learner_hosts > 1:
        multihost_learner.check_agent(builder, cfg.num_learner_hosts)
        node_class = multihost_learner.MultiHostLearnerNode
        with program.group("learner_rendezvous", program_lib.Resources(num_cpus=0)):
            rendezvous = program.add_node(multihost.Rendezvous)
        job = dict(num_learner_hosts=cfg.num_learner_hosts, rendezvous=rendezvous)
        per_process = [dict(job, learner_process_id=i) for i in range(cfg.num_learner_hosts)]
    with program.group(group, program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
        handles = [
            program.add_node(
                node_class,
                builder,
                spec,
                replay_nodes,
                monitor_node,
                cfg.seed,
                num_devices=cfg.num_learner_devices,
                checkpoint_dir=checkpoint_dir,
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
            for kwargs in per_process
        ]
    restart = functools.partial(_restart_learner, cfg.saves_checkpoints)
    for handle in handles:
        program.node(handle.name).restartable(restart)
    if cfg.num_learner_hosts > 1:
        # One replaced process cannot rejoin the others' jax.distributed job: a
        # fault of any learner process replaces the rendezvous (so the new chief
        # publishes a fresh coordinator address) and then every learner process,
        # which resume from the chief's newest checkpoint.
        program.node(rendezvous.name).restartable(_restart_rendezvous)
        program.restart_together([rendezvous.name, *(handle.name for handle in handles)])
    return handles[0]


def _add_actors_and_evaluator(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    nodes: tuple,
    restored_counters: dict[str, dict[str, int]],
) -> None:
    """Actors, and the evaluator if evaluations are on, wired to `nodes` = (replay shards,
    parameter source, monitor); the parameter source is the learner, or the Gorila shards."""
    replay_nodes, params_from, monitor_node = nodes
    add_evaluator(program, builder, cfg, spec, params_from, monitor_node)
    caches = _add_param_caches(
        program, builder, cfg, spec, params_from, monitor_node, restored_counters
    )
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            # Actor i reads its host's cache: actors_per_host consecutive actors share one.
            reads = caches[index // cfg.actors_per_host] if caches else params_from
            restored = restored_counters.get(f"actor/{index}")
            args, kwargs = actor_arguments(
                builder, cfg, spec, index, (replay_nodes, reads, monitor_node), restored
            )
            handle = program.add_node(actor.ActorNode, *args, **kwargs)
            if len(replay_nodes) > 1 and not caches:
                # Placed beside the shard it writes to (a cache's actors go with the cache).
                program.node(handle.name).near = replay.actor_shard(replay_nodes, index).name
            # A replacement acts with the same index (seed offset) and config,
            # and continues the counters (and exploration schedule) it reported last.
            program.node(handle.name).restartable(monitor.continue_counters)


def add_evaluator(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    params_from: Any,
    monitor_node: program_lib.Handle,
) -> None:
    """The evaluator, reading `params_from`, if evaluations are on."""
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


def actor_arguments(
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    index: int,
    nodes: tuple,
    restored_counters: dict[str, int] | None,
) -> tuple[tuple, dict[str, Any]]:
    """`ActorNode`'s (args, kwargs) for actor `index`, reading from `nodes` =
    (replay, parameter source, monitor): at launch, and for actors added later.

    An added actor (index >= cfg.num_actors) is told the configured actor
    count, not the current one: per-actor settings stay within their
    configured range (DQN's epsilon_end_spread gives an added actor the
    epsilon of configured actor index % num_actors), and agents sized by
    the count (PPO's per-actor KL report) keep their shapes.
    """
    replay_node, params_from, monitor_node = nodes
    args = (
        builder,
        spec,
        index,
        cfg.num_actors,
        replay_node,
        params_from,
        monitor_node,
        cfg.seed,
        cfg.num_envs_per_actor,
        cfg.param_pull_interval,
    )
    kwargs = dict(
        env_threads=cfg.env_threads_per_actor,
        restored_counters=restored_counters,
        report_interval_s=cfg.heartbeat_interval_s,
    )
    return args, kwargs


def _add_param_caches(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    params_from: program_lib.Handle | list[program_lib.Handle],
    monitor_node: program_lib.Handle,
    restored_counters: dict[str, dict[str, int]],
) -> list[program_lib.Handle]:
    """One parameter cache per actor host (none without `param_cache_per_host`).

    Each cache reads `params_from` (learner or shards). The ray launcher packs
    a cache with the actors that read it (`placement.DEFAULT_RULES`). A
    restarted cache starts empty and fetches again; its byte totals go on,
    after a restart and in a resumed run (from the checkpoint's counters).
    """
    caches: list[program_lib.Handle] = []
    if not cfg.param_cache_per_host:
        return caches
    with program.group(param_cache.GROUP, program_lib.Resources(cfg.param_cache_cpus)):
        for host in range(cfg.num_actor_hosts):
            counters = int_counters(restored_counters.get(f"{param_cache.GROUP}/{host}"))
            handle = program.add_node(
                param_cache.ParameterCache,
                params_from,
                builder,
                spec,
                cfg.seed,
                host,
                monitor_node,
                report_interval_s=cfg.heartbeat_interval_s,
                min_fetch_interval_s=cfg.param_cache_min_fetch_interval_s,
                restored_counters=counters,
            )
            program.node(handle.name).restartable(monitor.continue_counters)
            caches.append(handle)
    return caches


def int_counters(counters: dict[str, float] | None) -> dict[str, int] | None:
    """A node's counters from a checkpoint's meta (JSON numbers) as the node takes them."""
    return None if counters is None else {name: int(value) for name, value in counters.items()}


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
    make_tables, tiers = _replay_shard_tables(builder, cfg, spec)
    # Demonstrations sit on the first shard only: a table of their own, filled when it starts.
    first_tables, preload = make_tables, None
    if cfg.demos:
        first_tables, preload = demonstrations.first_shard(make_tables, cfg.demos, builder, spec)
    if cfg.replay_backend == replay.NATIVE:
        # Each shard draws from its own seed: shards' samples are independent.
        node_options = [{"seed": cfg.seed * num_shards + shard} for shard in range(num_shards)]
    else:
        ports = reverb_ports(cfg)
        node_options = [{"port": port, "any_port_if_taken": not cfg.replay_port} for port in ports]
    handles = []
    with program.group(
        program_lib.role_group("replay", role), program_lib.Resources(cfg.replay_cpus)
    ):
        for shard, options in enumerate(node_options):
            handle = program.add_node(
                replay.node_class(cfg.replay_backend),
                first_tables if shard == 0 else make_tables,
                checkpoint_dir=(
                    checkpoint.replay_dir(
                        checkpoint.role_logdir(cfg.logdir, role), shard, num_shards
                    )
                    if cfg.saves_checkpoints
                    else None
                ),
                restore_step=restore_step,
                preload=preload if shard == 0 else None,
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


def reverb_ports(cfg: ExperimentConfig) -> list[int]:
    """One port per Reverb shard for the whole run: a restarted shard serves at the same
    address, and Reverb's clients reconnect to it by themselves."""
    num_shards = cfg.num_replay_shards
    ports = [cfg.replay_port + shard for shard in range(num_shards)] if cfg.replay_port else []
    while len(ports) < num_shards:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


def checkpoint_template(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> Callable[[], Any]:
    """What the run's checkpoints restore into: the shards' state (gorila) or the learner's."""
    if cfg.learner_mode == "gorila":
        return lambda: shard_node.checkpoint_template(builder, spec, cfg.seed, cfg.num_ps_shards)
    return lambda: builder_lib.initial_train_state(builder, spec, cfg.seed)


def restart_replay(saving: bool, counters: dict[str, float]) -> dict[str, Any]:
    """A replacement replay restores its newest intact checkpoint (or starts empty).

    It loses the items written since that checkpoint: at most
    `checkpoint_interval_steps` learner steps' worth of inserts.
    """
    del counters  # the replay sends no heartbeats: its state is its checkpoint
    return {"restore_step": replay.NEWEST if saving else None}


def _restart_rendezvous(counters: dict[str, float]) -> dict[str, Any]:
    """A replacement rendezvous starts empty: the restarted chief publishes a new address."""
    del counters  # it sends no heartbeats
    return {}


def _restart_learner(saving: bool, counters: dict[str, float]) -> dict[str, Any]:
    """A replacement learner resumes from its newest checkpoint; its step count goes on."""
    return {
        "restore_step": sync_learner.NEWEST if saving else None,
        "restored_counters": counters,
    }


def add_actor(
    running: Any, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> str:
    """Starts one more actor in a running Gorila program; returns its name.

    Built as `make_program` builds actors, at the next index the program
    never used (so with a seed offset no actor of this run had). It acts
    with the learner's current parameters, fetched when it starts, and the
    supervisor restarts it like the others. In a resumed run, an index that
    an earlier actor of the run had continues that actor's counters (a
    total never goes backwards).
    """
    index = len(running.program.groups["actor"])
    restored = int_counters(running.client("monitor").node_counters().get(f"actor/{index}"))
    args, kwargs = actor_arguments(builder, cfg, spec, index, actor_sources(running), restored)
    handle = running.add_node(
        "actor", actor.ActorNode, args, kwargs, restart_kwargs=monitor.continue_counters
    )
    return handle.name


def remove_actor(running: Any, name: str) -> None:
    """Stops actor `name` cleanly; its final counters stay in the run's totals.

    Raises:
      ValueError: `name` is not an acting actor, it is the last one (the
        run would make no progress), or it is the last actor writing to its
        replay shard (the shard would stop filling, and its rate limiter
        would hold the learners back). Nothing is changed then.
    """
    acting = [spec.name for spec in running.active_nodes("actor")]
    if name not in acting:
        raise ValueError(f"cannot remove {name!r}: the acting actors are {', '.join(acting)}")
    if len(acting) == 1:
        raise ValueError(f"cannot remove {name}: it is the last actor of the run")
    num_shards = len(running.program.groups["replay"])
    shard = _written_shard(name, num_shards)
    if not any(_written_shard(other, num_shards) == shard for other in acting if other != name):
        raise ValueError(
            f"cannot remove {name}: it is the last actor writing to replay shard {shard} "
            f"(num_replay_shards={num_shards}); a shard without a writer stops filling and "
            "holds the learners back; remove another actor"
        )
    running.remove_node(name)  # returns after the actor's final report to the monitor
    running.client("monitor").retire(name)


def set_sample_weights(running: Any, weights: dict[int, float]) -> None:
    """Sends the data-balance priority weights (actor index -> factor) to every node that
    samples replay: the learner's processes, or the Gorila gradient workers.

    Sent without waiting: a node being restarted misses them, and the driver
    sends them again after the next balance window (`elastic.ActorScaler`).
    """
    for group in ("learner", "gradient_worker"):
        for spec in running.active_nodes(group):
            running.client(spec.name).futures.set_sample_weights(weights)


def _written_shard(actor_name: str, num_shards: int) -> int:
    """The replay shard actor `actor_name` ("actor/<index>") writes to."""
    return replay.assigned_shard(balance.actor_index(actor_name), num_shards)


def actor_sources(running: Any) -> tuple:
    """(replay, parameter source, monitor) handles for an added actor, wired as
    `make_program` wires actors: the learner, the Gorila shards, or the
    per-host parameter cache with the fewest acting readers."""
    groups = running.program.groups
    if param_cache.GROUP in groups:
        readers = {spec.name: 0 for spec in running.active_nodes(param_cache.GROUP)}
        for spec in running.active_nodes("actor"):
            for name in spec.dependencies() & set(readers):
                readers[name] += 1
        params_from = program_lib.Handle(min(readers, key=readers.get))
    elif "parameter_server" in groups:
        params_from = [program_lib.Handle(spec.name) for spec in groups["parameter_server"]]
    else:
        params_from = program_lib.Handle("learner/0")  # the chief of a multi-host learner
    # Every replay shard: the added actor writes to its assigned one (sharded_replay).
    replay_shards = [program_lib.Handle(spec.name) for spec in groups["replay"]]
    return replay_shards, params_from, program_lib.Handle("monitor/0")
