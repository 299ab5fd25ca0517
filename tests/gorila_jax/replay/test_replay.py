"""Replay on a real Reverb server: writes, batched sampling, priority updates, rate limiting.

The Reverb backend's own tests: the DeepMind set runs them (DEEPMIND=1 bash tests/run.sh).
"""

import errno
import ipaddress
import socket
import threading

import numpy as np
import pytest

from gorila_jax import replay, types
from tests.backends import import_reverb

reverb = import_reverb()
pytestmark = pytest.mark.reverb

TABLE = "table"


def _transitions(count: int, seed: int = 0) -> types.Transition:
    rng = np.random.default_rng(seed)
    return types.Transition(
        observation=np.arange(count, dtype=np.float32)[:, None].repeat(4, axis=1),
        action=rng.integers(0, 2, count).astype(np.int32),
        reward=rng.normal(size=count).astype(np.float32),
        discount=np.full(count, 0.99, np.float32),
        next_observation=rng.normal(size=(count, 4)).astype(np.float32),
    )


CODEC = replay.ItemCodec(types.Transition(*(x[0] for x in _transitions(1))))


def _server(limiter, max_size: int = 1000) -> reverb.Server:
    table = replay.prioritized_table(TABLE, max_size, 0.6, limiter, CODEC.num_bytes)
    return reverb.Server([replay.reverb_table(table)])


def _write(client: reverb.Client, transitions: types.Transition) -> None:
    writer = replay.TransitionWriter(client, TABLE)
    writer.write(CODEC.encode(transitions), np.ones(len(transitions.reward)))
    writer.flush()


def test_codec_round_trips_mixed_dtypes_exactly():
    rng = np.random.default_rng(3)
    example = {
        "frames": np.zeros((4, 84, 84), np.uint8),
        "q": np.zeros(6, np.float32),
        "step": np.int64(0),
        "done": np.bool_(False),
    }
    codec = replay.ItemCodec(example)
    batch = {
        "frames": rng.integers(0, 256, (5, 4, 84, 84), dtype=np.uint8),
        "q": rng.normal(size=(5, 6)).astype(np.float32),
        "step": rng.integers(0, 2**40, 5),
        "done": rng.random(5) < 0.5,
    }
    packed = codec.encode(batch, source=3)
    payload = 4 * 84 * 84 + 6 * 4 + 8 + 1
    assert packed.shape == (5, payload + replay.SOURCE_BYTES) and packed.dtype == np.uint8
    decoded = codec.decode(packed)
    for key in batch:
        assert decoded[key].dtype == batch[key].dtype
        np.testing.assert_array_equal(decoded[key], batch[key])
    with pytest.raises(ValueError, match="packed items must be"):
        codec.decode(packed[:, :-1])


def test_every_item_carries_the_actor_that_wrote_it_through_encode_and_decode():
    rng = np.random.default_rng(4)
    codec = replay.ItemCodec({"x": np.zeros(3, np.float32), "a": np.int32(0)})
    batch = {"x": rng.normal(size=(6, 3)).astype(np.float32), "a": np.arange(6, dtype=np.int32)}
    np.testing.assert_array_equal(codec.sources(codec.encode(batch, source=7)), [7] * 6)
    per_row = np.array([0, 1, 2, 40_000, 2**31 - 1, 5])
    packed = codec.encode(batch, source=per_row)
    np.testing.assert_array_equal(codec.sources(packed), per_row)
    # The trailer changes nothing the agent sees.
    np.testing.assert_array_equal(codec.decode(packed)["x"], batch["x"])
    np.testing.assert_array_equal(codec.decode(packed)["a"], batch["a"])
    # Items written without a source say so, rather than naming actor 0.
    np.testing.assert_array_equal(codec.sources(codec.encode(batch)), replay.UNKNOWN_SOURCE)
    # Rows of the old format (no trailer) are refused with the reason.
    with pytest.raises(ValueError, match="lack the source-actor trailer"):
        codec.decode(packed[:, : codec.payload_bytes])


@pytest.fixture
def server():
    srv = _server(replay.RateLimit(1))
    yield srv
    srv.stop()


