"""Actor and learner nodes on real envpool and a real Reverb server, under the local launcher."""

import dataclasses
import functools
import threading

import numpy as np
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import launchers, program
from gorila_jax.learning import learner
from gorila_jax.learning.settings import LearnerSettings
from tests import fakes, programs
from tests.backends import DefaultReplayNode, first_batch

SPEC = envs.env_spec("CartPole-v1")
GAMMA, N_STEP = 0.9, 3
CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=64,
    discount=GAMMA,
    n_step=N_STEP,
    min_replay_size=100,
    max_replay_size=10_000,
    samples_per_insert=4.0,
)


def _program(actor_steps: int, config: dqn.DQNConfig = CONFIG) -> program.Program:
    """replay + learner (driven by hand) + one actor with a step budget."""
    settings = ActorSettings(num_envs=4, param_pull_interval=5, max_env_steps=actor_steps)
    return programs.replay_learner_and_actor(dqn.DQNBuilder(config), SPEC, settings)


def test_actor_writes_consistent_n_step_transitions_and_learner_changes_priorities():
    with launchers.launch(_program(actor_steps=0), "local") as running:
        replay_client = running.client("replay")
        learner_client = running.client("learner")
        actor_client = running.client("actor")
        table = dqn.builder.TABLE
        assert fakes.wait_until(lambda: replay_client.table_info()[table]["size"] >= 200, 120)

        # Items on the table: CartPole pays 1 per step, so an m-step item has
        # reward (1 - gamma**m) / (1 - gamma) and discount gamma**m, or 0 at a
        # termination; m is N_STEP except at episode ends.
        codec = dqn.DQNBuilder(CONFIG).replay_layout(SPEC).codec
        batch = first_batch(replay_client, table, 64, codec)
        reward, discount = batch.data.reward, batch.data.discount
        bootstrapped = discount > 0
        np.testing.assert_allclose(
            reward[bootstrapped], (1 - discount[bootstrapped]) / (1 - GAMMA), rtol=1e-5
        )
        full_returns = [(1 - GAMMA**m) / (1 - GAMMA) for m in range(1, N_STEP + 1)]
        for r in reward[~bootstrapped]:
            assert min(abs(r - f) for f in full_returns) < 1e-4

        # The learner's updates reach the actor and change the priorities in the replay.
        assert learner_client.get_params()[0] == 0
        steps = 0
        while steps < 20:
            steps += learner_client.step()
        assert learner_client.get_params()[0] == 20
        assert fakes.wait_until(lambda: actor_client.counters()["param_version"] >= 1, 60)
        learner_client.close()  # drains queued priority updates
        probabilities = first_batch(replay_client, table, 64).probabilities
        assert np.ptp(probabilities) > 0, "priorities still all equal after 20 updates"


_SAMPLING_THREADS = ("device-prefetch", "replay-shard-", "priority-updater")


def test_a_learner_closed_while_it_steps_ends_its_sampling_before_close_returns():
    """The launcher closes a learner from its own thread, before the replay stops: every
    sampling thread must be gone when `close` returns, even with a step in flight, or
    it is left talking to a stopped server for good."""
    with launchers.launch(_program(actor_steps=0), "local") as running:
        replay_client, learner_client = running.client("replay"), running.client("learner")
        table = dqn.builder.TABLE
        assert fakes.wait_until(lambda: replay_client.table_info()[table]["size"] >= 200, 120)
        stepped, closed = threading.Event(), threading.Event()

        def step_until_closed():
            while not closed.is_set():
                if learner_client.step(0.2):
                    stepped.set()

        stepper = threading.Thread(target=step_until_closed)
        stepper.start()
        try:
            assert stepped.wait(120), "the learner never stepped"
            learner_client.close()
            assert fakes.threads_named(*_SAMPLING_THREADS) == []
            assert not learner_client.step(0.2), "a closed learner sampled again"
            assert fakes.threads_named(*_SAMPLING_THREADS) == []
        finally:
            closed.set()
            stepper.join(60)


def test_actor_stops_at_its_env_step_budget():
    with launchers.launch(_program(actor_steps=300), "local") as running:
        assert fakes.wait_until(lambda: running.client("actor").counters()["env_steps"] >= 300, 120)
        counters = running.client("actor").counters()
        assert 300 <= counters["env_steps"] < 300 + 4  # one vector step of 4 envs at most
        assert counters["episodes"] >= 1


def test_learner_rejects_more_devices_than_the_host_has():
    builder = dqn.DQNBuilder(CONFIG)
    replay_node = DefaultReplayNode(functools.partial(builder_lib.replay_tables, builder, SPEC))
    try:
        with pytest.raises(ValueError, match="num_learner_devices=8 but this host has 4"):
            learner.LearnerNode(builder, SPEC, replay_node, None, 0, LearnerSettings(num_devices=8))
    finally:
        replay_node.close()
