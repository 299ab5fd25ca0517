"""How a learner node runs, as one settings object: what every learner (one host, a
multi-host job's process, a federated client) takes from the run's settings whole.

The defaults here are the run's: `ExperimentConfig`'s fields of the same names take
theirs from `DEFAULTS`, and `ExperimentConfig.learner_settings()` makes the object a
run's learners get.
"""

import dataclasses

from gorila_jax.health.monitor import HEARTBEAT_INTERVAL_S


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """A learner node's settings.

    Attributes:
      num_devices: local devices the learner pmaps over; 0 takes all.
      heartbeat_interval_s: seconds between the node's heartbeats (its counters) to the
        monitor.
      checkpoint_interval_steps: a checkpoint every this many learner steps; the last
        one is taken when `run` ends. 0: only that last one.
      max_checkpoints_to_keep: older checkpoints (and their replay) are deleted.
      tf32: TensorFloat-32 matmuls on GPUs (`precision.use_tf32`).
      max_nonfinite_steps: after this many consecutive skipped (non-finite) updates,
        roll back to the newest checkpoint (`step.NumericGuard`); 0 never.
      rollback_lr_factor: each rollback multiplies the learning-rate scale by this.
      rollback_param_noise: after a rollback, Gaussian noise of this standard deviation
        on the trainable parameters (0: none), so the same batches do not lead to the
        same divergence.

    Raises:
      ValueError: a value that cannot work, naming it.
    """

    num_devices: int = 0
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    checkpoint_interval_steps: int = 5000
    max_checkpoints_to_keep: int = 2
    tf32: bool = False
    max_nonfinite_steps: int = 10
    rollback_lr_factor: float = 0.5
    rollback_param_noise: float = 0.0

    def __post_init__(self):
        if self.max_nonfinite_steps < 0:
            raise ValueError(
                f"max_nonfinite_steps must not be negative, got {self.max_nonfinite_steps}"
            )
        if not 0 < self.rollback_lr_factor <= 1:
            raise ValueError(f"rollback_lr_factor must be in (0, 1], got {self.rollback_lr_factor}")
        if self.rollback_param_noise < 0:
            raise ValueError(
                f"rollback_param_noise must not be negative, got {self.rollback_param_noise}"
            )


DEFAULTS = LearnerSettings()
