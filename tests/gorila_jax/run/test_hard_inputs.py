"""Hard inputs (issue 6, item 7): each gives a clear error or a recovery, never a hang or garbage.

Real replay nodes and files on disk; no Ray. The Reverb backend's own cases run on the
DeepMind set (`needs_reverb`). An unreachable --ray_address
is tested in test_launchers.py (`test_unreachable_ray_address_fails_fast`).
"""

import dataclasses
import logging
import os
import socket
import threading
import time

import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import envs, replay
from gorila_jax.learning import prefetch
from gorila_jax.learning import config_record
from gorila_jax.run import experiment
from tests.backends import needs_reverb, optional_module

reverb = optional_module("reverb")

TABLE = "transitions"
CODEC = replay.ItemCodec({"observation": np.zeros(4, np.float32), "action": np.int32(0)})
# The same structure for a 5-float observation: another environment's items.
OTHER_CODEC = replay.ItemCodec({"observation": np.zeros(5, np.float32), "action": np.int32(0)})


def _items(codec: replay.ItemCodec, count: int) -> np.ndarray:
    width = 4 if codec is CODEC else 5
    return codec.encode(
        {
            "observation": np.ones((count, width), np.float32),
            "action": np.arange(count, dtype=np.int32),
        }
    )


def _tables():
    return [replay.uniform_table(TABLE, 100, replay.RateLimit(1), CODEC.num_bytes)]


# ---------------------------------------------------------------- mis-shaped items


@needs_reverb
def test_a_mis_shaped_item_is_rejected_at_insert_naming_the_table_and_shapes():
    server = reverb.Server([replay.reverb_table(table) for table in _tables()])
    writer = replay.TransitionWriter(reverb.Client(f"localhost:{server.port}"), TABLE)
    try:
        # Reverb checks every item against the table's signature: the bad item
        # never reaches replay, and the actor that wrote it fails with this error.
        # Packed widths: 20 and 24 bytes of data, each with a 4-byte source-actor trailer.
        with pytest.raises(
            ValueError, match=f"(?s)table '{TABLE}'.*uint8 \\[24\\] tensor but got a uint8 \\[28\\]"
        ):
            writer.write(_items(OTHER_CODEC, 3), np.ones(3))
            writer.flush()
        assert reverb.Client(f"localhost:{server.port}").server_info()[TABLE].current_size == 0
    finally:
        server.stop()


@needs_reverb
def test_sampled_items_of_another_layout_fail_to_decode_naming_the_table_and_shapes():
    # A table of another agent config or environment (a replay checkpoint of
    # another run): its items are valid for it, but not for this learner's codec.
    limiter = replay.RateLimit(1)
    table = replay.uniform_table(TABLE, 100, limiter, OTHER_CODEC.num_bytes)
    server = reverb.Server([replay.reverb_table(table)])
    address = f"localhost:{server.port}"
    writer = replay.TransitionWriter(reverb.Client(address), TABLE)
    try:
        writer.write(_items(OTHER_CODEC, 8), np.ones(8))
        writer.flush()
        expected = (
            f"replay table '{TABLE}': packed items must be \\[B, 24\\] uint8 "
            r"\(int32\[\], float32\[4\], 4-byte source actor\), got uint8\[4, 28\]"
        )
        with pytest.raises(ValueError, match=expected):
            next(replay.batches(address, TABLE, 4, CODEC))
    finally:
        writer.close()
        server.stop()


# ---------------------------------------------------------------- a replay that goes away


def _batch(count: int = 4) -> replay.Batch:
    return replay.Batch(
        keys=np.arange(count, dtype=np.uint64),
        probabilities=np.full(count, 1 / count),
        table_size=np.full(count, count),
        data=np.arange(count, dtype=np.float32),
    )


