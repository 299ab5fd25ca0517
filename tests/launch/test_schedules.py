"""Schedules follow the run's budget (launch/schedules.py), through what launch.train
loads: the presets' layers and the fitting."""

import dataclasses

import pytest

from agents import dqn, ppo, sac
from launch import presets, schedules

FIELDS = {"total_env_steps", "num_actors"}


def _fitted(agent, env_id, env_steps, num_actors=2, kept=(), overrides=None, name="auto"):
    layers = presets.load_layers(name, agent, env_id, FIELDS)
    config, settings = layers.combined()
    config = dataclasses.replace(config, **(overrides or {}))
    budget = schedules.Budget(env_steps, num_actors)
    kept = {*kept, *(overrides or {}), *layers.file_agent}
    return schedules.fit(
        config, layers.config, schedules.preset_budget(layers.settings), budget, kept
    )


@pytest.mark.parametrize("env_steps", [120_000, 500_000])
def test_the_dqn_cartpole_schedules_end_at_each_budget(env_steps):
    config = _fitted("dqn", "CartPole-v1", env_steps)
    updates = env_steps * config.samples_per_insert / config.batch_size
    # The cosine and the importance anneal reach their ends with the run's last update,
    # epsilon after the same fifteenth of the run as in the preset's 120k.
    assert config.learning_rate_decay_steps == pytest.approx(updates, abs=1)
    assert config.importance_exponent_anneal_steps == pytest.approx(updates, abs=1)
    assert config.epsilon_decay_steps == pytest.approx(env_steps / 15, abs=1)


def test_the_run_s_own_rates_count_not_the_preset_s():
    # Twice the batch: half the updates in the same budget, and the cosine ends with them.
    config = _fitted("dqn", "CartPole-v1", 120_000, overrides={"batch_size": 128})
    assert config.learning_rate_decay_steps == 120_000 * config.samples_per_insert // 128
    # The preset's 2 actors decay epsilon over 8k of their 60k env steps each; 4 actors
    # over the same part of their 30k.
    config = _fitted("dqn", "CartPole-v1", 120_000, num_actors=4)
    assert config.epsilon_decay_steps == 4_000


def test_ppo_s_decay_keeps_its_part_of_the_budget():
    preset = presets.load("auto", "ppo", "CartPole-v1", FIELDS)[0]
    config = _fitted("ppo", "CartPole-v1", 400_000, num_actors=2)
    assert config.learning_rate_decay_updates == 2 * preset.learning_rate_decay_updates


def test_what_the_user_set_is_kept_and_what_is_off_stays_off(tmp_path):
    config = _fitted("dqn", "CartPole-v1", 500_000, overrides={"learning_rate_decay_steps": 777})
    updates = 500_000 * config.samples_per_insert // config.batch_size
    assert config.learning_rate_decay_steps == 777
    assert config.importance_exponent_anneal_steps == updates  # the rest still follow
    preset_file = tmp_path / "mine.yaml"
    preset_file.write_text("agent: {epsilon_decay_steps: 9000}\n")
    config = _fitted("dqn", "CartPole-v1", 500_000, name=str(preset_file))
    assert config.epsilon_decay_steps == 9_000 and config.learning_rate_decay_steps == updates
    # PPO's Atari preset keeps a constant step size (0: no decay) at any budget.
    layers = presets.load_layers("simple", "ppo", "CartPole-v1", FIELDS)
    assert layers.config.learning_rate_decay_updates == 0
    budget = schedules.Budget(10**6, 2)
    fitted = schedules.fit(layers.config, layers.config, schedules.Budget(10**7, 2), budget)
    assert fitted.learning_rate_decay_updates == 0
    assert "learning_rate_decay_updates off" in schedules.describe(fitted, budget)


def test_a_config_s_defaults_without_a_preset_budget_and_sac_are_left_as_they_are():
    config = dqn.DQNConfig()
    assert schedules.fit(config, config, None, schedules.Budget(50_000, 1)) == config
    assert schedules.describe(sac.SACConfig(), schedules.Budget(1, 1)) is None
    assert schedules.declared(ppo.PPOConfig()) == {"learning_rate_decay_updates": "updates"}
    # Batch growth follows the budget only where it is on.
    assert "batch_growth_steps" not in schedules.declared(dqn.DQNConfig())
    growing = dataclasses.replace(dqn.DQNConfig(), batch_size_max=1024)
    assert schedules.declared(growing)["batch_growth_steps"] == "updates"
