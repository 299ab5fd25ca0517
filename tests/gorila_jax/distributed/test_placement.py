"""Placement on a simulated 3-node Ray cluster: learners spread, replay and actors packed,
custom resources honoured, impossible requests refused at once with the group's name."""

import time

import pytest

from gorila_jax.distributed import placement, program

from tests import REPO

# Logical resources of the simulated nodes; one machine runs them all.
NODE_CPUS = 2
TPU_CHIPS = 4


def _graph(groups: dict[str, tuple[program.Resources, int]]) -> program.Program:
    """A program whose nodes are never built: placement only reads groups and resources."""
    graph = program.Program("placement-test")
    for name, (resources, count) in groups.items():
        with graph.group(name, resources):
            for _ in range(count):
                graph.add_node(dict)
    return graph


def _gorila_like_graph() -> program.Program:
    return _graph(
        {
            "replay": (program.Resources(num_cpus=0.5), 1),
            "monitor": (program.Resources(num_cpus=0), 1),
            "learner": (program.Resources(num_cpus=1, memory=64 * 2**20), 2),
            "actor": (program.Resources(num_cpus=0.1), 3),
            "tpu_worker": (program.Resources(num_cpus=0, custom={"TPU": TPU_CHIPS}), 1),
        }
    )


def test_resources_reject_bad_values_naming_the_setting():
    with pytest.raises(ValueError, match="memory must be a non-negative number"):
        program.Resources(memory=-1)
    with pytest.raises(ValueError, match=r"custom\['TPU'\] must be a non-negative number"):
        program.Resources(custom={"TPU": -4})
    with pytest.raises(ValueError, match=r"custom\['GPU'\]: use num_gpus"):
        program.Resources(custom={"GPU": 1})
    with pytest.raises(ValueError, match="num_gpus above 1 must be whole"):
        program.Resources(num_gpus=1.5)
    custom = {"TPU": 4}
    resources = program.Resources(custom=custom)
    custom["TPU"] = 8  # the caller's dict is not the node's request
    assert resources.custom == {"TPU": 4}
    assert resources == program.Resources(custom={"TPU": 4}) and hash(resources)


def test_plan_spreads_learners_and_packs_replay_with_actors():
    plans = {p.name: p for p in placement.plan(_gorila_like_graph())}
    assert set(plans) == {"learner", "replay+actor"}  # monitor asks nothing; tpu_worker no rule
    assert plans["learner"].strategy == placement.SPREAD
    assert plans["learner"].node_names == ("learner/0", "learner/1")
    assert plans["learner"].bundles[0] == {"CPU": 1.0, "memory": 64.0 * 2**20}
    assert plans["replay+actor"].strategy == placement.PACK
    assert plans["replay+actor"].node_names == ("replay/0", "actor/0", "actor/1", "actor/2")


def test_rules_may_name_single_nodes_and_must_name_real_ones():
    rules = (placement.Rule(("replay/0", "actor/1"), "STRICT_PACK"),)
    (only,) = placement.plan(_gorila_like_graph(), rules)
    assert only.node_names == ("replay/0", "actor/1") and only.strategy == "STRICT_PACK"
    with pytest.raises(ValueError, match="'actor/7', not in the program"):
        placement.plan(_gorila_like_graph(), (placement.Rule(("actor/7",), "PACK"),))
    with pytest.raises(ValueError, match="strategy must be one of"):
        placement.Rule(("learner",), "SCATTER")


def _sharded_replay_program() -> program.Program:
    """The Gorila graph of a run with 2 replay shards and 4 actors: each shard (0.5 CPU) and
    its two actors (0.75 each) fill one 2-CPU node exactly; the learner takes 1 CPU."""
    from agents import dqn
    from gorila_jax import envs
    from gorila_jax.run import experiment

    cfg = experiment.ExperimentConfig(
        launcher="ray",
        num_actors=4,
        num_replay_shards=2,
        replay_cpus=0.5,
        cpus_per_actor=0.75,
        learner_cpus=1.0,
        eval_interval_s=0.0,
        checkpoint_interval_steps=0,
    )
    return experiment.make_program(dqn.DQNBuilder(dqn.DQNConfig()), cfg, envs.env_spec(cfg.env_id))


def test_plan_packs_each_replay_shard_with_the_actors_that_write_to_it():
    plans = {p.name: p for p in placement.plan(_sharded_replay_program())}
    # Actor i writes to shard i % 2 (sharded_replay.assigned_shard).
    assert plans["replay/0+actor"].node_names == ("replay/0", "actor/0", "actor/2")
    assert plans["replay/1+actor"].node_names == ("replay/1", "actor/1", "actor/3")
    assert plans["replay/0+actor"].strategy == placement.PACK
    assert "replay+actor" not in plans  # nothing was left for the catch-all rule


