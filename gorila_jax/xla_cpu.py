"""XLA:CPU's worker threads in this process.

XLA:CPU runs the independent operations of a program on a pool of worker threads, one per
core the process may use when JAX starts its CPU backend (read from the CPU affinity);
no JAX or XLA option sets the count. For one small program that has the process to
itself, an Anakin loop on a few cores, the work then moves back and forth between
workers and the run is slower than on one (docs/benchmarks.md, "Anakin"):
`limit_worker_threads(1)` starts the backend with a pool of one, and then gives every
thread of the process its cores back, so the host's own threads still use them.
"""

import os

import jax

from gorila_jax import compat

# The pool's thread name, as Linux shows it in /proc/self/task/*/comm.
_POOL_THREAD = "tf_XLAEigen"


def worker_threads() -> int | None:
    """XLA:CPU's worker threads now, or None before JAX starts its backends, where the
    threads' names cannot be read (no /proc), or where jaxlib does not name them (0.4.34:
    every thread of the process is "python" there)."""
    if not compat.backends_started() or not os.path.isdir("/proc/self/task"):
        return None
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().strip() == _POOL_THREAD
        except OSError:
            pass  # the thread ended meanwhile
    return count or None


def limit_worker_threads(count: int) -> None:
    """Starts JAX's backends with `count` XLA:CPU worker threads (a no-op if they run so).

    Raises:
      ValueError: JAX's backends already run with another count (it is fixed when they
        start: set it before any JAX computation), `count` exceeds the cores this process
        may use, this platform cannot set a thread's CPU affinity, the run is not on
        XLA:CPU, or the pool cannot be counted (a jaxlib that does not name its threads)
        or did not follow (fewer than the CPU devices, or a jaxlib that sizes it otherwise).
    """
    setting = f"xla_cpu_threads={count}"
    running = worker_threads()
    if running == count:
        return
    if compat.backends_started():
        raise ValueError(
            f"{setting}: JAX's CPU backend already runs "
            f"{'an unknown number of' if running is None else running} XLA:CPU worker "
            "threads, fixed when it started; set it before any JAX computation in the "
            "process (launch/train.py does)"
        )
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        raise ValueError(f"{setting} needs Linux (a thread's CPU affinity, /proc)")
    allowed = os.sched_getaffinity(0)
    if count > len(allowed):
        raise ValueError(f"{setting}: this process may use {len(allowed)} cores")
    os.sched_setaffinity(0, sorted(allowed)[:count])
    try:
        jax.devices()
    finally:
        # Every thread the backend started inherited the narrow mask: all get it back.
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), allowed)
            except OSError:
                pass
    if jax.default_backend() != "cpu":
        raise ValueError(
            f"{setting} is for runs on XLA:CPU; this one runs on {jax.default_backend()}"
        )
    started = worker_threads()
    if started is None:
        raise ValueError(
            f"{setting}: this jaxlib ({jax.__version__}) does not name XLA:CPU's worker "
            "threads, so the count cannot be checked (the default set's JAX does)"
        )
    if started != count:
        devices = len(jax.devices("cpu"))
        why = (
            f": it keeps one per CPU device, and this process has {devices} (XLA_FLAGS)"
            if started == devices
            else ""
        )
        raise ValueError(f"{setting}: XLA:CPU started {started} worker threads instead{why}")
