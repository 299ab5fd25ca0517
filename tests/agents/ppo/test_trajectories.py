"""From actor to learner: trajectory chunks (hand-checked with a recording writer), then a
real actor, Reverb queue and learner under the local launcher."""

import dataclasses

import jax
import numpy as np

from agents import ppo
from agents.ppo import learning
from gorila_jax import envs, replay, types
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import launchers, program
from tests import fakes, programs
from tests.backends import sampled_items

SPEC = envs.env_spec("CartPole-v1")


class RecordingWriter:
    """Keeps what an adder writes (unit tests only)."""

    def __init__(self):
        self.writes: list[np.ndarray] = []

    def write(self, batch: np.ndarray, priorities: np.ndarray) -> None:
        assert len(priorities) == len(batch)
        self.writes.append(batch)

    def close(self) -> None:
        pass


def _step(t: int, terminated=(0, 0), truncated=(0, 0), valid=(1, 1), version=0) -> types.EnvStep:
    """Step t of 2 envs: env e observes 10 * t + e (then 10 * (t + 1) + e), acts t % 2."""
    obs = np.array([[10.0 * t], [10.0 * t + 1]], np.float32).repeat(4, axis=1)
    return types.EnvStep(
        observation=obs,
        action=np.full(2, t % 2, np.int32),
        reward=np.where(valid, 1.0, 0.0).astype(np.float32),
        terminated=np.array(terminated, bool),
        truncated=np.array(truncated, bool),
        next_observation=obs + 10.0,
        valid=np.array(valid, bool),
        extras=learning.PolicyExtras(
            log_prob=np.full(2, -0.1 * t, np.float32),
            value=np.full(2, float(t), np.float32),
            raw_action=np.full(2, t % 2, np.int32),
        ),
        param_version=version,
        actor_index=3,
    )


def test_chunks_hold_every_step_and_share_their_boundary_observation():
    builder = ppo.PPOBuilder(dataclasses.replace(ppo.PPOConfig(), trajectory_length=3))
    codec = builder.replay_layout(SPEC).codec
    recorder = RecordingWriter()
    adder = replay.TrajectoryAdder(recorder, codec, num_envs=2, length=3)
    # env 0 terminates at step 1 (step 2 is its reset step); env 1 is truncated
    # at step 3 (step 4 is its reset step); parameters change at step 4.
    steps = [
        _step(0),
        _step(1, terminated=(1, 0)),
        _step(2, valid=(0, 1)),
        _step(3, truncated=(0, 1)),
        _step(4, valid=(1, 0), version=1),
        _step(5, version=1),
        _step(6, version=1),
    ]
    for step in steps:
        adder.add(step)
    assert len(recorder.writes) == 2  # after steps 2 and 5; step 6 waits for its chunk
    first, second = (codec.decode(packed) for packed in recorder.writes)
    for chunk, start in ((first, 0), (second, 3)):
        for env in (0, 1):
            # T + 1 observations: the chunk's steps, then what followed the last one.
            expected = [10.0 * t + env for t in range(start, start + 4)]
            np.testing.assert_array_equal(chunk.observation[env, :, 0], expected)
            np.testing.assert_array_equal(
                chunk.action[env], [t % 2 for t in range(start, start + 3)]
            )
            np.testing.assert_allclose(
                chunk.extras.log_prob[env], [-0.1 * t for t in range(start, start + 3)]
            )
        np.testing.assert_array_equal(chunk.actor_index, [3, 3])
    np.testing.assert_array_equal(first.terminated, [[0, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(first.valid, [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(first.reward, [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(second.truncated, [[0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(second.valid, [[1, 1, 1], [1, 0, 1]])
    np.testing.assert_array_equal(second.param_version, [[0, 1, 1], [0, 1, 1]])


TINY = dataclasses.replace(
    ppo.PPOConfig(),
    torso="mlp",
    hidden_sizes=(32, 32),
    trajectory_length=8,
    batch_size=4,
    num_actors=1,
    num_epochs=2,
    num_minibatches=2,
    queue_batches=2,
)
NUM_ENVS = 4


def _program(config=TINY) -> program.Program:
    """replay + learner (driven by hand) + one actor."""
    settings = ActorSettings(num_envs=NUM_ENVS, param_pull_interval=1)
    return programs.replay_learner_and_actor(ppo.PPOBuilder(config), SPEC, settings, "ppo-nodes")


def test_actor_chunks_reach_the_learner_once_and_a_full_queue_holds_the_actor():
    capacity = TINY.queue_batches * TINY.global_batch_size  # 8 chunks
    with launchers.launch(_program(), "local") as running:
        replay_client = running.client("replay")
        learner_client, actor_client = running.client("learner"), running.client("actor")
        table = ppo.builder.TABLE
        assert fakes.wait_until(lambda: replay_client.table_info()[table]["size"] >= capacity, 120)
        # Nobody learns: the actor stops at the full queue, one write of unconfirmed
        # chunks (NUM_ENVS) and the step it was taking beyond it.
        held_at = actor_client.counters()["env_steps"]
        bound = (capacity + 2 * NUM_ENVS) * TINY.trajectory_length + NUM_ENVS
        assert fakes.wait_until(lambda: actor_client.counters()["env_steps"] == held_at, 30)
        assert held_at <= bound and replay_client.table_info()[table]["size"] == capacity

        # What the actor wrote, checked against CartPole and its own policy.
        # (taking exactly the items asked for: a sampler would take more from the queue.)
        codec = ppo.PPOBuilder(TINY).replay_layout(SPEC).codec
        taken = sampled_items(replay_client, table, 4, exponent=1.0)  # a queue: no priorities
        data = codec.decode(np.stack([row for row, _ in taken.values()]))
        assert np.all(data.reward == np.where(data.valid, 1.0, 0.0))  # CartPole pays 1 a step
        ended = data.terminated | data.truncated
        # Exactly the steps after an episode end are reset steps.
        np.testing.assert_array_equal(~data.valid[:, 1:], ended[:, :-1])
        np.testing.assert_array_equal(data.param_version, 0)
        np.testing.assert_array_equal(data.extras.raw_action, data.action)
        builder = ppo.PPOBuilder(TINY)
        version, params = learner_client.get_params()
        values, log_prob = learning.evaluate_chunks(
            builder._network(SPEC),
            ppo.networks.make_distribution(SPEC),
            params.params,
            jax.numpy.asarray(data.observation),
            jax.numpy.asarray(data.action),
        )
        np.testing.assert_allclose(log_prob, data.extras.log_prob, atol=1e-5)
        np.testing.assert_allclose(values[:, :-1], data.extras.value, atol=1e-5)

        # The learner consumes the queue; every chunk is learned from once and the
        # actor goes on with newer parameters.
        for _ in range(6):
            assert fakes.wait_until(lambda: learner_client.step(timeout=1.0), 60)
        assert learner_client.get_params()[0] == 6
        info = replay_client.table_info()[table]
        assert info["samples"] == info["inserts"] - info["size"]  # each sample removes its item
        assert fakes.wait_until(lambda: actor_client.counters()["param_version"] >= 1, 60)
