"""The cold tier of a tiered replay (`gorila_jax/replay/cold.py`): a ring of packed items on
disk, sampled by priority**alpha, checkpointed without its items' bytes."""

import logging
import os
import threading

import numpy as np
import pytest

from gorila_jax import replay

ColdStore = replay.ColdStore

WIDTH = 40  # bytes of an item: its key, then bytes that follow from the key


def rows_of(keys, width: int = WIDTH) -> np.ndarray:
    """Items whose bytes spell their key, so that a row read back tells which item it is."""
    keys = np.asarray(keys, np.uint64)
    rows = np.empty((len(keys), width), np.uint8)
    rows[:, :8] = keys.reshape(-1, 1).view(np.uint8)
    rows[:, 8:] = (
        keys.reshape(-1, 1) * np.uint64(31) + np.arange(width - 8, dtype=np.uint64)
    ) % 251
    return rows


def key_in(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows[:, :8]).view(np.uint64).reshape(-1)


def add(store: ColdStore, priorities, hashes=None) -> np.ndarray:
    """Adds one item per priority; returns their keys (their insertion indices)."""
    priorities = np.asarray(priorities, np.float64)
    keys = np.arange(store.inserted, store.inserted + len(priorities), dtype=np.uint64)
    store.add(rows_of(keys, store.item_bytes), priorities, hashes)
    return keys


def check_rows_are_their_items(rows) -> None:
    np.testing.assert_array_equal(key_in(rows.data), rows.keys)
    np.testing.assert_array_equal(rows.data, rows_of(rows.keys, rows.data.shape[1]))


def frequencies(keys: np.ndarray, held: np.ndarray) -> np.ndarray:
    return np.array([np.count_nonzero(keys == key) for key in held]) / len(keys)


def assert_frequencies_near(observed: np.ndarray, expected: np.ndarray, draws: int) -> None:
    # Five standard deviations of a binomial share: a fixed seed never comes near it.
    tolerance = 5 * np.sqrt(expected * (1 - expected) / draws) + 1e-12
    assert np.all(np.abs(observed - expected) <= tolerance), (observed, expected)


