"""Presets: the agent registry, the brief's per-game table, `auto` by env id, preset files."""

import dataclasses

import pytest

from agents import dqn
from agents import registry
from gorila_jax import envs
from gorila_jax.gorila import mode
from gorila_jax.run import experiment
from agents.dqn import presets as dqn_presets
from launch import presets

EXPERIMENT_FIELDS = {"num_actors", "param_pull_interval", "total_env_steps", "num_envs_per_actor"}


@pytest.mark.parametrize(
    "env_id, name, pull, batch",
    [
        ("Pong-v5", "simple", 10, 256),
        ("Breakout-v5", "medium", 5, 512),
        ("MontezumaRevenge-v5", "hard", 1, 1024),
    ],
)
def test_auto_picks_the_briefs_preset_for_each_game(env_id, name, pull, batch):
    assert presets.resolve("auto", env_id) == name
    config, settings = presets.load("auto", "dqn", env_id, EXPERIMENT_FIELDS)
    assert settings["param_pull_interval"] == pull and config.batch_size == batch


def test_other_envs_get_the_briefs_defaults_or_their_own_preset():
    assert presets.resolve("auto", "Alien-v5") == "default"
    assert presets.resolve("auto", "CartPole-v1") == "cartpole"
    assert presets.resolve("hard", "CartPole-v1") == "hard"  # a named preset is taken as given


def test_auto_falls_back_to_the_agents_default_where_it_has_no_preset_for_the_env():
    config, _ = presets.load("auto", "qrdqn", "Pong-v5", EXPERIMENT_FIELDS)
    assert config == registry.AGENTS["qrdqn"].preset("default")[0]
    with pytest.raises(ValueError, match="unknown preset 'simple'"):  # asked for by name
        presets.load("simple", "qrdqn", "Pong-v5", EXPERIMENT_FIELDS)


def test_a_preset_file_starts_from_its_base_and_overrides_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "base: simple\nagent: {batch_size: 128, hidden_sizes: [64, 64]}\n"
        "experiment: {num_actors: 3}\n"
    )
    config, settings = presets.load(str(path), "dqn", "Breakout-v5", EXPERIMENT_FIELDS)
    assert config.batch_size == 128 and config.hidden_sizes == (64, 64)
    assert settings["num_actors"] == 3 and settings["param_pull_interval"] == 10  # from simple


def test_a_json_preset_file_without_base_follows_auto(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"agent": {"discount": 0.98}}')
    config, settings = presets.load(str(path), "dqn", "MontezumaRevenge-v5", EXPERIMENT_FIELDS)
    assert config.discount == 0.98 and config.batch_size == 1024


@pytest.mark.parametrize(
    "content, message",
    [
        ("agent: {batch_sise: 3}", "has no field 'batch_sise'"),
        ("experiment: {num_actor: 3}", "unknown experiment settings ['num_actor']"),
        ("agents: {}", "must be a mapping with keys base, agent, experiment"),
        ("base: nosuch", "unknown preset 'nosuch'"),
        ("agent: [1, 2", "not valid JSON/YAML"),
    ],
)
def test_bad_preset_files_are_rejected_with_the_reason(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        presets.load(str(path), "dqn", "Pong-v5", EXPERIMENT_FIELDS)
    assert message in str(error.value)


def test_gorila_mode_lowers_adams_momentum_in_the_dqn_cartpole_preset_only():
    sync, _ = presets.load("auto", "dqn", "CartPole-v1", EXPERIMENT_FIELDS)
    gorila, _ = presets.load("auto", "dqn", "CartPole-v1", EXPERIMENT_FIELDS, "gorila")
    assert sync.adam_b1 == 0.9 and gorila.adam_b1 == dqn_presets.GORILA_CARTPOLE["adam_b1"] < 0.9
    # A worker pushes one gradient per call; the rest of the preset is the sync one.
    assert sync.updates_per_dispatch > 1 and gorila.updates_per_dispatch == 1
    assert gorila == dataclasses.replace(sync, **dqn_presets.GORILA_CARTPOLE)
    mode.check_agent(dqn.DQNBuilder(gorila), envs.env_spec("CartPole-v1"))  # runs there
    pong, _ = presets.load("auto", "dqn", "Pong-v5", EXPERIMENT_FIELDS, "gorila")
    assert pong.adam_b1 == 0.9  # measured on CartPole only


@pytest.mark.parametrize("agent", sorted(registry.AGENTS))
def test_every_registered_agent_has_each_preset_it_names(agent):
    entry = registry.AGENTS[agent]
    fields = {field.name for field in dataclasses.fields(experiment.ExperimentConfig)}
    for name in entry.preset_names:
        config, settings = entry.preset(name)
        assert isinstance(config, entry.config) and set(settings) <= fields, name
        assert name in presets.NAMES
    with pytest.raises(ValueError, match="'nosuch'"):
        entry.preset("nosuch")


def test_a_run_record_rebuilds_only_registered_agents():
    record = {"agent_config_class": "os.path.join", "agent_config": {}, "builder": "os.system"}
    with pytest.raises(ValueError, match="'os.path.join', which is not an agent"):
        presets.builder_from_record(record, None)
    dqn_config = registry.AGENTS["dqn"].config
    path = f"{dqn_config.__module__}.{dqn_config.__qualname__}"
    with pytest.raises(ValueError, match="'os.system', which is not an agent"):
        presets.builder_from_record({**record, "agent_config_class": path}, None)
