"""The same program object under the `local` and `ray` launchers."""

import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref

import psutil
import pytest
import ray.exceptions

from gorila_jax.distributed import launchers, program
from gorila_jax.distributed.launchers import ray_nodes
from tests import fakes


def _options(launcher: str, ray_options: dict) -> dict:
    return ray_options if launcher == "ray" else {}


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_same_program_runs_under_both_launchers(launcher, ray_options):
    graph = fakes.make_counting_program(num_producers=2, limit=50)
    with launchers.launch(graph, launcher, **_options(launcher, ray_options)) as running:
        assert running.wait(timeout=120), "producers did not finish"
        counter = running.client("counter")
        # Handles resolved to working clients: both producers reached the counter.
        assert counter.sources() == {"producer/0": 50, "producer/1": 50}
        assert counter.total() == 100


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_futures_return_without_blocking_the_caller(launcher, ray_options):
    graph = fakes.make_counting_program(num_producers=0)
    with launchers.launch(graph, launcher, **_options(launcher, ray_options)) as running:
        counter = running.client("counter")
        futures = [counter.futures.add("driver", 1) for _ in range(10)]
        assert sorted(f.result(timeout=60) for f in futures) == list(range(1, 11))


def test_a_client_used_for_futures_is_freed_where_its_last_reference_goes():
    # Left to the cyclic garbage collector, a client is freed on whatever thread that
    # runs: a courier client freed on its own callback thread aborted a Launchpad run.
    graph = fakes.make_counting_program(num_producers=0)
    with launchers.launch(graph, "local") as running:
        gc.disable()
        try:
            client = program.Client("counter")  # the base class's `futures`
            client._submit = running.client("counter")._submit
            client.futures.add("driver", 1).result(timeout=60)
            freed = weakref.ref(client)
            del client
            assert freed() is None, "the client outlived its last reference"
        finally:
            gc.enable()


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_a_failing_node_is_reported_by_name(launcher, ray_options):
    graph = program.Program("failing")
    with graph.group("bad", program.Resources(num_cpus=0)):
        graph.add_node(fakes.Failing)
    with launchers.launch(graph, launcher, **_options(launcher, ray_options)) as running:
        with pytest.raises(program.NodeError, match="(?s)bad/0.*boom from the failing node"):
            running.wait(timeout=120)


def test_a_node_that_cannot_be_constructed_under_ray_is_reported_with_its_own_exception(
    ray_options,
):
    # Ray's own first line is `ray::NodeActor.construct() (pid=..., repr=...)`: the node's
    # exception, type and message, is what a person needs to see.
    graph = program.Program("failing")
    with graph.group("bad", program.Resources(num_cpus=0)):
        graph.add_node(fakes.FailingToConstruct)
    with launchers.launch(graph, "ray", **ray_options) as running:
        assert fakes.wait_until(lambda: running.failures(), timeout_s=120)
        assert running.failures() == {"bad/0": "RuntimeError: corrupted record at 0"}
        with pytest.raises(program.NodeError, match="bad/0.*RuntimeError: corrupted record at 0"):
            running.pids()


def test_local_stop_ends_every_node_thread():
    graph = fakes.make_counting_program(num_producers=2)  # producers run until stopped
    running = launchers.launch(graph, "local")
    counter = running.client("counter")
    assert fakes.wait_until(lambda: counter.total() > 10, timeout_s=60)
    running.stop()
    assert running.finished()
    total = counter.total()
    time.sleep(0.2)
    assert counter.total() == total, "a producer kept running after stop()"


def test_ray_stop_leaves_no_processes(ray_options):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    graph = fakes.make_counting_program(num_producers=2)
    running = launchers.launch(graph, "ray", **ray_options)
    node_pids = set(running.pids().values())
    assert len(node_pids) == 3, "each node should run in a process of its own"
    assert fakes.wait_until(lambda: running.client("counter").total() > 10, timeout_s=60)
    running.stop()

    def no_new_processes():
        alive = {p.pid for p in me.children(recursive=True) if p.is_running()}
        return not (alive - before) and not any(psutil.pid_exists(pid) for pid in node_pids)

    assert fakes.wait_until(no_new_processes, timeout_s=60), "Ray processes outlived stop()"


@pytest.mark.timeout(60)  # ray.init alone would retry for minutes
def test_unreachable_ray_address_fails_fast():
    graph = fakes.make_counting_program(num_producers=1)
    with pytest.raises(ConnectionError, match="cannot reach the Ray cluster"):
        launchers.launch(graph, "ray", address="127.0.0.1:1")


