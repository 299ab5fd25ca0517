"""Where a program's nodes go on a Ray cluster: placement groups per rule, and a fail-fast check.

Learners (and Gorila's gradient workers and parameter shards) are spread over
hosts, so that a multi-host learner gets one process per host and a lost host
takes one of them, not all. Replay and actors are packed together, so that
transitions mostly travel within a host: with several replay shards, each
shard with the actors that write to it (`NodeSpec.near`), where resources
allow. A run that asks for more than the cluster has fails here with a
message naming the group and the resource, instead of waiting forever for
Ray to schedule it.
"""

import dataclasses
import uuid
from typing import Any, Sequence

import ray
from ray.util import scheduling_strategies

from gorila_jax.distributed import program as program_lib

SPREAD = "SPREAD"  # bundles on distinct hosts where possible
PACK = "PACK"  # bundles on as few hosts as possible
STRATEGIES = (SPREAD, PACK, "STRICT_SPREAD", "STRICT_PACK")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One placement group: these members, placed together under `strategy`.

    Attributes:
      members: group names (all their nodes) or node names ("replay/0").
      strategy: one of `STRATEGIES`. The soft ones (SPREAD, PACK) fall back to
        any placement that fits; the STRICT ones fail if they cannot hold.
      with_readers: a placement group per member node instead of one for all:
        the node with every node that takes its handle (a host's parameter
        cache with the actors that read it).
      with_near: a placement group per member node that some not yet placed
        node asked to be near (`NodeSpec.near`: a replay shard and the actors
        that write to it); a member nobody asked for is left to later rules.
    """

    members: tuple[str, ...]
    strategy: str
    with_readers: bool = False
    with_near: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"placement strategy must be one of {STRATEGIES}, got {self.strategy!r}"
            )


# The Gorila graph's placement. Groups in no rule are scheduled by Ray anywhere.
DEFAULT_RULES = (
    Rule(("param_cache",), PACK, with_readers=True),  # each host's cache beside its actors
    Rule(("learner",), SPREAD),
    Rule(("gradient_worker",), SPREAD),
    Rule(("parameter_server",), SPREAD),
    Rule(("replay",), PACK, with_near=True),  # each replay shard beside its writers
    Rule(("replay", "actor"), PACK),  # what is left: one replay, actors near nothing
)


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """The placement group of one rule: a bundle per node, in `node_names` order."""

    strategy: str
    node_names: tuple[str, ...]
    bundles: tuple[dict[str, float], ...]
    label: str = ""  # names a rule's per-node group ("param_cache/1+actor"); "": its groups

    @property
    def name(self) -> str:
        return self.label or "+".join(dict.fromkeys(n.split("/")[0] for n in self.node_names))


class UnplaceableError(RuntimeError):
    """The cluster cannot host (or did not make room for) what a group asks."""


def bundle(resources: program_lib.Resources) -> dict[str, float]:
    """One node's request as a Ray bundle: {"CPU": .., "GPU": .., "memory": .., custom}."""
    wanted = {"CPU": resources.num_cpus, "GPU": resources.num_gpus, "memory": resources.memory}
    wanted.update(resources.custom)
    return {name: float(amount) for name, amount in wanted.items() if amount > 0}


def actor_options(resources: program_lib.Resources) -> dict[str, Any]:
    """Keyword arguments of `ActorClass.options` that ask Ray for `resources`."""
    options: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
    if resources.memory:
        options["memory"] = resources.memory
    if resources.custom:
        options["resources"] = dict(resources.custom)
    return options


def plan(program: program_lib.Program, rules: Sequence[Rule] = DEFAULT_RULES) -> list[GroupPlan]:
    """The placement groups `program` needs: one per rule that matches any node.

    A node that asks for no resources at all gets no bundle (Ray rejects empty
    bundles; such a node fits anywhere). A node matched by two rules stays
    with the first.

    Raises:
      ValueError: if a rule member names a node ("group/index") the program lacks.
    """
    placed: set[str] = set()
    plans = []
    for rule in rules:
        names = []
        for member in rule.members:
            if member in program.groups:
                names.extend(spec.name for spec in program.groups[member])
            elif "/" in member:
                if member not in {spec.name for spec in program.nodes}:
                    raise ValueError(f"placement rule names node {member!r}, not in the program")
                names.append(member)
            # A group the program does not have (no Gorila workers in sync mode) is skipped.
        node_sets = [(names, "")]
        if rule.with_readers:
            node_sets = [_with_readers(program, name) for name in names]
        elif rule.with_near:
            node_sets = [_with_near(program, name, placed) for name in names]
            node_sets = [(members, label) for members, label in node_sets if len(members) > 1]
        for members, label in node_sets:
            members = [n for n in members if n not in placed and bundle(_resources(program, n))]
            placed.update(members)
            if members:
                bundles = tuple(bundle(_resources(program, n)) for n in members)
                plans.append(GroupPlan(rule.strategy, tuple(members), bundles, label))
    return plans


def _with_readers(program: program_lib.Program, name: str) -> tuple[list[str], str]:
    """Node `name` and the nodes that take its handle, and a label for their group."""
    readers = [spec.name for spec in program.nodes if name in spec.dependencies()]
    label = "+".join(dict.fromkeys([name] + [n.split("/")[0] for n in readers]))
    return [name, *readers], label


