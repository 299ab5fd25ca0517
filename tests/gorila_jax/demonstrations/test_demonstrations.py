"""Demonstrations (`--demos`, issue 18 item 2): the file format, recording, loading them into a
real Reverb table through the agent's adder, batches mixed at a fixed share, DQfD's margin
loss, and every way a run can be asked for them wrongly."""

import dataclasses
import os
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from agents import dqn, ppo, sac
from agents.dqn import learning as dqn_learning
from gorila_jax import demonstrations, envs, replay
from gorila_jax.learning import learner
from gorila_jax.learning.settings import LearnerSettings
from tests.gorila_jax.health.test_balance import random_transitions
from tests.backends import DefaultReplayNode, sampled_items

CARTPOLE = envs.env_spec("CartPole-v1")
DQN_CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=1,
    max_replay_size=5_000,
    demo_fraction=0.25,
)


def _balance_pole(observations: np.ndarray) -> np.ndarray:
    """A hand-written CartPole controller: push towards where the pole falls."""
    angle, angular_velocity = observations[:, 2], observations[:, 3]
    return (angle + 0.5 * angular_velocity > 0).astype(np.int32)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("demos"))
    episodes = demonstrations.record("CartPole-v1", _balance_pole, episodes=4, seed=3)
    demonstrations.write(out, episodes, "CartPole-v1", "the hand-written controller")
    return out


def test_recorded_episodes_round_trip_through_the_files(demo_dir):
    episodes = demonstrations.read(demo_dir, CARTPOLE)
    assert len(episodes) == 4
    for episode in episodes:
        steps = episode.steps
        assert episode.observations.shape == (steps + 1, 4)
        assert episode.actions.shape == (steps,) and episode.actions.dtype == np.int32
        np.testing.assert_array_equal(episode.rewards, np.ones(steps))  # CartPole: 1 a step
        # The controller balances: episodes end at the time limit, cut off, not fallen.
        assert steps == 500 and not episode.terminated
        # The actions are the controller's on the recorded observations.
        np.testing.assert_array_equal(episode.actions, _balance_pole(episode.observations[:-1]))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda e: e._replace(observations=e.observations[:, :3]), "observations must be"),
        (lambda e: e._replace(actions=e.actions[:-1]), "actions must be"),
        (lambda e: e._replace(actions=e.actions + 5), "actions must be integers in [0, 2)"),
        (lambda e: e._replace(rewards=np.full(e.steps, np.nan, np.float32)), "NaN"),
    ],
)
def test_an_episode_that_does_not_fit_the_env_is_rejected_naming_file_and_fault(
    tmp_path, change, message
):
    good = demonstrations.record("CartPole-v1", _balance_pole, episodes=1, seed=0)[0]
    demonstrations.write(str(tmp_path), [change(good)], "CartPole-v1", "test")
    with pytest.raises(demonstrations.DemonstrationError, match="episode_000000.npz") as error:
        demonstrations.read(str(tmp_path), CARTPOLE)
    assert message in str(error.value)


def test_a_directory_of_another_env_or_of_nothing_is_rejected(demo_dir, tmp_path):
    with pytest.raises(demonstrations.DemonstrationError, match="not of Acrobot-v1"):
        demonstrations.read(demo_dir, envs.env_spec("Acrobot-v1"))
    with pytest.raises(demonstrations.DemonstrationError, match="holds no"):
        demonstrations.read(str(tmp_path), CARTPOLE)
    with pytest.raises(demonstrations.DemonstrationError, match="no directory"):
        demonstrations.read(str(tmp_path / "missing"), CARTPOLE)
    with pytest.raises(demonstrations.DemonstrationError, match="already holds episodes"):
        demonstrations.write(demo_dir, [], "CartPole-v1", "test")


def test_a_person_can_write_an_episode_by_hand(tmp_path):
    # What docs/demonstrations.md tells someone with their own recordings to write.
    rng = np.random.default_rng(0)
    np.savez(
        os.path.join(tmp_path, "episode_000000.npz"),
        observations=rng.normal(size=(11, 4)),  # float64: read as the env's float32
        actions=rng.integers(0, 2, 10),
        rewards=np.ones(10),
        terminated=True,
    )
    (episode,) = demonstrations.read(str(tmp_path), CARTPOLE)
    assert episode.terminated and episode.steps == 10
    assert episode.observations.dtype == np.float32


