"""MPE tasks (mpe2) as vector envs: specs, roles, rows against the library's own env,
and envpool's auto-reset rule, through `envs` as actors and evaluators call it."""

import numpy as np
import pytest

from gorila_jax import envs, multiagent

SPREAD = "mpe/simple_spread_v3"
TAG = "mpe/simple_tag_v3"


def test_a_task_of_one_role_has_a_spec_with_a_row_per_agent():
    spec = envs.env_spec(SPREAD)
    assert spec.observation_shape == (18,) and spec.observation_dtype == "float32"
    assert spec.discrete and spec.num_actions == 5 and spec.action_shape == ()
    assert spec.agents_per_env == 3 and spec.max_episode_steps == 25
    assert envs.env_spec("CartPole-v1").agents_per_env == 1


def test_a_task_of_several_roles_is_refused_naming_its_roles():
    with pytest.raises(ValueError, match=r"mpe/simple_tag_v3 has 2 roles: adversary \(3\), agent"):
        envs.env_spec(TAG)
    specs = multiagent.role_specs(TAG)
    assert {role: (s.observation_shape, s.agents_per_env) for role, s in specs.items()} == {
        "adversary": ((16,), 3),
        "agent": ((14,), 1),
    }


def test_an_unknown_task_names_close_ones():
    with pytest.raises(ValueError, match=r"unknown env id 'mpe/simple_sprad_v3'.*simple_spread_v3"):
        envs.env_spec("mpe/simple_sprad_v3")
    with pytest.raises(ValueError, match="unknown env id"):
        envs.make_env("mpe/nothing", 2, seed=0)


def test_rows_are_the_library_envs_agents_copy_by_copy():
    num_envs, seed = 3, 11
    env = envs.make_env(SPREAD, num_envs, seed=seed, num_threads=1)  # envpool's option is dropped
    raws = [multiagent.make_task(SPREAD) for _ in range(num_envs)]
    try:
        obs, info = env.reset()
        want = [raw.reset(seed=seed + i)[0] for i, raw in enumerate(raws)]
        agents = raws[0].possible_agents
        np.testing.assert_array_equal(obs, [w[a] for w in want for a in agents])
        assert list(info["env_id"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        rng = np.random.default_rng(0)
        for _ in range(5):
            action = rng.integers(0, 5, num_envs * 3).astype(np.int32)
            env.send(action)  # the actor's way
            obs, reward, terminated, truncated, _ = env.recv()
            steps = [
                raw.step({a: int(action[3 * i + k]) for k, a in enumerate(agents)})
                for i, raw in enumerate(raws)
            ]
            np.testing.assert_array_equal(obs, [s[0][a] for s in steps for a in agents])
            np.testing.assert_allclose(reward, [s[1][a] for s in steps for a in agents], rtol=1e-6)
            assert obs.dtype == np.float32 and reward.dtype == np.float32
            assert not terminated.any() and not truncated.any()
    finally:
        env.close()
        for raw in raws:
            raw.close()


def test_an_ended_copy_restarts_on_the_next_step_as_envpools_do():
    env = envs.make_env(SPREAD, 2, seed=0)
    try:
        env.reset()
        zeros = np.zeros(6, np.int32)
        for _ in range(24):
            assert not env.step(zeros)[3].any()
        obs, reward, terminated, truncated, _ = env.step(zeros)  # the 25th step
        assert truncated.all() and not terminated.any()
        first, reward, terminated, truncated, _ = env.step(np.full(6, 4, np.int32))
        assert not (terminated | truncated).any() and not reward.any()
        # A new episode from the copy's own random stream, not its last state.
        assert not np.array_equal(first, obs)
        assert env.step(zeros)[0].shape == (6, 18)
    finally:
        env.close()


def test_actions_of_the_wrong_shape_are_refused():
    env = envs.make_env(SPREAD, 2, seed=0)
    try:
        env.reset()
        with pytest.raises(ValueError, match="expected 6 actions .one per agent row., got shape"):
            env.step(np.zeros(2, np.int32))
    finally:
        env.close()


def test_each_role_gets_its_own_rows_and_acts_its_own_agents():
    env = multiagent.MultiAgentVectorEnv(TAG, 2, seed=5)
    raws = [multiagent.make_task(TAG) for _ in range(2)]
    try:
        obs = env.reset()
        assert obs["adversary"].shape == (6, 16) and obs["agent"].shape == (2, 14)
        for i, raw in enumerate(raws):
            raw.reset(seed=5 + i)
        actions = {"adversary": np.array([1, 2, 3, 4, 0, 1]), "agent": np.array([2, 3])}
        stepped = env.step(actions)
        for i, raw in enumerate(raws):
            acts = {f"adversary_{k}": int(actions["adversary"][3 * i + k]) for k in range(3)}
            o, r, *_ = raw.step({**acts, "agent_0": int(actions["agent"][i])})
            np.testing.assert_array_equal(stepped["agent"][0][i], o["agent_0"])
            np.testing.assert_allclose(stepped["adversary"][1][3 * i : 3 * i + 3], r["adversary_0"])
    finally:
        env.close()
        for raw in raws:
            raw.close()
