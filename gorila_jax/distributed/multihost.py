"""Multi-host learners: joining a `jax.distributed` job and stepping over every host's devices.

One learner process runs per host. Each samples its own share of the global
batch, feeds it to its local devices, and runs one pmapped step that spans
the devices of all processes, so `parallel.pmean` averages gradients across
hosts. Only the chief (process 0) publishes parameters, writes checkpoints and
logs. On CPU the cross-process collectives run over gloo (TCP), which is how
this is tested on one machine.
"""

import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from gorila_jax import parallel

# XLA's flag for the number of fake CPU devices; read when the CPU backend starts.
_CPU_DEVICE_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where one learner process sits in a multi-host learner job.

    Attributes:
      coordinator_address: "host:port" of process 0's coordinator service;
        every process must be given the same one.
      num_processes: learner processes in the job (one per host).
      process_id: this process's index, 0 .. num_processes - 1; 0 is the chief.
    """

    coordinator_address: str
    num_processes: int
    process_id: int

    def __post_init__(self):
        if self.num_processes < 1:
            raise ValueError(f"num_learner_hosts must be at least 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"learner process_id={self.process_id} is outside 0..{self.num_processes - 1}"
            )
        host, _, port = self.coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"coordinator_address must be 'host:port', got {self.coordinator_address!r}"
            )

    @property
    def is_chief(self) -> bool:
        """Process 0 publishes parameters, checkpoints and reports to the monitor."""
        return self.process_id == 0


def free_coordinator_address(host: str) -> str:
    """ "host:port" with a TCP port that is free on this machine right now.

    Call it on the host of process 0 (the coordinator binds there), at launch,
    and hand the result to every process. Another program could take the port
    between this call and `initialize`; the window is short, and a clash fails
    loudly in `initialize` rather than joining a wrong job.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    return f"{host}:{port}"


def host_address() -> str:
    """This host's address as the other learner hosts reach it.

    Under Ray, the node's IP (what Ray itself uses between nodes); otherwise
    the address the host name resolves to.
    """
    if "ray" in sys.modules:  # never imported for this: the DeepMind set has no Ray
        from gorila_jax.distributed import placement

        address = placement.node_ip_address()
        if address:
            return address
    return socket.gethostbyname(socket.gethostname())


class Rendezvous:
    """A program node through which the chief tells the other learners where to join.

    The coordinator runs inside learner process 0, so its address (that
    host, a port free there) is only known once that process runs; the
    others ask this node for it. Under the Ray launcher each learner runs in
    a process of its own, possibly on another host.
    """

    def __init__(self):
        self._address: str | None = None
        self._set = threading.Event()

    def publish(self, coordinator_address: str) -> None:
        self._address = coordinator_address
        self._set.set()

    def coordinator_address(self, timeout_s: float) -> str | None:
        """The chief's coordinator address, or None if it did not publish within `timeout_s`."""
        self._set.wait(timeout_s)
        return self._address


def join(
    rendezvous: Any, num_processes: int, process_id: int, timeout_s: float = 300.0
) -> ProcessGroup:
    """Joins this learner process to the job; the chief picks the coordinator address.

    Process 0 takes a free port on its host and publishes the address on
    `rendezvous` (a `Rendezvous` client); the others wait for it. Then all
    call `initialize`. Call it before anything in the process uses a jax device.

    Raises:
      ValueError: if there is no rendezvous to meet at.
      TimeoutError: if the chief did not publish within `timeout_s`.
    """
    if rendezvous is None:
        raise ValueError(f"num_learner_hosts={num_processes} needs a learner rendezvous node")
    if process_id == 0:
        address = free_coordinator_address(host_address())
        rendezvous.publish(address)
    else:
        deadline = time.monotonic() + timeout_s
        address = None
        while address is None and time.monotonic() < deadline:
            # Short waits: a call must not outlast the client's own limits.
            address = rendezvous.coordinator_address(min(10.0, timeout_s))
        if address is None:
            raise TimeoutError(
                f"learner process {process_id}: learner process 0 did not publish its "
                f"coordinator address within {timeout_s:g}s"
            )
    group = ProcessGroup(address, num_processes, process_id)
    logging.info("learner process %d of %d joins %s", process_id, num_processes, address)
    initialize(group, timeout_s=int(timeout_s))
    return group