def test_a_full_store_keeps_the_newest_items_and_the_oldest_are_gone(tmp_path):
    store = ColdStore(str(tmp_path), capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    first = add(store, np.ones(7), hashes=np.arange(100, 107, dtype=np.uint64))
    second = add(store, np.ones(8), hashes=np.arange(200, 208, dtype=np.uint64))
    keys = np.concatenate([first, second])
    evicted, held = keys[:5], keys[5:]
    assert store.size == 10 and store.inserted == 15 and store.bytes == 10 * WIDTH

    assert store.update(evicted, np.full(5, 3.0)) == 0
    np.testing.assert_array_equal(store.hashes_of(evicted), 0)
    np.testing.assert_array_equal(store.hashes_of(held), [105, 106, *range(200, 208)])
    rows = store.sample(2_000, np.random.default_rng(0))
    check_rows_are_their_items(rows)
    assert set(rows.keys.tolist()) == set(held.tolist())
    assert store.update(held, np.full(10, 2.0)) == 10

    # One add larger than the ring keeps its last `capacity` items.
    big = ColdStore(str(tmp_path / "big"), capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    keys = add(big, np.ones(25))
    assert big.size == 10 and big.inserted == 25
    rows = big.sample(1_000, np.random.default_rng(1))
    check_rows_are_their_items(rows)
    assert set(rows.keys.tolist()) == set(keys[-10:].tolist())
    store.close()
    big.close()


@pytest.mark.parametrize("exponent", [0.6, 1.0])
def test_items_are_drawn_in_proportion_to_priority_to_the_exponent(tmp_path, exponent):
    store = ColdStore(str(tmp_path), capacity=16, item_bytes=WIDTH, priority_exponent=exponent)
    priorities = np.random.default_rng(2).uniform(0.05, 4.0, size=12)
    keys = add(store, priorities)
    weights = priorities**exponent
    expected = weights / weights.sum()
    np.testing.assert_allclose(store.mass, weights.sum(), rtol=1e-12)

    draws = 200_000
    rows = store.sample(draws, np.random.default_rng(3))
    assert len(rows.keys) == draws and store.reads == draws
    assert_frequencies_near(frequencies(rows.keys, keys), expected, draws)
    by_key = dict(zip(keys.tolist(), range(len(keys))))
    index = np.array([by_key[key] for key in rows.keys.tolist()])
    np.testing.assert_allclose(rows.probabilities, expected[index], rtol=1e-12)
    np.testing.assert_array_equal(rows.priorities, priorities[index])
    np.testing.assert_array_equal(rows.table_size, 12)
    check_rows_are_their_items(rows)
    store.close()


def test_a_uniform_store_draws_every_item_alike_and_keeps_their_priorities(tmp_path):
    store = ColdStore(str(tmp_path), capacity=16, item_bytes=WIDTH, priority_exponent=None)
    priorities = np.array([0.0, 1e-6, 1.0, 5.0, 1e6, 2.0, 0.5, 3.0])
    keys = add(store, priorities)
    assert store.mass == store.size == 8

    draws = 100_000
    rows = store.sample(draws, np.random.default_rng(4))
    np.testing.assert_array_equal(rows.probabilities, 1 / 8)
    assert_frequencies_near(frequencies(rows.keys, keys), np.full(8, 1 / 8), draws)
    np.testing.assert_array_equal(rows.priorities, priorities[rows.keys.astype(np.int64)])
    store.close()


def test_new_priorities_change_what_is_drawn_and_keys_of_items_gone_are_skipped(tmp_path):
    store = ColdStore(str(tmp_path), capacity=6, item_bytes=WIDTH, priority_exponent=1.0)
    keys = add(store, np.ones(6))
    assert store.update(keys[:2], [0.0, 1_000.0]) == 2
    rows = store.sample(20_000, np.random.default_rng(5))
    assert keys[0] not in rows.keys
    assert np.mean(rows.keys == keys[1]) > 0.98  # 1000 / 1004
    np.testing.assert_allclose(store.mass, 1_004.0)

    # The newest of two priorities for one key counts; bad priorities are skipped.
    assert store.update([keys[2], keys[2]], [50.0, 7.0]) == 1
    assert store.update([keys[3], keys[4]], [np.nan, -1.0]) == 0
    assert store.update([keys[5]], [np.inf]) == 0
    np.testing.assert_allclose(store.mass, 1_000.0 + 7.0 + 3.0)
    rows = store.sample(5_000, np.random.default_rng(6))
    np.testing.assert_array_equal(rows.priorities[rows.keys == keys[2]], 7.0)

    # Keys of evicted items and keys never given out change nothing.
    newer = add(store, np.ones(3))
    mass = store.mass
    never = int(newer[-1]) + np.array([1, 6])
    stale = np.concatenate([keys[:3], never.astype(np.uint64)])
    assert store.update(stale, np.full(5, 9.0)) == 0
    assert store.mass == mass
    assert store.update([keys[3], newer[0]], [2.0, 2.0]) == 2
    store.close()


def test_a_checkpoint_restored_on_the_same_directory_gives_back_the_same_replay(tmp_path):
    width = 1024
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    store = ColdStore(directory, capacity=50, item_bytes=width, priority_exponent=0.7)
    rng = np.random.default_rng(7)
    keys = add(store, rng.uniform(0.1, 2.0, 80), hashes=rng.integers(1, 2**63, 80, np.uint64))
    store.update(keys[-20:], rng.uniform(0.1, 9.0, 20))
    store.sample(300, rng)
    held = keys[-50:]
    saved = store.sample(20_000, np.random.default_rng(8))
    size, mass, inserted, reads = store.size, store.mass, store.inserted, store.reads
    hashes = store.hashes_of(held)
    store.checkpoint(path)
    store.close()
    assert sorted(os.listdir(tmp_path)) == ["cold", "cold.npz"], "no temporary file is left"
    # The items' bytes stay on disk: the checkpoint does not copy them.
    assert os.path.getsize(path) < 50 * width / 4

    restored = ColdStore(directory, capacity=50, item_bytes=width, priority_exponent=0.7)
    assert restored.size == 0, "a store opened without restore starts empty"
    restored.restore(path)
    assert (restored.size, restored.inserted, restored.reads) == (size, inserted, reads)
    np.testing.assert_allclose(restored.mass, mass, rtol=1e-12)
    np.testing.assert_array_equal(restored.hashes_of(held), hashes)
    # The same draws give the same rows: priorities, probabilities and bytes alike.
    rows = restored.sample(20_000, np.random.default_rng(8))
    for name in ("keys", "probabilities", "priorities", "table_size", "data"):
        np.testing.assert_array_equal(getattr(rows, name), getattr(saved, name), err_msg=name)
    check_rows_are_their_items(rows)
    restored.close()


@pytest.mark.parametrize("reopen", [True, False], ids=["fresh store", "same store"])
def test_items_overwritten_after_a_checkpoint_are_dropped_on_restore_and_counted(
    tmp_path, caplog, reopen
):
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    store = ColdStore(directory, capacity=20, item_bytes=WIDTH, priority_exponent=1.0)
    keys = add(store, np.arange(1.0, 21.0))
    store.checkpoint(path)
    later = add(store, np.full(6, 50.0))  # over the slots of keys[:6]
    if reopen:
        store.close()
        store = ColdStore(directory, capacity=20, item_bytes=WIDTH, priority_exponent=1.0)
    with caplog.at_level(logging.WARNING):
        store.restore(path)
    assert "6 of the 20 items" in caplog.text

    intact = keys[6:]
    assert store.size == 14
    np.testing.assert_allclose(store.mass, np.arange(7.0, 21.0).sum())
    rows = store.sample(10_000, np.random.default_rng(9))
    check_rows_are_their_items(rows)
    assert set(rows.keys.tolist()) == set(intact.tolist())
    np.testing.assert_array_equal(rows.priorities, rows.keys.astype(np.float64) + 1)
    assert store.update(np.concatenate([keys[:6], later]), np.ones(12)) == 0

    # Items added after the restore take keys no item on disk had: none is mistaken
    # for another, whichever checkpoint is restored next.
    newest = add(store, np.ones(4))
    assert newest.min() > later.max()
    check_rows_are_their_items(store.sample(2_000, np.random.default_rng(10)))
    store.close()


def test_a_used_directory_opened_without_restore_starts_empty(tmp_path):
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    keys = add(store, np.ones(10))
    store.checkpoint(path)
    store.close()

    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    assert store.size == 0 and store.mass == 0
    assert len(store.sample(8, np.random.default_rng(11)).keys) == 0
    assert store.update(keys, np.ones(10)) == 0
    newer = add(store, np.ones(3))
    assert set(store.sample(500, np.random.default_rng(12)).keys.tolist()) == set(newer.tolist())

    # The checkpoint still brings back the items no add went over.
    store.restore(path)
    rows = store.sample(2_000, np.random.default_rng(13))
    check_rows_are_their_items(rows)
    assert set(rows.keys.tolist()) == set(keys[3:].tolist())
    store.close()


def test_draws_at_the_ends_of_the_range_never_land_on_an_empty_or_weightless_slot(tmp_path):
    class EdgeDraws:
        """Uniform draws at and next to the ends of [0, 1)."""

        def random(self, size):
            below_one = 1.0 - np.arange(size // 2) * np.finfo(np.float64).epsneg
            return np.concatenate([below_one, np.zeros(size - len(below_one))])

    # 100 slots (a tree of 128 leaves) of which some items weigh nothing, among them the
    # last ones; sums of such priorities are inexact in floating point.
    store = ColdStore(str(tmp_path), capacity=100, item_bytes=WIDTH, priority_exponent=1.0)
    priorities = np.tile([0.1, 0.0, 0.2, 0.7, 0.0, 1e-9, 0.3], 10)[:61]
    priorities[-4:] = 0.0
    add(store, priorities)
    rows = store.sample(64, EdgeDraws())
    assert np.all(rows.priorities > 0)
    check_rows_are_their_items(rows)
    rows = store.sample(200_000, np.random.default_rng(14))
    assert np.all(rows.priorities > 0)
    store.close()


def test_an_empty_store_or_one_of_weightless_items_samples_no_rows(tmp_path):
    store = ColdStore(str(tmp_path / "a"), capacity=8, item_bytes=WIDTH, priority_exponent=1.0)
    for held in (0, 3):
        if held:
            add(store, np.zeros(held))  # items held, but none may be drawn
        rows = store.sample(32, np.random.default_rng(15))
        assert rows.data.shape == (0, WIDTH) and rows.data.dtype == np.uint8
        assert rows.keys.dtype == np.uint64 and rows.table_size.dtype == np.int64
        assert rows.probabilities.dtype == rows.priorities.dtype == np.float64
        assert all(len(column) == 0 for column in rows)
        assert store.size == held and store.reads == 0
    store.close()


@pytest.mark.parametrize(
    "items, priorities, problem",
    [
        (rows_of(range(3), WIDTH + 1), np.ones(3), r"\[n, 40\] uint8"),
        (rows_of(range(3)).astype(np.int16), np.ones(3), r"\[n, 40\] uint8"),
        (rows_of(range(3)), [1.0, -0.5, 1.0], "finite and >= 0"),
        (rows_of(range(3)), [1.0, np.nan, 1.0], "finite and >= 0"),
        (rows_of(range(3)), [np.inf, 1.0, 1.0], "finite and >= 0"),
        (rows_of(range(3)), np.ones(2), "priorities must be one per item"),
    ],
    ids=["width", "type", "negative", "nan", "inf", "count"],
)
def test_items_a_store_cannot_hold_are_refused_naming_the_problem(
    tmp_path, items, priorities, problem
):
    store = ColdStore(str(tmp_path), capacity=8, item_bytes=WIDTH, priority_exponent=1.0)
    with pytest.raises(ValueError, match=problem):
        store.add(items, priorities)
    assert store.size == 0 and store.inserted == 0, "nothing of a refused add is kept"
    store.close()


@pytest.mark.parametrize(
    "capacity, item_bytes, exponent, problem",
    [
        (0, WIDTH, 1.0, "capacity must be >= 1"),
        (8, 0, 1.0, "item_bytes must be >= 1"),
        (8, WIDTH, -0.5, "exponent must be >= 0"),
        (8, WIDTH, np.nan, "exponent must be >= 0"),
    ],
)
def test_a_store_that_could_not_work_is_refused(tmp_path, capacity, item_bytes, exponent, problem):
    with pytest.raises(ValueError, match=problem):
        ColdStore(str(tmp_path), capacity, item_bytes, exponent)


def test_a_directory_or_checkpoint_of_another_shape_is_refused_naming_both_shapes(tmp_path):
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    add(store, np.ones(4))
    store.checkpoint(path)
    store.close()
    for capacity, item_bytes in [(20, WIDTH), (10, 16)]:
        with pytest.raises(ValueError) as refused:
            ColdStore(directory, capacity, item_bytes, 1.0)
        for named in (directory, f"[10, {WIDTH}]", f"[{capacity}, {item_bytes}]"):
            assert named in str(refused.value)

        other = ColdStore(str(tmp_path / f"other{capacity}"), capacity, item_bytes, 1.0)
        with pytest.raises(ValueError) as refused:
            other.restore(path)
        for named in (path, f"[10, {WIDTH}]", f"[{capacity}, {item_bytes}]"):
            assert named in str(refused.value)
        other.close()

    # The directory is as it was: its own shape opens and restores.
    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    store.restore(path)
    assert store.size == 4
    store.close()


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_a_mover_adding_while_learners_sample_and_update_serves_each_key_its_own_item(
    tmp_path, compression
):
    width = WIDTH if compression == "none" else 512  # rows of 512 compress, of 40 not
    store = ColdStore(str(tmp_path), 64, width, 0.6, compression=compression)
    add(store, np.ones(8))
    done, failures = threading.Event(), []

    def mover():
        try:
            for batch in range(300):
                add(store, np.full(16, 1.0 + batch % 5))
        finally:
            done.set()

    def learner(seed):
        rng = np.random.default_rng(seed)
        try:
            while not done.is_set():
                rows = store.sample(32, rng)
                check_rows_are_their_items(rows)
                store.update(rows.keys, rng.uniform(0.1, 2.0, len(rows.keys)))
        except Exception as error:  # reported by the test's assert
            failures.append(error)

    threads = [threading.Thread(target=mover)]
    threads += [threading.Thread(target=learner, args=(seed,)) for seed in (16, 17)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures
    assert store.size == 64 and store.inserted == 8 + 300 * 16
    check_rows_are_their_items(store.sample(1_000, np.random.default_rng(18)))
    store.close()


def test_closing_twice_is_harmless_and_a_closed_store_refuses_work(tmp_path):
    store = ColdStore(str(tmp_path), capacity=8, item_bytes=WIDTH, priority_exponent=1.0)
    add(store, np.ones(2))
    store.close()
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.sample(4, np.random.default_rng(19))
    with pytest.raises(ValueError, match="closed"):
        add(store, np.ones(1))


def rows_that_compress_or_not(keys, width: int) -> np.ndarray:
    """Even keys: `rows_of`, which zlib packs small; odd keys: random bytes after the key,
    which it cannot."""
    rows = rows_of(keys, width)
    for row, key in zip(rows, np.asarray(keys).tolist()):
        if key % 2:
            row[8:] = np.random.default_rng(key).integers(0, 256, width - 8, np.uint8)
    return rows


def test_compressed_items_take_less_disk_and_come_back_as_they_were(tmp_path):
    width = 4096
    raw = ColdStore(str(tmp_path / "raw"), 64, width, 1.0)
    packed = ColdStore(str(tmp_path / "zlib"), 64, width, 1.0, compression="zlib")
    keys = np.arange(40, dtype=np.uint64)
    items = rows_that_compress_or_not(keys, width)
    for store in (raw, packed):
        store.add(items, np.ones(40))
    assert raw.bytes == 40 * width
    # The 20 random rows stay raw; the 20 others shrink to a few hundred bytes.
    assert 20 * width < packed.bytes < 20 * width + 20 * width // 8
    for store in (raw, packed):
        rows = store.sample(3_000, np.random.default_rng(20))
        assert set(rows.keys.tolist()) == set(keys.tolist())
        np.testing.assert_array_equal(rows.data, items[rows.keys.astype(np.int64)])
    raw.close()
    packed.close()


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_a_disk_budget_keeps_the_newest_items_that_fit_and_compression_fits_more(
    tmp_path, compression
):
    width, budget = 4096, 10 * 4096
    store = ColdStore(
        str(tmp_path), 1_000, width, 1.0, ring_bytes=budget + 100, compression=compression
    )
    for first in range(0, 600, 50):
        keys = np.arange(first, first + 50, dtype=np.uint64)
        store.add(rows_of(keys, width), np.ones(50))
    assert store.inserted == 600 and 0 < store.bytes <= budget + 100
    held = store.size
    if compression == "none":
        assert held == 10
    else:
        assert held > 100, "compressed items: ten times as many in the same disk"
    rows = store.sample(20 * held, np.random.default_rng(21))
    check_rows_are_their_items(rows)
    assert set(rows.keys.tolist()) == set(range(600 - held, 600)), "the newest, FIFO"
    assert store.update(np.arange(600 - held - 5, 600 - held, dtype=np.uint64), np.ones(5)) == 0
    np.testing.assert_allclose(store.mass, held)
    store.close()


def test_a_compressed_store_restores_without_the_items_written_over(tmp_path, caplog):
    width = 2048
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    options = dict(ring_bytes=8 * width, compression="zlib")
    store = ColdStore(directory, 1_000, width, 1.0, **options)
    store.add(rows_that_compress_or_not(np.arange(12, dtype=np.uint64), width), np.ones(12))
    before = store.sample(4_000, np.random.default_rng(22))
    store.checkpoint(path)
    # Two rows more: the oldest rows' bytes are written over.
    store.add(rows_that_compress_or_not(np.array([12, 13], np.uint64), width), np.ones(2))
    store.close()

    store = ColdStore(directory, 1_000, width, 1.0, **options)
    with caplog.at_level(logging.WARNING):
        store.restore(path)
    lost = set(before.keys.tolist()) - set(
        store.sample(4_000, np.random.default_rng(23)).keys.tolist()
    )
    assert lost and f"{len(lost)} of the {len(set(before.keys.tolist()))} items" in caplog.text
    rows = store.sample(4_000, np.random.default_rng(24))
    np.testing.assert_array_equal(
        rows.data, rows_that_compress_or_not(rows.keys, width), "each key its own bytes"
    )
    assert min(lost) < min(rows.keys.tolist()), "the oldest are the ones lost"
    assert store.inserted == 14, "new keys go on past those written after the checkpoint"
    store.close()


def test_a_ring_made_anew_gives_a_checkpoint_nothing_back(tmp_path, caplog):
    directory, path = str(tmp_path / "cold"), str(tmp_path / "cold.npz")
    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    add(store, np.ones(6))
    store.checkpoint(path)
    store.close()
    os.remove(os.path.join(directory, "head.i64"))  # its bytes could be anyone's now

    store = ColdStore(directory, capacity=10, item_bytes=WIDTH, priority_exponent=1.0)
    add(store, np.ones(3))
    with caplog.at_level(logging.WARNING):
        store.restore(path)
    assert store.size == 0 and "6 of the 6 items" in caplog.text and "made anew" in caplog.text
    store.close()


@pytest.mark.parametrize(
    "options, problem",
    [
        (dict(compression="lz4"), "unknown cold replay compression 'lz4'"),
        (dict(ring_bytes=WIDTH - 1), "cannot hold one item"),
        (dict(ring_bytes=2**62), r"needs \d+\.\d+ GiB of disk .* GiB are free"),
    ],
    ids=["compression", "budget below one item", "more than the disk"],
)
def test_a_budget_or_compression_that_cannot_work_is_refused(tmp_path, options, problem):
    with pytest.raises(ValueError, match=problem):
        ColdStore(str(tmp_path), 8, WIDTH, 1.0, **options)
    assert not os.path.exists(tmp_path / "ring.u8"), "no file is made for a refused store"


def test_a_directory_of_the_earlier_fixed_width_layout_is_refused(tmp_path):
    (tmp_path / "items.u8").write_bytes(b"\0" * 80)
    with pytest.raises(ValueError, match=r"earlier layout \(items.u8\)"):
        ColdStore(str(tmp_path), 2, WIDTH, 1.0)
