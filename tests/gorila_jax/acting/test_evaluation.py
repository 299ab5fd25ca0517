"""The evaluator node: periodic evaluations, and the last one when the driver stops it."""

import dataclasses
import threading

import jax
import numpy as np

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs
from gorila_jax.acting import actor, evaluation
from tests import fakes

SPEC = envs.env_spec("CartPole-v1")
BUILDER = dqn.DQNBuilder(dataclasses.replace(dqn.DQNConfig(), hidden_sizes=(16,)))
PARAMS = jax.device_get(
    BUILDER.state_access.actor_params(builder_lib.initial_train_state(BUILDER, SPEC, 0))
)


class _Learner:
    """Serves the same parameters at a fixed version, like a learner that stopped stepping."""

    def __init__(self, version: int):
        self.version, self.calls = version, 0

    def get_params(self, newer_than: int = -1):
        self.calls += 1
        return None if self.version <= newer_than else (self.version, PARAMS)


class _Monitor:
    def __init__(self):
        self.evaluations: list[tuple[int, int]] = []  # (param version, episodes)

    def report_eval(self, returns: list[float], param_version: int, role=None) -> None:
        assert role is None  # a task of one role
        self.evaluations.append((param_version, len(returns)))


def _start(learner: _Learner, interval_s: float):
    monitor = _Monitor()
    roles = {None: actor.RoleWiring(BUILDER, SPEC, None, learner)}  # a task of one role
    node = evaluation.EvaluatingNode(roles, monitor, 0, 2, interval_s)
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    return node, monitor, thread


def _stop(node, thread, final_evaluation: bool) -> None:
    node.stop(final_evaluation=final_evaluation)
    assert node.wait_finished(120)
    thread.join(10)
    assert not thread.is_alive()


def test_stopped_before_any_periodic_evaluation_it_evaluates_the_newest_parameters_once():
    learner = _Learner(version=7)
    node, monitor, thread = _start(learner, interval_s=3_600.0)
    _stop(node, thread, final_evaluation=True)
    assert monitor.evaluations == [(7, 2)]


def test_a_plain_stop_adds_no_evaluation():
    node, monitor, thread = _start(_Learner(version=7), interval_s=3_600.0)
    _stop(node, thread, final_evaluation=False)
    assert monitor.evaluations == []


def test_a_version_evaluated_already_is_not_evaluated_again_at_the_end():
    learner = _Learner(version=7)
    node, monitor, thread = _start(learner, interval_s=0.01)
    assert fakes.wait_until(lambda: learner.calls >= 3, 120)  # periodic looks after the first
    _stop(node, thread, final_evaluation=True)
    assert monitor.evaluations == [(7, 2)]


def test_the_untrained_network_gets_no_periodic_look_but_is_evaluated_at_the_end():
    learner = _Learner(version=0)
    node, monitor, thread = _start(learner, interval_s=0.01)
    assert fakes.wait_until(lambda: learner.calls >= 3, 120)
    assert monitor.evaluations == []
    _stop(node, thread, final_evaluation=True)
    assert monitor.evaluations == [(0, 2)]


def _keys_of_an_evaluation(key) -> list[bytes]:
    """The key of every policy call of `run_episodes` on 2 CartPole envs, pushing left."""
    keys = []

    def push_left(params, obs, key, env_steps):
        keys.append(np.asarray(key).tobytes())
        return np.zeros(obs.shape[0], np.int32)

    env = envs.make_env(SPEC.env_id, 2, seed=0, evaluation=True)
    try:
        evaluation.run_episodes(env, push_left, PARAMS, key)
    finally:
        env.close()
    return keys


def test_every_step_of_an_evaluation_gets_a_fresh_key_and_the_same_key_replays_them():
    keys = _keys_of_an_evaluation(jax.random.PRNGKey(3))
    assert len(keys) > 1 and len(set(keys)) == len(keys)
    assert _keys_of_an_evaluation(jax.random.PRNGKey(3)) == keys
