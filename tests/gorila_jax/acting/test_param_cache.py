"""The per-host parameter cache: one upstream fetch per version for many actors, the learner's
`get_params` contract, restarts, config checks, placement beside its actors, and the bytes a
real CartPole run saves."""

import concurrent.futures
import csv
import dataclasses
import json
import os
import threading

import numpy as np
import pytest

from agents import dqn
from gorila_jax import envs
from gorila_jax.acting import param_cache
from gorila_jax.distributed import placement, program
from gorila_jax.health import monitor
from gorila_jax.learning import checkpoint
from gorila_jax.run import experiment
from tests import REPO
from tests import fakes
from tests.gorila_jax.distributed.test_placement import placed_nodes
from tests.gorila_jax.replay.test_sharded_replay import saved_shard_use

SPEC = envs.env_spec("CartPole-v1")
PARAM_VALUES = 250  # float32: 1000 bytes per version
PARAM_BYTES = 4 * PARAM_VALUES


class _Learner:
    """Stands in for `LearnerNode.get_params`: same rule, counts what it sends; a closed
    `gate` holds every call, as a slow or restarting learner would."""

    def __init__(self):
        self._lock = threading.Lock()
        self.version = 0
        self.calls = 0
        self.sent_versions: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def publish(self) -> None:
        with self._lock:
            self.version += 1

    def get_params(self, newer_than: int = -1):
        self.gate.wait()
        with self._lock:
            self.calls += 1
            if self.version <= newer_than:
                return None
            self.sent_versions.append(self.version)
            return self.version, {"w": np.full(PARAM_VALUES, self.version, np.float32)}

    @property
    def bytes_sent(self) -> int:
        return len(self.sent_versions) * PARAM_BYTES


def _cache(upstream, **kwargs) -> param_cache.ParameterCache:
    # builder and spec only matter for Gorila shards; a learner client is used as it is.
    return param_cache.ParameterCache(upstream, None, SPEC, 0, host_index=0, **kwargs)


def _ask_together(cache, newer_than: int, num_actors: int, learner: _Learner) -> list:
    """`num_actors` concurrent requests, all in the cache before the held upstream call returns."""
    before = cache.counters()["requests"]
    with concurrent.futures.ThreadPoolExecutor(num_actors) as pool:
        learner.gate.clear()
        futures = [pool.submit(cache.get_params, newer_than) for _ in range(num_actors)]
        assert fakes.wait_until(
            lambda: cache.counters()["requests"] == before + num_actors, timeout_s=30
        )
        learner.gate.set()
        return [f.result(timeout=30) for f in futures]


def test_concurrent_actors_cause_one_upstream_fetch_per_version():
    learner, num_actors = _Learner(), 8
    cache = _cache(learner)
    try:
        for expected_version in range(3):
            held = expected_version - 1  # every actor holds the previous version (-1: none)
            answers = _ask_together(cache, held, num_actors, learner)
            assert [a[0] for a in answers] == [expected_version] * num_actors
            for _, params in answers:
                np.testing.assert_array_equal(params["w"], expected_version)
            learner.publish()
        # Each version crossed from the learner once: 3 x size, not 3 x 8 x size.
        assert learner.sent_versions == [0, 1, 2]
        counters = cache.counters()
        assert counters["bytes_received"] == learner.bytes_sent == 3 * PARAM_BYTES
        assert counters["bytes_served"] == 3 * num_actors * PARAM_BYTES
        assert counters["fetches"] == 3
    finally:
        cache.close()


def test_many_actors_pulling_freely_never_get_a_version_twice_from_upstream():
    """Actors pull like `ParameterPuller` while the learner publishes: whatever the
    interleaving, a version is sent to the cache at most once."""
    learner, num_actors, last = _Learner(), 6, 40
    cache = _cache(learner)

    def act() -> int:
        held, pulls = -1, 0
        while held < last:
            answer = cache.get_params(held)
            pulls += 1
            if answer is not None:
                held = answer[0]
        return pulls

    try:
        with concurrent.futures.ThreadPoolExecutor(num_actors + 1) as pool:
            actors = [pool.submit(act) for _ in range(num_actors)]
            for _ in range(last):
                learner.publish()
                threading.Event().wait(0.002)
            assert all(a.result(timeout=60) > 0 for a in actors)
        sent = learner.sent_versions
        assert sent == sorted(set(sent)) and len(sent) <= last + 1
        assert cache.counters()["bytes_received"] == learner.bytes_sent
        # Without the cache the learner would have sent every reply the actors got.
        assert cache.counters()["bytes_served"] >= num_actors * PARAM_BYTES
    finally:
        cache.close()


