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
