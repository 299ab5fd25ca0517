"""The multi-host learner in a real run: DQN on CartPole under the Ray launcher with
--num_learner_hosts=2, each learner process a jax.distributed process with 2 CPU devices.

It proves the wiring (not learning): both processes join one job and step, actors
and the learner make progress, only the chief (learner/0) counts updates, publishes
parameters and checkpoints, and a process killed with SIGKILL brings the whole
learner group back (a fresh jax.distributed job) from the chief's newest checkpoint.
The run's replay has two shards, so it is also the sharded replay's run under Ray.
"""

import os
import signal

import pytest

from agents import dqn
from gorila_jax import envs
from gorila_jax.distributed import multihost
from gorila_jax.health import supervisor as supervisor_lib
from gorila_jax.learning import checkpoint, sync_learner
from gorila_jax.run import experiment
from tests import fakes
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _csv_rows, _experiment
from tests.gorila_jax.health.test_fault_nodes import (
    _Clock,
    _FakeMonitor,
    _FakeRunning,
    _learner_steps,
    _node_status,
    _run_with,
)
from tests.gorila_jax.replay.test_sharded_replay import saved_shard_use

DEVICES_PER_PROCESS = 2


def test_multi_host_settings_are_refused_by_name_where_they_cannot_work(tmp_path):
    placed_by_ray = "num_learner_hosts=2 is one sync learner .* launcher=ray places"
    with pytest.raises(ValueError, match=f"{placed_by_ray}; it does not take launcher=local$"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="local").validate()
    with pytest.raises(ValueError, match=f"{placed_by_ray}; it does not take learner_mode=gorila$"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="ray", learner_mode="gorila").validate()
    with pytest.raises(ValueError, match="it does not take demos$"):
        _experiment(tmp_path, num_learner_hosts=2, launcher="ray", demos=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="num_learner_hosts must be positive"):
        _experiment(tmp_path, num_learner_hosts=0).validate()
    # With checkpoints: the chief saves them alone (no orbax sync across the job).
    _experiment(tmp_path, num_learner_hosts=2, launcher="ray", num_learner_devices=0).validate()


GROUP = ("learner_rendezvous/0", "learner/0", "learner/1")


def _two_host_program(logdir):
    cfg = _experiment(
        logdir, launcher="ray", num_learner_hosts=2, num_learner_devices=0, eval_interval_s=0.0
    )
    return experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, envs.env_spec(cfg.env_id))


def test_a_two_host_learner_program_has_one_chief_and_restarts_as_one_group(tmp_path):
    graph = _two_host_program(tmp_path)
    learners = graph.groups["learner"]
    assert [spec.kwargs["learner_process_id"] for spec in learners] == [0, 1]
    rendezvous = {spec.kwargs["rendezvous"].name for spec in learners}
    assert rendezvous == {"learner_rendezvous/0"}
    # Actors read parameters from the chief only.
    assert all(
        "learner/0" in spec.dependencies() and "learner/1" not in spec.dependencies()
        for spec in graph.groups["actor"]
    )
    # A fault of any learner process (or the rendezvous) replaces all three, the
    # rendezvous first, so the new chief publishes a fresh coordinator address there.
    assert all(graph.node(name).restart_group == GROUP for name in GROUP)
    assert graph.node("actor/0").restart_group == ()


def test_one_dead_learner_process_restarts_the_group_once_from_the_newest_checkpoint(tmp_path):
    graph = _two_host_program(tmp_path)
    running, clock = _FakeRunning(graph), _Clock()
    hub = _FakeMonitor(clock)
    supervisor = supervisor_lib.Supervisor(running, hub, 3.0, 0.0, max_restarts=1, clock=clock)
    hub.beat("learner/0", learner_steps=120)
    hub.beat("learner/1", process_learner_steps=120)
    assert supervisor.check() == []
    # Process 1 died; the chief's run failed in the broken collective at the same time.
    running.failed.update({"learner/1": "ActorDiedError: killed", "learner/0": "gloo: closed"})
    lines = supervisor.check()
    assert [name for name, _ in running.restarted] == list(GROUP)  # each once, in order
    assert "learner/0" in lines[0] and "died" in lines[0]  # the first faulty one is the reason
    kwargs = dict(running.restarted)
    start = kwargs["learner/0"]["start"]
    assert start.restore_step == sync_learner.NEWEST
    assert start.restored_counters == {"learner_steps": 120}  # the step count goes on from here
    assert start.checkpoint_dir == graph.node("learner/0").kwargs["start"].checkpoint_dir
    assert kwargs["learner_rendezvous/0"] == {}
    # max_restarts=1: the next fault of any member fails the run, replacing nobody.
    running.built.update(GROUP)
    running.failed["learner/1"] = "ActorDiedError: killed again"
    with pytest.raises(supervisor_lib.RunFailed, match="learner/1 died.*max_restarts=1"):
        supervisor.check()
    assert len(running.restarted) == len(GROUP)


