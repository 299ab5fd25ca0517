"""How an actor node acts, as one settings object: what every actor (of one role or
several) takes from the run's settings whole.

The defaults here are the run's: `ExperimentConfig`'s fields of these settings take
theirs from `DEFAULTS`, and `ExperimentConfig.actor_settings()` makes the object a
run's actors get.
"""

import dataclasses

from gorila_jax.health.monitor import HEARTBEAT_INTERVAL_S


@dataclasses.dataclass(frozen=True)
class ActorSettings:
    """An actor node's settings.

    Attributes:
      num_envs: env copies the actor steps together. A multi-agent task's copy gives
        `spec.agents_per_env` rows (one per agent); env steps count rows.
      param_pull_interval: actor steps between parameter requests (a request goes out
        without blocking; acting goes on with the copy it has).
      heartbeat_interval_s: how often counters and episode returns go to the monitor.
      env_threads: envpool worker threads; 1 suits cheap envs on few cores, more pay
        off for expensive ones (Atari, MuJoCo) when cores are free. Families without a
        thread pool refuse more than 1 (`run/combinations.py`).
      max_env_steps: the actor stops after this many env steps (0: when stopped). Runs
        leave it at 0 and cap actors near the end of their budget through
        `LimitedActing.limit_env_steps`; a bench or a test of one actor sets it.

    Raises:
      ValueError: a value that cannot work, naming it.
    """

    num_envs: int = 8
    param_pull_interval: int = 5
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    env_threads: int = 1
    max_env_steps: int = 0

    def __post_init__(self):
        for name in ("num_envs", "param_pull_interval", "env_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.heartbeat_interval_s <= 0:
            raise ValueError(
                f"heartbeat_interval_s must be positive, got {self.heartbeat_interval_s}"
            )
        if self.max_env_steps < 0:
            raise ValueError(f"max_env_steps must not be negative, got {self.max_env_steps}")


DEFAULTS = ActorSettings()