def test_check_fits_names_the_group_and_the_missing_resource():
    nodes = [{"CPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}]
    two_gpu_learners = _graph({"learner": (program.Resources(num_gpus=2), 1)})
    with pytest.raises(placement.UnplaceableError, match="group 'learner' asks for 2 GPU per node"):
        placement.check_fits(two_gpu_learners, nodes)
    too_many = _graph({"actor": (program.Resources(num_cpus=1), 5)})
    with pytest.raises(placement.UnplaceableError, match=r"5 CPU in total \(groups 'actor'\)"):
        placement.check_fits(too_many, nodes)
    placement.check_fits(_graph({"learner": (program.Resources(num_gpus=1), 1)}), nodes)


@pytest.fixture(scope="module")
def cluster():
    """Three simulated nodes; the second has TPU chips (a custom resource here)."""
    import ray
    from ray import cluster_utils

    store = 80 * 2**20  # Ray's minimum object store is 75 MiB
    simulated = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "include_dashboard": False,
            "object_store_memory": store,
        },
    )
    simulated.add_node(num_cpus=NODE_CPUS, resources={"TPU": TPU_CHIPS}, object_store_memory=store)
    simulated.add_node(num_cpus=NODE_CPUS, object_store_memory=store)
    simulated.wait_for_nodes()
    ray.init(address=simulated.address, runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    try:
        yield simulated
    finally:
        ray.shutdown()
        simulated.shutdown()


class _Where:
    """A Ray actor that says which node it runs on."""

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def placed_nodes(graph: program.Program, reserved_only: bool = False) -> dict[str, str]:
    """Reserves `graph`'s placement groups and starts one real Ray actor per node, placed
    as the reservation says; node name -> Ray node. Everything is released before it returns.

    Args:
      reserved_only: start only the nodes that ask for resources (the others go anywhere).
    """
    import ray

    reserved = placement.reserve(graph, timeout_s=60)
    where = ray.remote(_Where)
    actors = {}
    try:
        for spec in graph.nodes:
            resources = graph.resources(spec.group)
            if not reserved_only or placement.bundle(resources):
                actors[spec.name] = where.options(**reserved.options(spec.name, resources)).remote()
        return dict(
            zip(actors, ray.get([a.node_id.remote() for a in actors.values()], timeout=120))
        )
    finally:
        for actor in actors.values():
            ray.kill(actor)
        reserved.release()


def test_learners_land_on_different_nodes_and_actors_with_their_replay(cluster):
    import ray

    nodes = placed_nodes(_gorila_like_graph())
    assert nodes["learner/0"] != nodes["learner/1"]
    assert {nodes[f"actor/{i}"] for i in range(3)} == {nodes["replay/0"]}
    tpu_nodes = {n["NodeID"] for n in ray.nodes() if n["Resources"].get("TPU")}
    assert nodes["tpu_worker/0"] in tpu_nodes


@pytest.mark.timeout(180)
def test_each_replay_shards_actors_share_its_node(cluster):
    _wait_until_idle()
    nodes = placed_nodes(_sharded_replay_program())
    for index in range(4):
        assert nodes[f"actor/{index}"] == nodes[f"replay/{index % 2}"], index
    assert nodes["replay/0"] != nodes["replay/1"]  # each shard's group filled a node


@pytest.mark.timeout(60)  # a hang here is the bug under test
def test_impossible_requests_fail_fast_with_the_group_name(cluster):
    import ray

    before = len(ray.util.placement_group_table())
    gpu_learners = _graph({"learner": (program.Resources(num_gpus=1), 2)})
    with pytest.raises(placement.UnplaceableError, match="group 'learner' asks for 1 GPU"):
        placement.reserve(gpu_learners)
    many_tpus = _graph({"tpu_worker": (program.Resources(custom={"TPU": 2 * TPU_CHIPS}), 1)})
    with pytest.raises(placement.UnplaceableError, match="'tpu_worker' asks for 8 TPU per node"):
        placement.reserve(many_tpus)
    too_many_cpus = _graph({"actor": (program.Resources(num_cpus=NODE_CPUS), 4)})
    with pytest.raises(placement.UnplaceableError, match="asks for 8 CPU in total"):
        placement.reserve(too_many_cpus)
    assert len(ray.util.placement_group_table()) == before  # nothing was reserved


@pytest.mark.timeout(90)
def test_resources_held_by_other_work_fail_after_the_timeout_not_never(cluster):
    import ray

    hog = ray.util.placement_group([{"CPU": NODE_CPUS}] * 3, strategy="SPREAD")
    ray.get(hog.ready(), timeout=60)
    try:
        learners = _graph({"learner": (program.Resources(num_cpus=1), 2)})
        started = time.monotonic()
        with pytest.raises(placement.UnplaceableError, match=r"group\(s\) learner within 3s"):
            placement.reserve(learners, timeout_s=3)
        assert time.monotonic() - started < 45  # a liveness bound: it returned, it did not hang
    finally:
        ray.util.remove_placement_group(hog)
    states = {g["state"] for g in ray.util.placement_group_table().values()}
    assert "PENDING" not in states  # the failed reservation was removed, not left queued


def _wait_until_idle(timeout_s: float = 60.0) -> None:
    """Waits for the previous tests' actors to give their CPUs back (ray.kill is asynchronous):
    a soft SPREAD falls back to one node when only one has room."""
    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        assert time.monotonic() < deadline, "the cluster's CPUs were not released"
        time.sleep(0.2)


def _learner_graph() -> program.Program:
    """Two learner nodes (one CPU each) that say where they run, as a launched program."""
    graph = program.Program("placement-launch")
    with graph.group("learner", program.Resources(num_cpus=1)):
        for _ in range(2):
            handle = graph.add_node(_Where)
            graph.node(handle.name).restartable(lambda counters: {})
    return graph


@pytest.mark.timeout(300)
def test_the_ray_launcher_spreads_a_learner_group_and_releases_its_reservation(cluster):
    import ray

    from gorila_jax.distributed import launchers

    def reserved_for_this_program() -> list[str]:
        return [
            group["state"]
            for group in ray.util.placement_group_table().values()
            if group["name"].startswith("placement-launch-")
        ]

    _wait_until_idle()  # the previous test's placement groups are removed asynchronously
    with launchers.launch(_learner_graph(), "ray") as running:
        nodes = {name: running.client(name).node_id() for name in ("learner/0", "learner/1")}
        assert reserved_for_this_program() == ["CREATED"]  # one group: the learner rule
    assert nodes["learner/0"] != nodes["learner/1"]
    assert reserved_for_this_program() == ["REMOVED"]  # stop() gave the resources back


@pytest.mark.timeout(60)
def test_the_ray_launcher_refuses_an_impossible_program_at_once(cluster):
    from gorila_jax.distributed import launchers

    gpu_learners = _graph({"learner": (program.Resources(num_gpus=1), 2)})
    with pytest.raises(placement.UnplaceableError, match="group 'learner' asks for 1 GPU"):
        launchers.launch(gpu_learners, "ray")


@pytest.mark.timeout(300)
def test_a_learner_whose_node_is_removed_is_restarted_by_the_supervisor_on_a_live_node(cluster):
    """The restart path end to end: the launcher reports the lost node's actor dead, the
    supervisor restarts it, and the replacement, placed in its group's bundle (which Ray
    re-reserves), runs on a surviving node. Runs last: it shrinks the shared cluster."""
    import ray

    from gorila_jax.distributed import launchers
    from gorila_jax.health import monitor
    from gorila_jax.health import supervisor as supervisor_lib

    _wait_until_idle()
    with launchers.launch(_learner_graph(), "ray") as running:
        nodes = {name: running.client(name).node_id() for name in ("learner/0", "learner/1")}
        supervisor = supervisor_lib.Supervisor(
            running, monitor.MonitorNode(), 0.0, 0.0, max_restarts=1, startup_timeout_s=240
        )
        # Remove a learner's node that is not the head (the driver is connected there).
        lost_name, lost_node_id = next(
            (name, node_id)
            for name, node_id in nodes.items()
            if node_id != cluster.head_node.node_id
        )
        lost = next(n for n in cluster.list_all_nodes() if n.node_id == lost_node_id)
        cluster.remove_node(lost)
        lines: list[str] = []
        deadline = time.monotonic() + 180  # a liveness bound for Ray noticing the loss
        while not lines and time.monotonic() < deadline:
            lines = supervisor.check()
            time.sleep(0.5)
        assert len(lines) == 1 and f"restarted {lost_name}" in lines[0] and "died" in lines[0]
        new_node = running.client(lost_name).node_id()
        assert supervisor.check() == []  # the replacement is healthy
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert new_node in alive and new_node != lost_node_id
