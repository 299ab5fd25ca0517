"""Test setup: 4 CPU devices for pmap tests, before anything imports jax; a check that
each test module ends every thread and child process it started."""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=4"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    # Append rather than assign: the user may have XLA_FLAGS of their own.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAKE_DEVICES}".strip()

import threading  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

# Options for the Ray launcher in tests: 2 logical CPUs as on the CI machine,
# a small object store so the cluster starts fast.
RAY_TEST_OPTIONS = {"num_cpus": 2, "object_store_memory": 200 * 1024 * 1024}

# How long a module's threads and child processes may take to end after its
# last test: Ray's workers exit a few seconds after `ray.shutdown` on a loaded machine.
LEAK_GRACE_S = 10.0

# Python threads that a library starts once, on first use, and keeps for the
# life of the process: whichever module uses the library first is not leaking them.
PROCESS_LIFETIME_THREADS = ()


# The slow tests that took longest in the last CI runs (README, "Tests"), longest first.
LONGEST_SLOW_TESTS = (
    "test_gorila_dqn_solves_cartpole_with_two_workers_and_two_shards",
    "test_runs_tear_down_and_exit_cleanly_while_another_process_keeps_the_cpu_busy",
    "test_kill_9_of_a_gradient_worker_a_shard_and_the_replay_restarts_each_and_updates_go_on",
    "test_two_learner_processes_step_together_and_a_killed_one_restarts_the_group",
    "test_a_hung_actor_is_replaced_as_stalled_and_a_killed_one_as_dead",
)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected what will not run
def pytest_collection_modifyitems(config, items):
    """Under xdist (`-n`, `--dist loadfile --no-loadscope-reorder`), the files with the
    longest tests go to the workers first, then those with other slow tests, then the rest.

    xdist hands out files in this order, each file whole to one worker (its
    module-scoped fixtures run once, and the leak check sees the whole module):
    the short files at the end fill the workers evenly, where a long test that
    started last would keep one worker busy after the others end. A serial run
    keeps the file order.
    """
    if not hasattr(config, "workerinput"):
        return

    def rank(item) -> int:
        if not item.get_closest_marker("slow"):
            return len(LONGEST_SLOW_TESTS) + 1
        name = getattr(item, "originalname", item.name)
        return (
            LONGEST_SLOW_TESTS.index(name)
            if name in LONGEST_SLOW_TESTS
            else len(LONGEST_SLOW_TESTS)
        )

    file_rank: dict = {}
    for item in items:
        file_rank[item.path] = min(file_rank.get(item.path, rank(item)), rank(item))
    items.sort(key=lambda item: file_rank[item.path])  # stable: a file's own order stays


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
            and not thread.name.startswith(PROCESS_LIFETIME_THREADS)
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
