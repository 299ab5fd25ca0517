"""How a run learns from its replay (`--learner_mode`), one object per mode: which nodes it
adds to the graph, how many replays it needs, how its nodes stop, where its final
parameters are and what its checkpoints restore into.

    sync       one learner group (one host, or several as one jax.distributed job)
    gorila     gradient workers and parameter-server shards (gorila/mode.py)
    federated  a client (learner) per replay and a coordinator (federated/nodes.py)
    anakin     (--launcher=anakin) one learner that acts in its own JAX envs and keeps
               its replay on its devices: no replay or actor nodes (gorila_jax/anakin)

`of(cfg)` is where the settings are read; the program builder, the driver and the role
groups go through the mode's methods and never branch on its name.
"""

import dataclasses
from typing import Any, Callable, NamedTuple

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, replay, types
from gorila_jax.anakin import node as anakin_node
from gorila_jax.distributed import multihost
from gorila_jax.distributed import program as program_lib
from gorila_jax.federated import nodes as federated_nodes
from gorila_jax.gorila import mode as gorila_mode
from gorila_jax.gorila import parameter_server, shard_node
from gorila_jax.learning import checkpoint, learner, multihost_learner, sync_learner


class ParamSources(NamedTuple):
    """What the evaluator, and each actor, read parameters from (a node's handle, or the
    Gorila shards' list)."""

    evaluator: Any
    of_actor: Callable[[int], Any]


class LearningNodes(NamedTuple):
    """Where a mode's nodes go: the replay nodes they sample, the monitor, the checkpoint
    directory (None: none), the step to restore (a resume), the counters each node
    reported last, and the role they serve in a program of role groups (None: the only
    one)."""

    replays: list[program_lib.Handle]
    monitor: program_lib.Handle
    checkpoint_dir: str | None
    restore_step: int | None
    restored_counters: dict[str, dict[str, float]]
    role: str | None


def _group_nodes(running: Any, kind: str) -> list[str]:
    """The names of every node of groups of `kind` ("learner", "learner@prey", ...)."""
    return [
        spec.name
        for group, specs in running.program.groups.items()
        if group.partition(program_lib.ROLE_MARK)[0] == kind
        for spec in specs
    ]


class SyncMode:
    """One learner group: a process per learner host."""

    name = "sync"
    # Whether the run's checkpoint (in <logdir>/checkpoints) has its replay beside it, at
    # the same step: a resume then needs both intact.
    replay_beside_checkpoint = True
    # Whether the mode's learner acts itself: then the program has no replay and no actors.
    acts_itself = False

    def replay_copies(self, cfg: Any) -> int:
        """How many separate replays (each of cfg.num_replay_shards shards) the run has."""
        return 1

    def replay_checkpoints(
        self, logdir: str, copy: int, restore_step: int | None
    ) -> tuple[str, int | None]:
        """(the logdir whose checkpoints/replay/ replay copy `copy` keeps its checkpoints
        in, the step it restores) for a run resumed at `restore_step` (None: a new run)."""
        return logdir, restore_step

    def check_agent(self, builder: builder_lib.AgentBuilder, spec: types.EnvSpec, cfg: Any) -> None:
        """Raises ValueError for an agent (or its env) this mode cannot run."""

    def add_nodes(
        self,
        program: program_lib.Program,
        builder: builder_lib.AgentBuilder,
        cfg: Any,
        spec: types.EnvSpec,
        where: LearningNodes,
    ) -> ParamSources:
        """The learner group, joined by a rendezvous into one `jax.distributed` job when
        it has more than one process; actors and the evaluator read its chief."""
        group = program_lib.role_group("learner", where.role)
        start = sync_learner.LearnerStart(where.checkpoint_dir, where.restore_step)
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
                    where.replays,
                    where.monitor,
                    cfg.seed,
                    cfg.learner_settings(),
                    start=start,
                    **kwargs,
                )
                for kwargs in per_process
            ]
        for handle in handles:
            program.node(handle.name).restartable(start.restart_kwargs)
        if cfg.num_learner_hosts > 1:
            # One replaced process cannot rejoin the others' jax.distributed job: a
            # fault of any learner process replaces the rendezvous (so the new chief
            # publishes a fresh coordinator address) and then every learner process,
            # which resume from the chief's newest checkpoint.
            program.node(rendezvous.name).restartable(_restart_rendezvous)
            program.restart_together([rendezvous.name, *(handle.name for handle in handles)])
        return ParamSources(handles[0], lambda index: handles[0])

    def stop_stages(self, running: Any, cfg: Any) -> list[list[str]]:
        """The mode's nodes in the stages they stop in (each stage's together; the last
        stage takes the final checkpoint). A multi-host learner's processes stop together
        (their stop votes agree); so do the learners of the roles of role groups."""
        return [_group_nodes(running, "learner")]

    def final_params(
        self,
        running: Any,
        builder: builder_lib.AgentBuilder,
        cfg: Any,
        spec: types.EnvSpec,
        role: str | None = None,
    ) -> tuple[int, Any]:
        """(version, parameters) at the end of the run."""
        # The chief of a multi-host learner.
        return running.client(f"{program_lib.role_group('learner', role)}/0").get_params()

    def checkpoint_template(
        self, builder: builder_lib.AgentBuilder, cfg: Any, spec: types.EnvSpec
    ) -> Callable[[], Any]:
        """What the run's checkpoints restore into."""
        return lambda: builder_lib.initial_train_state(builder, spec, cfg.seed)

    def stop_reason(self, cfg: Any, snapshot: dict[str, Any]) -> str | None:
        """A reason of the mode's own to end the run (None: none yet)."""
        return None