@pytest.mark.parametrize("rows, fraction", [(64, 0.25), (512, 0.25), (100, 0.3), (7, 0.5)])
def test_demonstration_rows_are_spread_so_every_block_holds_its_share(rows, fraction):
    demo = replay.demo_rows(rows, fraction)
    assert demo.sum() == round(fraction * rows)
    # Any contiguous block (one update of a multi-update dispatch, one device's rows)
    # holds its share within one row.
    for block in (1, 2, 4, 8):
        if rows % block == 0:
            shares = demo.reshape(block, -1).sum(axis=1)
            assert np.all(np.abs(shares - fraction * rows / block) <= 1.0)


def _server_with_demos(builder, spec, demo_dir):
    """DQN's (or SAC's) own table without a rate limiter, and the demonstration table, loaded
    through the agent's adder as the first replay shard loads it."""
    codec = builder.replay_layout(spec).codec

    def tables():
        own = dataclasses.replace(
            builder.replay_layout(spec).tables[0], rate_limit=replay.RateLimit(1)
        )
        return [own, replay.demo_table(codec.num_bytes)]

    loader = demonstrations.Loader(demo_dir, builder, spec)
    return DefaultReplayNode(tables, preload=loader), codec


def test_loading_writes_one_item_per_step_once_across_restores(demo_dir, tmp_path):
    builder = dqn.DQNBuilder(DQN_CONFIG)
    node, _ = _server_with_demos(builder, CARTPOLE, demo_dir)
    try:
        # n-step transitions: one per step, the last n - 1 cut short at the episode's end.
        assert node.table_info()[replay.DEMO_TABLE]["size"] == 4 * 500
    finally:
        node.close()
    codec = builder.replay_layout(CARTPOLE).codec
    loader = demonstrations.Loader(demo_dir, builder, CARTPOLE)

    def restored_size(checkpoint_dir: str, loaded_before: bool) -> int:
        """Demonstration items of a replay restored from a checkpoint written by one that
        loaded them (or, `loaded_before` False, by a run without demonstrations)."""

        def tables():
            return [replay.demo_table(codec.num_bytes)]

        first = DefaultReplayNode(
            tables, checkpoint_dir=checkpoint_dir, preload=loader if loaded_before else None
        )
        try:
            first.checkpoint(10)
        finally:
            first.close()
        restored = DefaultReplayNode(
            tables, checkpoint_dir=checkpoint_dir, restore_step=replay.NEWEST, preload=loader
        )
        try:
            return restored.table_info()[replay.DEMO_TABLE]["size"]
        finally:
            restored.close()

    assert restored_size(str(tmp_path / "loaded"), loaded_before=True) == 4 * 500  # not twice
    assert restored_size(str(tmp_path / "empty"), loaded_before=False) == 4 * 500  # filled


def test_a_learner_samples_demonstrations_at_the_configured_share_and_sends_no_priorities_for_them(
    demo_dir,
):
    builder = dqn.DQNBuilder(DQN_CONFIG)
    node, codec = _server_with_demos(builder, CARTPOLE, demo_dir)
    learner_node = learner.LearnerNode(
        builder, CARTPOLE, node, None, 0, LearnerSettings(num_devices=1)
    )
    try:
        writer = replay.connect(node).writer(dqn.builder.TABLE)
        writer.write(codec.encode(random_transitions(1000, seed=0), source=0), np.ones(1000))
        writer.close()
        for _ in range(40):
            assert learner_node.step(timeout=60), "the learner got no batch"
        counters = learner_node._heartbeat_counters()
        demo, own = counters["sampled/demo"], counters["sampled/actor/0"]
        assert demo / (demo + own) == DQN_CONFIG.demo_fraction  # exactly: spread, not drawn
        learner_node.get_params()  # the last update has finished
    finally:
        learner_node.stop()
        learner_node.close()
    try:
        # New priorities reached the learner's own items (written at 1.0), and nothing
        # was lost or added in the demonstration table.
        sampled = sampled_items(node, dqn.builder.TABLE, 200, DQN_CONFIG.priority_exponent)
        priorities = {round(priority, 4) for _, priority in sampled.values()}
        assert priorities - {1.0}
        assert node.table_info()[replay.DEMO_TABLE]["size"] == 4 * 500
    finally:
        node.close()