def _with_near(program: program_lib.Program, name: str, placed: set[str]) -> tuple[list[str], str]:
    """Node `name` and the nodes not yet placed that asked to be near it, and a label."""
    near = [spec.name for spec in program.nodes if spec.near == name and spec.name not in placed]
    label = "+".join(dict.fromkeys([name] + [n.split("/")[0] for n in near]))
    return [name, *near], label


def _resources(program: program_lib.Program, node_name: str) -> program_lib.Resources:
    return program.resources(program.node(node_name).group)


def alive_node_resources() -> list[dict[str, float]]:
    """Total resources of every live node of the connected cluster."""
    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def check_fits(program: program_lib.Program, nodes: Sequence[dict[str, float]]) -> None:
    """Raises at once if the cluster can never host `program`, naming group and resource.

    Two checks, both necessary (not sufficient) for a placement to exist:
    the program's total of each resource is within the cluster's, and every
    node's request fits within some single cluster node (two GPUs per learner
    cannot run on hosts with one GPU each, whatever the total). An
    autoscaling cluster that would add nodes on demand should skip this check.

    Args:
      program: the graph to run.
      nodes: the cluster's nodes' total resources (`alive_node_resources()`).

    Raises:
      UnplaceableError: naming the first group that cannot be hosted.
    """
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + amount
    wanted: dict[str, float] = {}
    for group, specs in program.groups.items():
        request = bundle(program.resources(group))
        for name, amount in request.items():
            if not any(node.get(name, 0.0) >= amount for node in nodes):
                largest = max((node.get(name, 0.0) for node in nodes), default=0.0)
                raise UnplaceableError(
                    f"group {group!r} asks for {amount:g} {name} per node, but no Ray node has "
                    f"that much (the largest has {largest:g}); lower the group's resources or "
                    "add a node that has them"
                )
            wanted[name] = wanted.get(name, 0.0) + amount * len(specs)
    for name, amount in wanted.items():
        if amount > totals.get(name, 0.0):
            users = [g for g in program.groups if name in bundle(program.resources(g))]
            raise UnplaceableError(
                f"program {program.name!r} asks for {amount:g} {name} in total (groups "
                f"{', '.join(repr(g) for g in users)}) but the Ray cluster has "
                f"{totals.get(name, 0.0):g}; lower the group resources or add nodes"
            )


class Placement:
    """Placement groups reserved on the cluster; `options` tells where each node goes."""

    def __init__(self, plans: Sequence[GroupPlan], groups: Sequence[Any]):
        self._slots = {
            node_name: (group, index)
            for group_plan, group in zip(plans, groups)
            for index, node_name in enumerate(group_plan.node_names)
        }
        self._groups = list(groups)

    def scheduling_strategy(self, node_name: str) -> Any:
        """The `scheduling_strategy` option of the node's actor; None: not placed by a rule."""
        if node_name not in self._slots:
            return None
        group, index = self._slots[node_name]
        return scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        )

    def options(self, node_name: str, resources: program_lib.Resources) -> dict[str, Any]:
        """All `ActorClass.options` keyword arguments for the node: resources and placement."""
        options = actor_options(resources)
        strategy = self.scheduling_strategy(node_name)
        if strategy is not None:
            options["scheduling_strategy"] = strategy
        return options

    def release(self) -> None:
        """Frees the reserved resources (the actors in them should be gone first)."""
        for group in self._groups:
            ray.util.remove_placement_group(group)
        self._groups = []


def reserve(
    program: program_lib.Program,
    rules: Sequence[Rule] = DEFAULT_RULES,
    timeout_s: float = 30.0,
    check: bool = True,
) -> Placement:
    """Checks the cluster, then reserves the placement groups `plan` gives.

    Args:
      program: the graph to run.
      rules: which nodes go together and how.
      timeout_s: how long to wait for Ray to reserve every group. The
        resources may exist but be held by another job; then this fails
        after `timeout_s` instead of waiting forever.
      check: run `check_fits` first (turn off for an autoscaling cluster).

    Raises:
      UnplaceableError: if the cluster cannot host the program, or a group
        was not reserved within `timeout_s`; nothing stays reserved then.
    """
    if check:
        check_fits(program, alive_node_resources())
    plans = plan(program, rules)
    run_id = uuid.uuid4().hex[:8]  # two runs of one program on a shared cluster stay apart
    groups = [
        ray.util.placement_group(
            list(p.bundles), strategy=p.strategy, name=f"{program.name}-{run_id}/{p.name}"
        )
        for p in plans
    ]
    placement = Placement(plans, groups)
    ready = [group.ready() for group in groups]
    done, _ = ray.wait(ready, num_returns=len(ready), timeout=timeout_s)
    if len(done) < len(ready):
        waiting = [p.name for p, ref in zip(plans, ready) if ref not in done]
        placement.release()
        raise UnplaceableError(
            f"Ray did not reserve resources for group(s) {', '.join(waiting)} within "
            f"{timeout_s:g}s: they exist in the cluster but are held by other work, or the "
            f"{'/'.join(p.strategy for p in plans if p.name in waiting)} placement cannot fit"
        )
    return placement


def node_ip_address() -> str | None:
    """This process's node IP as Ray knows it, or None outside a Ray cluster."""
    return ray.util.get_node_ip_address() if ray.is_initialized() else None
