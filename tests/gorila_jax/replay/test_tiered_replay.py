"""A tiered replay on real files, on both backends (Reverb servers, native nodes): new items in
memory, old ones on disk."""

import threading
import time

import numpy as np
import pytest

from gorila_jax import replay
from tests.backends import BACKENDS, needs_reverb
from tests.gorila_jax.replay.test_sharded_replay import CODEC, EXPONENT, TABLE, _fill

HOT = 50
INDEX, PRIORITY = 1, 2  # the columns of `_fill`'s items (shard 0 here)


def _tables():
    limiter = replay.RateLimit(1)
    return [replay.prioritized_table(TABLE, 10_000, EXPONENT, limiter, CODEC.num_bytes)]


def _tiering(tmp_path, cold_size: int = 1000) -> replay.Tiering:
    return replay.Tiering(TABLE, HOT, cold_size, str(tmp_path / "cold"))


def _write(node, priorities: np.ndarray, first: int = 0) -> None:
    _fill(node, 0, priorities, first)


def _settled(node, cold_items: int, timeout_s: float = 60.0) -> dict:
    """The node's tier sizes once its mover has moved what the hot tier evicted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = node.tier_info()
        if info["cold_items"] >= cold_items and info["spill_items"] <= HOT:
            return info
        time.sleep(0.05)
    raise AssertionError(f"the mover did not move {cold_items} items: {node.tier_info()}")


def _batches(
    shards: replay.ReplayShards, rows: int, count: int, codec: replay.ItemCodec = CODEC
) -> list[replay.Batch]:
    sampler = shards.sampler(TABLE, codec)
    found = []
    try:
        while len(found) < count:
            found += [batch for _, batch in zip(range(count - len(found)), sampler.batches(rows))]
    finally:
        sampler.close()
    return found


@pytest.fixture(params=BACKENDS)
def node_class(request):
    """The replay node of each backend."""
    return replay.node_class(request.param)


@pytest.fixture
def tiered(tmp_path, node_class):
    nodes = []

    def start(**kwargs):
        node = node_class(_tables, tiering=_tiering(tmp_path), **kwargs)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.close()


def test_five_hot_tiers_of_items_are_all_held_the_newest_in_memory(tiered):
    node = tiered()
    _write(node, np.ones(5 * HOT))
    info = _settled(node, 4 * HOT)
    assert (info["hot_items"], info["cold_items"]) == (HOT, 4 * HOT)  # nothing lost
    assert info["cold_bytes"] == 4 * HOT * CODEC.num_bytes > 0
    # 6400 rows of 250 equally likely items: P(some item is never drawn) < 250 e^-25.6 < 1e-8
    # (at 40 batches it was about 1 %, and CI once drew that).
    batches = _batches(replay.ReplayShards(node), 64, 100)
    index = np.concatenate([batch.data[:, INDEX] for batch in batches])
    tier = np.concatenate([batch.shards for batch in batches])  # 0: hot, 1: cold
    assert set(np.unique(index).astype(int)) == set(range(5 * HOT)), "every item is sampled"
    assert index[tier == 0].min() >= 4 * HOT, "the hot tier holds the newest items"
    assert index[tier == 1].max() < 4 * HOT
    assert node.tier_info()["cold_reads"] >= (tier == 1).sum()


def test_probabilities_and_table_size_are_those_of_one_replay_of_both_tiers(tiered):
    node = tiered()
    priorities = np.arange(1.0, 4 * HOT + 1)
    _write(node, priorities)
    _settled(node, 3 * HOT)
    total_mass = np.sum(priorities**EXPONENT)
    batches = _batches(replay.ReplayShards(node), 64, 30)
    for batch in batches:
        written = batch.data[:, PRIORITY]
        np.testing.assert_allclose(batch.probabilities, written**EXPONENT / total_mass, 1e-9)
        np.testing.assert_array_equal(batch.table_size, 4 * HOT)
    tier = np.concatenate([batch.shards for batch in batches])
    cold_mass = np.sum(priorities[: 3 * HOT] ** EXPONENT)
    # 1920 rows: the cold share's standard deviation is about 0.008.
    assert abs(np.mean(tier == 1) - cold_mass / total_mass) < 0.05


def test_priority_updates_reach_the_tier_that_holds_the_item_and_move_with_it(tiered):
    node = tiered()
    priorities = np.ones(3 * HOT)
    _write(node, priorities)
    _settled(node, 2 * HOT)
    shards = replay.ReplayShards(node)
    batch = _batches(shards, 48, 1)[0]
    assert set(batch.shards.tolist()) == {0, 1}, "the batch holds rows of both tiers"
    updated = set(batch.data[:, INDEX].astype(int).tolist())
    updater = shards.priority_updater(TABLE)
    updater.submit(replay.row_keys(batch, with_sources=True), np.full(48, 100.0))
    updater.close()
    # Every item updated, in either tier, now has the new priority ...
    new = np.where(np.isin(np.arange(3 * HOT), list(updated)), 100.0, 1.0)
    for batch in _batches(shards, 64, 10):
        index = batch.data[:, INDEX].astype(int)
        expected = new[index] ** EXPONENT / np.sum(new**EXPONENT)
        np.testing.assert_allclose(batch.probabilities, expected, 1e-9)
    # ... and hot items take it to the cold tier when they leave the hot one.
    _write(node, np.ones(HOT), first=3 * HOT)
    _settled(node, 3 * HOT)
    new = np.concatenate([new, np.ones(HOT)])
    moved = [i for i in updated if 2 * HOT <= i < 3 * HOT]
    assert moved, "some updated items were hot"
    for batch in _batches(shards, 64, 10):
        index = batch.data[:, INDEX].astype(int)
        expected = new[index] ** EXPONENT / np.sum(new**EXPONENT)
        np.testing.assert_allclose(batch.probabilities, expected, 1e-9)
        assert (batch.shards[np.isin(index, moved)] == 1).all()


def test_a_restarted_replay_node_comes_back_with_both_tiers(tiered, tmp_path):
    checkpoints = str(tmp_path / "checkpoints")
    node = tiered(checkpoint_dir=checkpoints)
    priorities = np.arange(1.0, 4 * HOT + 1)
    _write(node, priorities)
    _settled(node, 3 * HOT)
    record = node.checkpoint(7)
    assert record["table_sizes"][TABLE] == HOT
    node.close()  # killed after its checkpoint: the next node restores it
    restarted = tiered(checkpoint_dir=checkpoints, restore_step=replay.NEWEST)
    assert restarted.restored_from()["step"] == 7
    info = restarted.tier_info()
    assert (info["hot_items"], info["cold_items"]) == (HOT, 3 * HOT)
    total_mass = np.sum(priorities**EXPONENT)
    batches = _batches(replay.ReplayShards(restarted), 64, 20)
    for batch in batches:
        np.testing.assert_allclose(
            batch.probabilities, batch.data[:, PRIORITY] ** EXPONENT / total_mass, 1e-9
        )
    index = np.concatenate([batch.data[:, INDEX] for batch in batches])
    assert set(np.unique(index).astype(int)) <= set(range(4 * HOT))
    assert len(np.unique(index)) > 3 * HOT, "items of both tiers are served again"
    # It goes on: new items push more into the cold tier.
    _write(restarted, np.ones(HOT), first=4 * HOT)
    assert _settled(restarted, 4 * HOT)["cold_items"] == 4 * HOT


def test_a_checkpoint_of_one_kind_of_replay_is_refused_by_the_other(tiered, tmp_path, node_class):
    checkpoints = str(tmp_path / "checkpoints")
    node = node_class(_tables, checkpoint_dir=checkpoints)
    _write(node, np.ones(10))
    node.checkpoint(1)
    node.close()
    with pytest.raises(replay.IncompatibleCheckpoint, match="in-memory replay.*with tiers"):
        tiered(checkpoint_dir=checkpoints, restore_step=1)


def test_a_queue_table_cannot_be_tiered(tmp_path, node_class):
    def queue():
        return [replay.queue_table(TABLE, 100, CODEC.num_bytes)]

    with pytest.raises(ValueError, match="samples each item once"):
        node_class(queue, tiering=_tiering(tmp_path))


@needs_reverb
def test_reverbs_tiers_keep_the_samples_per_insert_ratio_together(tmp_path):
    """Samples of either tier count against one ratio: the learner cannot out-sample it by
    drawing cold rows, and a lagging learner holds the mover, then the actors, back (the
    native table keeps one ratio over both tiers by construction: the next test)."""
    buffer = 60.0  # samples_per_insert 1: within 60 rows of one sample per insert

    def tables():
        limiter = replay.RateLimit(1, 1.0, buffer)
        return [replay.prioritized_table(TABLE, 10_000, EXPONENT, limiter, CODEC.num_bytes)]

    node = replay.ReplayNode(tables, tiering=_tiering(tmp_path))
    try:
        inserts = 4 * HOT
        _write(node, np.ones(inserts))
        time.sleep(1.0)
        # Nothing sampled: the mover stopped once inserts ran `buffer` ahead of samples.
        assert node.tier_info()["spill_items"] >= inserts - (HOT + buffer + 1)
        sampler = replay.ReplayShards(node).sampler(TABLE, CODEC)
        rows = cold_rows = 0
        try:
            for more in (0, 4 * HOT):
                if more:
                    _write(node, np.ones(more), first=inserts)
                    inserts += more
                for _ in range(3):  # each pass ends when the ratio holds samples back
                    for batch in sampler.batches(16):
                        rows += len(batch.keys)
                        cold_rows += int(np.sum(batch.shards == 1))
                # One sample per insert and the buffer's worth ahead (min_diff = 1 - buffer).
                assert inserts - HOT <= rows <= inserts + buffer - 1
                _settled(node, inserts - HOT)  # sampling caught up: the mover went on
        finally:
            sampler.close()
        assert cold_rows > HOT, "cold rows were drawn, and counted within the ratio"
        assert node.tier_info()["cold_reads"] >= cold_rows
    finally:
        node.close()


def test_a_uniform_table_is_sampled_uniformly_over_both_tiers(tmp_path, node_class):
    """SAC's table: no priorities to move, every item of either tier equally likely."""

    def tables():
        limiter = replay.RateLimit(1)
        return [replay.uniform_table(TABLE, 10_000, limiter, CODEC.num_bytes)]

    node = node_class(tables, tiering=_tiering(tmp_path))
    try:
        assert node.cold_tier() == {"table": TABLE, "prioritized": False}
        _write(node, np.arange(1.0, 4 * HOT + 1))  # priorities a uniform table ignores
        _settled(node, 3 * HOT)
        batches = _batches(replay.ReplayShards(node), 64, 30)
        for batch in batches:
            np.testing.assert_allclose(batch.probabilities, 1 / (4 * HOT), 1e-9)
            np.testing.assert_array_equal(batch.table_size, 4 * HOT)
        tier = np.concatenate([batch.shards for batch in batches])
        assert abs(np.mean(tier == 1) - 0.75) < 0.05  # 3 of 4 items are cold
    finally:
        node.close()


