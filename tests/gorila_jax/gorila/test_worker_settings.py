"""A Gorila worker's settings are one object, made from the run's settings, defaults said
once."""

import pytest

from gorila_jax.gorila import workers
from gorila_jax.run import experiment


def test_a_run_with_default_settings_gives_its_workers_the_default_settings():
    assert experiment.ExperimentConfig().worker_settings() == workers.DEFAULTS


def test_each_run_setting_reaches_the_worker_settings():
    changed = experiment.ExperimentConfig(
        async_update=3, compression="onebit", outlier_stds=0.0
    ).worker_settings()
    assert changed == workers.WorkerSettings(
        async_update=3, compression_scheme="onebit", outlier_stds=0.0
    )
    assert all(
        getattr(changed, name) != getattr(workers.DEFAULTS, name)
        for name in ("async_update", "compression_scheme", "outlier_stds")
    )


def test_a_worker_that_would_never_pull_parameters_is_refused():
    with pytest.raises(ValueError, match="async_update must be positive, got 0"):
        workers.WorkerSettings(async_update=0)
