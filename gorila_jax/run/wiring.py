"""The Gorila program graph of a run: which nodes, wired to which, restarted how.

`make_program` builds it at launch (its replay group: replay_wiring.py);
live_actors.py changes a running one's actors (elastic actors) with the same wiring.
"""

import dataclasses
from typing import Any, Callable

from gorila_jax import builder as builder_lib
from gorila_jax import demonstrations, envs, multiagent, replay, types
from gorila_jax.acting import actor, evaluation, param_cache, role_actor
from gorila_jax.distributed import program as program_lib
from gorila_jax.health import balance, monitor
from gorila_jax.learning import checkpoint
from gorila_jax.run import combinations, learning_modes, replay_wiring
from gorila_jax.run.experiment_config import ExperimentConfig

Builders = builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder]


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
        balance.check_remedy(cfg.balance_remedy, builder.replay_layout(spec).sampled)
    demonstrations.check_run(cfg.demos, builder, spec, agents_taking_demos)
    learning_modes.of(cfg).check_agent(builder, spec, cfg)
    combinations.check_agents(cfg, [builder])
    cfg.replay_tiering(builder, spec)  # raises for a table that cannot be tiered
    replay_wiring.check_replay_tables(builder, cfg, spec)


def role_builders(builder: Builders, env_id: str) -> dict[Any, builder_lib.AgentBuilder]:
    """role -> agent of the task `env_id`: {None: builder} for a task of one role; each
    role of a task of several (`multiagent.roles_of`), where `builder` is one agent for
    every role or role -> agent."""
    roles = multiagent.roles_of(env_id)
    if not roles:
        return {None: builder}
    return builder if isinstance(builder, dict) else dict.fromkeys(roles, builder)


def newest_meta(resume: dict[Any, checkpoint.Restored] | None) -> dict[str, Any]:
    """The meta of the roles' newest checkpoint (the monitor's state, every node's
    counters, at the latest time any role saved); {} for a new run."""
    if not resume:
        return {}
    return max((r.meta for r in resume.values()), key=lambda meta: meta.get("unix_time", 0))


def make_program(
    builder: Builders,
    cfg: ExperimentConfig,
    spec: types.EnvSpec | None = None,
    resume: checkpoint.Restored | dict[str, checkpoint.Restored] | None = None,
) -> program_lib.Program:
    """The Gorila graph of a task (`role_builders`): a monitor; per role a replay and what
    learns from it (`add_learning`: a learner, Gorila workers and shards, federated
    clients); actors and an evaluator acting for every role.

    A task of one role has the groups `replay`, `learner`, ...; each role r of a task of
    several has its own, `replay@r`, `learner@r`, ... (docs/multiagent.md), with its
    config and checkpoints in `checkpoint.role_logdir`.

    With `resume` (a task of several roles: role -> checkpoint), every node starts from
    it: a role's learning state and replay from its checkpoint's step, counters, returns
    and evaluations from the newest checkpoint's meta.
    """
    builders = role_builders(builder, cfg.env_id)
    if None in builders:
        specs = {None: spec or envs.env_spec(cfg.env_id)}
    else:
        specs = multiagent.role_specs(cfg.env_id)
    resumed = {None: resume} if isinstance(resume, checkpoint.Restored) else resume
    meta = newest_meta(resumed)
    restored_counters = meta.get("node_counters", {})
    roles = tuple(role for role in builders if role is not None)
    # An Anakin learner acts in its own envs: no replay, no actors.
    acts_itself = learning_modes.of(cfg).acts_itself
    learning_cfg = cfg
    if roles and cfg.launcher == "local":
        # Every role's learner pmaps in this one process: one device each, never a
        # shared set that all of them pmap over (the default, all devices).
        learning_cfg = dataclasses.replace(cfg, num_learner_devices=1)
    program = program_lib.Program("roles" if roles else "gorila")
    with program.group("monitor", program_lib.Resources(num_cpus=0)):
        monitor_node = program.add_node(monitor.MonitorNode, restored=meta, roles=roles)
    wirings, sources = {}, {}
    for role in sorted(builders, key=str):
        restore_step = resumed[role].step if resumed else None
        role_builder, role_spec = builders[role], specs[role]
        replay_nodes = (
            []
            if acts_itself
            else replay_wiring.add_replay_shards(
                program, role_builder, cfg, role_spec, restore_step, role
            )
        )
        where = (replay_nodes, monitor_node)
        sources[role] = add_learning(
            program, role_builder, learning_cfg, role_spec, where, restore_step,
            restored_counters, role,
        )  # fmt: skip
        wirings[role] = actor.RoleWiring(
            role_builder, role_spec, replay_nodes, sources[role].evaluator
        )
    add_evaluator(program, cfg, wirings, monitor_node)
    if acts_itself:
        return program
    if roles:
        _add_role_actors(program, cfg, wirings, monitor_node, restored_counters)
    else:
        nodes = (wirings[None].replay, sources[None], monitor_node)
        _add_actors(program, builders[None], cfg, specs[None], nodes, restored_counters)
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
) -> learning_modes.ParamSources:
    """What learns from the replay nodes in `nodes` = (replay nodes, monitor), as the run's
    learning mode adds it (`learning_modes`); returns what the evaluator and each actor read
    parameters from. With `role`, that role's groups of a program of role groups,
    checkpointing under `checkpoint.role_logdir`."""
    replay_nodes, monitor_node = nodes
    checkpoint_dir = None
    if cfg.saves_checkpoints:
        checkpoint_dir = checkpoint.learner_dir(checkpoint.role_logdir(cfg.logdir, role))
    where = learning_modes.LearningNodes(
        replay_nodes, monitor_node, checkpoint_dir, restore_step, restored_counters, role
    )
    return learning_modes.of(cfg).add_nodes(program, builder, cfg, spec, where)


