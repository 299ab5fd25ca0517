"""What every launcher returns: a running program that can be waited on, changed and stopped."""

import abc
import os
import threading
import time
from typing import Any, Callable

from gorila_jax.distributed import program as program_lib

# Here, not in the package's __init__, so the Launchpad launcher can check it without
# importing the package that imports it.
LAUNCHPAD_LAUNCH_TYPES = ("local_mp", "local_mt")


def close_stages(specs: list[program_lib.NodeSpec]) -> list[list[program_lib.NodeSpec]]:
    """`specs` in the order to close them: each stage's nodes after every node that holds
    a handle of one of them (actors, then the learner, then replay and monitor).

    A node's threads and Reverb clients end before the servers they talk to
    stop; a sampling thread still in Reverb's native code when its server
    stops, or when the process exits, can abort the process (see
    `prefetch.DevicePrefetcher.close`). Within a stage, and for nodes whose
    handles form a cycle (closed together, last), nodes go in reverse
    program order.
    """
    remaining = list(reversed(specs))
    names = {spec.name for spec in specs}
    holds = {spec.name: spec.dependencies() & names for spec in specs}
    stages = []
    while remaining:
        held = set().union(*(holds[spec.name] for spec in remaining))
        stage = [spec for spec in remaining if spec.name not in held] or remaining
        stages.append(stage)
        remaining = [spec for spec in remaining if spec not in stage]
    return stages


class HostedNode:
    """One node inside a launcher's host process (a Ray actor, a Launchpad courier node):
    built once by `construct`, then called, stopped and closed through the host."""

    def __init__(self, name: str):
        self._name = name
        self._node: Any = None
        self._construct_error: str | None = None
        self._built = threading.Event()
        # The launcher may stop a program while a node is still being built (CI, loaded:
        # one producer counting, the other not built yet); the node then stops as soon
        # as it exists, and its `run` never starts (`stop_requested`).
        self._stop_lock = threading.Lock()
        self._stop_requested = False

    def construct(self, constructor: Callable[..., Any], args: tuple, kwargs: dict) -> int:
        """Builds the node; returns this process's id."""
        try:
            node = constructor(*args, **kwargs)
            with self._stop_lock:
                self._node = node
                if self._stop_requested and hasattr(node, "stop"):
                    node.stop()
        except BaseException as error:
            self._construct_error = repr(error)
            raise
        finally:
            self._built.set()
        return os.getpid()

    def _get(self) -> Any:
        self._built.wait()
        if self._construct_error is not None:
            raise program_lib.NodeError(self._name, f"construction failed: {self._construct_error}")
        return self._node

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def stop(self) -> None:
        with self._stop_lock:
            self._stop_requested = True
            node = self._node
        if node is not None and hasattr(node, "stop"):
            node.stop()

    def close(self) -> None:
        if self._built.is_set() and hasattr(self._node, "close"):
            self._node.close()


