"""What every launcher returns: a running program that can be waited on and stopped."""

import abc
import os
import time

from gorila_jax import program as program_lib


class RunningProgram(abc.ABC):
    """A launched program. Use as a context manager so that it always stops."""

    def __init__(self, program: program_lib.Program):
        self.program = program

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
        return {spec.name: os.getpid() for spec in self.program.nodes}

    def is_built(self, name: str) -> bool:
        """True once node `name`'s constructor has returned (or failed)."""
        return True

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
