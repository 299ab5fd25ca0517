"""An actor's settings: made once from the run's, and refused when they cannot work."""

import pytest

from gorila_jax.acting import settings
from gorila_jax.run import experiment


def test_a_run_s_actors_get_its_settings_and_its_defaults_are_the_actors():
    cfg = experiment.ExperimentConfig(
        num_envs_per_actor=3, param_pull_interval=7, heartbeat_interval_s=0.5
    )
    made = cfg.actor_settings()
    assert (made.num_envs, made.param_pull_interval, made.heartbeat_interval_s) == (3, 7, 0.5)
    assert made.max_env_steps == 0  # runs cap actors through the driver, not here
    assert experiment.ExperimentConfig().actor_settings() == settings.DEFAULTS


@pytest.mark.parametrize(
    "bad, named",
    [
        (dict(num_envs=0), "num_envs must be positive"),
        (dict(param_pull_interval=0), "param_pull_interval must be positive"),
        (dict(env_threads=0), "env_threads must be positive"),
        (dict(heartbeat_interval_s=0.0), "heartbeat_interval_s must be positive"),
        (dict(max_env_steps=-1), "max_env_steps must not be negative"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(bad, named):
    with pytest.raises(ValueError, match=named):
        settings.ActorSettings(**bad)
