"""Small programs that tests of the nodes share."""

import functools

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.acting import actor
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program
from gorila_jax.learning import learner
from tests.backends import DefaultReplayNode


def replay_learner_and_actor(
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    settings: ActorSettings,
    name: str = "nodes",
) -> program.Program:
    """The default backend's replay, a learner the test steps by hand (its `run` off) and
    one actor acting with `settings`."""
    graph = program.Program(name)
    with graph.group("replay"):
        replay_node = graph.add_node(
            DefaultReplayNode, functools.partial(builder_lib.replay_tables, builder, spec)
        )
    with graph.group("learner"):
        learner_node = graph.add_node(learner.LearnerNode, builder, spec, replay_node, None, 0)
    with graph.group("actor"):
        graph.add_node(
            actor.ActorNode, builder, spec, 0, 1, replay_node, learner_node, None, 0, settings
        )
    graph.node("learner").disable_run()
    return graph
