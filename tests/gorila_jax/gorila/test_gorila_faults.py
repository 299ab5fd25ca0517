"""Gorila nodes under the supervisor: a killed gradient worker, shard and replay are replaced.

Real Ray processes killed with SIGKILL, as in test_fault_nodes.py.
"""

import os
import signal

import pytest

from agents import dqn
from gorila_jax import replay
from gorila_jax.learning import checkpoint
from tests import fakes
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment
from tests.gorila_jax.health.test_fault_nodes import (
    _RAY_SETTINGS,
    _START_UP_TIMEOUT_S,
    _node_status,
    _replay_restored_from,
    _run_with,
)


def _counter(logdir, node: str, name: str) -> int:
    return int(_node_status(logdir).get(node, {}).get("counters", {}).get(name, 0))


def _pid(logdir, node: str) -> int | None:
    return _node_status(logdir).get(node, {}).get("pid")


@pytest.mark.slow
def test_kill_9_of_a_gradient_worker_a_shard_and_the_replay_restarts_each_and_updates_go_on(
    tmp_path, ray_options
):
    settings = {
        **_RAY_SETTINGS,
        "num_actors": 1,
        "learner_mode": "gorila",
        "num_learners": 2,
        "num_ps_shards": 2,
        "ps_cpus": 0.25,
        "learner_cpus": 0.25,
        "checkpoint_interval_steps": 40,
    }
    cfg = _experiment(tmp_path, total_env_steps=10**9, **settings)
    worker, shard = "gradient_worker/1", "parameter_server/1"
    workers = ["gradient_worker/0", worker]

    def kill_worker_then_shard():
        assert fakes.wait_until(
            lambda: (
                _counter(tmp_path, worker, "applied") > 20
                and len(checkpoint.saved_steps(tmp_path)) > 0
            ),
            timeout_s=_START_UP_TIMEOUT_S,
        )
        worker_pid = _pid(tmp_path, worker)
        applied_at_kill = _counter(tmp_path, worker, "applied")
        os.kill(worker_pid, signal.SIGKILL)
        worker_back = fakes.wait_until(
            lambda: (
                _pid(tmp_path, worker) not in (None, worker_pid)
                and _counter(tmp_path, worker, "applied") > applied_at_kill + 10
            ),
            timeout_s=240,
        )
        shard_pid = _pid(tmp_path, shard)
        newest = checkpoint.saved_steps(tmp_path)[-1]
        shard_applied = _counter(tmp_path, shard, "shard_applied")
        os.kill(shard_pid, signal.SIGKILL)
        shard_back = fakes.wait_until(
            lambda: (
                _pid(tmp_path, shard) not in (None, shard_pid)
                and _counter(tmp_path, shard, "shard_applied") > 10
            ),
            timeout_s=240,
        )
        # Updates go on through both shards after the restart.
        steps_after = _counter(tmp_path, "gradient_worker/0", "applied")
        going_on = fakes.wait_until(
            lambda: _counter(tmp_path, "gradient_worker/0", "applied") > steps_after + 10,
            timeout_s=120,
        )
        replay_seen = kill_replay() if going_on else {}
        return {
            "applied_at_kill": applied_at_kill,
            "worker_back": worker_back,
            "shard_back": shard_back,
            "going_on": going_on,
            "newest_before_shard_kill": newest,
            "shard_applied_before_kill": shard_applied,
            **replay_seen,
        }

    def kill_replay():
        """kill -9 of the replay: it restores its newest checkpoint (saved by
        gradient_worker/0), and both workers and the actor go on through it
        without being restarted themselves."""
        replay_dir = checkpoint.replay_dir(tmp_path)
        newest = replay.newest_intact_checkpoint(replay_dir)
        sizes = replay.check_checkpoint(os.path.join(replay_dir, str(newest)))
        replay_pid = _pid(tmp_path, "replay/0")
        before = {node: _counter(tmp_path, node, "applied") for node in workers}
        env_steps = _counter(tmp_path, "actor/0", "env_steps")
        os.kill(replay_pid, signal.SIGKILL)
        replay_back = fakes.wait_until(
            lambda: (
                _node_status(tmp_path).get("replay/0", {}).get("restarts") == 1
                and all(_counter(tmp_path, n, "applied") > before[n] + 10 for n in workers)
                and _counter(tmp_path, "actor/0", "env_steps") > env_steps + 300
            ),
            timeout_s=240,
        )
        return {
            "replay_newest": newest,
            "replay_sizes": sizes,
            "replay_back": replay_back,
            "replay_restored": _replay_restored_from() if replay_back else None,
        }

    summary, seen = _run_with(dqn.DQNBuilder(CONFIG), cfg, ray_options, kill_worker_then_shard)
    assert seen["worker_back"], "no replacement gradient worker applied updates"
    assert seen["shard_back"], "no replacement shard applied updates"
    assert seen["going_on"], "updates stopped after the shard restart"
    assert seen["replay_back"], "workers or actor did not go on after the replay restart"
    # Nobody but the three killed nodes was restarted: the workers reconnected by themselves.
    assert [r["node"] for r in summary["restarts"]] == [worker, shard, "replay/0"]
    assert all("died" in r["reason"] for r in summary["restarts"])
    # The replacement worker continued its counters instead of starting at 0.
    assert _counter(tmp_path, worker, "applied") > seen["applied_at_kill"]
    # Checkpoints went on after the restarts, past the one the shard restored.
    assert checkpoint.saved_steps(tmp_path)[-1] > seen["newest_before_shard_kill"]
    # The replacement replay holds at least what its newest checkpoint held.
    restored = seen["replay_restored"]
    assert restored["step"] >= seen["replay_newest"] > 0
    for table, size in seen["replay_sizes"].items():
        assert restored["table_sizes"][table] >= size > 0