def test_native_tiers_count_both_tiers_samples_in_one_ratio(tmp_path):
    """spi 1, min size 1, error buffer 60: without samples, inserts stop at 1 + 60 = 61;
    then samples of either tier may run until inserts * 1 - samples = 1 - 60."""

    def tables():
        limiter = replay.RateLimit(1, 1.0, 60.0)
        return [replay.prioritized_table(TABLE, 10_000, EXPONENT, limiter, CODEC.num_bytes)]

    node = replay.NativeReplayNode(tables, tiering=_tiering(tmp_path))
    try:
        stop = threading.Event()
        writer = replay.connect(node).writer(TABLE, max_pending=1, stop_event=stop)
        threading.Timer(2.0, stop.set).start()
        items = np.stack([np.zeros(100), np.arange(100), np.ones(100)], axis=1)
        with pytest.raises(replay.Stopped):
            writer.write(CODEC.encode(items), np.ones(100))
        assert node.table_info()[TABLE]["inserts"] == 61
        assert node.tier_info()["cold_items"] == 61 - HOT
        sampler = replay.ReplayShards(node).sampler(TABLE, CODEC)
        try:
            batches = list(sampler.batches(1))
        finally:
            sampler.close()
        assert len(batches) == 61 + 60 - 1
        assert sum(int(batch.shards[0] == 1) for batch in batches) > 0, "cold rows counted"
        assert node.table_info()[TABLE]["samples"] == len(batches)
    finally:
        node.close()