def test_dqfd_margin_loss_is_zero_when_the_demonstrated_action_leads_by_the_margin():
    q = jnp.array([[1.0, 0.0], [1.0, 0.9], [0.0, 1.0], [5.0, -5.0]])
    action = jnp.array([0, 0, 0, 1])
    # Row 0: leads by 1 >= 0.8 -> 0. Row 1: 0.9 + 0.8 - 1.0 = 0.7. Row 2: 1.8 - 0 = 1.8.
    # Row 3 is not a demonstration row: it does not count.
    demo = jnp.array([True, True, True, False])
    loss = dqn_learning.demo_margin_loss(q, action, demo, margin=0.8)
    assert float(loss) == pytest.approx((0.0 + 0.7 + 1.8) / 3, rel=1e-6)
    nothing = dqn_learning.demo_margin_loss(q, action, jnp.zeros(4, bool), margin=0.8)
    assert float(nothing) == 0.0


def test_sac_learns_from_batches_mixed_with_demonstrations(tmp_path):
    spec = envs.env_spec("Pendulum-v1")
    config = dataclasses.replace(
        sac.SACConfig(),
        hidden_sizes=(32, 32),
        batch_size=32,
        min_replay_size=1,
        max_replay_size=5_000,
        demo_fraction=0.25,
    )
    builder = sac.SACBuilder(config)
    rng = np.random.default_rng(0)

    def random_torque(observations):
        return rng.uniform(-2, 2, (len(observations), 1)).astype(np.float32)

    episodes = demonstrations.record("Pendulum-v1", random_torque, episodes=2, seed=0)
    demonstrations.write(str(tmp_path), episodes, "Pendulum-v1", "uniform random")
    node, _ = _server_with_demos(builder, spec, str(tmp_path))
    learner_node = learner.LearnerNode(builder, spec, node, None, 0, LearnerSettings(num_devices=1))
    try:
        # Items of its own table, as actor 0's adder writes them: other random episodes.
        own = demonstrations.record("Pendulum-v1", random_torque, episodes=1, seed=1)
        connection = replay.connect(node)
        adder = builder.replay_layout(spec).make_adder(connection, 1, threading.Event())
        demonstrations.add_episodes(adder, own, source=0)
        adder.close()
        for _ in range(20):
            assert learner_node.step(timeout=60)
        counters = learner_node._heartbeat_counters()
        assert counters["sampled/demo"] / (
            counters["sampled/demo"] + counters["sampled/actor/0"]
        ) == pytest.approx(0.25)
    finally:
        learner_node.stop()
        learner_node.close()
        node.close()


@pytest.mark.parametrize(
    "builder, demos, message",
    [
        (ppo.PPOBuilder(ppo.PPOConfig()), "DIR", "learns on-policy"),
        (dqn.DQNBuilder(dqn.DQNConfig()), "DIR", "needs --config.demo_fraction > 0"),
        (dqn.DQNBuilder(DQN_CONFIG), None, "needs --demos=DIR"),
    ],
)
def test_demonstrations_and_their_share_are_asked_for_together(demo_dir, builder, demos, message):
    with pytest.raises(ValueError, match=message):
        demonstrations.check_run(demo_dir if demos else None, builder, CARTPOLE)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"demo_fraction": 1.0}, "must lie in"),
        ({"demo_fraction": 0.001}, "0 demonstration rows"),
        ({"demo_fraction": 0.0, "demo_margin_weight": 1.0}, "needs demonstrations"),
        ({"demo_margin": -1.0}, "config.demo_margin"),
    ],
)
def test_bad_demonstration_settings_are_rejected_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DQN_CONFIG, **changes).validate(1)
