"""Atari through envpool: the DQN preprocessing contract, uint8 all the way, a short real run."""

import csv
import dataclasses
import functools
import math

import jax
import numpy as np
import pytest

from agents import dqn
from agents.dqn import networks
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, replay, types
from gorila_jax.run import experiment
from tests.backends import DefaultReplayNode, first_batch


def _random_steps(env, num_steps: int, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    env.reset()
    steps = []
    for _ in range(num_steps):
        action = rng.integers(0, env.action_space.n, env.config["num_envs"])
        _, reward, terminated, truncated, info = env.step(action)
        steps.append((reward, terminated, truncated, info["lives"]))
    return steps


def test_training_clips_rewards_and_ends_at_lost_lives_evaluation_keeps_raw_games():
    # Space Invaders pays 5-30 points per alien and has 3 lives: both rules show
    # within a few hundred random steps.
    training = _random_steps(envs.make_env("SpaceInvaders-v5", 2, seed=1), 600)
    evaluation = _random_steps(envs.make_env("SpaceInvaders-v5", 2, seed=1, evaluation=True), 600)

    train_rewards = np.concatenate([step[0] for step in training])
    assert set(np.unique(train_rewards)) <= {-1.0, 0.0, 1.0} and train_rewards.max() == 1.0
    assert np.concatenate([step[0] for step in evaluation]).max() > 1.0

    # Training: an episode ends at each lost life, lives left or not.
    assert any((term & (lives > 0)).any() for _, term, _, lives in training)
    # Evaluation: only a lost game ends an episode.
    for _, terminated, _, lives in evaluation:
        assert not (terminated & (lives > 0)).any()


def test_atari_observations_are_uint8_frame_stacks():
    spec = envs.env_spec("Pong-v5")
    assert spec.observation_shape == (4, 84, 84) and spec.observation_dtype == "uint8"
    obs, _ = envs.make_env("Pong-v5", 2, seed=0).reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8


def test_observations_stay_uint8_from_replay_to_device():
    spec = envs.env_spec("Pong-v5")
    # A small table: the native replay refuses one that the host's memory cannot hold.
    config = dataclasses.replace(
        dqn.DQNConfig(), min_replay_size=8, batch_size=8, max_replay_size=1000
    )
    builder = dqn.DQNBuilder(config)
    node = DefaultReplayNode(functools.partial(builder_lib.replay_tables, builder, spec))
    env = envs.make_env("Pong-v5", 4, seed=0)
    obs, _ = env.reset()
    adder = builder.replay_layout(spec).make_adder(replay.connect(node), 4, stop_event=None)
    for _ in range(6):
        action = np.zeros(4, np.int32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        valid = np.ones(4, bool)
        adder.add(types.EnvStep(obs, action, reward, terminated, truncated, next_obs, valid))
        obs = next_obs
    adder.close()  # flushes what is pending

    batch = first_batch(node, dqn.builder.TABLE, 8, builder.replay_layout(spec).codec)
    assert batch.data.observation.dtype == np.uint8
    assert batch.data.observation.shape == (8, 4, 84, 84)
    on_device = parallel.shard_to_devices(batch.data, jax.local_devices()[:2])
    assert on_device.observation.dtype == np.uint8 and on_device.observation.shape[:2] == (2, 4)
    node.close()


def _param_count(params) -> int:
    return sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))


@pytest.mark.parametrize("torso", ["nature", "impala"])
def test_conv_torsos_map_uint8_frames_to_float32_q_values(torso):
    spec = envs.env_spec("Pong-v5")
    network = networks.make_network(spec, (512,), dueling=True, torso=torso)
    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    params = network.init(jax.random.PRNGKey(0), frames)
    q = network.apply(params, frames)
    assert q.shape == (3, spec.num_actions) and q.dtype == np.float32
    assert np.isfinite(np.asarray(q)).all()
    if torso == "nature":
        # Mnih et al. (2015): convs 8,224 + 32,832 + 36,928 weights, a 3136 -> 512
        # layer (1,606,144), then a dueling head (513 + 3,078) for 6 actions.
        assert _param_count(params) == 1_687_719


def test_conv_torso_on_vector_observations_is_rejected():
    with pytest.raises(ValueError, match="nature torso needs uint8 image stacks"):
        networks.make_network(envs.env_spec("CartPole-v1"), (64,), True, torso="nature")
    assert networks.make_network(envs.env_spec("CartPole-v1"), (64,), True).torso == "mlp"


def test_a_short_pong_run_fills_replay_updates_and_writes_its_summary(tmp_path):
    config = dataclasses.replace(
        dqn.DQNConfig(),
        hidden_sizes=(64,),
        batch_size=32,
        min_replay_size=500,
        max_replay_size=5_000,
        samples_per_insert=2.0,
        epsilon_decay_steps=2_000,
    )
    exp = experiment.ExperimentConfig(
        env_id="Pong-v5",
        launcher="local",
        num_actors=1,
        num_envs_per_actor=8,
        total_env_steps=2_000,
        num_learner_devices=1,
        eval_interval_s=0,
        eval_episodes=1,
        log_interval_s=1.0,
        logdir=str(tmp_path),
    )
    summary = experiment.run_experiment(dqn.DQNBuilder(config), exp)
    assert summary["env_steps"] >= 2_000
    assert summary["learner_steps"] > 0
    # A full, unclipped game of Pong scores between -21 and 21.
    assert -21 <= summary["final_eval_return"] <= 21
    with open(tmp_path / "metrics.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f) if row.get("loss")]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert (tmp_path / "summary.json").exists()


def test_training_returns_count_whole_games_in_raw_points():
    env = envs.make_env("SpaceInvaders-v5", 2, seed=1)
    env.reset()
    rng = np.random.default_rng(0)
    life_ends = game_ends = 0
    raw_points = []
    for _ in range(1500):
        _, reward, terminated, truncated, info = env.step(rng.integers(0, 6, 2))
        raw, game_over = envs.game_signals(reward, terminated, truncated, info)
        raw_points.extend(raw[raw != 0].tolist())
        life_ends += int(terminated.sum())
        game_ends += int(game_over.sum())
        assert not (game_over & (info["lives"] > 0)).any()
    assert life_ends > game_ends >= 1  # Space Invaders has 3 lives per game
    assert max(raw_points) > 1  # points, not the clipped training reward
