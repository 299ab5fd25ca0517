"""One short learning run per env family and action kind beyond classic control, with the
preset `auto` picks there (CartPole and Pendulum have tests of their own under tests/agents/).

Each asserts the final greedy return at the end of a bounded budget (not a first
crossing), against a random policy's mean return measured with envpool over 100
episodes (uniform actions, seed 0): the margins are what a run that learns
nothing cannot reach.
"""

import pytest

from gorila_jax.run import experiment
from launch import presets


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
        }
    )
    summary = experiment.run_experiment(presets.AGENTS[agent].builder(config), exp)
    assert summary["env_steps"] >= total_env_steps, summary["stop_reason"]
    assert summary["final_eval_episodes"] >= 10
    return summary


@pytest.mark.slow
def test_ppo_learns_to_balance_mujocos_inverted_pendulum(tmp_path):
    # mujoco.gym, continuous actions, the small_continuous family (ppo's pendulum
    # preset). A random policy: 5.5 (std 3.0). With this budget, 3 seeds of the
    # sweep ended at 126, 294 and 515 (docs/presets.md).
    summary = _final_return(tmp_path, "ppo", "InvertedPendulum-v4", 50_000)
    assert summary["final_eval_return"] >= 50, summary["evaluations"]


@pytest.mark.slow
def test_dqn_learns_to_land_box2ds_lunar_lander(tmp_path):
    # box2d, discrete actions, the vector_discrete family (dqn's cartpole
    # preset). A random policy: -192 (std 116 per episode, so about 37 for a
    # 10-episode mean: -100 is 2.5 of those above it). With this budget, 3 seeds
    # of the sweep ended at 34, 127 and 141 with the preset's earlier 256x256
    # network; with its 128x128 one, seeds 0 and 1 at -11.6 and 51.1, and this
    # test (seed 0) at -51.9 in a clean-clone CI run (docs/presets.md).
    summary = _final_return(tmp_path, "dqn", "LunarLander-v2", 50_000)
    assert summary["final_eval_return"] >= -100, summary["evaluations"]


@pytest.mark.slow
def test_ppo_learns_to_balance_dm_controls_cartpole(tmp_path):
    # mujoco.dmc: dict observations flattened into one array (gorila_jax/envs.py),
    # continuous actions, the continuous family (ppo's mujoco preset). Baselines
    # over 10-20 episodes: a random policy 340, a constant push 747 (a strong one
    # on this task, so the threshold is above it). The sweep's 3 seeds (1M env
    # steps) first evaluated >= 800 at 344k, 508k and 194k env steps and ended at
    # 989-1000 (docs/presets.md).
    summary = _final_return(tmp_path, "ppo", "CartpoleBalance-v1", 600_000)
    assert summary["final_eval_return"] >= 800, summary["evaluations"]


@pytest.mark.slow
def test_dqn_learns_to_catch_in_toy_text(tmp_path):
    # toy_text: a [10, 5] grid, discrete actions (dqn's cartpole preset). A random
    # policy: -0.32; 1.0 is every ball caught. The sweep's 3 seeds ended at 1.0.
    summary = _final_return(tmp_path, "dqn", "Catch-v0", 20_000)
    assert summary["final_eval_return"] >= 0.9, summary["evaluations"]


@pytest.mark.slow
def test_dqn_beats_a_random_driver_on_highway(tmp_path):
    # highway: kinematics [5, 5], discrete actions (dqn's cartpole preset). A random
    # policy: 7.5 over 50 episodes; the sweep's 3 seeds ended at 21.3-21.6. The best
    # constant action (slower) scores 20.9, so this shows learning, not driving skill.
    summary = _final_return(tmp_path, "dqn", "HighwayFast-v0", 50_000)
    assert summary["final_eval_return"] >= 15, summary["evaluations"]