class GorilaMode(SyncMode):
    """Gradient workers and parameter-server shards (docs/gorila.md)."""

    name = "gorila"

    def check_agent(self, builder: builder_lib.AgentBuilder, spec: types.EnvSpec, cfg: Any) -> None:
        gorila_mode.check_agent(builder, spec)

    def add_nodes(self, program, builder, cfg, spec, where: LearningNodes) -> ParamSources:
        """Shards and workers; actors and the evaluator read the shards."""
        shards = gorila_mode.add_nodes(
            program,
            builder,
            cfg,
            spec,
            where.replays,
            where.monitor,
            checkpoint_dir=where.checkpoint_dir,
            restore_step=where.restore_step,
            restored_counters=where.restored_counters,
            role=where.role,
        )
        return ParamSources(shards, lambda index: shards)

    def stop_stages(self, running: Any, cfg: Any) -> list[list[str]]:
        # Worker 0 takes the final checkpoint (of each role's groups, in a program of
        # role groups), so the others stop first: a gradient they pushed after its
        # snapshot would be lost on resume.
        workers = _group_nodes(running, "gradient_worker")
        first = [name for name in workers if not name.endswith("/0")]
        return [first, [name for name in workers if name.endswith("/0")]]

    def final_params(self, running, builder, cfg, spec, role=None) -> tuple[int, Any]:
        group = program_lib.role_group("parameter_server", role)
        shards = [running.client(f"{group}/{i}") for i in range(cfg.num_ps_shards)]
        source = parameter_server.sharded_parameters(shards, builder, spec, cfg.seed, "driver")
        try:
            return source.get_params()
        finally:
            parameter_server.close_source(source)

    def checkpoint_template(self, builder, cfg, spec) -> Callable[[], Any]:
        return lambda: shard_node.checkpoint_template(builder, spec, cfg.seed, cfg.num_ps_shards)


