"""Parameter-server shards: exact split/join, balance by size, versions under concurrency."""

import threading

import jax
import numpy as np
import optax
import pytest

from gorila_jax.gorila import compression, parameter_server, shard_node

UNBALANCED = {
    "big": np.arange(3136 * 64, dtype=np.float32).reshape(3136, 64),
    "small": [np.ones(3, np.float32), np.full((2, 2), 7.0, np.float32)],
    "bias": np.linspace(-1, 1, 5).astype(np.float32),
}


def _leaves_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), y)


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7])
def test_split_then_join_round_trips_any_pytree_exactly(num_shards):
    layout = parameter_server.ShardLayout(UNBALANCED, num_shards)
    parts = layout.split(UNBALANCED)
    assert len(parts) == num_shards
    _leaves_equal(layout.join(parts), UNBALANCED)


def test_shards_balance_by_size_not_by_layer():
    layout = parameter_server.ShardLayout(UNBALANCED, 4)
    lengths = [len(part) for part in layout.split(UNBALANCED)]
    assert max(lengths) - min(lengths) <= 1  # one layer holds 99.9% of the values


def test_bad_shard_counts_and_mismatched_slices_are_rejected():
    with pytest.raises(ValueError, match="num_ps_shards must lie in"):
        parameter_server.ShardLayout(UNBALANCED, 0)
    layout = parameter_server.ShardLayout(UNBALANCED, 2)
    with pytest.raises(ValueError, match="do not match the layout"):
        layout.join(layout.split(UNBALANCED)[::-1][:1])


def _push(shard, gradient, version):
    return shard.push(compression.GradientCompressor("none").encode(gradient), version)


def test_a_push_applies_the_optimizer_and_bumps_the_version_once():
    shard = parameter_server.ParameterShard(np.ones(4, np.float32), optax.sgd(0.5))
    result = _push(shard, np.array([1, 2, 3, 4], np.float32), version=0)
    assert result == parameter_server.PushResult(True, 1, 0)
    version, params = shard.get()
    assert version == 1
    np.testing.assert_allclose(params, [0.5, 0.0, -0.5, -1.0])
    assert shard.get(held_version=1) is None


def test_concurrent_pushes_each_apply_once_and_lose_nothing():
    shard = parameter_server.ParameterShard(np.zeros(100, np.float32), optax.sgd(1.0))
    rng = np.random.default_rng(0)
    gradients = rng.integers(-5, 5, (8, 50, 100)).astype(np.float32)  # exact sums in float32

    def worker(index):
        for gradient in gradients[index]:
            _push(shard, gradient, version=shard.get()[0])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    version, params = shard.get()
    assert version == shard.counters["applied"] == 400
    np.testing.assert_array_equal(params, -gradients.sum(axis=(0, 1)))


def test_stale_gradients_are_dropped_and_counted():
    shard = parameter_server.ParameterShard(
        np.zeros(3, np.float32), optax.sgd(1.0), max_staleness=1
    )
    ones = np.ones(3, np.float32)
    assert _push(shard, ones, version=0).applied  # staleness 0
    assert _push(shard, ones, version=0).applied  # staleness 1
    dropped = _push(shard, ones, version=0)  # staleness 2 > 1
    assert not dropped.applied and dropped.staleness == 2
    assert shard.counters["dropped_stale"] == 1 and shard.get()[0] == 2
    np.testing.assert_array_equal(shard.get()[1], -2 * ones)


def test_readers_are_not_blocked_by_an_update_in_progress():
    shard = parameter_server.ParameterShard(np.zeros(3, np.float32), optax.sgd(1.0))
    read = threading.Event()
    with shard._update_lock:  # an update is being applied
        reader = threading.Thread(target=lambda: (shard.get(), read.set()))
        reader.start()
        assert read.wait(timeout=30)
    reader.join()


def test_staleness_scaling_moves_parameters_less_for_older_gradients():
    shard = parameter_server.ParameterShard(
        np.zeros(3, np.float32), optax.sgd(1.0), staleness_scaling=True
    )
    ones = np.ones(3, np.float32)
    _push(shard, ones, version=0)  # fresh: the whole step
    np.testing.assert_array_equal(shard.get()[1], -ones)
    _push(shard, ones, version=0)  # one version stale: half a step
    np.testing.assert_array_equal(shard.get()[1], -1.5 * ones)
    _push(shard, ones, version=0)  # two versions stale: a third
    np.testing.assert_allclose(shard.get()[1], -(1.5 + 1 / 3) * ones, rtol=1e-6)


class _Reports:
    """A monitor client that keeps the metrics of every report."""

    def __init__(self):
        self.metrics: list[dict] = []
        self.futures = self

    def report(self, name, counters, metrics=None):
        self.metrics.append(dict(metrics or {}))


def test_a_shard_node_counts_the_parameter_bytes_it_serves_and_reports_them_per_version():
    from agents import dqn
    from gorila_jax import envs
    from tests import fakes
    from tests.agents.dqn.test_learning import TINY

    reports = _Reports()
    node = shard_node.ParameterShardNode(
        dqn.DQNBuilder(TINY),
        envs.env_spec("CartPole-v1"),
        0,
        0,
        2,
        shard_node.ShardSettings(max_staleness=-1, heartbeat_interval_s=0.01),
        monitor=reports,
    )
    version, full = node.get()  # a worker's (or the evaluator's) full slice
    assert node.get(version) is None  # nothing newer: costs nothing
    _, first = node.get_delta("actor/0", has_base=False)  # an actor's first: the full slice
    assert node.get_delta("actor/0", version) is None
    gradient = compression.GradientCompressor("none").encode(np.ones_like(full))
    result, (new_version, refreshed) = node.push_and_get(gradient, version, version)
    assert result.applied and new_version == version + 1
    _, delta = node.get_delta("actor/0", version)
    assert delta.nbytes < first.nbytes == full.nbytes  # what went on the wire is counted
    sent = full.nbytes + first.nbytes + refreshed.nbytes + delta.nbytes
    assert node.counters()["bytes_served"] == sent

    runner = threading.Thread(target=node.run, daemon=True)
    runner.start()
    try:
        assert fakes.wait_until(lambda: reports.metrics, timeout_s=30)
    finally:
        node.stop()
        runner.join(10)
    metrics = reports.metrics[-1]
    assert metrics["shard0/params_bytes_served"] == sent
    assert metrics["shard0/params_bytes_served_per_version"] == sent / new_version