def test_written_items_come_back_in_batches_with_keys_and_probabilities(server):
    client = reverb.Client(f"localhost:{server.port}")
    written = _transitions(100)
    _write(client, written)
    assert client.server_info()[TABLE].current_size == 100

    batch = next(replay.batches(f"localhost:{server.port}", TABLE, batch_size=32, codec=CODEC))
    assert batch.keys.shape == (32,) and batch.keys.dtype == np.uint64
    np.testing.assert_allclose(batch.probabilities, 1 / 100)  # equal priorities
    index = batch.data.observation[:, 0].astype(int)  # observation encodes the item index
    for field, expected in zip(batch.data, written):
        np.testing.assert_array_equal(field, expected[index])


def test_sampled_batches_name_the_actor_of_every_item(server):
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    written = _transitions(60)
    first, second = (types.Transition(*(x[a:b] for x in written)) for a, b in ((0, 20), (20, 60)))
    for transitions, actor in ((first, 3), (second, 11)):  # two actors, through a real writer
        writer = replay.TransitionWriter(client, TABLE)
        writer.write(CODEC.encode(transitions, source=actor), np.ones(len(transitions.reward)))
        writer.flush()
    batch = next(replay.batches(address, TABLE, batch_size=64, codec=CODEC))
    index = batch.data.observation[:, 0].astype(int)  # observation encodes the item index
    np.testing.assert_array_equal(batch.sources, np.where(index < 20, 3, 11))
    keys = replay.row_keys(batch, with_sources=True)
    np.testing.assert_array_equal(keys.sources, batch.sources)
    assert keys.shards is None and keys.size == 64
    assert isinstance(replay.row_keys(batch), np.ndarray), "plain keys unless asked"


def test_priority_updates_reach_the_table(server):
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    _write(client, _transitions(10))
    keys = np.unique(next(replay.batches(address, TABLE, batch_size=200)).keys)
    assert len(keys) == 10
    new_priorities = np.arange(2.0, 12.0)
    updater = replay.PriorityUpdater(client, TABLE)
    updater.submit(keys, new_priorities)
    updater.close()  # drains the queue
    assert updater.updates_sent == 1
    # Sampling probabilities now follow p**alpha / sum(p**alpha), alpha = 0.6.
    expected = dict(zip(keys.tolist(), new_priorities**0.6 / np.sum(new_priorities**0.6)))
    batch = next(replay.batches(address, TABLE, batch_size=50))
    for key, probability in zip(batch.keys.tolist(), batch.probabilities):
        assert probability == pytest.approx(expected[key])


def test_rate_limiter_blocks_inserts_that_run_ahead_of_samples():
    spi, min_size, batch = 2.0, 10, 1
    limiter = replay.rate_limiter(spi, min_size, batch)
    srv = _server(limiter)
    try:
        client = reverb.Client(f"localhost:{srv.port}")
        stop = threading.Event()
        inserted = []

        def write_forever():
            writer = replay.TransitionWriter(client, TABLE, max_pending=2, stop_event=stop)
            try:
                for i in range(10_000):
                    writer.write(CODEC.encode(_transitions(1, seed=i)), np.ones(1))
                    inserted.append(i)
            except replay.Stopped:
                pass

        thread = threading.Thread(target=write_forever)
        thread.start()
        # Without samples the writer stalls once inserts exceed the allowed error.
        thread.join(timeout=5)
        assert thread.is_alive(), "the rate limiter let the writer run ahead unbounded"
        stalled_at = client.server_info()[TABLE].rate_limiter_info.insert_stats.completed
        buffer_inserts = 16.0 * batch / spi  # the error buffer, in inserts
        assert stalled_at <= min_size + buffer_inserts + 1

        # Sampling lets it go on, and over a long run the ratio is held.
        samples = 0
        for batch_ in replay.batches(f"localhost:{srv.port}", TABLE, batch_size=8):
            samples += len(batch_.keys)
            if samples >= 2000:
                break
        stop.set()
        thread.join(timeout=30)
        info = client.server_info()[TABLE].rate_limiter_info
        inserts, sampled = info.insert_stats.completed, info.sample_stats.completed
        assert inserts > stalled_at
        # |(inserts - min_size) * spi - samples| stays within the error buffer.
        assert abs((inserts - min_size) * spi - sampled) <= 16.0 * batch + 1
    finally:
        srv.stop()