def _first_batch(prefetcher: prefetch.DevicePrefetcher, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = prefetcher.get(timeout=0.5)
        if item is not None:
            return item
    return None


def test_the_learner_samples_again_when_the_replay_connection_drops():
    made = []

    def make_batches(batch_size: int):
        made.append(batch_size)
        if len(made) == 1:  # the server went away under the first iterator
            raise ConnectionResetError("Socket closed")
        return iter([_batch(batch_size)] * 3)

    stop = threading.Event()
    devices = jax.local_devices()[:1]
    prefetcher = prefetch.DevicePrefetcher(
        _lazy(make_batches), lambda: 4, devices, stop, connection_errors=(ConnectionError,)
    )
    try:
        item = _first_batch(prefetcher)
        assert item is not None, "no batch after the connection came back"
        keys, _ = item
        np.testing.assert_array_equal(keys, np.arange(4))
        assert len(made) >= 2
    finally:
        stop.set()


def test_a_sampling_error_that_is_not_a_lost_connection_reaches_the_learner():
    def make_batches(batch_size: int):
        raise ValueError("replay table 'transitions': packed items must be ...")

    stop = threading.Event()
    devices = jax.local_devices()[:1]
    prefetcher = prefetch.DevicePrefetcher(_lazy(make_batches), lambda: 4, devices, stop)
    try:
        with pytest.raises(RuntimeError, match="sampling from replay failed") as raised:
            _first_batch(prefetcher, timeout_s=30)
        assert "packed items must be" in str(raised.value.__cause__)
    finally:
        stop.set()


def _lazy(make_batches):
    """Like `prefetch.sampler`: the error comes from the iterator, when it is first read."""

    def batches(batch_size: int):
        yield from make_batches(batch_size)

    return batches


# ---------------------------------------------------------------- truncated checkpoints


def _checkpointed_node(checkpoint_dir: str, steps: list[int]) -> None:
    """Replay checkpoints at `steps`, the one at steps[i] holding 10 * (i + 1) items."""
    node = replay.ReplayNode(_tables, checkpoint_dir=checkpoint_dir)
    writer = replay.TransitionWriter(reverb.Client(node.address()), TABLE)
    try:
        for step in steps:
            writer.write(_items(CODEC, 10), np.ones(10))
            writer.flush()
            node.checkpoint(step)
    finally:
        writer.close()
        node.close()


@needs_reverb
def test_a_restarted_replay_skips_a_truncated_checkpoint_and_restores_the_one_before(
    tmp_path, caplog
):
    checkpoint_dir = str(tmp_path / "replay")
    _checkpointed_node(checkpoint_dir, [10, 20])
    chunks = os.path.join(checkpoint_dir, "20", "chunks.tfrecord")
    with open(chunks, "r+b") as f:
        f.truncate(os.path.getsize(chunks) // 2)
    with caplog.at_level(logging.WARNING):
        node = replay.ReplayNode(_tables, checkpoint_dir=checkpoint_dir, restore_step=replay.NEWEST)
    try:
        assert node.restored_from() == {"step": 10, "table_sizes": {TABLE: 10}}
        assert node.table_info()[TABLE]["size"] == 10
        assert any("skipping checkpoint 20" in r.message for r in caplog.records)
    finally:
        node.close()


@needs_reverb
def test_a_restarted_replay_without_an_intact_checkpoint_starts_empty(tmp_path):
    checkpoint_dir = str(tmp_path / "replay")
    _checkpointed_node(checkpoint_dir, [10])
    os.remove(os.path.join(checkpoint_dir, "10", replay.CHECKPOINT_MANIFEST))
    node = replay.ReplayNode(_tables, checkpoint_dir=checkpoint_dir, restore_step=replay.NEWEST)
    try:
        assert node.restored_from() == {"step": None, "table_sizes": {}}
        assert node.table_info()[TABLE]["size"] == 0
    finally:
        node.close()


# ---------------------------------------------------------------- config files


def test_a_config_file_with_unknown_fields_fails_naming_them(tmp_path):
    values = dataclasses.asdict(dqn.DQNConfig())
    values.update(learning_rat=1e-3, hiden_sizes=[64])  # typos
    with pytest.raises(
        ValueError,
        match="config.json has fields that DQNConfig does not know: "
        "hiden_sizes, learning_rat \\(known: ",
    ):
        config_record.config_from_dict(dqn.DQNConfig, values, source="config.json")
    with pytest.raises(ValueError, match="expected a mapping of DQNConfig fields, got list"):
        config_record.config_from_dict(dqn.DQNConfig, [1, 2])
    # Missing fields take their defaults: a file written before a field was added.
    del values["learning_rat"], values["hiden_sizes"], values["batch_size"]
    assert config_record.config_from_dict(dqn.DQNConfig, values) == dqn.DQNConfig()


# ---------------------------------------------------------------- ports


@needs_reverb
def test_a_replay_port_in_use_fails_naming_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(replay.PortInUse, match=f"replay port {port} is already in use"):
            replay.ReplayNode(_tables, port=port)


@needs_reverb
def test_a_port_the_run_picked_and_another_process_took_since_is_swapped_for_a_free_one():
    # Seen in CI: the kernel handed a picked port to another process's connection in
    # the minute before the replay bound it, and its restarts failed the same way.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = replay.ReplayNode(_tables, port=port, any_port_if_taken=True)
        try:
            served = int(node.address().rpartition(":")[2])
            assert served != port
            # Clients ask the node where it serves: they reach the swapped port.
            assert replay.ReplayClient(node).server_info()
        finally:
            node.close()


@needs_reverb
def test_a_free_replay_port_is_used():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = replay.ReplayNode(_tables, port=port)
    try:
        assert node.address().endswith(f":{port}")
    finally:
        node.close()


def test_a_replay_port_out_of_range_is_refused_before_the_run():
    with pytest.raises(ValueError, match="replay_port must be in 0..65535, got 70000"):
        experiment.ExperimentConfig(replay_port=70_000).validate()


def test_an_env_that_observes_a_dict_is_refused_by_name_before_any_node_starts():
    # A dict observation space used to fail deep in tuple(None) with a TypeError and
    # a traceback. dm_control's dicts of float arrays are flattened now
    # (tests/gorila_jax/test_dict_observations.py); MiniGrid's image and text are not.
    with pytest.raises(ValueError, match="MiniGrid-Empty-5x5-v0 has dict observations"):
        envs.env_spec("MiniGrid-Empty-5x5-v0")
