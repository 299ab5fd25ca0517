"""The program graph (Launchpad's model): named nodes in groups, wired by handles.

A node is a constructor plus arguments. An argument may be the `Handle` of
another node; a launcher replaces it with a working `Client` of that node
before the constructor runs, wherever the node runs (a thread, a Ray actor).
The same `Program` object runs unchanged under every launcher.

Node contract, all optional except the constructor:
  run()   the node's main loop; the launcher calls it once in its own thread.
  stop()  asks `run` to return soon; `Worker` below implements it.
  close() releases what the node holds (servers, environments) after `run`.
Any other public method can be called through a client.
"""

import concurrent.futures
import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one node of a group asks of the cluster (Ray logical resources).

    Attributes:
      num_cpus: logical CPUs.
      num_gpus: GPUs; above 1 a whole number.
      memory: bytes of Ray's "memory" resource the node reserves (0: none).
      custom: other Ray resources by name, e.g. {"TPU": 4} or a label such as
        {"replay_host": 1} that only some cluster nodes declare.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: float = 0.0
    # Not hashed (a dict cannot be); compared like the other fields.
    custom: dict[str, float] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        amounts = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "memory": self.memory}
        amounts.update({f"custom[{name!r}]": value for name, value in self.custom.items()})
        for setting, value in amounts.items():
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(
                    f"resources {setting} must be a non-negative number, got {value!r}"
                )
        if self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ValueError(f"resources num_gpus above 1 must be whole, got {self.num_gpus}")
        for name in self.custom:
            if not isinstance(name, str) or not name:
                raise ValueError(f"resources custom names must be non-empty strings, got {name!r}")
            if name in _BUILT_IN_RESOURCES:
                raise ValueError(
                    f"resources custom[{name!r}]: use {_BUILT_IN_RESOURCES[name]} instead"
                )
        object.__setattr__(self, "custom", dict(self.custom))  # a copy the caller cannot change


# Ray's own resource names, and the Resources field that asks for each.
_BUILT_IN_RESOURCES = {
    "CPU": "num_cpus",
    "GPU": "num_gpus",
    "memory": "memory",
    "object_store_memory": "the launcher's object_store_memory",
}


# Group names of a role's nodes in a program of role groups: "learner@adversary".
ROLE_MARK = "@"


def role_group(group: str, role: str | None) -> str:
    """The name of `group` in role `role`'s part of a program; `group` itself without a role."""
    return group if role is None else f"{group}{ROLE_MARK}{role}"


def node_role(name: str) -> str | None:
    """The role of node `name` ("learner@adversary/0" -> "adversary"); None for shared nodes."""
    group = name.split("/", 1)[0]
    return group.partition(ROLE_MARK)[2] or None


@dataclasses.dataclass(frozen=True)
class Handle:
    """A reference to a node, passed as an argument to other nodes."""

    name: str  # "group/index"


@dataclasses.dataclass
class NodeSpec:
    """One node of the graph: where it sits and how to build it."""

    name: str
    group: str
    constructor: Callable[..., Any]
    args: tuple
    kwargs: dict
    run_enabled: bool = True
    # How to rebuild the node after a fault: (its last reported counters) ->
    # constructor keyword arguments that replace the original ones (a
    # restored counter, the newest checkpoint). None: the node is not restarted.
    restart_kwargs: Callable[[dict[str, float]], dict[str, Any]] | None = None
    # Nodes replaced together with this one, in this order (`Program.restart_together`);
    # empty: only itself.
    restart_group: tuple[str, ...] = ()
    # A node this one should share a host with where resources allow (an actor
    # and the replay shard it writes to); the Ray launcher's placement reads it.
    near: str | None = None

    def restartable(self, restart_kwargs: Callable[[dict[str, float]], dict[str, Any]]) -> None:
        """Lets a supervisor rebuild this node after a fault, with `restart_kwargs(counters)`."""
        self.restart_kwargs = restart_kwargs

    def disable_run(self) -> None:
        """Builds the node but never calls its `run`; tests drive it by hand."""
        self.run_enabled = False

    def dependencies(self) -> set[str]:
        """Names of the nodes whose handles this node receives."""
        found: set[str] = set()
        map_handles(lambda h: found.add(h.name), (self.args, self.kwargs))
        return found