def test_scaled_priority_updates_reach_the_table_scaled(server):
    # What the learner sends for a dominant actor's items (balance "downweight").
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    _write(client, _transitions(10))
    keys = np.unique(next(replay.batches(address, TABLE, batch_size=200)).keys)
    updater = replay.PriorityUpdater(client, TABLE)
    new_priorities = np.arange(2.0, 12.0)
    scale = np.where(np.arange(10) < 5, 0.25, 1.0)
    updater.submit(replay.SampledKeys(keys, sources=np.zeros(10, np.int32)), new_priorities, scale)
    updater.close()
    held = {int(s[0].info.key): s[0].info.priority for s in client.sample(TABLE, num_samples=500)}
    assert held == pytest.approx(dict(zip(keys.tolist(), new_priorities * scale)))


def test_a_replay_checkpoint_without_source_actors_fails_to_restore_with_the_reason(tmp_path):
    def tables(item_bytes):
        limiter = replay.RateLimit(1)
        return [replay.prioritized_table(TABLE, 100, 0.6, limiter, item_bytes)]

    # Items before the trailer.
    old = replay.ReplayNode(lambda: tables(CODEC.payload_bytes), checkpoint_dir=str(tmp_path))
    try:
        with reverb.Client(old.address()).trajectory_writer(1) as writer:
            for row in CODEC.encode(_transitions(5))[:, : CODEC.payload_bytes]:
                writer.append({"item": row})
                writer.create_item(TABLE, 1.0, writer.history["item"][-1])
        old.checkpoint(step=8)
    finally:
        old.close()
    with pytest.raises(replay.IncompatibleCheckpoint, match="before items carried the actor"):
        replay.ReplayNode(
            lambda: tables(CODEC.num_bytes), checkpoint_dir=str(tmp_path), restore_step=8
        )
    # A checkpoint in the current format restores (and says nothing).
    node = replay.ReplayNode(lambda: tables(CODEC.num_bytes), checkpoint_dir=str(tmp_path))
    try:
        _write(reverb.Client(node.address()), _transitions(5))
        node.checkpoint(step=9)
    finally:
        node.close()
    node = replay.ReplayNode(
        lambda: tables(CODEC.num_bytes), checkpoint_dir=str(tmp_path), restore_step=9
    )
    try:
        assert node.table_info()[TABLE]["size"] == 5
    finally:
        node.close()


def _has_a_route() -> bool:
    """Whether this host routes beyond itself (not so in some sandboxes)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("8.8.8.8", 53))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _one_table() -> list[replay.TableSpec]:
    return [replay.uniform_table(TABLE, 10, replay.RateLimit(1), CODEC.num_bytes)]


def _serves_its_table(node: replay.ReplayNode) -> bool:
    return TABLE in reverb.Client(node.address()).server_info()


def test_a_replay_node_advertises_an_address_other_hosts_reach_and_serves_at_it():
    node = replay.ReplayNode(_one_table)
    try:
        host = node.address().rpartition(":")[0]
        # A host with a route gives its outward interface's address, not loopback.
        assert ipaddress.ip_address(host).is_loopback != _has_a_route()
        assert _serves_its_table(node)
    finally:
        node.close()


def test_a_replay_node_on_a_host_without_a_route_advertises_its_name_address(monkeypatch):
    def unreachable(self, address):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    node = replay.ReplayNode(_one_table)
    try:
        # As Ray does then: the address the host's name resolves to.
        assert node.address().rpartition(":")[0] == socket.gethostbyname(socket.getfqdn())
        assert _serves_its_table(node)
    finally:
        node.close()


@pytest.mark.parametrize(
    "spi, min_size, match",
    [(0.0, 10, "samples_per_insert"), (1.0, 0, "min_replay_size")],
)
def test_bad_rate_limiter_settings_are_rejected(spi, min_size, match):
    with pytest.raises(ValueError, match=match):
        replay.rate_limiter(spi, min_size, batch_size=32)
