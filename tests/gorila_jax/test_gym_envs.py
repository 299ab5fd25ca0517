"""Gymnasium environments through the environment interface (`--env=gym:<id>`): envpool's
rules kept, bad ids refused, and DQN learning both a registered Gymnasium task and an
environment this file registers, through the whole program.

The file is also the module `gym:tests.gorila_jax.test_gym_envs:GorilaCorridor-v0`
imports: importing it registers the corridor, in any process of a run.
"""

import dataclasses

import gymnasium
import numpy as np
import pytest

from agents import dqn
from gorila_jax import env_api, envs
from gorila_jax.run import experiment
from agents.dqn import presets as dqn_presets
from launch import families, presets, schedules
from tests.test_end_to_end import _assert_solved_at_the_end, _cartpole

CORRIDOR_LENGTH = 6


class Corridor(gymnasium.Env):
    """Start at cell 0 of a corridor; action 1 steps right, 0 left; reward 1 and the end
    at the last cell. Observed as a one-hot row of the cells."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (CORRIDOR_LENGTH,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cell = 0
        return self._observation(), {}

    def step(self, action):
        self._cell = int(np.clip(self._cell + (1 if action == 1 else -1), 0, CORRIDOR_LENGTH - 1))
        done = self._cell == CORRIDOR_LENGTH - 1
        return self._observation(), float(done), done, False, {}

    def _observation(self):
        return np.eye(CORRIDOR_LENGTH, dtype=np.float32)[self._cell]


CORRIDOR_ID = "GorilaCorridor-v0"
if CORRIDOR_ID not in gymnasium.registry:
    gymnasium.register(CORRIDOR_ID, entry_point=Corridor, max_episode_steps=20)
CORRIDOR = f"gym:{__name__}:{CORRIDOR_ID}"


def test_a_gym_env_has_the_spec_of_the_same_envpool_task():
    spec = envs.env_spec("gym:CartPole-v1")
    assert spec == envs.env_spec("CartPole-v1")._replace(env_id="gym:CartPole-v1")
    assert families.family(spec) == "vector_discrete"
    assert presets.auto_preset("dqn", spec) == "cartpole"


def test_a_gym_vector_env_resets_on_the_step_after_an_episode_ends_as_envpool_does():
    env = envs.make_env(CORRIDOR, 3, seed=0)
    assert isinstance(env, env_api.VectorEnv)
    try:
        observations, _ = env.reset()
        assert observations.dtype == np.float32 and observations.shape == (3, CORRIDOR_LENGTH)
        right = np.ones(3, np.int32)
        for _ in range(CORRIDOR_LENGTH - 2):
            env.send(right)
            _, reward, terminated, truncated, _ = env.recv()
            assert not terminated.any() and not reward.any()
        observations, reward, terminated, _, _ = env.step(right)
        assert terminated.all() and (reward == 1.0).all() and reward.dtype == np.float32
        # The next step starts a new episode in each copy: its first cell, reward 0, and
        # the action (right) ignored.
        observations, reward, terminated, truncated, _ = env.step(right)
        assert (observations.argmax(axis=1) == 0).all()
        assert not reward.any() and not terminated.any() and not truncated.any()
        with pytest.raises(RuntimeError, match="recv.. before send"):
            env.recv()
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("gym:CartPol-v1", "unknown env id 'gym:CartPol-v1'; did you mean gym:CartPole-v1"),
        ("gym:no_such_module:X-v0", "cannot import 'no_such_module'"),
        ("gym:FrozenLake-v1", "observes one integer state out of 16"),
    ],
)
def test_bad_gym_ids_are_refused_with_what_would_work(env_id, message):
    with pytest.raises(ValueError, match=message):
        envs.env_spec(env_id)


def test_an_env_without_a_time_limit_is_refused():
    name = "GorilaEndless-v0"
    if name not in gymnasium.registry:
        gymnasium.register(name, entry_point=Corridor, max_episode_steps=None)
    with pytest.raises(ValueError, match="no max_episode_steps"):
        envs.env_spec(f"gym:{name}")


@pytest.mark.slow
def test_dqn_learns_an_environment_registered_by_the_user(tmp_path):
    preset, settings = dqn_presets.dqn_preset("cartpole")
    config = dataclasses.replace(preset, min_replay_size=200, epsilon_decay_steps=1_000)
    # Its schedules fitted to this budget as launch.train fits them (the learning rate
    # decays over these 6,000 env steps, not the preset's 120k).
    config = schedules.fit(
        config,
        preset,
        schedules.preset_budget(settings),
        schedules.Budget(6_000, 1),
        kept=("epsilon_decay_steps",),
    )
    cfg = experiment.ExperimentConfig(
        **{**settings, "total_env_steps": 6_000},
        env_id=CORRIDOR,
        logdir=str(tmp_path),
        launcher="local",
        num_actors=1,
        num_learner_devices=1,
    )
    summary = experiment.run_experiment(dqn.DQNBuilder(config), cfg)
    # Greedy from cell 0: right every step reaches the end (return 1); anything else
    # goes back and forth until the time limit (return 0).
    assert summary["final_eval_return"] == 1.0, summary


@pytest.mark.slow
def test_dqn_solves_gymnasium_cartpole_through_the_whole_program(tmp_path):
    # The envpool CartPole test's preset and budget (tests/test_end_to_end.py), on
    # Gymnasium's CartPole-v1 stepped in the actors' processes.
    builder, cfg = _cartpole(tmp_path, launcher="local", env_id="gym:CartPole-v1", eval_episodes=50)
    summary = experiment.run_experiment(builder, cfg)
    _assert_solved_at_the_end(summary, cfg)