def _add_actors(
    program: program_lib.Program,
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    nodes: tuple,
    restored_counters: dict[str, dict[str, int]],
) -> None:
    """The actors of a task of one role, wired to `nodes` = (replay nodes, parameter
    sources, monitor); the sources are the learner's, the Gorila shards or the federated
    clients and coordinator, or a parameter cache per actor host."""
    replay_nodes, sources, monitor_node = nodes
    # Caches serve runs whose actors all read one source (their settings check refuses
    # them in federated runs).
    caches = _add_param_caches(
        program, builder, cfg, spec, sources.evaluator, monitor_node, restored_counters
    )
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            # Actor i reads its host's cache: actors_per_host consecutive actors share one.
            reads = caches[index // cfg.actors_per_host] if caches else sources.of_actor(index)
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


def _add_role_actors(
    program: program_lib.Program,
    cfg: ExperimentConfig,
    wirings: dict[str, actor.RoleWiring],
    monitor_node: program_lib.Handle,
    restored_counters: dict[str, dict[str, int]],
) -> None:
    """The actors of a task of several roles: each acts for every role, reading each
    role's one source (role groups refuse federated runs and caches)."""
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            handle = program.add_node(
                role_actor.RoleActorNode,
                cfg.env_id,
                wirings,
                index,
                cfg.num_actors,
                monitor_node,
                cfg.seed,
                cfg.actor_settings(),
                restored_counters=int_counters(restored_counters.get(f"actor/{index}")),
            )
            program.node(handle.name).restartable(monitor.continue_counters)


def add_evaluator(
    program: program_lib.Program,
    cfg: ExperimentConfig,
    wirings: dict[Any, actor.RoleWiring],
    monitor_node: program_lib.Handle,
) -> None:
    """The evaluator of every role (each reading its role's `params_from`), if evaluations
    are on."""
    if cfg.eval_interval_s > 0:
        # It reads no replay: not a node it depends on (placement, restarts).
        reads = {role: wiring._replace(replay=None) for role, wiring in wirings.items()}
        with program.group("evaluator", program_lib.Resources(num_cpus=0)):
            program.add_node(
                evaluation.EvaluatingNode,
                reads,
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
        cfg.actor_settings(),
    )
    return args, dict(restored_counters=restored_counters)


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
                heartbeat_interval_s=cfg.heartbeat_interval_s,
                min_fetch_interval_s=cfg.param_cache_min_fetch_interval_s,
                restored_counters=counters,
            )
            program.node(handle.name).restartable(monitor.continue_counters)
            caches.append(handle)
    return caches


def int_counters(counters: dict[str, float] | None) -> dict[str, int] | None:
    """A node's counters from a checkpoint's meta (JSON numbers) as the node takes them."""
    return None if counters is None else {name: int(value) for name, value in counters.items()}


def checkpoint_template(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> Callable[[], Any]:
    """What the run's checkpoints restore into (the learner's state, or the shards')."""
    return learning_modes.of(cfg).checkpoint_template(builder, cfg, spec)
