"""Duplicate-aware priorities (`--config.priority_duplicate_bonus`): content hashes, the
learner's count of actors per transition, and a real learner's priorities in its replay."""

import dataclasses

import numpy as np
import pytest

from agents import dqn
from gorila_jax import envs, replay
from tests.backends import sampled_items
from tests.gorila_jax.health.test_balance import learner_on_a_dqn_table, random_transitions

BONUS = 100.0  # far above |TD error| of these transitions (rewards ~ N(0, 1)): easy to read
CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=1,
    max_replay_size=5_000,
    priority_duplicate_bonus=BONUS,
)


def test_content_hashes_ignore_the_writer_and_tell_contents_apart():
    codec = dqn.DQNBuilder(CONFIG).replay_layout(envs.env_spec("CartPole-v1")).codec
    batch = random_transitions(500, seed=0)
    by_actor_0 = codec.content_hashes(codec.encode(batch, source=0))
    by_actor_3 = codec.content_hashes(codec.encode(batch, source=3))
    np.testing.assert_array_equal(by_actor_0, by_actor_3)
    assert len(np.unique(by_actor_0)) == 500
    # One bit of one reward changes the hash.
    flipped = batch._replace(reward=np.nextafter(batch.reward, np.inf))
    assert not np.any(codec.content_hashes(codec.encode(flipped, source=0)) == by_actor_0)


def test_the_counter_counts_distinct_actors_per_content_and_forgets_the_oldest_first():
    counter = replay.DuplicateCounter(bonus=0.5, capacity=3)
    a, b, c, d = 11, 22, 33, 44
    np.testing.assert_array_equal(counter.count([a, a, b], [0, 0, 1]), [1, 1, 1])
    np.testing.assert_array_equal(counter.count([a, b], [2, 1]), [2, 1])  # actor 2 found a too
    # Unknown writers count as one actor of their own.
    np.testing.assert_array_equal(counter.count([a], [replay.UNKNOWN_SOURCE]), [3])
    np.testing.assert_allclose(counter.bonus([a], [5]), 0.5 * np.sqrt(4))
    counter.count([c, d], [0, 0])  # b was seen longest ago: forgotten, and then a
    assert len(counter) == 3
    np.testing.assert_array_equal(counter.count([b], [7]), [1])
    np.testing.assert_array_equal(counter.count([a], [9]), [1])


@pytest.mark.parametrize("bonus, capacity", [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_a_counter_that_could_not_work_is_refused(bonus, capacity):
    with pytest.raises(ValueError, match="must be"):
        replay.DuplicateCounter(bonus, capacity)


def test_a_negative_bonus_is_rejected_naming_the_field_and_zero_turns_it_off():
    with pytest.raises(ValueError, match="config.priority_duplicate_bonus"):
        dataclasses.replace(CONFIG, priority_duplicate_bonus=-0.1).validate(1)
    off = dataclasses.replace(CONFIG, priority_duplicate_bonus=0.0)
    assert dqn.DQNBuilder(off).duplicate_counter() is None
    assert dqn.DQNConfig().priority_duplicate_bonus == 0.0, "off by default"


def test_a_learner_adds_eps_sqrt_n_to_the_new_priority_of_a_transition_n_actors_wrote():
    # Actors 0, 1 and 2 each wrote the same 100 transitions; actor 0 also 100 of its own.
    replay_node, node, codec = learner_on_a_dqn_table(CONFIG)
    table = dqn.builder.TABLE
    shared, own = random_transitions(100, seed=1), random_transitions(100, seed=2)
    try:
        writer = replay.connect(replay_node).writer(table)
        # Written at a priority above any new one, as actors write at the replay's
        # largest: each item is sampled before the learner samples updated ones again.
        first = np.full(100, 3 * BONUS)
        for actor in (0, 1, 2):
            writer.write(codec.encode(shared, source=actor), first)
        writer.write(codec.encode(own, source=0), first)
        writer.close()
        for _ in range(150):  # 4800 rows: every item sampled about 12 times
            assert node.step(timeout=60), "the learner got no batch"
    finally:
        node.stop()
        node.close()
    try:
        sampled = sampled_items(replay_node, table, 8000, CONFIG.priority_exponent)
        found = {  # key -> (content hash, priority)
            key: (codec.content_hashes(row[None])[0], priority)
            for key, (row, priority) in sampled.items()
        }
    finally:
        replay_node.close()
    assert len(found) == 400, len(found)
    shared_hashes = set(codec.content_hashes(codec.encode(shared)).tolist())
    tripled = np.array([p for h, p in found.values() if h in shared_hashes])
    single = np.array([p for h, p in found.values() if h not in shared_hashes])
    # |TD error| + eps * sqrt(N): N = 3 for the shared transitions, 1 for the others.
    # An item updated before the learner had sampled all three copies got less (N < 3):
    # the median, not every item, must be there.
    assert np.all(tripled < 3 * BONUS) and np.all(single < 3 * BONUS), "an item never updated"
    assert np.all(tripled >= BONUS) and np.all(single >= BONUS), "an update without the bonus"
    assert BONUS * np.sqrt(3) <= np.median(tripled) <= BONUS * np.sqrt(3) + 10, tripled
    assert BONUS <= np.median(single) <= BONUS + 10, single
