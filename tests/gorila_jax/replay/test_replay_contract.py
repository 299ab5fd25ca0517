"""The replay interface's contract, held by every backend on real servers.

Each test runs on Reverb (a Reverb server per node), on the native backend in
this process (what the local launcher runs), and on the native backend hosted
by the Ray launcher (a Ray actor per node, reached through the program's
client as actors and learners reach it). Items are 16-byte rows whose first
8 bytes hold the item's id, so a test can tell which items it sampled.
"""

import functools
import math
import threading
import time

import numpy as np
import pytest
import scipy.stats

from agents import dqn
from gorila_jax import envs, replay, types
from gorila_jax.distributed import launchers
from gorila_jax.distributed import program as program_lib
from tests import conftest
from tests.backends import REVERB_MARKS, needs_ray, needs_reverb

TABLE = "t"
WIDTH = 16
ALPHA = 0.6
BACKENDS = (
    pytest.param("reverb", marks=REVERB_MARKS),
    "native",
    pytest.param("native-ray", marks=needs_ray),
)


def _rows(ids) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    rows = np.zeros((len(ids), WIDTH), np.uint8)
    rows[:, :8] = ids.reshape(-1, 1).view(np.uint8)
    return rows


def _ids(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(rows)[:, :8]).view(np.int64).reshape(-1)


# What each test's nodes hold; module-level functions, so that Ray can send them.
def _prioritized(alpha: float = ALPHA, max_size: int = 100) -> list[replay.TableSpec]:
    return [replay.prioritized_table(TABLE, max_size, alpha, replay.RateLimit(1), WIDTH)]


def _uniform(max_size: int) -> list[replay.TableSpec]:
    return [replay.uniform_table(TABLE, max_size, replay.RateLimit(1), WIDTH)]


def _ratio(samples_per_insert: float, min_size: int, error_buffer: float):
    limit = replay.RateLimit(min_size, samples_per_insert, error_buffer)
    return [replay.uniform_table(TABLE, 1000, limit, WIDTH)]


def _queue(max_size: int) -> list[replay.TableSpec]:
    return [replay.queue_table(TABLE, max_size, WIDTH)]


NODES = {
    "probabilities": functools.partial(_prioritized),
    "fifo": functools.partial(_uniform, 10),
    "narrow": functools.partial(_uniform, 10),
    "ratio": functools.partial(_ratio, 2.0, 4, 4.0),
    "queue": functools.partial(_queue, 8),
    "ring": functools.partial(_prioritized, 1.0, 10),
    "shard0": functools.partial(_prioritized, 1.0),
    "shard1": functools.partial(_prioritized, 1.0),
}


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory):
    """One Ray program hosting a native node for every test (launched once: ~10 s)."""
    checkpoints = str(tmp_path_factory.mktemp("ray-checkpoints"))
    graph = program_lib.Program("contract")
    with graph.group("replay", program_lib.Resources(num_cpus=0)):
        names = {}
        for name, make_tables in NODES.items():
            handle = graph.add_node(replay.NativeReplayNode, make_tables, seed=len(names))
            names[name] = handle.name
        handle = graph.add_node(
            replay.NativeReplayNode, functools.partial(_prioritized), checkpoint_dir=checkpoints
        )
        names["checkpoint"] = handle.name
    with launchers.launch(graph, "ray", **conftest.RAY_TEST_OPTIONS) as running:
        yield running, names


@pytest.fixture(params=BACKENDS)
def nodes(request, tmp_path):
    """name -> a replay node of the backend under test (`NODES`, and "checkpoint")."""
    made = []

    def make(name: str, **options):
        if request.param == "native-ray":
            running, names = request.getfixturevalue("ray_nodes")
            if "restore_step" in options:  # kill the node's process, start one restoring
                running.restart(names[name], {"restore_step": options["restore_step"]})
            return running.client(names[name])
        backend = replay.NATIVE if request.param == "native" else replay.REVERB
        make_tables = NODES.get(name, functools.partial(_prioritized))
        node = replay.node_class(backend)(make_tables, **options)
        made.append(node)
        return node

    make.backend = request.param
    yield make
    for node in made:
        node.close()


def _write(node, ids, priorities=None) -> None:
    writer = replay.connect(node).writer(TABLE, max_pending=1)
    priorities = np.ones(len(ids)) if priorities is None else priorities
    writer.write(_rows(ids), np.asarray(priorities, np.float64))
    writer.close()


