"""Replay sharded over several real replay nodes: writes, cross-shard sampling, priorities.

The cross-shard sampler of Reverb (`replay.ShardedSampler`) is tested here on real Reverb
servers (the DeepMind set); the contract suite tests both backends' (test_replay_contract.py)."""

import dataclasses
import functools
import itertools
import os
import time

import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay
from gorila_jax.acting import actor
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import launchers, program
from gorila_jax.learning import checkpoint, learner
from gorila_jax.run import experiment, resume
from gorila_jax.learning.settings import LearnerSettings
from tests import fakes
from tests.backends import DefaultReplayNode, needs_reverb

TABLE = "table"
EXPONENT = 0.6
# Item: (shard it was written to, its index there, its priority), as float64.
CODEC = replay.ItemCodec(np.zeros(3, np.float64))


def saved_shard_use(logdir, step: int, table: str, initial_priority: float) -> list[dict]:
    """What each replay shard's checkpoint at learner step `step` says of the run, read
    from the backend's files (no server, so no rate limiter to wait on): items inserted and
    sampled (both backends keep the rate limiter's counts), and items whose priority a
    learner set (any other than `initial_priority`, the one actors write)."""
    found = []
    for directory in checkpoint.saved_replay_dirs(str(logdir)):
        path = os.path.join(directory, str(step))
        use = {"shard_dir": directory, "inserts": 0, "samples": 0, "updated_priorities": 0}
        if replay.checkpoint_backend(path) == replay.NATIVE:
            with np.load(os.path.join(path, f"table-{table}.npz")) as saved:
                inserts, samples = saved["counts"].tolist()
                updated = int(np.sum(saved["priorities"] != initial_priority))
            found.append(
                {**use, "inserts": inserts, "samples": samples, "updated_priorities": updated}
            )
            continue
        from reverb.cc import schema_pb2  # the DeepMind set's only
        from reverb.cc.checkpointing import checkpoint_pb2

        for record in _records(os.path.join(path, "tables.tfrecord")):
            saved = checkpoint_pb2.PriorityTableCheckpoint.FromString(record)
            if saved.table_name == table:
                counts = saved.rate_limiter
                use.update(inserts=counts.insert_count, samples=counts.sample_count)
        for record in _records(os.path.join(path, "items.tfrecord")):
            item = schema_pb2.PrioritizedItem.FromString(record)
            use["updated_priorities"] += item.table == table and item.priority != initial_priority
        found.append(use)
    return found


def _records(path: str):
    import tensorflow as tf  # the DeepMind set's only

    return tf.data.TFRecordDataset(path, compression_type="ZLIB").as_numpy_iterator()


def _tables(max_size: int = 1000):
    limiter = replay.RateLimit(1)
    return [replay.prioritized_table(TABLE, max_size, EXPONENT, limiter, CODEC.num_bytes)]


def _fill(node, shard: int, priorities: np.ndarray, first: int = 0) -> None:
    """Writes items of `priorities`, numbered from `first` on, through the actors' writer."""
    count = len(priorities)
    items = np.stack([np.full(count, shard), first + np.arange(count), priorities], axis=1)
    writer = replay.connect(node).writer(TABLE)
    try:
        writer.write(CODEC.encode(items), priorities)
        writer.flush()
    finally:
        writer.close()


@pytest.fixture
def two_shards():
    nodes = [replay.ReplayNode(_tables) for _ in range(2)]
    yield nodes
    for node in nodes:
        node.close()


