"""Per-step randomness is the actor's: it hands its policy a fresh key at every step, and a
policy acts on the key it is given, nothing else random."""

import concurrent.futures
import dataclasses
import functools

import chex
import jax
import numpy as np
import pytest

from agents import dqn, ppo, sac
from gorila_jax import builder as builder_lib
from gorila_jax import envs
from gorila_jax.acting import actor, parts
from gorila_jax.acting.settings import ActorSettings
from tests.backends import DefaultReplayNode

CARTPOLE = envs.env_spec("CartPole-v1")
PENDULUM = envs.env_spec("Pendulum-v1")
PAST_SCHEDULES = 10**7  # env steps past every epsilon decay and random-step phase


@pytest.mark.parametrize(
    "builder, spec",
    [
        (dqn.DQNBuilder(dataclasses.replace(dqn.DQNConfig(), hidden_sizes=(16,))), CARTPOLE),
        (ppo.PPOBuilder(dataclasses.replace(ppo.PPOConfig(), hidden_sizes=(16,))), PENDULUM),
        (sac.SACBuilder(dataclasses.replace(sac.SACConfig(), hidden_sizes=(16,))), PENDULUM),
    ],
    ids=["dqn", "ppo", "sac"],
)
def test_a_policy_given_the_same_key_twice_acts_the_same(builder, spec):
    params = builder.state_access.actor_params(builder_lib.initial_train_state(builder, spec, 0))
    policy = builder.make_policy(spec, 0, 2, evaluation=False)  # PPO's default: 2 actors
    obs = np.random.default_rng(0).normal(size=(1024, *spec.observation_shape))
    obs = obs.astype(np.float32)
    key = jax.random.PRNGKey(1)
    first = jax.device_get(policy(params, obs, key, PAST_SCHEDULES))
    chex.assert_trees_all_equal(jax.device_get(policy(params, obs, key, PAST_SCHEDULES)), first)
    # The env-step count steers schedules only: it adds no randomness of its own.
    chex.assert_trees_all_equal(jax.device_get(policy(params, obs, key, PAST_SCHEDULES + 1)), first)
    other = builder_lib.split_policy_output(policy(params, obs, jax.random.PRNGKey(2), 0))[0]
    assert not np.array_equal(other, builder_lib.split_policy_output(first)[0]), (
        "another key gave the same actions: the policy does not draw from its key"
    )


@dataclasses.dataclass(frozen=True)
class _RecordingDQN(dqn.DQNBuilder):
    """DQN whose acting policy records the key and env-step count of every call."""

    calls: list = dataclasses.field(default_factory=list)

    def make_policy(self, spec, actor_index, num_actors, evaluation):
        act = super().make_policy(spec, actor_index, num_actors, evaluation)

        def policy(params, observation, key, env_steps):
            self.calls.append((np.asarray(key).tobytes(), env_steps))
            return act(params, observation, key, env_steps)

        return policy


class _Learner:
    """Serves one set of parameters at version 0, like a learner that has not stepped."""

    def __init__(self, params):
        self._params = params
        self.futures = self._Futures(self)

    def get_params(self, newer_than: int = -1):
        return None if newer_than >= 0 else (0, self._params)

    class _Futures:
        def __init__(self, learner):
            self._learner = learner

        def get_params(self, newer_than: int = -1) -> concurrent.futures.Future:
            answered = concurrent.futures.Future()
            answered.set_result(self._learner.get_params(newer_than))
            return answered


# Inserts never wait on the rate limiter: the table stays below its sampling size.
CONFIG = dataclasses.replace(
    dqn.DQNConfig(), hidden_sizes=(16,), min_replay_size=10_000, max_replay_size=20_000
)
ENV_STEPS = 120  # one env: CartPole episodes of random play end every ~20 steps


@pytest.fixture(scope="module")
def replay_node():
    node = DefaultReplayNode(
        functools.partial(builder_lib.replay_tables, dqn.DQNBuilder(CONFIG), CARTPOLE)
    )
    yield node
    node.close()


def _keys_of_a_run(replay_node, actor_index: int, seed: int = 0, restored_env_steps: int = 0):
    """(key bytes, env_steps) of every policy call of one actor run of ENV_STEPS env steps."""
    builder = _RecordingDQN(CONFIG)
    params = builder.state_access.actor_params(
        builder_lib.initial_train_state(builder, CARTPOLE, seed)
    )
    node = actor.ActorNode(
        builder,
        CARTPOLE,
        actor_index,
        2,
        replay_node,
        _Learner(jax.device_get(params)),
        None,
        seed,
        ActorSettings(
            num_envs=1, param_pull_interval=10, max_env_steps=restored_env_steps + ENV_STEPS
        ),
        restored_counters={"env_steps": restored_env_steps} if restored_env_steps else None,
    )
    node.run()  # returns once the env-step budget is spent
    return builder.calls


def test_the_actor_hands_its_policy_a_different_key_each_step(replay_node):
    calls = _keys_of_a_run(replay_node, actor_index=0)
    keys = [key for key, _ in calls]
    assert len(calls) > ENV_STEPS  # reset steps add no env step
    assert len(set(keys)) == len(keys), "the actor handed its policy a key twice"
    # Among them, steps in which the env only reset: the env-step count stood still.
    env_steps = [steps for _, steps in calls]
    assert any(a == b for a, b in zip(env_steps, env_steps[1:]))

    assert _keys_of_a_run(replay_node, actor_index=0) == calls, "the same seed did not reproduce"
    other_actor = {key for key, _ in _keys_of_a_run(replay_node, actor_index=1)}
    assert not other_actor & set(keys), "two actors share keys"
    resumed = {key for key, _ in _keys_of_a_run(replay_node, 0, restored_env_steps=ENV_STEPS)}
    assert not resumed & set(keys), "a resumed actor repeats its predecessor's keys"


def test_step_keys_are_a_function_of_the_key_and_the_step_across_blocks():
    steps = parts.KEY_BLOCK + 3  # into the second block
    first = [key.tobytes() for _, key in zip(range(steps), parts.step_keys(jax.random.PRNGKey(0)))]
    again = [key.tobytes() for _, key in zip(range(steps), parts.step_keys(jax.random.PRNGKey(0)))]
    other = [key.tobytes() for _, key in zip(range(steps), parts.step_keys(jax.random.PRNGKey(1)))]
    assert first == again
    assert len(set(first)) == steps
    assert not set(first) & set(other)