def test_a_group_restart_continues_from_the_counts_reported_before_the_kill(tmp_path):
    # The dead process takes the group down, but the chief steps (and reports)
    # on until it is killed: its successor must continue from that later count,
    # or the job's step count goes backwards (seen in CI: 71 -> 70).
    graph = _two_host_program(tmp_path)
    running, clock = _FakeRunning(graph), _Clock()
    hub = _FakeMonitor(clock)
    supervisor = supervisor_lib.Supervisor(running, hub, 3.0, 0.0, max_restarts=1, clock=clock)
    hub.beat("learner/0", learner_steps=70)
    hub.beat("learner/1", process_learner_steps=70)
    assert supervisor.check() == []
    running.failed["learner/1"] = "ActorDiedError: killed"

    def final_report(name: str) -> None:
        if name == "learner/0":
            hub.beat("learner/0", learner_steps=71)  # its heartbeat as it is stopped

    running.on_kill = final_report
    supervisor.check()
    assert running.killed == list(GROUP)
    assert dict(running.restarted)["learner/0"]["start"].restored_counters == {"learner_steps": 71}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_learner_processes_step_together_and_a_killed_one_restarts_the_group(
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
        total_env_steps=10**9,  # stopped by the scenario (SIGTERM), as a scheduler would
        num_actors=2,
        num_replay_shards=2,  # each learner process samples both shards
        learner_cpus=0.5,
        replay_cpus=0.25,
        cpus_per_actor=0.25,
        eval_interval_s=0.0,
        checkpoint_interval_steps=40,
        heartbeat_interval_s=0.5,
        max_restarts=1,
    )

    def kill_learner_process_1():
        assert fakes.wait_until(
            lambda: _learner_steps(tmp_path) > 60 and checkpoint.saved_steps(tmp_path),
            timeout_s=400,
        )
        before = _node_status(tmp_path)
        newest = checkpoint.saved_steps(tmp_path)[-1]
        killed_at = int(before["learner/0"]["counters"]["learner_steps"])
        os.kill(before["learner/1"]["pid"], signal.SIGKILL)
        old_pids = {before[name]["pid"] for name in ("learner/0", "learner/1")}

        def group_replaced_and_stepping() -> bool:
            now = _node_status(tmp_path)
            pids = {now.get(name, {}).get("pid") for name in ("learner/0", "learner/1")}
            return not pids & (old_pids | {None}) and _learner_steps(tmp_path) > killed_at + 20

        replaced = fakes.wait_until(group_replaced_and_stepping, timeout_s=400)
        return {"killed_at": killed_at, "newest": newest, "replaced": replaced, "before": before}

    summary, seen = _run_with(dqn.DQNBuilder(CONFIG), cfg, ray_options, kill_learner_process_1)
    assert seen["replaced"], "the learner group was not replaced, or did not step, in time"
    before = seen["before"]
    # Before the kill: both processes stepped, the job's updates counted once (by the chief).
    assert before["learner/0"]["counters"]["learner_steps"] > 0
    assert before["learner/1"]["counters"]["process_learner_steps"] > 0
    assert "learner_steps" not in before["learner/1"]["counters"]
    assert before["learner/0"]["pid"] != before["learner/1"]["pid"]
    # One group restart: the rendezvous and both processes, learner/1 named as the cause.
    assert sorted(r["node"] for r in summary["restarts"]) == sorted(GROUP)
    assert any(r["node"] == "learner/1" and "died" in r["reason"] for r in summary["restarts"])
    # Both new processes started from the chief's checkpoint (process 1 by broadcast) ...
    nodes = _node_status(tmp_path)
    for name in ("learner/0", "learner/1"):
        assert nodes[name]["counters"]["started_from_step"] >= seen["newest"] > 0
    # ... and the job's step count went on from where it was, never backwards.
    assert summary["learner_steps"] > seen["killed_at"] + 20
    assert summary["params_version"] == summary["learner_steps"]
    rows = _csv_rows(tmp_path)
    for column in ("env_steps", "learner_steps"):
        values = [row[column] for row in rows]
        assert values == sorted(values) and values[-1] > values[0], f"{column} went backwards"
    # The chief alone went on checkpointing after the restart, final save included.
    final = checkpoint.saved_steps(tmp_path)[-1]
    assert final == summary["params_version"] > seen["killed_at"]
    # Sharded replay under Ray: both shards filled and sampled, priorities reached both.
    for use in saved_shard_use(tmp_path, final, dqn.builder.TABLE, CONFIG.initial_priority):
        assert min(use["inserts"], use["samples"], use["updated_priorities"]) > 0, use