def _batches(
    sampler,
    batch_size: int,
    timeout_s: float = 120.0,
    retry_unreachable: bool = False,
):
    """The sampler's batches for up to `timeout_s`, asking again when its iterator ends,
    as `DevicePrefetcher` does: it also ends when a shard's new dataset brings nothing
    within the rate limiter's timeout, which a loaded machine can take just to start it.
    With `retry_unreachable`, also when a shard is unreachable."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for batch in sampler.batches(batch_size):
                yield batch
                if time.monotonic() >= deadline:
                    return
        except replay.CONNECTION_ERRORS:
            if not retry_unreachable:
                raise


def _rows(sampler, batch_size: int, count: int) -> list:
    batches = list(itertools.islice(_batches(sampler, batch_size), count))
    assert len(batches) == count, f"{len(batches)} of {count} batches within the timeout"
    return batches


@needs_reverb
def test_sampling_covers_the_shards_in_proportion_to_their_priority_mass(two_shards):
    # Mass = sum of priority**alpha: 100 * 1 on shard 0, 100 * 3 on shard 1.
    _fill(two_shards[0], 0, np.ones(100))
    _fill(two_shards[1], 1, np.full(100, 3.0 ** (1 / EXPONENT)))
    with replay.ShardedSampler(two_shards, TABLE, CODEC, seed=0) as sampler:
        batches = _rows(sampler, 64, 100)
        shards = np.concatenate([batch.shards for batch in batches])
        # Each row's shard is the one its item was written to.
        for batch in batches:
            np.testing.assert_array_equal(batch.data[:, 0], batch.shards)
        # 6400 rows: the share's standard deviation is sqrt(3/16 / 6400) = 0.0054.
        assert abs(np.mean(shards == 1) - 0.75) < 0.03, np.mean(shards == 1)
        assert len(np.unique(np.concatenate([b.keys for b in batches]))) == 200  # every item seen


@needs_reverb
def test_rows_carry_global_probabilities_and_the_total_table_size(two_shards):
    # Unequal shards: 30 items of priorities 1..30, and 70 of priorities 31..100.
    priorities = np.arange(1.0, 101.0)
    _fill(two_shards[0], 0, priorities[:30])
    _fill(two_shards[1], 1, priorities[30:])
    total_mass = np.sum(priorities**EXPONENT)
    with replay.ShardedSampler(two_shards, TABLE, CODEC, seed=1) as sampler:
        for batch in _rows(sampler, 32, 20):
            row_priority = batch.data[:, 2]
            np.testing.assert_allclose(
                batch.probabilities, row_priority**EXPONENT / total_mass, 1e-9
            )
            np.testing.assert_array_equal(batch.table_size, 100)
        # What an agent computes from them (agents/dqn/learning.py): N * P, as for one replay.
        weights = batch.table_size * batch.probabilities
        np.testing.assert_allclose(weights, 100 * row_priority**EXPONENT / total_mass, 1e-9)


@needs_reverb
def test_one_shard_gives_reverb_batches_unchanged(two_shards):
    _fill(two_shards[0], 0, np.arange(1.0, 51.0))
    with replay.ShardedSampler(two_shards[:1], TABLE, CODEC) as sampler:
        batch = _rows(sampler, 16, 1)[0]
        assert batch.shards is None  # plain keys for priority updates, as before sharding
        assert isinstance(replay.row_keys(batch), np.ndarray)
        # Reverb's own within-table probability and size.
        row_priority = batch.data[:, 2]
        total = np.sum(np.arange(1.0, 51.0) ** EXPONENT)
        np.testing.assert_allclose(batch.probabilities, row_priority**EXPONENT / total, 1e-9)
        np.testing.assert_array_equal(batch.table_size, 50)


@needs_reverb
def test_close_waits_for_the_datasets_that_ended_before_it():
    """A shard's dataset ends each time the rate limiter holds samples back past its
    timeout, and the next batch starts another: `close` must wait for the threads of
    the ended ones too, or one still tearing down its dataset is left behind when the
    server stops (a CI run left such a thread in two learning tests)."""
    node = replay.ReplayNode(lambda: [_blocking_table()])
    before = set(fakes.threads_named("replay-shard-"))
    try:
        _fill(node, 0, np.ones(5))  # below the table's minimum size: no sample comes
        sampler = replay.ShardedSampler([node], TABLE, CODEC, rate_limiter_timeout_ms=100)
        for _ in range(3):  # each ends once the rate limiter held samples past the timeout
            assert list(sampler.batches(4)) == []
        sampler.close()
        assert set(fakes.threads_named("replay-shard-")) - before == set()
    finally:
        node.close()


def _blocking_table():
    limiter = replay.RateLimit(1000)
    return replay.prioritized_table(TABLE, 1000, EXPONENT, limiter, CODEC.num_bytes)


@needs_reverb
def test_uniform_and_queue_tables_sample_across_shards_too():
    # A uniform table (SAC): every item of the 30 + 90 equally likely, P = 1 / 120.
    def uniform_tables():  # a rate limiter belongs to one table: a new one each time
        limiter = replay.RateLimit(1)
        return [replay.uniform_table(TABLE, 1000, limiter, CODEC.num_bytes)]

    uniform = [replay.ReplayNode(uniform_tables) for _ in range(2)]
    # A queue (PPO): each item comes out exactly once, from either shard.
    queues = [
        replay.ReplayNode(lambda: [replay.queue_table(TABLE, 100, CODEC.num_bytes)])
        for _ in range(2)
    ]
    try:
        for shard, count in ((0, 30), (1, 90)):
            _fill(uniform[shard], shard, np.ones(count))
            _fill(queues[shard], shard, np.ones(40))
        with replay.ShardedSampler(uniform, TABLE, CODEC, seed=3) as sampler:
            batches = _rows(sampler, 40, 50)
            for batch in batches:
                np.testing.assert_allclose(batch.probabilities, 1 / 120, 1e-12)
                np.testing.assert_array_equal(batch.table_size, 120)
            shards = np.concatenate([batch.shards for batch in batches])
            assert abs(np.mean(shards == 1) - 0.75) < 0.04, np.mean(shards == 1)

        with replay.ShardedSampler(queues, TABLE, CODEC, seed=4) as sampler:
            items = np.concatenate([b.data for b in _rows(sampler, 10, 6)])  # 60 of the 80
            pairs = {(int(shard), int(index)) for shard, index, _ in items}
            assert len(pairs) == 60, "an item of a queue came out twice"
            assert {shard for shard, _ in pairs} == {0, 1}
    finally:
        for node in uniform + queues:
            node.close()


class _RecordingClient:
    """A real Reverb client that also records the keys it was asked to re-prioritize."""

    def __init__(self, address: str):
        import reverb  # the DeepMind set's only

        self._client = reverb.Client(address)
        self.mutated: set[int] = set()

    def mutate_priorities(self, table, updates=None, deletes=None):
        self.mutated.update(int(key) for key in (updates or {}))
        return self._client.mutate_priorities(table, updates=updates, deletes=deletes)


def _priorities_on(node, count: int) -> dict[int, float]:
    """key -> priority of each of the shard's `count` items, read back from its server."""
    import reverb  # the DeepMind set's only

    client = reverb.Client(node.address())
    # 5000 samples: an item of priority 1 among ones of up to 140 is missed with p < 1e-9.
    samples = client.sample(TABLE, num_samples=5000)
    priorities = {int(s[0].info.key): float(s[0].info.priority) for s in samples}
    assert len(priorities) == count
    return priorities


