"""Dict observations (dm_control's position, velocity, ...): flattened into one float32
array in sorted key order by `envs`, against envpool's own dicts; dicts of images,
text or nested dicts refused."""

import math

import envpool
import gymnasium
import jax
import numpy as np
import pytest

from gorila_jax import env_api, envs
from gorila_jax.acting import evaluation, parts


def _raw_sizes(env_id: str) -> dict[str, int]:
    space = envpool.make_spec(env_id).gymnasium_observation_space
    return {key: math.prod(entry.shape) for key, entry in space.spaces.items()}


def _concatenated(raw_obs: dict[str, np.ndarray]) -> np.ndarray:
    """What the flat observation must be: each entry flattened per env, sorted keys."""
    num_envs = len(next(iter(raw_obs.values())))
    parts = [raw_obs[key].reshape(num_envs, -1) for key in sorted(raw_obs)]
    return np.concatenate(parts, axis=1).astype(np.float32)


@pytest.mark.parametrize(
    "env_id, size",
    [
        ("CartpoleBalance-v1", 5),  # position 3, velocity 2
        ("CheetahRun-v1", 17),
        ("ReacherEasy-v1", 6),
        ("ManipulatorBringBall-v1", 44),  # arm_pos is [8, 2]
        ("FetchReach-v4", 16),  # robotics: observation, achieved_goal, desired_goal
    ],
)
def test_a_dict_of_float_arrays_is_specified_as_one_flat_float32_array(env_id, size):
    spec = envs.env_spec(env_id)
    assert sum(_raw_sizes(env_id).values()) == size
    assert spec.observation_shape == (size,)
    assert spec.observation_dtype == "float32"
    assert not spec.discrete
    assert spec.max_episode_steps == envpool.make_spec(env_id).config.max_episode_steps


def test_dm_control_episodes_last_envpools_1000_steps():
    assert envs.env_spec("CartpoleBalance-v1").max_episode_steps == 1000


@pytest.mark.parametrize(
    "env_id, declared_sorted",
    # Swimmer and Manipulator declare their keys out of sorted order, and
    # Manipulator's arm_pos is two-dimensional.
    [
        ("CartpoleBalance-v1", True),
        ("SwimmerSwimmer6-v1", False),
        ("ManipulatorBringBall-v1", False),
    ],
)
def test_make_env_observes_the_sorted_concatenation_of_envpools_dict(env_id, declared_sorted):
    spec = envs.env_spec(env_id)
    env = envs.make_env(env_id, 3, seed=7)
    raw = envpool.make(env_id, env_type="gymnasium", num_envs=3, seed=7)
    try:
        declared = list(raw.observation_space.spaces)
        assert (declared == sorted(declared)) == declared_sorted
        obs, _ = env.reset()
        raw_obs, _ = raw.reset()
        assert obs.shape == (3, *spec.observation_shape) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, _concatenated(raw_obs))
        rng = np.random.default_rng(0)
        for _ in range(5):
            action = rng.uniform(-1, 1, (3, *spec.action_shape)).astype(spec.action_dtype)
            obs, reward, terminated, truncated, _ = env.step(action)
            raw_obs, raw_reward, raw_terminated, raw_truncated, _ = raw.step(action)
            assert obs.shape == (3, *spec.observation_shape) and obs.dtype == np.float32
            np.testing.assert_array_equal(obs, _concatenated(raw_obs))
            np.testing.assert_array_equal(reward, raw_reward)
            np.testing.assert_array_equal(terminated, raw_terminated)
            np.testing.assert_array_equal(truncated, raw_truncated)
        # The actor's way: send, then recv.
        action = rng.uniform(-1, 1, (3, *spec.action_shape)).astype(spec.action_dtype)
        env.send(action)
        raw.send(action)
        obs, *_ = env.recv()
        raw_obs, *_ = raw.recv()
        np.testing.assert_array_equal(obs, _concatenated(raw_obs))
        assert env.observation_space.shape == spec.observation_shape
        assert env.action_space.shape == spec.action_shape  # the envpool env's own
        assert env.config["num_envs"] == 3
    finally:
        env.close()
        raw.close()


def test_episodes_of_a_dm_control_task_end_at_the_time_limit_and_are_counted():
    # dm_control episodes end by the time limit only: truncated, never terminated.
    # A 10-step limit: envpool's option, passed through make_env.
    env = envs.make_env("CartpoleBalance-v1", 2, seed=0, max_episode_steps=10)
    try:
        obs, _ = env.reset()
        tracker, valid, action = parts.EpisodeTracker(2), np.ones(2, bool), np.zeros((2, 1))
        summed = np.zeros(2)
        for step in range(11):
            obs, reward, terminated, truncated, info = env.step(action)
            raw_reward, game_over = envs.game_signals(reward, terminated, truncated, info)
            summed += np.where(valid, reward, 0.0)
            tracker.update(raw_reward, valid & game_over, valid)
            assert not terminated.any()
            assert truncated.all() == (step == 9)
            valid = ~(valid & (terminated | truncated))
        assert tracker.episodes == 2
        np.testing.assert_allclose(tracker.take_returns(), summed)
        assert 0 < summed.min() and summed.max() <= 10  # dm_control rewards lie in [0, 1]
        # Greedy evaluation's loop takes the flat observations too.
        policy = lambda params, obs, key, step: np.zeros((len(obs), 1))  # noqa: E731
        returns = evaluation.run_episodes(env, policy, None, jax.random.PRNGKey(0))
        assert returns.shape == (2,) and np.all((0 < returns) & (returns <= 10))
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, message",
    [
        (
            "MiniGrid-Empty-5x5-v0",
            "MiniGrid-Empty-5x5-v0 has dict observations (direction, image, mission); "
            "gorila-jax agents take one array (they flatten a dict into one when every entry "
            "is a numeric Box; here 'direction' is a Discrete space)",
        ),
        ("Sokoban-v0", "here 'grid' is a uint8 Box [10, 10, 2] (an image or text as bytes)"),
        ("FrankaKitchen-v1", "here 'desired_goal' is a nested dict"),
        ("Game2048-v1", "here 'action_mask' is a MultiBinary space"),  # jumanji
    ],
)
def test_a_dict_of_images_text_or_other_spaces_is_refused_saying_which_entry(env_id, message):
    with pytest.raises(ValueError) as error:
        envs.env_spec(env_id)
    assert message in str(error.value)


def test_int_and_bool_boxes_are_flattened_uint8_ones_are_not():
    box = gymnasium.spaces.Box
    numbers = gymnasium.spaces.Dict(
        {"b": box(-1, 1, (2, 2), np.int32), "a": box(0, 1, (3,), np.bool_)}
    )
    assert env_api.space_problem("X", "observations", numbers) is None
    flat = env_api.flatten_observations(
        {"b": np.arange(8).reshape(2, 2, 2), "a": np.ones((2, 3), bool)}, env_api.flat_keys(numbers)
    )
    assert flat.dtype == np.float32
    np.testing.assert_array_equal(flat, [[1, 1, 1, 0, 1, 2, 3], [1, 1, 1, 4, 5, 6, 7]])
    text = gymnasium.spaces.Dict({"mission": box(0, 255, (96,), np.uint8)})
    assert "'mission' is a uint8 Box [96]" in env_api.space_problem("X", "observations", text)
    # Dict actions stay refused: agents act with one array.
    problem = env_api.space_problem("X", "actions", numbers)
    assert problem == "X has dict actions (a, b); gorila-jax agents take one array"  # sorted