def _sample(nodes: list, rows: int, batch_size: int = 100) -> list[replay.Batch]:
    shards = replay.ReplayShards(nodes)
    sampler = shards.sampler(TABLE, None)
    try:
        found = []
        while len(found) * batch_size < rows:
            batches = sampler.batches(batch_size)
            found += [batch for _, batch in zip(range(rows // batch_size - len(found)), batches)]
        return found
    finally:
        sampler.close()


def test_sampling_follows_priority_to_the_alpha_with_the_probabilities_it_returns(nodes):
    node = nodes("probabilities")
    priorities = np.arange(1, 9, dtype=np.float64)
    _write(node, range(8), priorities)
    batches = _sample([node], 20_000)
    ids = np.concatenate([_ids(batch.data) for batch in batches])
    expected = priorities**ALPHA / np.sum(priorities**ALPHA)
    observed = np.bincount(ids, minlength=8)
    assert scipy.stats.chisquare(observed, expected * len(ids)).pvalue > 1e-6
    probabilities = np.concatenate([batch.probabilities for batch in batches])
    np.testing.assert_allclose(probabilities, expected[ids], rtol=1e-5)
    # Importance weights (N P)^-beta need the table size with each row.
    assert all((batch.table_size == 8).all() for batch in batches)


def test_a_full_table_removes_its_oldest_items_first(nodes):
    node = nodes("fifo")
    _write(node, range(15))
    ids = np.concatenate([_ids(batch.data) for batch in _sample([node], 2000)])
    assert set(ids.tolist()) == set(range(5, 15))
    assert node.table_info()[TABLE]["size"] == 10


def test_the_rate_limiter_holds_samples_and_inserts_at_the_stated_ratio(nodes):
    """spi 2, min size 4, error buffer 4: samples may trail inserts * 2 by at least
    4 * 2 - 4 = 4 and lead by at most 4 * 2 + 4 = 12."""
    node = nodes("ratio")
    _write(node, range(3))
    assert _drain(node) == 0  # below the minimum size
    _write(node, [3])
    assert _drain(node) == 4 * 2 - 4  # released at the minimum size, up to min_diff
    _write(node, [4])
    assert _drain(node) == 5 * 2 - 4  # one insert releases spi more
    # Inserts may go on while 2 * inserts - samples <= 12: with samples 6, up to 9.
    stop = threading.Event()
    writer = replay.connect(node).writer(TABLE, max_pending=1, stop_event=stop)
    threading.Timer(3.0, stop.set).start()
    with pytest.raises(replay.Stopped):  # at the write, or at the flush (calls in flight)
        writer.write(_rows(range(5, 20)), np.ones(15))
        writer.flush()
    writer.close()
    # Against the table's own count of samples: a Reverb dataset's request still in
    # flight when `_drain` closed it may land later (seen once: 8 samples, 10 inserts).
    info = node.table_info()[TABLE]
    assert info["samples"] >= 6
    assert info["inserts"] == (info["samples"] + 12) // 2


def _drain(node) -> int:
    """Samples one row at a time until the rate limiter holds them; returns the samples
    the table served in all, which is what the limiter allowed so far.

    The table's count, not this sampler's: Reverb's datasets sample ahead of use, and
    a request of an earlier, closed sampler can still wait on the server and take a
    sample the next insert releases (CI at 9431dea: a drain after one insert saw 0 of
    its 2). Whoever takes them, the total is the limiter's.
    """
    sampler = replay.ReplayShards([node]).sampler(TABLE, None)
    try:
        for _ in sampler.batches(1):
            pass
    finally:
        sampler.close()
    return int(node.table_info()[TABLE]["samples"])


def test_a_queue_gives_each_item_once_and_holds_writers_while_full(nodes):
    node = nodes("queue")
    _write(node, range(8))
    batches = [_ids(batch.data).tolist() for batch in _sample([node], 8, batch_size=4)]
    assert sorted(batches[0] + batches[1]) == list(range(8))
    if nodes.backend != "reverb":  # Reverb's datasets interleave their workers' samples
        assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]], "oldest first"
    assert node.table_info()[TABLE]["size"] == 0
    _write(node, range(8, 16))  # room again, up to the queue's size
    _top_up(node, 8, next_id=16)
    stop = threading.Event()
    writer = replay.connect(node).writer(TABLE, max_pending=1, stop_event=stop)
    threading.Timer(2.0, stop.set).start()
    with pytest.raises(replay.Stopped):
        writer.write(_rows([99]), np.ones(1))
        writer.flush()


def _top_up(node, size: int, next_id: int) -> None:
    """Writes until the table holds `size` items and stays there: under Reverb a request
    of the closed sampler can still wait on the server and take an item as it arrives
    (CI at 9431dea: the queue then had room for the write that should have waited)."""
    steady = 0
    while steady < 3:
        time.sleep(0.2)
        held = node.table_info()[TABLE]["size"]
        if held < size:
            _write(node, range(next_id, next_id + size - held))
            next_id += size - held
            steady = 0
        else:
            steady += 1


def test_priority_updates_reach_their_items_after_inserts_moved_the_ring(nodes):
    node = nodes("ring")
    _write(node, range(10))
    (batch,) = _sample([node], 100, batch_size=100)
    _write(node, range(10, 15))  # evicts items 0-4
    ids = _ids(batch.data)
    survivor = int(ids[ids >= 5][0])
    updater = replay.ReplayShards([node]).priority_updater(TABLE)
    # Every sampled row gets 1, the survivor 1000; updates of evicted items are dropped.
    new = np.where(ids == survivor, 1000.0, 1.0)
    updater.submit(replay.row_keys(batch), new)
    updater.close()
    sampled = np.concatenate([_ids(b.data) for b in _sample([node], 2000)])
    assert set(sampled.tolist()) <= set(range(5, 15))
    share = np.mean(sampled == survivor)
    assert share == pytest.approx(1000 / (1000 + 9), abs=0.01)


def test_two_shards_are_sampled_in_proportion_to_their_priority_mass(nodes):
    shards = [nodes("shard0"), nodes("shard1")]
    _write(shards[0], range(10), np.full(10, 1.0))
    _write(shards[1], range(10, 20), np.full(10, 3.0))
    batches = _sample(shards, 8000)
    from_second = np.mean(np.concatenate([b.shards for b in batches]) == 1)
    assert from_second == pytest.approx(0.75, abs=0.03)
    # Probabilities are those of one replay of both: priority / total mass (alpha 1).
    for batch in batches:
        expected = np.where(batch.shards == 1, 3.0, 1.0) / 40.0
        np.testing.assert_allclose(batch.probabilities, expected, rtol=1e-5)
        assert (batch.table_size == 20).all()


def test_a_checkpoint_restores_the_same_items_and_priorities(nodes, tmp_path):
    """On Ray the node's process is killed and a new one restores the checkpoint, as the
    supervisor restarts a crashed replay shard."""
    node = nodes("checkpoint", checkpoint_dir=str(tmp_path))
    _write(node, range(20), np.arange(1, 21, dtype=np.float64))
    updater = replay.ReplayShards([node]).priority_updater(TABLE)
    (batch,) = _sample([node], 50, batch_size=50)
    ids = _ids(batch.data)
    priorities = (ids + 1.0) * np.where(ids == 3, 10.0, 1.0)  # item 3 now weighs 40
    updater.submit(replay.row_keys(batch), priorities)
    updater.close()
    assert node.checkpoint(7)["table_sizes"] == {TABLE: 20}
    restored = nodes("checkpoint", checkpoint_dir=str(tmp_path), restore_step=7)
    assert restored.restored_from() == {"step": 7, "table_sizes": {TABLE: 20}}
    batches = _sample([restored], 4000)
    ids = np.concatenate([_ids(b.data) for b in batches])
    probabilities = np.concatenate([b.probabilities for b in batches])
    weights = np.arange(1, 21, dtype=np.float64)
    if 3 in _ids(batch.data):
        weights[3] = 40.0
    weights = weights**ALPHA
    np.testing.assert_allclose(probabilities, weights[ids] / weights.sum(), rtol=1e-5)
    assert set(ids.tolist()) == set(range(20))


@needs_reverb
def test_a_checkpoint_of_the_other_backend_is_refused_naming_both(tmp_path):
    native = replay.NativeReplayNode(NODES["probabilities"], checkpoint_dir=str(tmp_path))
    _write(native, range(4))
    native.checkpoint(3)
    native.close()
    with pytest.raises(replay.IncompatibleCheckpoint, match="native replay.*reverb replay"):
        replay.ReplayNode(NODES["probabilities"], checkpoint_dir=str(tmp_path), restore_step=3)


def test_items_of_the_wrong_width_are_refused_and_the_table_is_unchanged(nodes):
    node = nodes("narrow")
    _write(node, range(3))
    writer = replay.connect(node).writer(TABLE, max_pending=1)
    if nodes.backend == "reverb":
        error = Exception  # Reverb's own error, from its signature check
    else:
        error = ValueError
    with pytest.raises(error, match="16|uint8|signature|shape"):
        writer.write(np.zeros((2, WIDTH + 1), np.uint8), np.ones(2))
        writer.flush()
    assert node.table_info()[TABLE]["size"] == 3


@pytest.mark.parametrize(
    "field, bad, message",
    [
        ("observation", np.zeros((4, 5), np.float32), r"'observation': expected \[\d+, 4\]"),
        ("action", np.zeros(4, np.float32), "'action': expected int32 values, got float32"),
    ],
)
def test_an_actor_item_of_the_wrong_shape_or_dtype_is_refused_naming_the_field(field, bad, message):
    """Through the DQN agent's own adder, as an actor writes: the table stays empty."""
    spec = envs.env_spec("CartPole-v1")
    builder = dqn.DQNBuilder(dqn.DQNConfig(n_step=1))
    node = replay.NativeReplayNode(lambda: builder.replay_layout(spec).tables)
    try:
        adder = builder.replay_layout(spec).make_adder(replay.connect(node), 4, threading.Event())
        step = types.EnvStep(
            observation=np.zeros((4, 4), np.float32),
            action=np.zeros(4, np.int32),
            reward=np.ones(4, np.float32),
            terminated=np.ones(4, bool),
            truncated=np.zeros(4, bool),
            next_observation=np.zeros((4, 4), np.float32),
            valid=np.ones(4, bool),
        )
        with pytest.raises(ValueError, match=message):
            adder.add(step._replace(**{field: bad}))
        adder.close()
        assert node.table_info()[builder.replay_layout(spec).sample_table]["size"] == 0
    finally:
        node.close()


def test_a_table_larger_than_the_hosts_memory_is_refused_with_the_numbers():
    huge = functools.partial(_uniform, 10**12)
    with pytest.raises(MemoryError, match=r"GiB.*priority|GiB.*available"):
        replay.NativeReplayNode(huge)


def test_a_flipped_byte_in_a_native_checkpoint_is_found_and_an_older_one_restored(tmp_path):
    node = replay.NativeReplayNode(NODES["probabilities"], checkpoint_dir=str(tmp_path))
    _write(node, range(4))
    node.checkpoint(1)
    _write(node, range(4, 8))
    record = node.checkpoint(2)
    node.close()
    table_file = next(p for p in (tmp_path / "2").iterdir() if p.suffix == ".npz")
    data = bytearray(table_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table_file.write_bytes(bytes(data))
    with pytest.raises(replay.CheckpointDamaged, match="CRC"):
        replay.check_checkpoint(record["path"])
    restarted = replay.NativeReplayNode(
        NODES["probabilities"], checkpoint_dir=str(tmp_path), restore_step=replay.NEWEST
    )
    try:
        assert restarted.restored_from() == {"step": 1, "table_sizes": {TABLE: 4}}
    finally:
        restarted.close()


def test_a_writer_held_by_the_rate_limiter_stops_when_asked_within_its_timeout():
    node = replay.NativeReplayNode(NODES["queue"])
    try:
        _write(node, range(8))
        stop = threading.Event()
        writer = replay.connect(node).writer(TABLE, max_pending=1, stop_event=stop)
        stop.set()
        started = time.monotonic()
        with pytest.raises(replay.Stopped):
            writer.write(_rows([9]), np.ones(1))
        assert time.monotonic() - started < 30  # a liveness bound: it did not hang
    finally:
        node.close()


def test_native_tables_reject_bad_priorities_without_inserting():
    node = replay.NativeReplayNode(NODES["fifo"])
    try:
        for bad in (np.array([1.0, math.nan]), np.array([1.0, -1.0]), np.ones(3)):
            with pytest.raises(ValueError, match="nothing was inserted"):
                node.insert(TABLE, _rows([0, 1]), bad, 0.1)
        assert node.table_info()[TABLE]["size"] == 0
    finally:
        node.close()