class FederatedMode(SyncMode):
    """A client (a learner) on each of num_clients replays, and a coordinator averaging
    their updates round by round (docs/federated.md). Actor i acts for client
    i % num_clients, so a client's data never leaves it.

    Checkpoints: the coordinator's are the run's (the global model at a round, with the
    monitor's state); each client keeps its learner and replay in
    `checkpoint.client_logdir`, at its own learner steps. A resume, or a restarted
    client, takes each client's newest; the coordinator then hands every client the
    global model of its round, which replaces the client's trainable parameters (its
    optimizer state and replay stay its own)."""

    name = "federated"
    replay_beside_checkpoint = False

    def replay_copies(self, cfg: Any) -> int:
        return cfg.num_clients

    def replay_checkpoints(self, logdir, copy, restore_step):
        newest = None if restore_step is None else replay.NEWEST
        return checkpoint.client_logdir(logdir, copy), newest

    def add_nodes(self, program, builder, cfg, spec, where: LearningNodes) -> ParamSources:
        """The clients and the coordinator; the evaluator reads the coordinator's global
        parameters, actor i its client's."""
        privacy = cfg.privacy_settings()
        saving = where.checkpoint_dir is not None
        restore = None if where.restore_step is None else sync_learner.NEWEST
        starts = [
            sync_learner.LearnerStart(
                checkpoint.learner_dir(checkpoint.client_logdir(cfg.logdir, client))
                if saving
                else None,
                restore,
            )
            for client in range(cfg.num_clients)
        ]
        with program.group("learner", program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
            clients = [
                program.add_node(
                    federated_nodes.FederatedClientNode,
                    builder,
                    spec,
                    where.replays[client],
                    where.monitor,
                    cfg.seed,
                    # A rollback would undo the round's global parameters with the rest.
                    dataclasses.replace(cfg.learner_settings(), max_nonfinite_steps=0),
                    start=start,
                    client_index=client,
                    local_updates=cfg.local_updates_per_round,
                    privacy=privacy,
                    secure=cfg.secure_aggregation,
                )
                for client, start in enumerate(starts)
            ]
        for handle, start in zip(clients, starts):
            program.node(handle.name).restartable(start.restart_kwargs)
        settings = federated_nodes.CoordinatorSettings(
            local_updates=cfg.local_updates_per_round,
            rounds=cfg.federated_rounds,
            privacy=privacy,
            secure=cfg.secure_aggregation,
            heartbeat_interval_s=cfg.heartbeat_interval_s,
            checkpoint_every_rounds=(
                max(1, cfg.checkpoint_interval_steps // cfg.local_updates_per_round)
                if saving
                else 0
            ),
            max_checkpoints_to_keep=cfg.max_checkpoints_to_keep,
        )
        with program.group(federated_nodes.GROUP, program_lib.Resources(num_cpus=0)):
            coordinator = program.add_node(
                federated_nodes.CoordinatorNode,
                builder,
                spec,
                clients,
                where.monitor,
                cfg.seed,
                settings,
                checkpoint_dir=where.checkpoint_dir,
                restore_step=where.restore_step,
            )
        return ParamSources(coordinator, lambda index: clients[index % cfg.num_clients])

    def stop_stages(self, running: Any, cfg: Any) -> list[list[str]]:
        # The coordinator first: no round may start while clients stop.
        return [[f"{federated_nodes.GROUP}/0"], _group_nodes(running, "learner")]

    def final_params(self, running, builder, cfg, spec, role=None) -> tuple[int, Any]:
        return running.client(f"{federated_nodes.GROUP}/0").get_params()  # the global model

    def stop_reason(self, cfg: Any, snapshot: dict[str, Any]) -> str | None:
        rounds = snapshot["metrics"].get(federated_nodes.ROUNDS_METRIC, 0)
        if cfg.federated_rounds and rounds >= cfg.federated_rounds:
            return "federated_rounds reached"
        return None


class AnakinMode(SyncMode):
    """One learner acting in its own JAX envs inside its compiled loop (`--launcher=anakin`,
    docs/anakin.md): no replay or actor nodes; the evaluator reads it as a learner."""

    name = "anakin"
    replay_beside_checkpoint = False
    acts_itself = True

    def check_agent(self, builder: builder_lib.AgentBuilder, spec: types.EnvSpec, cfg: Any) -> None:
        devices = len(parallel.local_devices(cfg.num_learner_devices))
        anakin_node.check_run(builder, spec, anakin_settings(cfg), devices)

    def add_nodes(self, program, builder, cfg, spec, where: LearningNodes) -> ParamSources:
        name = "learner/0"
        with program.group("learner", program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
            handle = program.add_node(
                anakin_node.AnakinNode,
                builder,
                spec,
                where.monitor,
                cfg.seed,
                cfg.learner_settings(),
                anakin_settings(cfg),
                sync_learner.LearnerStart(
                    where.checkpoint_dir, where.restore_step, where.restored_counters.get(name)
                ),
            )
        # Not restartable: the program runs in one process, as under launcher=local.
        return ParamSources(handle, lambda index: handle)


def anakin_settings(cfg: Any) -> anakin_node.AnakinSettings:
    """What an Anakin learner takes from the run's settings."""
    return anakin_node.AnakinSettings(
        num_actors=cfg.num_actors,
        num_envs_per_actor=cfg.num_envs_per_actor,
        iterations_per_call=cfg.anakin_iterations_per_call,
        max_env_steps=cfg.total_env_steps,
    )


MODES: dict[str, SyncMode] = {
    mode.name: mode for mode in (SyncMode(), GorilaMode(), FederatedMode())
}
ANAKIN = AnakinMode()


def of(cfg: Any) -> SyncMode:
    """The learning mode `cfg.learner_mode` names; Anakin's under `--launcher=anakin`."""
    return ANAKIN if cfg.launcher == "anakin" else MODES[cfg.learner_mode]


def _restart_rendezvous(counters: dict[str, float]) -> dict[str, Any]:
    """A replacement rendezvous starts empty: the restarted chief publishes a new address."""
    del counters  # it sends no heartbeats
    return {}
