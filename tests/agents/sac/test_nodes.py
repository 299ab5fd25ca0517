"""SAC's items through a real Reverb server, and the learner node's published parameters."""

import dataclasses
import functools
import threading

import chex
import jax
import numpy as np

from agents import sac
from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay, types
from gorila_jax.learning import learner
from gorila_jax.learning.settings import LearnerSettings
from tests.backends import DefaultReplayNode, first_batch

SPEC = envs.env_spec("HalfCheetah-v5")  # float64 observations [17], float32 actions [6]
CONFIG = dataclasses.replace(
    sac.SACConfig(),
    hidden_sizes=(32, 32),
    batch_size=16,
    min_replay_size=10,
    max_replay_size=1_000,
    samples_per_insert=4.0,
)
NUM_ENVS = 4


def _env_steps(seed: int, count: int) -> list[types.EnvStep]:
    """`count` vector steps of NUM_ENVS MuJoCo-like envs, none ending."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(NUM_ENVS, 17))
    steps = []
    for _ in range(count):
        next_obs = rng.normal(size=(NUM_ENVS, 17))
        steps.append(
            types.EnvStep(
                observation=obs,
                action=rng.uniform(-1, 1, (NUM_ENVS, 6)).astype(np.float32),
                reward=rng.normal(size=NUM_ENVS).astype(np.float32),
                terminated=np.zeros(NUM_ENVS, bool),
                truncated=np.zeros(NUM_ENVS, bool),
                next_observation=next_obs,
                valid=np.ones(NUM_ENVS, bool),
            )
        )
        obs = next_obs
    return steps


def _fill(builder: sac.SACBuilder, replay_node, steps: list[types.EnvStep]) -> None:
    connection = replay.connect(replay_node)
    adder = builder.replay_layout(SPEC).make_adder(connection, NUM_ENVS, threading.Event())
    for step in steps:
        adder.add(step)
    # close() confirms every item first: without that the table once held 34 of 40.
    adder.close()


def test_continuous_transitions_round_trip_through_replay():
    builder = sac.SACBuilder(CONFIG)
    replay_node = DefaultReplayNode(functools.partial(builder_lib.replay_tables, builder, SPEC))
    try:
        steps = _env_steps(seed=0, count=10)
        _fill(builder, replay_node, steps)
        # Every item the adder was given is in the table once close() returns.
        assert replay_node.table_info()[sac.builder.TABLE]["size"] == 10 * NUM_ENVS
        batch = first_batch(replay_node, sac.builder.TABLE, 16, builder.replay_layout(SPEC).codec)
    finally:
        replay_node.close()
    data = batch.data
    assert data.action.dtype == np.float32 and data.action.shape == (16, 6)
    assert data.observation.dtype == np.float32 and data.observation.shape == (16, 17)
    # Every sampled item is one written step, bit for bit after the float32 cast
    # of observations, with its one-step reward and bootstrap discount gamma.
    written = {
        step.observation[env].astype(np.float32).tobytes(): (step, env)
        for step in steps
        for env in range(NUM_ENVS)
    }
    for i in range(16):
        step, env = written[data.observation[i].tobytes()]
        np.testing.assert_array_equal(data.action[i], step.action[env])
        np.testing.assert_array_equal(data.reward[i], step.reward[env])
        np.testing.assert_array_equal(
            data.next_observation[i], step.next_observation[env].astype(np.float32)
        )
        assert data.discount[i] == np.float32(CONFIG.discount)
    np.testing.assert_array_equal(batch.probabilities, 1 / (10 * NUM_ENVS))  # uniform


def test_parameters_an_actor_holds_stay_as_published_while_the_learner_steps():
    builder = sac.SACBuilder(CONFIG)
    replay_node = DefaultReplayNode(functools.partial(builder_lib.replay_tables, builder, SPEC))
    node = None
    try:
        _fill(builder, replay_node, _env_steps(seed=1, count=10))
        node = learner.LearnerNode(
            builder, SPEC, replay_node, None, seed=0, settings=LearnerSettings(num_devices=4)
        )
        while not node.step(timeout=5.0):
            pass
        version, held = node.get_params()
        copy = jax.tree.map(np.array, held)
        for _ in range(5):
            while not node.step(timeout=5.0):
                pass
        newest_version, newest = node.get_params()
        assert (version, newest_version) == (1, 6)
        chex.assert_trees_all_equal(held, copy)  # the learner never wrote into it
        changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), newest, copy)
        assert any(jax.tree.leaves(changed)), "five more updates left the policy unchanged"
        assert node.get_params(newer_than=newest_version) is None
    finally:
        if node is not None:
            node.stop()
            node.close()
        replay_node.close()
