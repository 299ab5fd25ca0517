"""The same program object under real dm-launchpad (`local_mt`, `local_mp`) and `local`.

The DeepMind set only (Python 3.10): `DEEPMIND=1 bash tests/run.sh` runs these;
under the default set the module is skipped.
"""

import json
import os
import subprocess
import sys
import threading

import psutil
import pytest

pytest.importorskip("launchpad", reason="the DeepMind set only: DEEPMIND=1 bash tests/run.sh")

from gorila_jax.distributed import launchers, program  # noqa: E402
from gorila_jax.distributed.launchers import launchpad_nodes  # noqa: E402
from tests import REPO
from tests import fakes  # noqa: E402

LAUNCH_TYPES = ["local_mt", "local_mp"]


def _launch(graph, launch_type, tmp_path):
    return launchers.launch(
        graph, "launchpad", launch_type=launch_type, log_dir=str(tmp_path / "launchpad")
    )


@pytest.mark.parametrize("launch_type", LAUNCH_TYPES)
def test_the_same_program_gives_the_same_results_as_under_local(launch_type, tmp_path):
    with launchers.launch(fakes.make_counting_program(2, limit=50), "local") as running:
        assert running.wait(timeout=120)
        expected = running.client("counter").sources()
    graph = fakes.make_counting_program(num_producers=2, limit=50)
    with _launch(graph, launch_type, tmp_path) as running:
        assert running.wait(timeout=120), "producers did not finish"
        # Handles resolved to working clients: both producers reached the counter.
        assert (
            running.client("counter").sources()
            == expected
            == {
                "producer/0": 50,
                "producer/1": 50,
            }
        )
        pids = running.process_ids()
        # Each node its own process under local_mp; all in this one under local_mt.
        want = 3 if launch_type == "local_mp" else 1
        assert len(set(pids.values())) == want
        assert sorted(pids) == ["counter/0", "producer/0", "producer/1"]
    if launch_type == "local_mp":  # Launchpad's groups keep the program's names
        assert sorted(os.listdir(tmp_path / "launchpad")) == ["counter", "producer"]


@pytest.mark.parametrize("launch_type", LAUNCH_TYPES)
def test_futures_return_without_blocking_the_caller(launch_type, tmp_path):
    with _launch(fakes.make_counting_program(num_producers=0), launch_type, tmp_path) as running:
        counter = running.client("counter")
        futures = [counter.futures.add("driver", 1) for _ in range(10)]
        assert sorted(f.result(timeout=60) for f in futures) == list(range(1, 11))


@pytest.mark.parametrize("launch_type", LAUNCH_TYPES)
def test_a_failing_node_is_reported_by_name_and_a_node_error_keeps_its_type(launch_type, tmp_path):
    graph = program.Program("failing")
    with graph.group("bad", program.Resources(num_cpus=0)):
        graph.add_node(fakes.Failing)
    with graph.group("counter", program.Resources(num_cpus=0)):
        graph.add_node(fakes.Counter)
    with _launch(graph, launch_type, tmp_path) as running:
        with pytest.raises(program.NodeError, match="(?s)bad/0.*boom from the failing node"):
            running.wait(timeout=120)
        # A node's exception reaches the caller as itself, not as courier's error.
        with pytest.raises(TypeError):
            running.client("counter").add("driver")


def test_local_mp_stop_leaves_no_processes(tmp_path):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    running = _launch(fakes.make_counting_program(num_producers=2), "local_mp", tmp_path)
    try:
        counter = running.client("counter")
        assert fakes.wait_until(lambda: counter.total() > 10, timeout_s=120)
        # One producer can count past 10 while the other is still being built (CI, loaded).
        assert fakes.wait_until(lambda: len(running.process_ids()) == 3, timeout_s=120)
        node_pids = set(running.process_ids().values())
        assert len(node_pids) == 3 and os.getpid() not in node_pids
    finally:
        running.stop()
    alive = {p.pid for p in me.children(recursive=True) if p.is_running()} - before
    assert not alive and not any(psutil.pid_exists(pid) for pid in node_pids)


def test_local_mt_stop_ends_every_node_thread(tmp_path):
    running = _launch(fakes.make_counting_program(num_producers=2), "local_mt", tmp_path)
    counter = running.client("counter")
    assert fakes.wait_until(lambda: counter.total() > 10, timeout_s=120)
    running.stop()
    # The nodes' `run` threads and Launchpad's thread of each node (named by group).
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("counter", "producer"))]


def test_a_node_stopped_before_it_was_built_starts_no_run_thread():
    # The stop that CI once raced: it reached producer/0's host while the node was still
    # being built, and the run thread started afterwards outlived `stop`.
    host = launchpad_nodes.NodeHost("producer/0")
    host.stop()
    host.construct(fakes.Producer, ("producer/0", None), {})
    host.start_node_run()
    assert host._get().stopping
    assert host.wait_run(0.0) and not fakes.threads_named("producer/0")


def test_what_launchpad_cannot_do_fails_at_once_with_what_to_use(tmp_path):
    with pytest.raises(ValueError, match="unknown launchpad launch type 'local_xm'"):
        launchers.launch(fakes.make_counting_program(0), "launchpad", launch_type="local_xm")
    with _launch(fakes.make_counting_program(num_producers=0), "local_mt", tmp_path) as running:
        with pytest.raises(NotImplementedError, match="cannot restart nodes.*ray launcher can"):
            running.restart("counter/0")
        with pytest.raises(NotImplementedError, match="cannot add nodes"):
            running.add_node("counter", fakes.Counter)


@pytest.mark.slow
def test_dqn_solves_cartpole_under_launchpad_local_mp(tmp_path):
    """The default DQN command under `--launcher=launchpad` (local_mp), its whole budget."""
    logdir = tmp_path / "run"
    command = [sys.executable, "-m", "launch.train", "--launcher=launchpad", "--seed=0"]
    result = subprocess.run(
        [*command, f"--logdir={logdir}", "--log_interval_s=10"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    third_party_log = logdir / "third_party.log"
    assert result.returncode == 0, result.stderr[-3000:] + (
        third_party_log.read_text()[-3000:] if third_party_log.exists() else ""
    )
    assert "launchpad launcher: a node that fails ends the run" in result.stdout
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "total_env_steps reached"
    assert summary["final_eval_return"] >= 475.0, summary["final_eval_return"]
    # What the driver writes under every launcher.
    rows = (logdir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("wall_time_s,env_steps") and len(rows) > 5
    assert list(logdir.glob("events.out.tfevents.*")), "no TensorBoard events"
    # One Launchpad process per node, each with its log file, all gone now.
    groups = sorted(os.listdir(logdir / "launchpad"))
    assert groups == ["actor", "evaluator", "learner", "monitor", "replay"]
    nodes = json.loads((logdir / "nodes.json").read_text())
    pids = {node["pid"] for node in nodes.values()}
    assert len(pids) == len(nodes) == 6 and os.getpid() not in pids  # a process each
    assert not any(psutil.pid_exists(pid) for pid in pids)