@needs_reverb
def test_priority_updates_reach_the_shard_that_owns_the_item_and_no_other(two_shards):
    _fill(two_shards[0], 0, np.ones(20))
    _fill(two_shards[1], 1, np.ones(20))
    with replay.ShardedSampler(two_shards, TABLE, CODEC, seed=2) as sampler:
        batch = _rows(sampler, 24, 1)[0]
        assert set(batch.shards.tolist()) == {0, 1}
        clients = [_RecordingClient(node.address()) for node in two_shards]
        updater = replay.PriorityUpdater(clients, TABLE)
        # A new priority per row that says which shard and item it is for.
        new = 10.0 + 100.0 * batch.data[:, 0] + batch.data[:, 1]
        updater.submit(replay.row_keys(batch), new)
        updater.close()  # sends what is queued
        assert updater.updates_sent == 2  # one call per shard
        for shard, node in enumerate(two_shards):
            owned = batch.shards == shard
            assert clients[shard].mutated == set(batch.keys[owned].tolist())
            updated = dict(zip(batch.keys[owned].tolist(), new[owned].tolist()))
            for key, priority in _priorities_on(node, 20).items():
                assert priority == updated.get(key, 1.0)


@needs_reverb
def test_a_shard_restarted_at_another_address_is_sampled_again():
    class MovableShard:
        """A replay node's client whose server may be replaced, as a restarted node's is."""

        def __init__(self):
            self.node = replay.ReplayNode(_tables)
            self.asked = 0

        def address(self) -> str:
            self.asked += 1
            return self.node.address()

    shards = [MovableShard(), MovableShard()]
    try:
        for index, shard in enumerate(shards):
            _fill(shard.node, index, np.ones(50))
        with replay.ShardedSampler(
            shards, TABLE, CODEC, probe_after_s=1.0, rate_limiter_timeout_ms=200
        ) as sampler:
            _rows(sampler, 16, 1)
            old_address = shards[1].node.address()
            shards[1].node.close()
            shards[1].node = replay.ReplayNode(_tables)  # a new port: another address
            assert shards[1].node.address() != old_address
            _fill(shards[1].node, 7, np.ones(50))  # its items say "7"
            for batch in _batches(sampler, 16, timeout_s=60, retry_unreachable=True):
                if 7 in batch.data[batch.shards == 1, 0]:
                    break
            else:
                pytest.fail("no rows from the restarted shard within 60 s")
            assert shards[1].asked >= 2
    finally:
        for shard in shards:
            shard.node.close()


