"""Env families by spec, the preset `auto` gives each agent there, and the errors for the rest."""

import pytest

from agents import registry
from gorila_jax import envs
from agents.dqn import presets as dqn_presets
from launch import families, listings, presets

EXPERIMENT_FIELDS = {"num_actors", "param_pull_interval", "total_env_steps", "num_envs_per_actor"}


@pytest.mark.parametrize(
    "env_id, family",
    [
        ("Pong-v5", "image"),  # atari
        ("Alien-v5", "image"),
        ("CartPole-v1", "vector_discrete"),  # classic_control
        ("Acrobot-v1", "vector_discrete"),
        ("LunarLander-v2", "vector_discrete"),  # box2d
        ("Highway-v0", "vector_discrete"),  # highway: [5, 5] kinematics, flattened
        ("Catch-v0", "vector_discrete"),  # toy_text
        ("Backgammon-v1", "vector_discrete"),  # pgx: int32 board features
        ("Pendulum-v1", "small_continuous"),
        ("InvertedPendulum-v4", "small_continuous"),  # mujoco.gym, 4 observations
        ("HalfCheetah-v4", "continuous"),
        ("BipedalWalker-v3", "continuous"),
        ("Racetrack-v0", "continuous"),  # highway: a [2, 12, 12] float occupancy grid
        ("MetaWorld/Reach-v3", "continuous"),
        ("AdroitHandDoor-v1", "continuous"),  # mujoco.robotics
        ("SpotGetup-v1", "continuous"),  # mujoco.playground
        # Dicts of float arrays, flattened (gorila_jax/envs.py): dm_control, robotics' goals.
        ("CheetahRun-v1", "continuous"),  # mujoco.dmc: position 8 + velocity 9
        ("CartpoleBalance-v1", "continuous"),  # position 3 + velocity 2
        ("PointMassEasy-v1", "small_continuous"),  # position 2 + velocity 2
        ("FetchReach-v4", "continuous"),  # observation 10 + achieved_goal 3 + desired_goal 3
        ("mpe/simple_spread_v3", "multiagent"),  # 3 agents, a row each
        ("mpe/simple_v3", "vector_discrete"),  # one agent: a single-agent task
    ],
)
def test_an_envs_family_follows_from_its_observations_and_actions(env_id, family):
    assert families.family(envs.env_spec(env_id)) == family


@pytest.mark.parametrize(
    "env_id, message",
    [
        (
            "MiniGrid-Empty-5x5-v0",
            "MiniGrid-Empty-5x5-v0 has dict observations (direction, image, mission); "
            "gorila-jax agents take one array",
        ),
        # Dicts that do not flatten into numbers: an image, a nested dict.
        ("Sokoban-v0", "Sokoban-v0 has dict observations (grid, step_count)"),  # jumanji
        ("FrankaKitchen-v1", "here 'desired_goal' is a nested dict"),  # robotics
        ("FrozenLake-v1", "observes one integer state out of 16 (a Discrete space, tabular)"),
        ("CarRacing-v3", "CarRacing-v3 has channel-last images [96, 96, 3]"),
        ("gfootball/academy_empty_goal-v1", "has channel-last images [72, 96, 4]"),
        ("Basic-v1", "Basic-v1 has continuous actions without finite bounds"),  # vizdoom
        ("Go9x9-v1", "Go9x9-v1: envpool cannot describe its spaces"),  # pgx
    ],
)
def test_an_env_no_agent_can_take_is_refused_saying_why(env_id, message):
    with pytest.raises(ValueError) as error:
        families.family(envs.env_spec(env_id))
    assert message in str(error.value)
    for agent in registry.AGENTS:  # the same reason, whichever agent is asked
        with pytest.raises(ValueError) as error:
            presets.load("auto", agent, env_id, EXPERIMENT_FIELDS)
        assert message in str(error.value)