def test_newer_than_means_what_it_means_to_the_learner():
    learner = _Learner()
    for _ in range(3):
        learner.publish()
    cache = _cache(learner)
    try:
        for newer_than in (-1, 0, 2, 3, 7, 1, 3):
            direct, cached = learner.get_params(newer_than), cache.get_params(newer_than)
            assert (direct is None) == (cached is None), newer_than
            if direct is not None:
                assert cached[0] == direct[0] == 3
                np.testing.assert_array_equal(cached[1]["w"], direct[1]["w"])
    finally:
        cache.close()


def test_a_slow_upstream_holds_only_actors_that_are_up_to_date_and_for_one_call():
    learner = _Learner()
    cache = _cache(learner)
    try:
        assert cache.get_params(-1)[0] == 0
        learner.publish()
        learner.gate.clear()  # the learner is slow from now on
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            up_to_date = pool.submit(cache.get_params, 0)
            assert fakes.wait_until(lambda: cache.counters()["requests"] == 2, timeout_s=30)
            # An actor behind the cache's copy is answered from it, upstream call or not.
            assert cache.get_params(-1)[0] == 0
            # A second up-to-date actor joins the call in flight rather than starting one.
            joining = pool.submit(cache.get_params, 0)
            assert fakes.wait_until(lambda: cache.counters()["requests"] == 4, timeout_s=30)
            assert not up_to_date.done() and not joining.done()
            learner.gate.set()
            assert up_to_date.result(timeout=30)[0] == joining.result(timeout=30)[0] == 1
        assert learner.calls == 2  # the first fill and the one held call
    finally:
        cache.close()


def test_min_fetch_interval_answers_up_to_date_actors_none_without_asking_upstream():
    learner = _Learner()
    cache = _cache(learner, min_fetch_interval_s=3600.0)
    try:
        assert cache.get_params(-1)[0] == 0
        learner.publish()
        assert cache.get_params(0) is None  # within the interval: no second call
        assert learner.calls == 1
    finally:
        cache.close()


def test_a_restarted_cache_starts_empty_fetches_again_and_continues_its_byte_totals():
    learner = _Learner()
    first = _cache(learner)
    first.get_params(-1)
    learner.publish()
    first.get_params(0)
    counters = first.counters()
    first.close()
    learner.publish()
    # What the supervisor passes a restarted cache: its predecessor's last counters.
    restarted = _cache(learner, **monitor.continue_counters(counters))
    try:
        assert restarted.version() == -1
        # An actor still holding version 1 gets the newest at its next pull.
        version, params = restarted.get_params(1)
        assert version == 2 and params["w"][0] == 2
        assert restarted.counters()["bytes_received"] == counters["bytes_received"] + PARAM_BYTES
        assert learner.sent_versions == [0, 1, 2]
    finally:
        restarted.close()


def test_bad_cache_settings_are_rejected_naming_the_setting():
    with pytest.raises(ValueError, match="param_cache_per_host needs actors_per_host"):
        experiment.ExperimentConfig(param_cache_per_host=True).validate()
    with pytest.raises(ValueError, match="actors_per_host=2 only groups actors"):
        experiment.ExperimentConfig(actors_per_host=2).validate()
    with pytest.raises(ValueError, match="actors_per_host must not be negative"):
        experiment.ExperimentConfig(actors_per_host=-1).validate()
    with pytest.raises(ValueError, match="param_cache_cpus must be positive"):
        experiment.ExperimentConfig(
            param_cache_per_host=True, actors_per_host=2, param_cache_cpus=0
        ).validate()
    with pytest.raises(ValueError, match="param_cache_min_fetch_interval_s must not be negative"):
        experiment.ExperimentConfig(param_cache_min_fetch_interval_s=-1.0).validate()


CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=200,
    max_replay_size=5_000,
    samples_per_insert=2.0,
    epsilon_decay_steps=2_000,
)


def _cache_experiment(**overrides) -> experiment.ExperimentConfig:
    settings = dict(
        launcher="local",
        num_actors=4,
        num_envs_per_actor=4,
        num_learner_devices=1,
        eval_interval_s=0,
        eval_episodes=2,
        log_interval_s=0.5,
        heartbeat_interval_s=0.2,
        checkpoint_interval_steps=0,
        param_cache_per_host=True,
        actors_per_host=2,
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


def test_actors_of_a_host_read_its_cache_and_ray_packs_them_together_in_the_plan():
    cfg = _cache_experiment(num_actors=5, launcher="ray")
    graph = experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, SPEC)
    caches = [spec.name for spec in graph.groups["param_cache"]]
    assert caches == ["param_cache/0", "param_cache/1", "param_cache/2"]  # 2 + 2 + 1 actors
    for index in range(5):
        assert graph.node(f"actor/{index}").dependencies() >= {f"param_cache/{index // 2}"}
        assert "learner/0" not in graph.node(f"actor/{index}").dependencies()
    assert graph.node("param_cache/0").restart_kwargs is not None
    plans = {p.name: p for p in placement.plan(graph)}
    assert plans["param_cache/0+actor"].node_names == ("param_cache/0", "actor/0", "actor/1")
    assert plans["param_cache/2+actor"].node_names == ("param_cache/2", "actor/4")
    assert plans["param_cache/1+actor"].strategy == placement.PACK
    assert plans["replay"].node_names == ("replay/0",)  # its actors went with their caches


def test_a_resumed_run_continues_each_hosts_cache_byte_totals(tmp_path):
    """--resume hands each cache the counters the checkpoint holds for it (the monitor's
    totals start from them too), so its byte totals go on instead of restarting at 0."""
    saved = {"requests": 40, "replies": 38, "bytes_served": 38_000, "fetches": 9}
    saved["bytes_received"] = 9_000
    meta = {"node_counters": {"param_cache/1": saved, "actor/2": {"env_steps": 500}}}
    resume = checkpoint.Restored(step=10, state=None, meta=meta)
    cfg = _cache_experiment(logdir=str(tmp_path), checkpoint_interval_steps=100)
    graph = experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, SPEC, resume)
    assert graph.node("param_cache/1").kwargs["restored_counters"] == saved
    assert graph.node("param_cache/0").kwargs["restored_counters"] is None  # none saved: from 0
    # A cache built as the program builds it serves on from the saved totals.
    learner = _Learner()
    cache = _cache(
        learner, restored_counters=graph.node("param_cache/1").kwargs["restored_counters"]
    )
    try:
        cache.get_params(-1)
        assert cache.counters()["bytes_served"] == saved["bytes_served"] + PARAM_BYTES
        assert cache.counters()["bytes_received"] == saved["bytes_received"] + PARAM_BYTES
    finally:
        cache.close()


def _last_row(logdir) -> dict[str, float]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return {k: float(v) for k, v in list(csv.DictReader(f))[-1].items() if v}


def test_a_cartpole_run_with_two_host_caches_sends_about_half_the_bytes(tmp_path):
    """4 actors on 2 hosts: the learner sends each version to 2 caches instead of 4 actors,
    and the actors still act with fresh parameters."""
    builder = dqn.DQNBuilder(CONFIG)
    steps = 4_000
    cached = experiment.run_experiment(
        builder, _cache_experiment(logdir=str(tmp_path / "cached"), total_env_steps=steps)
    )
    direct = experiment.run_experiment(
        builder,
        _cache_experiment(
            logdir=str(tmp_path / "direct"),
            total_env_steps=steps,
            param_cache_per_host=False,
            actors_per_host=0,
        ),
    )
    assert cached["learner_steps"] > 0 and direct["learner_steps"] > 0
    nodes = json.loads((tmp_path / "cached" / experiment.NODE_STATUS_FILE).read_text())
    learner_steps = nodes["learner/0"]["counters"]["learner_steps"]
    for index in range(4):
        # Fresh parameters reached every actor through its cache.
        version = nodes[f"actor/{index}"]["counters"]["param_version"]
        assert version >= learner_steps // 2 > 0, (index, version, learner_steps)
    received = sum(nodes[f"param_cache/{h}"]["counters"]["bytes_received"] for h in range(2))
    served = sum(nodes[f"param_cache/{h}"]["counters"]["bytes_served"] for h in range(2))
    assert served > received > 0
    # Bytes the learner sent per env step, cache vs none: about hosts / actors = 1/2.
    with_cache, without = _last_row(tmp_path / "cached"), _last_row(tmp_path / "direct")
    ratio = (with_cache["params_bytes_served"] / with_cache["env_steps"]) / (
        without["params_bytes_served"] / without["env_steps"]
    )
    assert 0.3 < ratio < 0.75, ratio