class _HandStartedHead:
    """A Ray head started by hand, as a user would (`ray start --head`), on loopback.

    `stop` ends this head's processes only. `ray stop --force` would end
    every Ray process on the machine, a user's training run among them.
    """

    def __init__(self, token: str | None = None):
        """`token`: the head's own, instead of the one in ~/.ray/auth_token."""
        import portpicker

        self.port = portpicker.pick_unused_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray's unix socket paths under it must fit in 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="rayhead", dir="/tmp")
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        subprocess.run(
            [
                ray_cli,
                "start",
                "--head",
                f"--port={self.port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={self.temp_dir}",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            env={**os.environ, "RAY_AUTH_TOKEN": token} if token else None,
        )

    def processes(self) -> list[psutil.Process]:
        # Every process of the head names its temp dir or its GCS address
        # (the client server only the latter).
        def ours(args: list[str]) -> bool:
            return any(self.temp_dir in arg or arg.endswith(f":{self.port}") for arg in args)

        return [p for p in psutil.process_iter(["cmdline"]) if ours(p.info["cmdline"] or [])]

    def stop(self) -> None:
        processes = self.processes()
        for process in processes:
            process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=15)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=15)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _token_auth(monkeypatch) -> None:
    """`ray start` enables token authentication and needs a token in ~/.ray/auth_token,
    made here if missing (as a private cluster's `ray.init` also does); a joining driver
    must say that it uses one.

    The token must be the one in the user's home: Ray loads it once per process and
    keeps it, so a test process that started a private cluster before (any Ray test on
    this xdist worker) would present that token to a head started with another one.
    """
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray_cli, "get-auth-token", "--generate"], check=True, capture_output=True)


@pytest.fixture
def existing_cluster(monkeypatch):
    _token_auth(monkeypatch)
    head = _HandStartedHead()
    yield head.address
    head.stop()


def test_stopping_a_hand_started_head_leaves_another_ray_cluster_running(monkeypatch):
    _token_auth(monkeypatch)
    first, other = _HandStartedHead(), _HandStartedHead()
    try:
        others = other.processes()
        assert first.processes() and others
        first.stop()
        assert not first.processes()
        assert all(process.is_running() for process in others)
    finally:
        first.stop()
        other.stop()


def test_ray_launcher_joins_an_existing_cluster_and_leaves_it_running(existing_cluster):
    import ray

    graph = fakes.make_counting_program(num_producers=2, limit=20)
    with launchers.launch(graph, "ray", address=existing_cluster) as running:
        assert running.wait(timeout=120)
        assert running.client("counter").total() == 40
    assert not ray.is_initialized()  # our connection is closed ...
    ray.init(address=existing_cluster)  # ... but the cluster itself still runs
    try:
        assert ray.cluster_resources().get("CPU") == 2
    finally:
        ray.shutdown()


@pytest.mark.timeout(180)
def test_joining_a_cluster_with_another_token_names_the_refused_token(monkeypatch):
    _token_auth(monkeypatch)
    head = _HandStartedHead(token="0" * 64)
    try:
        graph = fakes.make_counting_program(num_producers=1)
        with pytest.raises(ConnectionError, match="cannot join.*Authentication token"):
            launchers.launch(graph, "ray", address=head.address)
    finally:
        head.stop()


def test_a_node_exception_ray_could_not_unpickle_is_still_reported_by_its_own_line():
    # Ray keeps the formatted traceback of an exception it cannot unpickle; a CI run
    # once got one for the test above.
    try:
        raise RuntimeError("corrupted record at 0")
    except RuntimeError as error:
        formatted = "".join(traceback.format_exception(error))
    unpickled = ray.exceptions.UnserializableException(formatted)
    assert ray_nodes.first_line(unpickled) == "RuntimeError: corrupted record at 0"


def test_a_node_stopped_while_it_is_being_built_stops_once_built_and_never_runs():
    # A launcher's stop can reach a host before its node is built (CI, loaded: one
    # producer counting, the other still in its constructor). The node a Ray actor
    # hosts, driven in this process as Ray drives it: construct, run, stop.
    building = threading.Event()
    release = threading.Event()

    def slow_producer():
        building.set()
        release.wait(30)
        return fakes.Producer("producer/0", counter=None, limit=0)

    host = ray_nodes.NodeActor("producer/0")
    constructing = threading.Thread(target=host.construct, args=(slow_producer, (), {}))
    constructing.start()
    assert building.wait(30)
    host.stop()
    release.set()
    constructing.join(30)
    node = host._get()
    assert node.stopping
    host.run()  # returns at once: the counter is None, so a started loop would raise
    assert node.produced == 0