# Rows of 4 KB: (shard, index, priority) and zeros, as image rows are mostly alike.
WIDE = replay.ItemCodec(np.zeros(512, np.float64))


def test_compressed_cold_items_outnumber_what_the_disk_budget_holds_raw(tmp_path, node_class):
    def wide_tables():
        limiter = replay.RateLimit(1)
        return [replay.prioritized_table(TABLE, 10_000, EXPONENT, limiter, WIDE.num_bytes)]

    budget = HOT * WIDE.num_bytes  # room for HOT raw items, a quarter of the cold ones
    checkpoints = str(tmp_path / "checkpoints")
    tiering = replay.Tiering(TABLE, HOT, 1000, str(tmp_path / "cold"), budget, "zlib")
    items = np.zeros((5 * HOT, 512))
    items[:, INDEX], items[:, PRIORITY] = np.arange(5 * HOT), 1.0
    node = node_class(wide_tables, tiering=tiering, checkpoint_dir=checkpoints)
    try:
        writer = replay.connect(node).writer(TABLE)
        writer.write(WIDE.encode(items), items[:, PRIORITY])
        writer.close()
        info = _settled(node, 4 * HOT)
        assert info["cold_items"] == 4 * HOT, "nothing lost"
        assert 0 < info["cold_bytes"] < budget / 4
        node.checkpoint(3)
    finally:
        node.close()
    node = node_class(
        wide_tables, tiering=tiering, checkpoint_dir=checkpoints, restore_step=replay.NEWEST
    )
    try:
        assert node.tier_info()["cold_items"] == 4 * HOT, "a restart brings them back"
        rows = np.concatenate(
            [batch.data for batch in _batches(replay.ReplayShards(node), 64, 100, WIDE)]
        )
        assert set(rows[:, INDEX].astype(int)) == set(range(5 * HOT)), "every item is sampled"
        np.testing.assert_array_equal(rows, items[rows[:, INDEX].astype(int)], "as written")
    finally:
        node.close()
