"""The `ray` launcher: one Ray actor process per node, with per-group resources.

Starts a private local Ray cluster unless given the address of an existing one.
Before any actor starts, `placement.reserve` checks that the cluster can host
the program (failing at once, with the group and resource named, if it cannot)
and reserves placement groups: learners spread over hosts, replay and actors
packed together. Each node's actor goes into its group's bundle, also when it
is restarted. Nodes are built in two phases (create every actor, then
construct every node with clients of the others), so handles may point in any
direction. A node lives in a `ray_nodes.NodeActor`; its handles become
`ray_nodes.RayClient`s.
"""

import logging
import time
import uuid
from typing import Any

import ray
import ray.exceptions

from gorila_jax.distributed import placement as placement_lib
from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base, ray_cluster, ray_nodes

# Enough threads that a node's run loop never starves its client calls.
_MAX_CONCURRENCY = 32
_STOP_TIMEOUT_S = 60.0


class RayProgram(base.RunningProgram):
    """The program's nodes as Ray actors.

    Args:
      program: the graph to run.
      owns_cluster: `stop()` also disconnects from (or shuts down) the cluster.
      reconnect_timeout_s: see `ray_nodes.RayClient`.
      placement: the placement groups reserved for the program; each node's
        actor (and its replacement after a restart) goes into its bundle.
        `stop()` releases them. None: Ray schedules every actor anywhere.
    """

    def __init__(
        self,
        program: program_lib.Program,
        owns_cluster: bool,
        reconnect_timeout_s: float = 0.0,
        placement: placement_lib.Placement | None = None,
    ):
        super().__init__(program)
        self._owns_cluster = owns_cluster
        self._placement = placement
        self._stopped = False
        self._reconnect_timeout_s = reconnect_timeout_s
        self._remote_cls = ray.remote(max_concurrency=_MAX_CONCURRENCY)(ray_nodes.NodeActor)
        # Named actors let clients find a restarted node; the id keeps two
        # programs in one cluster apart.
        self._namespace = ray.get_runtime_context().namespace
        self._prefix = f"{program.name}-{uuid.uuid4().hex[:8]}"
        self._actors: dict[str, Any] = {}
        self._construct_refs: dict[str, Any] = {}
        self._run_refs: dict[str, Any] = {}
        self._watch_refs: dict[str, Any] = {}
        # An added node takes the placement bundle a removed node of its group
        # left (`_bundle_of`: added node -> the removed node whose bundle it has).
        self._free_bundles: dict[str, list[str]] = {}
        self._bundle_of: dict[str, str] = {}
        for spec in program.nodes:
            self._actors[spec.name] = self._create_actor(spec)
        for spec in program.nodes:
            self._start(spec, {})

    def _create_actor(self, spec: program_lib.NodeSpec, timeout_s: float = 60.0) -> Any:
        resources = self.program.resources(spec.group)
        if self._placement is not None:
            # The node's own bundle: a replacement takes the resources its predecessor held.
            options = self._placement.options(self._bundle_of.get(spec.name, spec.name), resources)
        else:
            options = placement_lib.actor_options(resources)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._remote_cls.options(
                    name=self._actor_name(spec.name), namespace=self._namespace, **options
                ).remote(spec.name)
            except ValueError:  # the name is still held by the killed predecessor
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _actor_name(self, name: str) -> str:
        return f"{self._prefix}/{name}"

    def _start(self, spec: program_lib.NodeSpec, overrides: dict) -> None:
        actor = self._actors[spec.name]
        resolve = lambda handle: self.client(handle.name)  # noqa: E731
        kwargs = {**spec.kwargs, **overrides}
        self._construct_refs[spec.name] = actor.construct.remote(
            spec.constructor,
            program_lib.map_handles(resolve, spec.args),
            program_lib.map_handles(resolve, kwargs),
        )
        self._watch_refs[spec.name] = actor.watch.remote()
        if spec.run_enabled:
            self._run_refs[spec.name] = actor.run.remote()

    def client(self, name: str) -> ray_nodes.RayClient:
        name = self.program.resolve_name(name)
        return ray_nodes.RayClient(
            name,
            self._actors[name],
            self._actor_name(name),
            self._namespace,
            self._reconnect_timeout_s,
        )

    def pids(self) -> dict[str, int]:
        """Process id of every node (blocks until all are built)."""
        return {name: self._get(name, ref) for name, ref in self._construct_refs.items()}

    def process_ids(self) -> dict[str, int]:
        """Process id of every node built so far (does not wait for the others)."""
        names = {ref: name for name, ref in self._construct_refs.items()}
        ready, _ = ray.wait(list(names), num_returns=len(names), timeout=0)
        found = {}
        for ref in ready:
            try:
                found[names[ref]] = ray.get(ref)
            except ray.exceptions.RayError:
                pass  # a failed node has no process to show
        return found

    def _get(self, name: str, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as error:
            raise program_lib.NodeError(name, ray_nodes.first_line(error)) from None

    def is_built(self, name: str) -> bool:
        ref = self._construct_refs[self.program.resolve_name(name)]
        ready, _ = ray.wait([ref], timeout=0)
        return bool(ready)

    def failures(self) -> dict[str, str]:
        refs = [
            (name, ref)
            for table in (self._construct_refs, self._run_refs, self._watch_refs)
            for name, ref in table.items()
        ]
        ready, _ = ray.wait([ref for _, ref in refs], num_returns=len(refs), timeout=0)
        ready = set(ready)
        failed: dict[str, str] = {}
        for name, ref in refs:
            if ref in ready and name not in failed:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as error:
                    failed[name] = ray_nodes.first_line(error)
        return failed

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _check_room(self, group: str) -> None:
        """Fails at once, instead of a node that never starts, if the cluster is full.

        Raises:
          placement.UnplaceableError: naming the resource the cluster lacks now.
        """
        if self._free_bundles.get(group):
            return  # a removed node's place is free
        available = ray.available_resources()
        wanted = placement_lib.bundle(self.program.resources(group))
        for resource, amount in wanted.items():
            if available.get(resource, 0.0) < amount:
                raise placement_lib.UnplaceableError(
                    f"cannot add a node to group {group!r}: it asks for {amount:g} {resource} "
                    f"per node and the Ray cluster has {available.get(resource, 0.0):g} free; "
                    "remove a node of the group first (its place is reused) or add Ray nodes"
                )

    def _start_added(self, spec: program_lib.NodeSpec) -> None:
        free = self._free_bundles.get(spec.group, [])
        if free:
            self._bundle_of[spec.name] = free.pop(0)
        self._actors[spec.name] = self._create_actor(spec)
        self._start(spec, {})

    def _stop_node(self, name: str, timeout_s: float) -> None:
        actor = self._actors[name]
        try:
            ray.wait([actor.stop.remote()], timeout=timeout_s)
            if name in self._run_refs:  # its `run` sends the final counters before returning
                ray.wait([self._run_refs[name]], timeout=timeout_s)
            ray.wait([actor.close.remote()], timeout=timeout_s)
        except ray.exceptions.RayError:
            logging.warning("orderly stop of %s failed; killing it", name, exc_info=True)
        ray.kill(actor, no_restart=True)
        for table in (self._actors, self._construct_refs, self._run_refs, self._watch_refs):
            table.pop(name, None)
        if self._placement is not None:
            bundle_owner = self._bundle_of.pop(name, name)
            if self._placement.scheduling_strategy(bundle_owner) is not None:
                group = self.program.node(name).group
                self._free_bundles.setdefault(group, []).append(bundle_owner)

    def kill(self, name: str, timeout_s: float = 30.0) -> None:
        spec = self.program.node(name)
        ray.kill(self._actors[spec.name], no_restart=True)
        # A killed actor's pending `watch` fails once its process is gone.
        watch = self._watch_refs.get(spec.name)
        if watch is not None:
            ray.wait([watch], timeout=timeout_s)

    def restart(self, name: str, kwargs: dict | None = None) -> None:
        """Kills node `name`'s actor (if still alive) and starts a fresh one in its place.

        The new actor has the same name, group resources and constructor
        arguments (so the same seed offset and configuration), with `kwargs`
        replacing some of them; clients with `reconnect_timeout_s` find it.
        """
        spec = self.program.node(name)
        ray.kill(self._actors[spec.name], no_restart=True)
        self._run_refs.pop(spec.name, None)
        self._actors[spec.name] = self._create_actor(spec)
        self._start(spec, kwargs or {})

    def finished(self) -> bool:
        refs = {**self._construct_refs, **self._run_refs}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
        names = {ref: name for name, ref in refs.items()}
        for ref in ready:
            self._get(names[ref], ref)  # raises NodeError for a failed node
        return len(ready) == len(refs)

    def stop(self) -> None:
        """Stops every node and waits for their `run`s, closes them in stages, kills them.

        A node is closed only after every node holding its handle has closed
        (`base.close_stages`): a learner's samplers and priority updates end
        while the replay still serves, not in a race with its close.
        """
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
            live = [self.program.node(name) for name in self._actors]
            for stage in base.close_stages(live):
                closing = [self._actors[spec.name].close.remote() for spec in stage]
                ray.wait(closing, num_returns=len(closing), timeout=_STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001  the actors are killed below regardless
            logging.exception("orderly stop of program %s failed", self.program.name)
        for actor in self._actors.values():
            ray.kill(actor)
        if self._placement is not None:
            self._placement.release()  # on a shared cluster the reservation must not outlive us
        if self._owns_cluster:
            ray.shutdown()


def launch(
    program: program_lib.Program,
    address: str | None = None,
    num_cpus: int | None = None,
    object_store_memory: int | None = None,
    reconnect_timeout_s: float = 0.0,
    placement_timeout_s: float = 60.0,
) -> RayProgram:
    """Reserves placement groups for `program`, then starts every node as a Ray actor.

    Args:
      program: the graph to run.
      address: an existing cluster ("host:port" or "auto"); None starts a
        private local cluster that `stop()` shuts down again.
      num_cpus: logical CPUs of the private cluster; by default enough for the
        program's request (oversubscribing is fine on one machine).
      object_store_memory: bytes for the private cluster's object store.
      reconnect_timeout_s: how long a call to a dead node waits for its
        restart before it fails (`ray_nodes.RayClient`); 0 fails at once.
      placement_timeout_s: how long Ray may take to reserve the placement
        groups (resources that exist but are held by other work).

    Raises:
      placement.UnplaceableError: at once if the cluster lacks what a group
        asks for, or after `placement_timeout_s` if it could not be reserved.
    """
    owns_cluster = ray_cluster.start_or_join(program, address, num_cpus, object_store_memory)
    try:
        reserved = placement_lib.reserve(program, timeout_s=placement_timeout_s)
        try:
            return RayProgram(program, owns_cluster, reconnect_timeout_s, reserved)
        except BaseException:
            reserved.release()
            raise
    except BaseException:
        if owns_cluster:
            ray.shutdown()
        raise