def test_each_shard_keeps_its_share_of_the_tables():
    config = dataclasses.replace(dqn.DQNConfig(), min_replay_size=100, max_replay_size=1000)
    spec = envs.env_spec("CartPole-v1")
    make_tables = functools.partial(builder_lib.replay_tables, dqn.DQNBuilder(config), spec)
    (whole,) = make_tables()
    (shard,) = replay.shard_tables(make_tables, 4)
    assert shard.max_size == 250
    assert shard.rate_limit.min_size == 25
    assert (shard.kind, shard.priority_exponent) == (whole.kind, whole.priority_exponent)
    limits = shard.rate_limit
    assert limits.samples_per_insert == whole.rate_limit.samples_per_insert
    assert limits.max_diff - limits.min_diff >= 2 * max(1, limits.samples_per_insert)
    queue = replay.shard_tables(lambda: [replay.queue_table("q", 64, 8)], 4)[0]
    assert queue.max_size == 16 and queue.kind == replay.QUEUE


@needs_reverb
def test_reverb_holds_the_writers_of_a_full_shard_queue():
    queue = replay.shard_tables(lambda: [replay.queue_table("q", 64, 8)], 4)[0]
    built = replay.reverb_table(queue)
    assert built.info.max_times_sampled == 1 and built.info.rate_limiter_info.max_diff == 16


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_replay_shards=0), "num_replay_shards must be positive, got 0"),
        (dict(num_replay_shards=3, num_actors=2), "num_replay_shards=3 exceeds num_actors=2"),
        (
            dict(num_replay_shards=4, num_actors=4, replay_port=65534),
            "replay_port=65534 with num_replay_shards=4",
        ),
    ],
)
def test_bad_num_replay_shards_is_rejected_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        experiment.ExperimentConfig(launcher="local", **settings).validate()


# ---------------------------------------------------------------- nodes and a whole run

SPEC = envs.env_spec("CartPole-v1")
CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    n_step=1,
    min_replay_size=64,
    max_replay_size=5_000,
    samples_per_insert=2.0,
    epsilon_decay_steps=2_000,
)
NUM_ENVS = 4


def _actor_program(budgets: dict[int, int]) -> program.Program:
    """Two replay shards, a learner driven by hand, and actors (index -> env step budget)."""
    builder = dqn.DQNBuilder(CONFIG)
    graph = program.Program("shards")
    make_tables = functools.partial(
        replay.shard_tables, functools.partial(builder_lib.replay_tables, builder, SPEC), 2
    )
    with graph.group("replay"):
        shards = [graph.add_node(DefaultReplayNode, make_tables) for _ in range(2)]
    with graph.group("learner"):
        learner_node = graph.add_node(
            learner.LearnerNode, builder, SPEC, shards, None, 0, LearnerSettings(num_devices=1)
        )
    with graph.group("actor"):
        for index, budget in budgets.items():
            graph.add_node(
                actor.ActorNode,
                builder,
                SPEC,
                index,
                3,
                shards,
                learner_node,
                None,
                0,
                ActorSettings(num_envs=NUM_ENVS, max_env_steps=budget),
            )
    graph.node("learner").disable_run()
    return graph