def test_gorila_actors_read_the_shards_through_their_host_caches(tmp_path):
    """In Gorila mode a cache assembles the shards' slices (as one delta receiver) and
    its actors act with the versions the shards reach. The run's replay has two shards:
    the gradient workers sample both and send their priorities to the owning one."""
    cfg = _cache_experiment(
        logdir=str(tmp_path),
        total_env_steps=3_000,
        learner_mode="gorila",
        num_learners=2,
        num_ps_shards=2,
        num_replay_shards=2,
        checkpoint_interval_steps=10**6,  # only the final one, to read the shards from
    )
    config = dataclasses.replace(CONFIG, min_replay_size=500)
    summary = experiment.run_experiment(dqn.DQNBuilder(config), cfg)
    final = checkpoint.saved_steps(tmp_path)[-1]
    for use in saved_shard_use(tmp_path, final, dqn.builder.TABLE, config.initial_priority):
        assert min(use["inserts"], use["samples"], use["updated_priorities"]) > 0, use
    nodes = json.loads((tmp_path / experiment.NODE_STATUS_FILE).read_text())
    assert summary["params_version"] > 0
    for index in range(4):
        version = nodes[f"actor/{index}"]["counters"]["param_version"]
        assert version >= summary["params_version"] // 2 > 0, (index, version)
    for host in range(2):
        counters = nodes[f"param_cache/{host}"]["counters"]
        assert counters["fetches"] > 1 and counters["bytes_served"] > counters["bytes_received"]


@pytest.fixture(scope="module")
def two_node_cluster():
    """Two simulated Ray nodes of 2 CPUs each: one per actor host."""
    import ray
    from ray import cluster_utils

    store = 80 * 2**20  # Ray's minimum object store is 75 MiB
    simulated = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False, "object_store_memory": store},
    )
    simulated.add_node(num_cpus=2, object_store_memory=store)
    simulated.wait_for_nodes()
    ray.init(address=simulated.address, runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    try:
        yield simulated
    finally:
        ray.shutdown()
        simulated.shutdown()


@pytest.mark.timeout(180)
def test_each_hosts_cache_and_actors_land_on_one_ray_node(two_node_cluster):
    """Each host (a cache at 0.5 CPU and two actors at 0.75) fills one 2-CPU node exactly,
    so the two hosts take one node each, and no actor sits away from its cache."""
    cfg = _cache_experiment(
        launcher="ray", cpus_per_actor=0.75, param_cache_cpus=0.5, learner_cpus=0, replay_cpus=0
    )
    graph = experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, SPEC)
    nodes = placed_nodes(graph, reserved_only=True)  # the nodes that ask for nothing go anywhere
    for host in range(2):
        host_nodes = {nodes[f"actor/{2 * host}"], nodes[f"actor/{2 * host + 1}"]}
        assert host_nodes == {nodes[f"param_cache/{host}"]}, nodes
    assert nodes["param_cache/0"] != nodes["param_cache/1"], nodes


def test_program_resources_of_the_cache_group_follow_the_config():
    cfg = _cache_experiment(param_cache_cpus=0.5)
    graph = experiment.make_program(dqn.DQNBuilder(CONFIG), cfg, SPEC)
    assert graph.resources("param_cache") == program.Resources(num_cpus=0.5)
    no_cache = experiment.make_program(
        dqn.DQNBuilder(CONFIG),
        _cache_experiment(param_cache_per_host=False, actors_per_host=0),
        SPEC,
    )
    assert "param_cache" not in no_cache.groups
