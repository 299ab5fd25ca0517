"""A learner's settings are one object, made from the run's settings, defaults said once."""

import dataclasses

import pytest

from gorila_jax.learning import settings
from gorila_jax.run import experiment


def test_a_run_with_default_settings_gives_its_learners_the_default_settings():
    assert experiment.ExperimentConfig().learner_settings() == settings.DEFAULTS


def test_each_run_setting_reaches_the_learner_settings():
    changed = experiment.ExperimentConfig(
        num_learner_devices=2,
        heartbeat_interval_s=0.5,
        checkpoint_interval_steps=7,
        max_checkpoints_to_keep=4,
        tf32=True,
        max_nonfinite_steps=3,
        rollback_lr_factor=0.25,
        rollback_param_noise=0.01,
    ).learner_settings()
    assert changed == settings.LearnerSettings(2, 0.5, 7, 4, True, 3, 0.25, 0.01)
    fields = {field.name for field in dataclasses.fields(settings.LearnerSettings)}
    assert all(getattr(changed, name) != getattr(settings.DEFAULTS, name) for name in fields)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(rollback_lr_factor=0.0), r"rollback_lr_factor must be in \(0, 1\], got 0.0"),
        (dict(rollback_lr_factor=1.5), r"rollback_lr_factor must be in \(0, 1\], got 1.5"),
        (dict(max_nonfinite_steps=-1), "max_nonfinite_steps must not be negative, got -1"),
        (dict(rollback_param_noise=-0.1), "rollback_param_noise must not be negative"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_the_run_and_by_the_node_alike(values, message):
    with pytest.raises(ValueError, match=message):
        settings.LearnerSettings(**values)
    with pytest.raises(ValueError, match=message):
        experiment.ExperimentConfig(**values).learner_settings()