def cpu_device_env(num_devices: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process that should see `num_devices` CPU devices.

    XLA reads the device count once, when the CPU backend starts, so it must
    be in the child's environment before the child touches jax. Any count
    already in XLA_FLAGS (the test suite sets 4) is replaced, other XLA flags kept.

    Args:
      num_devices: CPU devices the child gets.
      environ: the environment to start from; `os.environ` by default (read, never written).
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    env = dict(os.environ if environ is None else environ)
    kept = re.sub(rf"{_CPU_DEVICE_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(kept + [f"{_CPU_DEVICE_FLAG}={num_devices}"])
    return env


def initialize(
    group: ProcessGroup, local_device_ids: list[int] | None = None, timeout_s: int = 300
) -> None:
    """Joins this process to the job; call once, before any other jax call of the process.

    Sets CPU collectives to gloo first: without it a pmap over several
    processes' CPU devices has no way to exchange data. GPU and TPU backends
    use their own collectives (NCCL, ICI) and ignore the setting.

    Args:
      group: the job's layout; every process passes the same coordinator and count.
      local_device_ids: accelerators this process may use (None: all it sees).
      timeout_s: how long to wait for all processes to join before failing.

    Raises:
      RuntimeError: if jax already ran a computation in this process.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=group.coordinator_address,
            num_processes=group.num_processes,
            process_id=group.process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=timeout_s,
        )
    except RuntimeError as error:
        raise RuntimeError(
            f"learner process {group.process_id} of {group.num_processes} could not join "
            f"the jax.distributed job at {group.coordinator_address}: {error}. "
            "initialize must run before any jax computation in the process."
        ) from error


def shutdown() -> None:
    """Leaves the job; process 0 also stops the coordinator the others talk to."""
    jax.distributed.shutdown()


def is_chief() -> bool:
    """True in process 0 (and in a single-process run)."""
    return jax.process_index() == 0


def global_devices() -> list[jax.Device]:
    """Every process's devices, process 0's first: each process owns a contiguous block.

    This is the order in which the pmapped step assigns per-device batch
    shards, so process p's local batch is rows [p * B/P, (p + 1) * B/P) of
    the global batch, as `process_rows` cuts it.
    """
    return sorted(jax.devices(), key=lambda device: (device.process_index, device.id))


def local_batch_size(global_batch_size: int, num_processes: int, local_device_count: int) -> int:
    """The rows one process samples from replay for a global batch.

    Raises:
      ValueError: if the global batch does not split evenly over every device.
    """
    num_devices = num_processes * local_device_count
    if global_batch_size % num_devices:
        raise ValueError(
            f"batch_size={global_batch_size} must be divisible by the {num_devices} learner "
            f"devices ({num_processes} learner hosts x {local_device_count} devices)"
        )
    return global_batch_size // num_processes


def process_rows(global_batch: Any, process_id: int, num_processes: int) -> Any:
    """Process `process_id`'s rows of a [B, ...] global batch: the block it would sample."""

    def rows(x):
        x = np.asarray(x)
        share = x.shape[0] // num_processes
        return x[process_id * share : (process_id + 1) * share]

    return jax.tree.map(rows, global_batch)


def make_global_step(step_fn: Callable, out_axes: tuple) -> Callable:
    """Compiles `step_fn(state, batch) -> outputs` over all global devices, with a stop vote.

    The returned `step(state, batch, stop_vote)` takes, per process, state
    replicated on its local devices, its local batch [L, B/(P*L), ...] and
    `stop_votes(stopping)`. It returns `step_fn`'s outputs plus `stop`, True
    in every process when any process voted to stop. A step with a stop vote
    changes nothing: the state comes back as it went in (its other outputs,
    priorities and published parameters, belong to the discarded update and
    must be dropped), so a stopping process may feed any batch (its previous
    one) just to take part, and all processes end after the same number of
    updates. Without this agreement a process
    that leaves the loop one step early leaves the others waiting forever in
    that step's collectives.

    Args:
      step_fn: per-device step; its first output is the new state.
      out_axes: `step_fn`'s output axes, as for `parallel.pmap_step`.
    """

    def voted_step(state, batch, stop_vote):
        outputs = step_fn(state, batch)
        stop = parallel.pmax(stop_vote.astype(jnp.int32)) > 0
        # Keep the state that went in when anyone stops (the buffers are donated,
        # so the old state exists only inside this computation).
        kept = jax.tree.map(lambda new, old: jnp.where(stop, old, new), outputs[0], state)
        return (kept,) + tuple(outputs[1:]) + (stop,)

    return parallel.pmap_step(voted_step, global_devices(), out_axes=tuple(out_axes) + (None,))


def stop_votes(stopping: bool) -> np.ndarray:
    """This process's vote for `make_global_step`: one [L] bool per local device."""
    return np.full(jax.local_device_count(), stopping, dtype=bool)


def broadcast_from_chief(tree: Any) -> Any:
    """Every process gets process 0's `tree` (numpy leaves).

    For state that only the chief has: a checkpoint restored from its local
    disk, or parameters initialised from a seed it alone was given.
    """
    return multihost_utils.broadcast_one_to_all(tree, is_source=is_chief())
