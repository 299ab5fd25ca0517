"""Test setup: 4 CPU devices for pmap tests, before anything imports jax; a check that
each test module ends every thread and child process it started."""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=4"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    # Append rather than assign: the user may have XLA_FLAGS of their own.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAKE_DEVICES}".strip()

# No persistent XLA compilation cache (it was one for the whole suite, .cache/xla, from
# issue 35 on): a pmapped step with cross-device all-reduces on the 4 forced CPU devices,
# loaded from it, aborted in XLA's CPU rendezvous ("only 2 of 4 threads arrived", then
# SIGABRT after 40 s) where the same step compiled afresh ran; DQfD's margin-loss test
# did so on every cached load (docs/testing.md). An xdist worker that aborts reads as
# "node down: Not properly terminated". The cache saved about a fifth of the learning
# tests' time.

import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

# A non-interactive shell starts its background jobs (`cmd &`) with SIGINT ignored,
# and every child inherits that. The tests that press Ctrl-C on a sweep or a
# benchmark's run stand for a person at a terminal, whose runs never ignore it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Options for the Ray launcher in tests: 2 logical CPUs as on the CI machine,
# a small object store so the cluster starts fast.
RAY_TEST_OPTIONS = {"num_cpus": 2, "object_store_memory": 200 * 1024 * 1024}

# How long a module's threads and child processes may take to end after its
# last test: Ray's workers exit a few seconds after `ray.shutdown` on a loaded machine.
LEAK_GRACE_S = 10.0

# Threads that a module is known to leave running, by module and thread name prefix:
# each a bug of the production code, to be removed with its fix. (No library here
# keeps a Python thread of its own past its use: none needs a place in this list.)
KNOWN_LEFTOVER_THREADS = {
    # test_a_shard_restarted_at_another_address_is_sampled_again: the shard's puller,
    # abandoned on the server the test stopped, stays blocked in Reverb for good
    # (gorila_jax/replay/sharded.py, `_ShardStream.close`).
    "tests.gorila_jax.replay.test_sharded_replay": ("replay-shard-",),
}


# Tests that run one after another in a pytest process of their own, after the others
# (tests/run.sh): their bounds on wall time (a stall timeout, waits for a restarted
# node) and Gorila's asynchronous learning were measured with one such run on the
# machine at a time, and the teardown test keeps a core busy on purpose. They are also
# the Ray-heavy ones in whose xdist worker the channel to the controller was lost three
# times (docs/testing.md): without xdist there is no channel. They get the
# `one_at_a_time` mark here, by name (one list, not a mark on each).
ONE_AT_A_TIME = frozenset(
    {
        "test_gorila_dqn_learns_cartpole_with_two_workers_and_two_shards",
        "test_gorila_dqn_solves_cartpole_with_two_workers_and_two_shards",
        "test_kill_9_of_a_gradient_worker_a_shard_and_the_replay_restarts_each_and_updates_go_on",
        "test_a_hung_actor_is_replaced_as_stalled_and_a_killed_one_as_dead",
        "test_kill_9_of_the_learner_restarts_it_from_its_newest_checkpoint",
        "test_kill_9_of_the_replay_restores_its_checkpoint_and_nodes_reconnect",
        "test_two_learner_processes_step_together_and_a_killed_one_restarts_the_group",
        "test_ppo_learns_under_the_ray_launcher_with_two_actors",
        "test_runs_tear_down_and_exit_cleanly_while_another_process_keeps_the_cpu_busy",
    }
)


def _test_name(nodeid: str) -> str:
    return nodeid.rpartition("::")[2].partition("[")[0]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config, items):
    """Marks the `ONE_AT_A_TIME` tests; under xdist, the files with slow tests go first,
    then the rest: the short files at the end fill the workers evenly.

    xdist gives each file whole to one worker (`--dist loadfile`), so a module's
    fixtures run once and the leak check sees the whole module. A serial run keeps
    the file order.
    """
    for item in items:
        if _test_name(item.nodeid) in ONE_AT_A_TIME:
            item.add_marker(pytest.mark.one_at_a_time)
    if not hasattr(config, "workerinput"):
        return
    has_slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in has_slow)  # stable: a file's own order stays


@pytest.fixture
def one_cpu_device_env():
    """The environment for a child process with one CPU device, as a user's machine has:
    this file's XLA_FLAGS without the 4 forced host devices (XLA:CPU keeps a worker per
    CPU device, so `--xla_cpu_threads=1` needs one)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f != _FAKE_DEVICES]
    return {**os.environ, "XLA_FLAGS": " ".join(flags)}


@pytest.fixture
def ray_options():
    """Launcher options for a private Ray cluster; asserts it is gone afterwards."""
    import ray

    yield dict(RAY_TEST_OPTIONS)
    if ray.is_initialized():  # a test that failed before stop(): do not leak the cluster
        ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def no_thread_or_child_process_outlives_its_module(request):
    """Fails the module (an error at its last test's teardown) if a thread or a child
    process it started is still running `LEAK_GRACE_S` after its last test.

    Leftover children are killed, so that one leaking module does not slow or
    break the modules after it.
    """
    known = KNOWN_LEFTOVER_THREADS.get(request.module.__name__, ())
    threads_before = set(threading.enumerate())
    children_before = set(_children())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        threads = [
            thread
            for thread in threading.enumerate()
            if thread not in threads_before
            and thread.is_alive()
            and not thread.name.startswith(known)
            # A native thread that once ran a Python callback (courier's gRPC threads
            # settling a future): Python records it for good and cannot see it end.
            # Not a thread the module started.
            and not isinstance(thread, threading._DummyThread)  # noqa: SLF001
        ]
        children = [child for child in _children() if child not in children_before]
        if not (threads or children) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not (threads or children):
        return
    names = [_describe(child) for child in children]
    for child in children:
        _kill(child)
    pytest.fail(
        f"{request.module.__name__} left running: "
        f"threads {sorted(thread.name for thread in threads)}, child processes {names}",
        pytrace=False,
    )


def _children() -> list[psutil.Process]:
    """This process's running descendants (a zombie has ended: only its exit status is left)."""
    running = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                running.append(child)
        except psutil.NoSuchProcess:
            pass
    return running


def _describe(child: psutil.Process) -> str:
    try:
        return f"{child.pid} {' '.join(child.cmdline())[:200]}"
    except psutil.Error:
        return f"{child.pid} (ended)"


def _kill(child: psutil.Process) -> None:
    try:
        child.kill()
        child.wait(timeout=5)
    except psutil.Error:
        pass