def test_actors_write_to_their_assigned_shard_and_the_learner_samples_both():
    # Actor 1 writes to shard 1, actor 2 to shard 0 (i % 2), each its own amount.
    budgets = {1: 120, 2: 60}
    with launchers.launch(_actor_program(budgets), "local") as running:
        env_steps = {}
        for node_index, actor_index in enumerate(budgets):  # actor/0 is actor 1
            node = running.client(f"actor/{node_index}")
            assert node.wait_finished(120)
            env_steps[actor_index] = node.counters()["env_steps"]
        inserts = [
            running.client(f"replay/{k}").table_info()[dqn.builder.TABLE]["inserts"] for k in (0, 1)
        ]
        # 1-step transitions: an item per env step, but perhaps each env's last one.
        assert env_steps[2] - NUM_ENVS <= inserts[0] <= env_steps[2], (inserts, env_steps)
        assert env_steps[1] - NUM_ENVS <= inserts[1] <= env_steps[1], (inserts, env_steps)

        learner_client = running.client("learner")
        steps = 0
        while steps < 10:
            steps += learner_client.step()
        assert learner_client.get_params()[0] == 10
        for shard in (0, 1):
            info = running.client(f"replay/{shard}").table_info()[dqn.builder.TABLE]
            assert info["samples"] > 0, f"the learner never sampled shard {shard}"


def _run_config(logdir, **overrides) -> experiment.ExperimentConfig:
    settings = dict(
        launcher="local",
        logdir=str(logdir),
        seed=0,
        num_actors=2,
        num_envs_per_actor=4,
        num_learner_devices=1,
        num_replay_shards=2,
        total_env_steps=2_000,
        eval_interval_s=0.0,
        eval_episodes=1,
        log_interval_s=0.5,
        checkpoint_interval_steps=50,
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


def test_a_run_with_two_replay_shards_fills_both_learns_and_resumes(tmp_path):
    builder = dqn.DQNBuilder(CONFIG)
    first = experiment.run_experiment(builder, _run_config(tmp_path))
    assert first["learner_steps"] > 0
    assert first["env_steps"] >= 2_000
    # The final checkpoint has an intact replay checkpoint of each shard beside
    # it, and records each shard's table: both received inserts.
    target = jax.device_get(builder_lib.initial_train_state(builder, SPEC, 0))
    saved = checkpoint.restore_newest(str(tmp_path), target, need_replay=True)
    assert saved.step == first["params_version"]
    sizes = [record["table_sizes"][dqn.builder.TABLE] for record in saved.meta["replay"]["shards"]]
    assert len(sizes) == 2 and min(sizes) > 0, sizes
    assert saved.meta["replay"]["table_sizes"][dqn.builder.TABLE] == sum(sizes)
    # Both shards were sampled, and the learner's priorities reached both.
    for use in saved_shard_use(tmp_path, saved.step, dqn.builder.TABLE, CONFIG.initial_priority):
        assert use["samples"] > 0 and use["updated_priorities"] > 0, use

    # Resuming with another shard count would find no replay to restore: refused by name.
    with pytest.raises(checkpoint.CheckpointError, match="hold a replay of 2 shard.*shards=1"):
        resume.check_resumable(
            _run_config(tmp_path, num_replay_shards=1, num_actors=1, resume=True)
        )
    # Each shard restores its own checkpoint, and the run goes on from it: 1,000 env
    # steps past where the first ended (past its budget, by more on a faster machine).
    second = experiment.run_experiment(
        builder, _run_config(tmp_path, total_env_steps=first["env_steps"] + 1_000, resume=True)
    )
    assert second["resumed_from_learner_step"] == first["params_version"]
    assert second["learner_steps"] > first["learner_steps"]
