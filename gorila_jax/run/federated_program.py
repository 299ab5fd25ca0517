"""The program of a federated run (`--learner_mode=federated`, docs/federated.md).

Client k has a replay of its own (replay/k), a learner on it (learner/k) and
the actors i with i % num_clients == k, which write to that replay and act
with that learner's parameters: a client's data never leaves it. The
coordinator (coordinator/0) averages the clients' updates round by round; the
evaluator evaluates its global parameters. Every client's replay, learner and
actors are restartable; a restarted learner starts from the current global
parameters (no checkpoints yet).
"""

import functools

import portpicker

from gorila_jax import builder as builder_lib
from gorila_jax import replay, types
from gorila_jax.acting import actor
from gorila_jax.distributed import program as program_lib
from gorila_jax.federated import nodes
from gorila_jax.health import monitor
from gorila_jax.run import wiring
from gorila_jax.run.experiment_config import ExperimentConfig


def make_program(
    builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> program_lib.Program:
    program = program_lib.Program("federated")
    with program.group("monitor", program_lib.Resources(num_cpus=0)):
        monitor_node = program.add_node(monitor.MonitorNode, restored={})
    with program.group("replay", program_lib.Resources(cfg.replay_cpus)):
        replays = [
            program.add_node(
                replay.node_class(cfg.replay_backend),
                functools.partial(builder_lib.replay_tables, builder, spec),
                **(
                    {"seed": cfg.seed * cfg.num_clients + client}
                    if cfg.replay_backend == replay.NATIVE
                    else {"port": portpicker.pick_unused_port(), "any_port_if_taken": True}
                ),
            )
            for client in range(cfg.num_clients)
        ]
    restart_replay = functools.partial(wiring.restart_replay, False)
    for handle in replays:
        program.node(handle.name).restartable(restart_replay)
    privacy = cfg.privacy_settings()
    with program.group("learner", program_lib.Resources(cfg.learner_cpus, cfg.learner_gpus)):
        clients = [
            program.add_node(
                nodes.FederatedClientNode,
                builder,
                spec,
                replays[client],
                monitor_node,
                cfg.seed,
                num_devices=cfg.num_learner_devices,
                tf32=cfg.tf32,
                report_interval_s=cfg.heartbeat_interval_s,
                max_nonfinite_steps=0,  # no checkpoint to roll back to
                client_index=client,
                local_updates=cfg.local_updates_per_round,
                privacy=privacy,
                secure=cfg.secure_aggregation,
            )
            for client in range(cfg.num_clients)
        ]
    for handle in clients:
        program.node(handle.name).restartable(monitor.continue_counters)
    with program.group(nodes.GROUP, program_lib.Resources(num_cpus=0)):
        coordinator = program.add_node(
            nodes.CoordinatorNode,
            builder,
            spec,
            clients,
            monitor_node,
            cfg.seed,
            cfg.local_updates_per_round,
            rounds=cfg.federated_rounds,
            privacy=privacy,
            secure=cfg.secure_aggregation,
            report_interval_s=cfg.heartbeat_interval_s,
        )
    wiring.add_evaluator(program, builder, cfg, spec, coordinator, monitor_node)
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            client = index % cfg.num_clients
            nodes_of_client = (replays[client], clients[client], monitor_node)
            args, kwargs = wiring.actor_arguments(builder, cfg, spec, index, nodes_of_client, None)
            handle = program.add_node(actor.ActorNode, *args, **kwargs)
            program.node(handle.name).restartable(monitor.continue_counters)
    return program
