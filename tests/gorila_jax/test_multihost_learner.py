"""The multi-host learner in a real run: DQN on CartPole under the Ray launcher with
--num_learner_hosts=2, each learner process a jax.distributed process with 2 CPU devices.

It proves the wiring (not learning): both processes join one job and step, actors
and the learner make progress, only the chief (learner/0) counts updates and
publishes parameters, and the run stops cleanly. (A multi-host learner takes no
checkpoints yet: `learner.MULTIHOST_CHECKPOINTS`.)
"""

import json
import os

import pytest

from agents import dqn
from gorila_jax import checkpoint, experiment, multihost
from tests.gorila_jax.test_checkpoint import CONFIG, _csv_rows, _experiment

DEVICES_PER_PROCESS = 2


def test_multi_host_settings_are_refused_by_name_where_they_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="num_learner_hosts=2 needs launcher=ray"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="local").validate()
    with pytest.raises(ValueError, match="num_learner_hosts=2 needs learner_mode=sync"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="ray", learner_mode="gorila").validate()
    with pytest.raises(ValueError, match="num_learner_hosts must be positive"):
        _experiment(tmp_path, num_learner_hosts=0).validate()
    with pytest.raises(ValueError, match="cannot checkpoint yet.*checkpoint_interval_steps=0"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="ray").validate()


def test_a_two_host_learner_program_has_one_chief_that_actors_read_from(tmp_path):
    from gorila_jax import envs

    cfg = _experiment(
        tmp_path,
        launcher="ray",
        num_learner_hosts=2,
        num_learner_devices=0,
        checkpoint_interval_steps=0,
    )
    graph = experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, envs.env_spec(cfg.env_id))
    learners = graph.groups["learner"]
    assert [spec.kwargs["learner_process_id"] for spec in learners] == [0, 1]
    rendezvous = {spec.kwargs["rendezvous"].name for spec in learners}
    assert rendezvous == {"learner_rendezvous/0"}
    # Actors read parameters from the chief only; no learner process is restartable alone.
    assert all(
        "learner/0" in spec.dependencies() and "learner/1" not in spec.dependencies()
        for spec in graph.groups["actor"]
    )
    assert all(spec.restart_kwargs is None for spec in learners)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_learner_processes_step_together_and_only_the_chief_publishes(
    tmp_path, ray_options, monkeypatch
):
    # The Ray cluster started below hands this environment to its workers: 2 CPU
    # devices in each learner process, 4 in the job.
    monkeypatch.setenv("XLA_FLAGS", multihost.cpu_device_env(DEVICES_PER_PROCESS)["XLA_FLAGS"])
    cfg = _experiment(
        tmp_path,
        launcher="ray",
        num_learner_hosts=2,
        num_learner_devices=0,
        total_env_steps=3_000,
        learner_cpus=0.5,
        replay_cpus=0.5,
        cpus_per_actor=0.5,
        eval_interval_s=0.0,
        checkpoint_interval_steps=0,
        max_restarts=0,  # any fault fails the run instead of hiding behind a restart
    )
    summary = experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg, **ray_options)

    assert summary["stop_reason"] == "total_env_steps reached"
    assert summary["restarts"] == []
    assert summary["env_steps"] >= 3_000 and summary["learner_steps"] > 0
    # The job's updates are counted once (by the chief), and they are its parameter version.
    assert summary["params_version"] == summary["learner_steps"]
    assert summary["final_eval_episodes"] > 0  # the chief's parameters act
    rows = _csv_rows(tmp_path)
    for column in ("env_steps", "learner_steps"):
        values = [row[column] for row in rows]
        assert values == sorted(values) and values[-1] > values[0], f"{column} did not grow"

    with open(os.path.join(tmp_path, experiment.NODE_STATUS_FILE)) as f:
        nodes = json.load(f)
    chief, other = nodes["learner/0"]["counters"], nodes["learner/1"]["counters"]
    assert chief["learner_steps"] > 0
    assert other["process_learner_steps"] > 0  # process 1 ran global steps too ...
    assert "learner_steps" not in other  # ... without adding them to the job's count
    assert nodes["learner/0"]["pid"] != nodes["learner/1"]["pid"]
    assert not checkpoint.saved_steps(tmp_path)