class RunningProgram(abc.ABC):
    """A launched program. Use as a context manager so that it always stops."""

    def __init__(self, program: program_lib.Program):
        self.program = program
        # Removed nodes keep their specs in the program, so a name (and the seed
        # offset an actor derives from its index) is never given out twice.
        self._removed: set[str] = set()

    def active_nodes(self, group: str | None = None) -> list[program_lib.NodeSpec]:
        """The nodes launched or added, and not removed (of `group` only, if given)."""
        specs = self.program.nodes if group is None else self.program.groups.get(group, [])
        return [spec for spec in specs if spec.name not in self._removed]

    def add_node(
        self,
        group: str,
        constructor: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
        restart_kwargs: Callable[[dict[str, float]], dict[str, Any]] | None = None,
    ) -> program_lib.Handle:
        """Adds a node to `group` of the running program and starts it; returns its handle.

        The node is named "group/N" with N the group's next unused index, gets
        the group's resources, and may receive handles of any node. With
        `restart_kwargs`, a supervisor may restart it like the launched nodes
        (see `NodeSpec.restartable`).

        Raises:
          ValueError: the program has no group `group` (its resources would be unknown).
          RuntimeError: the program was stopped.
          placement.UnplaceableError: (ray) the cluster has no room for the node.
        """
        if group not in self.program.groups:
            raise ValueError(
                f"cannot add a node to group {group!r}: the program has groups "
                f"{', '.join(self.program.groups)}"
            )
        if self.stopped:
            raise RuntimeError(f"cannot add a node to the stopped program {self.program.name!r}")
        self._check_room(group)
        with self.program.group(group):
            handle = self.program.add_node(constructor, *args, **(kwargs or {}))
        spec = self.program.node(handle.name)
        if restart_kwargs is not None:
            spec.restartable(restart_kwargs)
        try:
            self._start_added(spec)
        except BaseException:
            self._removed.add(spec.name)  # in the graph (its name is taken) but never active
            raise
        return handle

    def remove_node(self, name: str, timeout_s: float = 60.0) -> None:
        """Stops node `name` cleanly and takes it out of the program.

        Its `stop()` is called, its `run` may finish (an actor sends its final
        counters then), its `close()` runs, and its process (ray) is gone when
        this returns. The supervisor stops watching it. Up to `timeout_s` is
        given to `run` to return; then a Ray node is killed, and a local
        node's thread (which cannot be killed) is left to end by itself.

        Raises:
          ValueError: the node was removed already, or a node still running
            holds a handle of it (removing the replay would strand the actors).
        """
        name = self.program.resolve_name(name)
        if name in self._removed:
            raise ValueError(f"node {name} was removed already")
        users = [spec.name for spec in self.active_nodes() if name in spec.dependencies()]
        if users:
            raise ValueError(f"cannot remove node {name}: it is used by {', '.join(users)}")
        self._stop_node(name, timeout_s)
        self._removed.add(name)

    @property
    def removed_nodes(self) -> list[str]:
        """Names of the nodes taken out by `remove_node`."""
        return sorted(self._removed)

    @property
    def stopped(self) -> bool:
        """True once `stop()` was called."""
        return False

    def _check_room(self, group: str) -> None:
        """Raises if one more node of `group` cannot be placed now (launchers with resources)."""
        del group  # threads in this process: always room

    def _start_added(self, spec: program_lib.NodeSpec) -> None:
        """Builds and runs the node of `spec`, just added to the program."""
        raise NotImplementedError(f"the {type(self).__name__} launcher cannot add nodes")

    def _stop_node(self, name: str, timeout_s: float) -> None:
        """Stops, closes and forgets node `name`, within about `timeout_s`."""
        raise NotImplementedError(f"the {type(self).__name__} launcher cannot remove nodes")

    @abc.abstractmethod
    def client(self, name: str) -> program_lib.Client:
        """A client of node `name` ("group/index", or a group with one node)."""

    @abc.abstractmethod
    def finished(self) -> bool:
        """True once every node's `run` has returned. Raises NodeError if one failed."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stops every node, releases their resources; leaves no process behind."""

    def failures(self) -> dict[str, str]:
        """{node name: why} for every node whose process died or whose constructor or `run`
        raised, without raising; a supervisor decides what to do about them."""
        try:
            self.finished()
        except program_lib.NodeError as error:
            return {error.node_name: str(error)}
        return {}

    def process_ids(self) -> dict[str, int]:
        """Process id of every node built so far (for operators and memory benchmarks)."""
        return {spec.name: os.getpid() for spec in self.active_nodes()}

    def is_built(self, name: str) -> bool:
        """True once node `name`'s constructor has returned (or failed)."""
        return True

    def kill(self, name: str) -> None:
        """Ends node `name`'s current incarnation at once; returns when its process is gone.

        A supervisor kills every node it replaces before it reads their last
        counters, so a node still alive cannot report a later count after
        the one its successor continues from.

        Raises:
          NotImplementedError: this launcher cannot replace nodes.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} launcher cannot restart nodes (the ray launcher can)"
        )

    def restart(self, name: str, kwargs: dict | None = None) -> None:
        """Replaces node `name` with a fresh one built from its spec, `kwargs` overriding.

        Raises:
          NotImplementedError: this launcher cannot replace nodes.
        """
        raise NotImplementedError(
            f"the {type(self).__name__} launcher cannot restart nodes (the ray launcher can)"
        )

    def wait(self, timeout: float | None = None, poll_s: float = 0.1) -> bool:
        """Blocks until every `run` returned (True) or `timeout` passed (False).

        Raises:
          NodeError: as soon as any node fails.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def check(self) -> None:
        """Raises NodeError if any node has failed so far."""
        self.finished()

    def __enter__(self) -> "RunningProgram":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
