"""Changes to a running program's actors (elastic actors, data balance): added with the
wiring `wiring.make_program` gives actors, removed only where the run can go on."""

from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import replay, types
from gorila_jax.acting import actor, param_cache
from gorila_jax.distributed import program as program_lib
from gorila_jax.health import balance, monitor
from gorila_jax.run import wiring
from gorila_jax.run.experiment_config import ExperimentConfig


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
    restored = wiring.int_counters(running.client("monitor").node_counters().get(f"actor/{index}"))
    args, kwargs = wiring.actor_arguments(
        builder, cfg, spec, index, actor_sources(running), restored
    )
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