class Program:
    """A graph of named nodes in groups."""

    def __init__(self, name: str = "gorila"):
        self.name = name
        self._nodes: dict[str, NodeSpec] = {}
        self._resources: dict[str, Resources] = {}
        self._group: str | None = None

    @contextlib.contextmanager
    def group(self, name: str, resources: Resources | None = None) -> Iterator[None]:
        """Nodes added inside this block belong to group `name`."""
        if self._group is not None:
            raise ValueError(f"groups do not nest: '{name}' opened inside '{self._group}'")
        if "/" in name:
            raise ValueError(f"group name may not contain '/': {name!r}")
        if resources is not None:
            self._resources[name] = resources
        self._group = name
        try:
            yield
        finally:
            self._group = None

    def add_node(self, constructor: Callable[..., Any], *args, **kwargs) -> Handle:
        """Adds a node to the current group and returns its handle."""
        if self._group is None:
            raise ValueError("add_node must be called inside `with program.group(name):`")
        index = len(self.groups.get(self._group, []))
        spec = NodeSpec(f"{self._group}/{index}", self._group, constructor, args, kwargs)
        self._nodes[spec.name] = spec
        return Handle(spec.name)

    @property
    def nodes(self) -> list[NodeSpec]:
        return list(self._nodes.values())

    @property
    def groups(self) -> dict[str, list[NodeSpec]]:
        out: dict[str, list[NodeSpec]] = {}
        for spec in self._nodes.values():
            out.setdefault(spec.group, []).append(spec)
        return out

    def node(self, name: str) -> NodeSpec:
        """The node called `name`; a group with a single node may be named alone."""
        return self._nodes[self.resolve_name(name)]

    def resolve_name(self, name: str) -> str:
        if name in self._nodes:
            return name
        members = self.groups.get(name, [])
        if len(members) == 1:
            return members[0].name
        known = ", ".join(self._nodes)
        raise KeyError(f"no single node called {name!r} in program {self.name!r}; nodes: {known}")

    def restart_together(self, names: list[str]) -> None:
        """A fault of any of these nodes makes the supervisor replace all of them, in this order.

        For nodes that cannot outlive one another: the processes of a
        multi-host learner share one `jax.distributed` job, which a single
        replaced process cannot rejoin.

        Raises:
          ValueError: a node is not `restartable`.
        """
        specs = [self.node(name) for name in names]
        fixed = [spec.name for spec in specs if spec.restart_kwargs is None]
        if fixed:
            raise ValueError(f"restart_together: {', '.join(fixed)} not restartable")
        for spec in specs:
            spec.restart_group = tuple(member.name for member in specs)

    def resources(self, group: str) -> Resources:
        return self._resources.get(group, Resources())


def map_handles(fn: Callable[[Handle], Any], tree: Any) -> Any:
    """Rebuilds `tree` (nested tuples, lists, dicts) with every Handle replaced by fn(handle)."""
    if isinstance(tree, Handle):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_handles(fn, x) for x in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_handles(fn, x) for x in tree)
    if isinstance(tree, dict):
        return {k: map_handles(fn, v) for k, v in tree.items()}
    return tree


class Client:
    """Calls methods of a node wherever it runs.

    `client.method(...)` blocks and returns the result; `client.futures.method(...)`
    returns a `concurrent.futures.Future` at once, so a caller can keep working
    while the call is in flight (actors pulling parameters, learners pushing
    priorities).
    """

    def __init__(self, node_name: str):
        self.node_name = node_name

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def _submit(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        raise NotImplementedError

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, args, kwargs)

    @property
    def futures(self) -> "_Futures":
        return _Futures(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.node_name!r})"


class _Futures:
    """`client.futures`: its methods return a Future at once.

    A class of its own, not one made per call: a class is a reference cycle, and a
    client kept by one would be freed by the cyclic garbage collector on whatever
    thread it runs, a courier client's own callback thread included (which aborts).
    """

    def __init__(self, client: Client):
        self._client = client

    def __getattr__(self, method: str) -> Callable[..., concurrent.futures.Future]:
        if method.startswith("_"):
            raise AttributeError(method)
        client = self._client
        return lambda *args, **kwargs: client._submit(method, args, kwargs)


class Worker:
    """Base for nodes with a `run` loop: gives them a stop signal the launcher sets,
    and `wait_finished` for the driver, which `run` releases by setting `_finished`
    last, in its `finally` (after its final report or checkpoint)."""

    def __init__(self):
        self._stop_event = threading.Event()
        self._finished = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def wait_finished(self, timeout: float) -> bool:
        """Blocks until `run` has returned (its last report sent), or timeout."""
        return self._finished.wait(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleeps up to `seconds`; returns True if the node was asked to stop meanwhile."""
        return self._stop_event.wait(seconds)


class NodeError(RuntimeError):
    """A node's constructor or `run` raised; carries the node's name."""

    def __init__(self, node_name: str, detail: str):
        super().__init__(f"node {node_name} failed: {detail}")
        self.node_name = node_name
