"""One short learning run per env family and action kind beyond classic control, with the
preset `auto` picks there (CartPole and Pendulum have tests of their own under tests/agents/).

Each asserts the final greedy return at the end of a bounded budget (not a first
crossing), against a random policy's mean return measured with envpool over 100
episodes (uniform actions, seed 0): the margins are what a run that learns
nothing cannot reach.
"""

import pytest

from agents import registry
from gorila_jax.run import experiment
from launch import presets


# Evaluation episodes where 10 are too few to judge one run by. LunarLander's greedy
# returns spread 70-120 per episode: a sweep's seed 1 (120k) ended at -94.6 over the
# final evaluation's 10 episodes and at -31.5 over 100 of the same parameters
# (`launch.evaluate --episodes=100`; seeds 0 and 2: 40.8 and 136.9).
EVAL_EPISODES = {"LunarLander-v2": 50}


def _final_return(tmp_path, agent: str, env_id: str, total_env_steps: int) -> dict:
    config, settings = presets.load("auto", agent, env_id, set())
    exp = experiment.ExperimentConfig(
        **{
            **settings,
            "env_id": env_id,
            "launcher": "local",
            "logdir": str(tmp_path),
            "seed": 0,
            "total_env_steps": total_env_steps,
            # One learner device: 1 vs 4 devices is checked in tests/agents/.
            "num_learner_devices": 1,
            "checkpoint_interval_steps": 0,
            **({"eval_episodes": EVAL_EPISODES[env_id]} if env_id in EVAL_EPISODES else {}),
        }
    )
    summary = experiment.run_experiment(registry.AGENTS[agent].builder(config), exp)
    assert summary["env_steps"] >= total_env_steps, summary["stop_reason"]
    assert summary["final_eval_episodes"] >= 10
    return summary


# (agent, env id, env steps, the final greedy return the run must reach), one case per
# family and action kind; the comment above each says why the threshold means learning.
CASES = [
    # mujoco.gym, continuous actions, the small_continuous family (ppo's pendulum
    # preset). A random policy: 5.5 (std 3.0). With this budget, 3 seeds of the
    # sweep ended at 126, 294 and 515 (docs/presets.md).
    pytest.param("ppo", "InvertedPendulum-v4", 50_000, 50, id="mujoco-ppo-inverted-pendulum"),
    # box2d, discrete actions, the vector_discrete family (dqn's lunarlander preset,
    # its whole 100k budget, over which its learning rate decays to 0: a longer run
    # learns nothing more). A random policy: -192 (std 116 per episode, so about 16
    # for a 50-episode mean: -100 is 5.6 of those above it). The preset's sweep at
    # 100k ended at 211.6 for seed 0 and at 205.5-262.3 over seeds 0-4
    # (docs/presets.md, "Against the reference implementations").
    pytest.param("dqn", "LunarLander-v2", 100_000, -100, id="box2d-dqn-lunar-lander"),
    # mujoco.dmc: dict observations flattened into one array (gorila_jax/envs.py),
    # continuous actions, the continuous family (ppo's mujoco preset). Baselines
    # over 10-20 episodes: a random policy 340, a constant push 747 (a strong one
    # on this task, so the threshold is above it). The sweep's 3 seeds (1M env
    # steps) first evaluated >= 800 at 344k, 508k and 194k env steps and ended at
    # 989-1000 (docs/presets.md). Extended, not in CI (121 s of it): CI proves the
    # dict-observation adapter on dm_control itself (tests/gorila_jax/test_dict_observations.py)
    # and PPO's continuous-action learning on InvertedPendulum above.
    pytest.param(
        "ppo",
        "CartpoleBalance-v1",
        600_000,
        800,
        id="dm_control-ppo-cartpole",
        marks=pytest.mark.extended,
    ),
    # toy_text: a [10, 5] grid, discrete actions (dqn's cartpole preset). A random
    # policy: -0.32; 1.0 is every ball caught. The sweep's 3 seeds ended at 1.0.
    pytest.param("dqn", "Catch-v0", 20_000, 0.9, id="toy_text-dqn-catch"),
    # highway: kinematics [5, 5], discrete actions (dqn's cartpole preset). A random
    # policy: 7.5 over 50 episodes; the sweep's 3 seeds ended at 21.3-21.6. The best
    # constant action (slower) scores 20.9, so this shows learning, not driving skill.
    pytest.param("dqn", "HighwayFast-v0", 50_000, 15, id="highway-dqn-highway-fast"),
    # mpe2: 3 agents a copy, a row each, one shared policy (the multiagent family,
    # ppo's mpe preset, its whole 300k agent-step budget). Over 100 copies a random
    # policy's agents get -27.9 each (std 7.0), the best constant action (no-op)
    # -24.9; -23.5 is 4.4 above random and beats every constant action. The sweep's
    # 3 seeds ended at -20.2, -20.2 and -23.4 (docs/multiagent.md). Extended, not
    # in CI: in the clean-clone CI at 576dbbb this run (seed 0) evaluated between
    # -60.6 and -20.9 and ended at -30.5 beside the suite's other workers, while
    # seed 0 alone ended at -20.2 and -20.4, and at -20.1 beside two busy cores.
    pytest.param(
        "ppo",
        "mpe/simple_spread_v3",
        300_000,
        -23.5,
        id="mpe-ppo-simple-spread",
        marks=pytest.mark.extended,
    ),
    # The same family with DQN's mpe preset, its whole 300k agent-step budget: the
    # sweep's 3 seeds ended at -17.7, -20.6 and -20.5 (docs/multiagent.md), so -23.5
    # leaves 5.8 for this seed (0) under the suite's load; a random policy -27.9, the
    # best constant action -24.9.
    pytest.param("dqn", "mpe/simple_spread_v3", 300_000, -23.5, id="mpe-dqn-simple-spread"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("agent", "env_id", "total_env_steps", "threshold"), CASES)
def test_the_auto_preset_learns_by_the_end_of_its_budget(
    tmp_path, agent, env_id, total_env_steps, threshold
):
    summary = _final_return(tmp_path, agent, env_id, total_env_steps)
    assert summary["final_eval_return"] >= threshold, summary["evaluations"]