@pytest.mark.parametrize(
    "agent, env_id, preset",
    [
        ("dqn", "Alien-v5", "default"),  # an Atari game without a difficulty
        ("dqn", "Pong-v5", "simple"),
        ("dqn", "LunarLander-v2", "lunarlander"),
        ("ppo", "Alien-v5", "simple"),  # CleanRL's Atari PPO
        ("ppo", "Breakout-v5", "medium"),
        ("qrdqn", "Breakout-v5", "default"),  # QR-DQN has no difficulty presets
        ("dqn", "Acrobot-v1", "lunarlander"),  # by its name (BY_ENV_NAME)
        ("dqn", "MountainCar-v0", "cartpole"),
        ("qrdqn", "LunarLander-v2", "lunarlander"),
        ("qrdqn", "CartPole-v1", "cartpole"),
        ("qrdqn", "Acrobot-v1", "lunarlander"),
        ("ppo", "MountainCar-v0", "cartpole"),
        ("sac", "InvertedPendulum-v4", "pendulum"),
        ("ppo", "InvertedPendulum-v4", "pendulum"),
        ("ppo", "MountainCarContinuous-v0", "pendulum"),
        ("sac", "Hopper-v4", "mujoco"),
        ("ppo", "BipedalWalker-v3", "mujoco"),
        ("sac", "LunarLanderContinuous-v2", "mujoco"),
        ("sac", "CartpoleBalance-v1", "mujoco"),  # dm_control, 5 numbers flattened
        ("ppo", "CheetahRun-v1", "mujoco"),
    ],
)
def test_auto_gives_each_agent_its_preset_for_the_family(agent, env_id, preset):
    assert presets.resolve("auto", env_id, agent) == preset
    config, settings = presets.load("auto", agent, env_id, EXPERIMENT_FIELDS)
    assert (config, settings) == registry.AGENTS[agent].preset(preset)
    registry.AGENTS[agent].builder(config).validate(1, envs.env_spec(env_id))


@pytest.mark.parametrize(
    "agent, env_id, preset, message",
    [
        (
            "sac",
            "CartPole-v1",
            "auto",
            "SAC cannot act in CartPole-v1: it has shape (4,) float32 observations and 2 "
            "discrete actions; SAC takes continuous actions; agents that can: dqn, ppo, qrdqn",
        ),
        (
            "dqn",
            "Pendulum-v1",
            "auto",
            "DQN cannot act in Pendulum-v1: it has shape (3,) float32 observations and "
            "continuous actions of shape (1,); DQN takes discrete actions; agents that can: "
            "ppo, sac",
        ),
        ("qrdqn", "HalfCheetah-v4", "cartpole", "agents that can: ppo, sac"),  # named too
        (
            "dqn",
            "CartpoleBalance-v1",
            "auto",
            "DQN cannot act in CartpoleBalance-v1: it has shape (5,) float32 observations and "
            "continuous actions of shape (1,); DQN takes discrete actions; agents that can: "
            "ppo, sac",
        ),
        ("sac", "Pong-v5", "mujoco", "agents that can: dqn, ppo, qrdqn"),
        (
            "qrdqn",
            "mpe/simple_spread_v3",
            "auto",
            "QRDQN cannot act in mpe/simple_spread_v3: it has shape (18,) float32 observations "
            "and 5 discrete actions, 3 agents per copy sharing one policy; QRDQN has no preset "
            "for the multiagent family; agents that can: dqn, ppo",
        ),
    ],
)
def test_an_agent_that_cannot_act_there_says_so_and_names_those_that_can(
    agent, env_id, preset, message
):
    with pytest.raises(ValueError) as error:
        presets.load(preset, agent, env_id, EXPERIMENT_FIELDS)
    assert message in str(error.value)


def test_every_preset_auto_picks_is_one_the_agent_has():
    for family, picks in presets.AUTO_PRESETS.items():
        assert family in families.FAMILIES
        for agent, preset in picks.items():
            assert preset in registry.AGENTS[agent].preset_names, (family, agent)
    for family, by_name in presets.BY_ENV_NAME.items():
        for preset in by_name.values():  # some agent of the family has it
            assert any(
                preset in registry.AGENTS[a].preset_names for a in presets.AUTO_PRESETS[family]
            )
    for preset in presets.BY_ENV_NAME["image"].values():
        assert preset in registry.AGENTS["dqn"].preset_names
        assert preset in registry.AGENTS["ppo"].preset_names


def test_list_presets_says_what_auto_picks_in_each_family():
    lines = listings.auto_lines()
    for family, picks in presets.AUTO_PRESETS.items():
        (line,) = [line for line in lines if line.startswith(f"  {family}: ")]
        assert families.FAMILIES[family] in line
        for agent, preset in picks.items():
            assert f"{agent} {preset}" in line


def test_gorila_mode_drops_adams_momentum_in_every_vector_discrete_env():
    for env_id in ("MountainCar-v0", "LunarLander-v2"):
        sync, _ = presets.load("auto", "dqn", env_id, EXPERIMENT_FIELDS)
        gorila, _ = presets.load("auto", "dqn", env_id, EXPERIMENT_FIELDS, "gorila")
        assert sync.adam_b1 > 0.0 and sync.updates_per_dispatch > 1
        for field, value in dqn_presets.GORILA_CARTPOLE.items():
            assert getattr(gorila, field) == value, field
