"""A run's settings are checked once: `check_run` gives the `CheckedRun` that
`run_checked` runs, and `run_experiment` is the two in a row."""

import pytest

from agents import dqn
from gorila_jax.run import experiment
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment


def test_a_checked_run_runs_without_checking_its_settings_again(tmp_path, monkeypatch):
    checked = experiment.check_run(
        dqn.DQNBuilder(CONFIG), _experiment(tmp_path, total_env_steps=400)
    )

    def validated_again(self):
        raise AssertionError("the settings were checked a second time")

    monkeypatch.setattr(experiment.ExperimentConfig, "validate", validated_again)
    summary = experiment.run_checked(checked)
    assert summary["env_steps"] >= 400 and summary["learner_steps"] > 0


def test_run_experiment_refuses_bad_settings_before_anything_changes(tmp_path):
    cfg = _experiment(tmp_path / "run", total_env_steps=100)  # below min_replay_size
    with pytest.raises(ValueError, match="min_replay_size"):
        experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg)
    assert not (tmp_path / "run").exists()
