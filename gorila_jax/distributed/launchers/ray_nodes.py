"""The Ray actor that hosts a node, and the client other nodes and the driver call it with.

Both travel between processes: the launcher wraps `NodeActor` with
`ray.remote`, and a `RayClient` is pickled into the nodes that hold a handle
of the node it calls.
"""

import concurrent.futures
import logging
import threading
import time
from typing import Any

import ray
import ray.exceptions

from gorila_jax import text
from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base


class NodeActor(base.HostedNode):
    """Hosts one node inside a Ray actor process (a threaded actor)."""

    def __init__(self, name: str):
        super().__init__(name)
        self._stopped = threading.Event()

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self._get(), method)(*args, **kwargs)

    def run(self) -> None:
        node = self._get()
        if hasattr(node, "run") and not self.stop_requested:
            node.run()

    def watch(self) -> None:
        """Returns when the node is stopped; fails (ActorDiedError) if its process dies first.

        Every node has one pending, so the launcher sees a dead process even
        for nodes without a `run` loop (the replay server).
        """
        self._stopped.wait()

    def stop(self) -> None:
        self._stopped.set()
        super().stop()


# Client calls retried after a peer's death run here, so futures stay non-blocking.
_retry_executor: concurrent.futures.ThreadPoolExecutor | None = None
_retry_executor_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _retry_executor
    with _retry_executor_lock:
        if _retry_executor is None:
            _retry_executor = concurrent.futures.ThreadPoolExecutor(
                16, thread_name_prefix="ray-client"
            )
        return _retry_executor


class RayClient(program_lib.Client):
    """Calls a node hosted by a Ray actor; picklable, so nodes pass it to each other.

    With `reconnect_timeout_s` > 0, a call to a node whose process died waits
    up to that long for the launcher to start its replacement (a named actor
    of the same name), then goes to the replacement: the callers of a
    restarted learner or replay reconnect by themselves.
    """

    def __init__(
        self,
        node_name: str,
        actor: Any,
        actor_name: str | None = None,
        namespace: str | None = None,
        reconnect_timeout_s: float = 0.0,
    ):
        super().__init__(node_name)
        self._actor = actor
        self._actor_name, self._namespace = actor_name, namespace
        self._reconnect_timeout_s = reconnect_timeout_s

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        deadline = None
        while True:
            actor = self._actor
            try:
                return ray.get(actor.call.remote(method, args, kwargs))
            except ray.exceptions.RayTaskError as error:
                # Re-raise as the node's own exception type so callers can catch it.
                raise error.as_instanceof_cause() from None
            except ray.exceptions.RayActorError as error:
                if not self._reconnect_timeout_s or self._actor_name is None:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + self._reconnect_timeout_s
                    logging.warning("%s unreachable, waiting for its restart", self.node_name)
                if time.monotonic() >= deadline:
                    raise program_lib.NodeError(
                        self.node_name,
                        f"unreachable and not restarted within {self._reconnect_timeout_s}s: "
                        f"{first_line(error)}",
                    ) from None
                time.sleep(0.5)
                self._actor = self._lookup(actor)

    def _lookup(self, dead: Any) -> Any:
        """The actor now carrying our node's name (the replacement, once it exists)."""
        try:
            return ray.get_actor(self._actor_name, namespace=self._namespace)
        except ValueError:  # not (yet) created again
            return dead

    def _submit(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        future = self._actor.call.remote(method, args, kwargs).future()
        if not self._reconnect_timeout_s:
            return future
        # Ray's own future while the node lives; a call that met a dead node
        # is retried (waiting for the replacement) in a thread of this process.
        outer: concurrent.futures.Future = concurrent.futures.Future()

        def settle(done: concurrent.futures.Future) -> None:
            error = done.exception()
            if isinstance(error, ray.exceptions.RayActorError):
                retry = _executor().submit(self._call, method, args, kwargs)
                retry.add_done_callback(lambda again: _copy_outcome(again, outer))
            else:
                _copy_outcome(done, outer)

        future.add_done_callback(settle)
        return outer


def _copy_outcome(source: concurrent.futures.Future, target: concurrent.futures.Future) -> None:
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def first_line(error: BaseException) -> str:
    """`Type: first non-blank line` of `error`, for one-line failure reports.

    A node's own exception inside Ray's task error is what is reported: Ray's first
    line is only `ray::NodeActor.construct() (pid=..., repr=...)`, which hid a replay
    node's "corrupted record" behind three restarts.
    """
    cause = getattr(error, "cause", None)  # RayTaskError: the exception the node raised
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        error = cause
    if isinstance(error, ray.exceptions.UnserializableException):
        # Ray could not unpickle the node's exception (seen once in CI, for a plain
        # RuntimeError) and kept only its formatted traceback, whose last line is the
        # node's own `Type: message`.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return lines[-1]
    return text.first_line(error)
