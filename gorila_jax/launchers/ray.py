"""The `ray` launcher: one Ray actor process per node, with per-group resources.

Starts a private local Ray cluster unless given the address of an existing one.
Nodes are built in two phases (create every actor, then construct every node
with clients of the others), so handles may point in any direction.
"""

import concurrent.futures
import logging
import os
import socket
import threading
from typing import Any

import ray
import ray.exceptions

from gorila_jax import program as program_lib
from gorila_jax.launchers import base

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Enough threads that a node's run loop never starves its client calls.
_MAX_CONCURRENCY = 32
_STOP_TIMEOUT_S = 60.0


class _NodeActor:
    """Hosts one node inside a Ray actor process (a threaded actor)."""

    def __init__(self, name: str):
        self._name = name
        self._node: Any = None
        self._error: BaseException | None = None
        self._built = threading.Event()

    def construct(self, constructor, args: tuple, kwargs: dict) -> int:
        try:
            self._node = constructor(*args, **kwargs)
        except BaseException as error:
            self._error = error
            raise
        finally:
            self._built.set()
        return os.getpid()

    def _get(self) -> Any:
        self._built.wait()
        if self._error is not None:
            raise program_lib.NodeError(self._name, f"construction failed: {self._error!r}")
        return self._node

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self._get(), method)(*args, **kwargs)

    def run(self) -> None:
        node = self._get()
        if hasattr(node, "run"):
            node.run()

    def stop(self) -> None:
        if self._built.is_set() and hasattr(self._node, "stop"):
            self._node.stop()

    def close(self) -> None:
        if self._built.is_set() and hasattr(self._node, "close"):
            self._node.close()


class RayClient(program_lib.Client):
    """Calls a node hosted by a Ray actor; picklable, so nodes pass it to each other."""

    def __init__(self, node_name: str, actor: Any):
        super().__init__(node_name)
        self._actor = actor

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        try:
            return ray.get(self._actor.call.remote(method, args, kwargs))
        except ray.exceptions.RayTaskError as error:
            # Re-raise as the node's own exception type so callers can catch it.
            raise error.as_instanceof_cause() from None

    def _submit(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        return self._actor.call.remote(method, args, kwargs).future()


class RayProgram(base.RunningProgram):
    def __init__(self, program: program_lib.Program, owns_cluster: bool):
        super().__init__(program)
        self._owns_cluster = owns_cluster
        self._stopped = False
        remote_cls = ray.remote(max_concurrency=_MAX_CONCURRENCY)(_NodeActor)
        self._actors = {}
        for spec in program.nodes:
            resources = program.resources(spec.group)
            self._actors[spec.name] = remote_cls.options(
                num_cpus=resources.num_cpus, num_gpus=resources.num_gpus
            ).remote(spec.name)
        resolve = lambda handle: self.client(handle.name)  # noqa: E731
        self._construct_refs = {
            spec.name: self._actors[spec.name].construct.remote(
                spec.constructor,
                program_lib.map_handles(resolve, spec.args),
                program_lib.map_handles(resolve, spec.kwargs),
            )
            for spec in program.nodes
        }
        self._run_refs = {
            spec.name: self._actors[spec.name].run.remote()
            for spec in program.nodes
            if spec.run_enabled
        }

    def client(self, name: str) -> RayClient:
        name = self.program.resolve_name(name)
        return RayClient(name, self._actors[name])

    def pids(self) -> dict[str, int]:
        """Process id of every node (blocks until all are built)."""
        return {name: self._get(name, ref) for name, ref in self._construct_refs.items()}

    def _get(self, name: str, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as error:
            raise program_lib.NodeError(name, str(error)) from None

    def finished(self) -> bool:
        refs = {**self._construct_refs, **self._run_refs}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
        names = {ref: name for name, ref in refs.items()}
        for ref in ready:
            self._get(names[ref], ref)  # raises NodeError for a failed node
        return len(ready) == len(refs)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            ray.wait(
                [actor.stop.remote() for actor in self._actors.values()],
                num_returns=len(self._actors),
                timeout=_STOP_TIMEOUT_S,
            )
            ray.wait(
                list(self._run_refs.values()),
                num_returns=len(self._run_refs),
                timeout=_STOP_TIMEOUT_S,
            )
            closing = [actor.close.remote() for actor in reversed(list(self._actors.values()))]
            ray.wait(closing, num_returns=len(closing), timeout=_STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  the actors are killed below regardless
            logging.exception("orderly stop of program %s failed", self.program.name)
        for actor in self._actors.values():
            ray.kill(actor)
        if self._owns_cluster:
            ray.shutdown()


def _check_resources(program: program_lib.Program) -> None:
    """Fails fast when an existing cluster cannot host the program at all."""
    wanted = {"CPU": 0.0, "GPU": 0.0}
    for spec in program.nodes:
        resources = program.resources(spec.group)
        wanted["CPU"] += resources.num_cpus
        wanted["GPU"] += resources.num_gpus
    have = ray.cluster_resources()
    for key, amount in wanted.items():
        if amount > have.get(key, 0.0):
            raise RuntimeError(
                f"program {program.name!r} needs {amount:g} {key} but the Ray cluster has "
                f"{have.get(key, 0.0):g}; lower the group resources or add nodes"
            )


def launch(
    program: program_lib.Program,
    address: str | None = None,
    num_cpus: int | None = None,
    object_store_memory: int | None = None,
) -> RayProgram:
    """Starts every node of `program` as a Ray actor.

    Args:
      program: the graph to run.
      address: an existing cluster ("host:port" or "auto"); None starts a
        private local cluster that `stop()` shuts down again.
      num_cpus: logical CPUs of the private cluster; by default enough for the
        program's request (oversubscribing is fine on one machine).
      object_store_memory: bytes for the private cluster's object store.
    """
    if ray.is_initialized():
        owns_cluster = False
    elif address is None:
        wanted = sum(program.resources(spec.group).num_cpus for spec in program.nodes)
        ray.init(
            num_cpus=num_cpus or max(os.cpu_count() or 1, int(wanted + 0.999)),
            object_store_memory=object_store_memory,
            include_dashboard=False,
            # Workers import gorila_jax and agents from this checkout.
            runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}},
        )
        owns_cluster = True
    else:
        _connect(address)
        owns_cluster = True  # our connection only; the cluster itself keeps running
    try:
        _check_resources(program)
        return RayProgram(program, owns_cluster)
    except BaseException:
        if owns_cluster:
            ray.shutdown()
        raise


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)


def _connect(address: str, probe_timeout_s: float = 5.0) -> None:
    """Joins an existing cluster and ships this checkout to its workers.

    Raises:
      ConnectionError: at once if nothing listens at `address`; `ray.init`
        itself would retry for minutes.
    """
    if address != "auto":
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=probe_timeout_s).close()
        except (OSError, ValueError) as error:
            raise ConnectionError(
                f"cannot reach the Ray cluster at --ray_address={address!r}: {error}"
            ) from None
    try:
        ray.init(
            address=address,
            runtime_env={"working_dir": _REPO_ROOT, "excludes": [".venv", ".git", "runs"]},
        )
    except ConnectionError as error:
        # Ray 2.60 clusters started with `ray start` require token authentication.
        hint = ""
        if os.environ.get("RAY_AUTH_MODE") != "token":
            hint = (
                "; if the cluster uses token authentication (Ray's default for `ray start`), "
                "export RAY_AUTH_MODE=token and make its token available "
                "(~/.ray/auth_token or RAY_AUTH_TOKEN)"
            )
        raise ConnectionError(
            f"cannot join the Ray cluster at {address!r}: {error}{hint}"
        ) from None
