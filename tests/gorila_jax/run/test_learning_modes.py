"""Each learning mode adds its own nodes to the one program builder, and stops them in
the order its checkpoints need; built here without launching anything."""

import os
import types

import pytest

from agents import dqn
from gorila_jax import envs, replay
from gorila_jax.run import experiment, learning_modes

SPEC = envs.env_spec("CartPole-v1")
BUILDER = dqn.DQNBuilder(dqn.DQNConfig(hidden_sizes=(16,)))


def _program(tmp_path, **settings):
    cfg = experiment.ExperimentConfig(
        env_id="CartPole-v1", logdir=str(tmp_path), num_actors=4, **settings
    )
    return cfg, experiment.make_program(BUILDER, cfg, SPEC)


def _names(program, group):
    return [spec.name for spec in program.groups.get(group, [])]


def test_federated_clients_learn_from_their_own_replay_and_their_actors_feed_it(tmp_path):
    cfg, program = _program(tmp_path, learner_mode="federated", num_clients=2)
    assert _names(program, "replay") == ["replay/0", "replay/1"]
    assert _names(program, "learner") == ["learner/0", "learner/1"]
    assert _names(program, "coordinator") == ["coordinator/0"]
    assert cfg.saves_checkpoints
    for client in range(2):
        assert program.node(f"learner/{client}").dependencies() >= {f"replay/{client}"}
        # Each client's learner and replay checkpoint in the client's own directory.
        client_dir = os.path.join(str(tmp_path), "clients", str(client), "checkpoints")
        learner_kwargs = program.node(f"learner/{client}").kwargs
        assert learner_kwargs["start"].checkpoint_dir == os.path.join(client_dir, "learner")
        assert program.node(f"replay/{client}").kwargs["checkpoint_dir"] == os.path.join(
            client_dir, "replay"
        )
        assert f"replay/{1 - client}" not in program.node(f"learner/{client}").dependencies()
    for index in range(4):
        actor = program.node(f"actor/{index}")
        replays, params_from = actor.args[4], actor.args[5]
        # Actor i writes to client i % 2's replay and acts with that client's parameters.
        assert replay.actor_shard(replays, index).name == f"replay/{index % 2}"
        assert params_from.name == f"learner/{index % 2}"
    assert program.node("evaluator/0").dependencies() >= {"coordinator/0"}


@pytest.mark.parametrize(
    "settings, learning_groups, reads",
    [
        (dict(), ["learner"], "learner/0"),
        (
            dict(learner_mode="gorila", num_learners=2, num_ps_shards=2),
            ["gradient_worker", "parameter_server"],
            "parameter_server/0",
        ),
    ],
)
def test_sync_and_gorila_runs_share_one_replay_and_one_parameter_source(
    tmp_path, settings, learning_groups, reads
):
    cfg, program = _program(tmp_path, **settings)
    assert cfg.saves_checkpoints
    assert _names(program, "replay") == ["replay/0"]
    assert all(_names(program, group) for group in learning_groups)
    for index in range(4):
        assert reads in program.node(f"actor/{index}").dependencies()


def test_each_mode_stops_its_nodes_in_the_order_its_checkpoints_need(tmp_path):
    stages = {}
    for mode, settings in {
        "sync": dict(),
        "gorila": dict(num_learners=3, num_ps_shards=2),
        "federated": dict(num_clients=2),
    }.items():
        cfg, program = _program(tmp_path, learner_mode=mode, **settings)
        running = types.SimpleNamespace(program=program)
        stages[mode] = learning_modes.of(cfg).stop_stages(running, cfg)
    assert stages["sync"] == [["learner/0"]]
    # Worker 0 takes Gorila's final checkpoint: the others stop first.
    assert stages["gorila"] == [["gradient_worker/1", "gradient_worker/2"], ["gradient_worker/0"]]
    # No federated round starts while clients stop.
    assert stages["federated"] == [["coordinator/0"], ["learner/0", "learner/1"]]


def test_the_modes_are_the_settings_choices():
    assert (
        experiment.LEARNER_MODES == tuple(learning_modes.MODES) == ("sync", "gorila", "federated")
    )
