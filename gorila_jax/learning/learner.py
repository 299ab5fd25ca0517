"""The synchronous learner on one host: sample -> shard -> pmapped guarded update ->
priorities -> publish, rolling back to a checkpoint when updates stay non-finite.

With `num_learner_hosts` > 1 the learner is H processes (one per host) that
join one `jax.distributed` job (`multihost_learner.MultiHostLearnerNode`).
"""

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types
from gorila_jax.distributed import program
from gorila_jax.learning import sync_learner
from gorila_jax.learning import step as step_lib


class LearnerNode(sync_learner.SyncLearnerNode):
    """Turns replay batches into updates on all local devices and serves parameters.

    Args:
      builder: the agent.
      spec: the environment's spec.
      replay_client: client of the replay node, or a list of the replay shards'
        clients (`sharded_replay`): batches are drawn across all of them.
      monitor: client of the monitor node (or None when driven by hand).
      seed: root seed; the learner's key is fold_in(seed key, 0).
      num_devices: local devices to pmap over; 0 takes them all.
      report_interval_s: how often counters and metrics go to the monitor.
      checkpoint_dir: the run's learner checkpoint directory (absolute); None
        disables checkpoints.
      checkpoint_interval_steps: learner steps between checkpoints; the last
        one is taken when `run` ends. 0: only that last one.
      max_checkpoints_to_keep: older checkpoints (and their replay) are deleted.
      restore_step: start from the checkpoint of this learner step;
        `NEWEST` takes the newest one that loads (a fresh state if none does).
      restored_counters: the counters this learner reported last (a restart
        after a crash): learner steps, which are also the parameter version
        actors compare against, go on from there instead of going back to
        the checkpoint's; the updates in between are lost, not uncounted.
      tf32: TensorFloat-32 matmuls on GPUs (`precision.use_tf32`).
      max_nonfinite_steps: after this many consecutive skipped (non-finite)
        updates, roll back to the newest checkpoint (`step.NumericGuard`); 0 never.
      rollback_lr_factor: each rollback multiplies the learning-rate scale by this.
      rollback_param_noise: after a rollback, add Gaussian noise of this
        standard deviation to the trainable parameters (0: none), so the
        same batches do not lead to the same divergence.
      name: the node's name (a federated run has a learner per client).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client | list[program.Client],
        monitor: program.Client | None,
        seed: int,
        num_devices: int = 0,
        report_interval_s: float = 1.0,
        checkpoint_dir: str | None = None,
        checkpoint_interval_steps: int = 0,
        max_checkpoints_to_keep: int = 2,
        restore_step: int | None = None,
        tf32: bool = False,
        max_nonfinite_steps: int = 10,
        rollback_lr_factor: float = 0.5,
        rollback_param_noise: float = 0.0,
        restored_counters: dict[str, float] | None = None,
        name: str = "learner/0",
    ):
        super().__init__(
            builder,
            spec,
            replay_client,
            monitor,
            seed,
            num_devices,
            report_interval_s,
            checkpoint_dir,
            checkpoint_interval_steps,
            max_checkpoints_to_keep,
            restore_step,
            tf32,
            max_nonfinite_steps,
            restored_counters,
            name=name,
            rollback_lr_factor=rollback_lr_factor,
            rollback_param_noise=rollback_param_noise,
        )
        self._updates = builder.batch_plan.updates_per_dispatch
        self._step_fn = parallel.pmap_step(
            step_lib.make_step(builder, spec, updates=self._updates),
            self._devices,
            out_axes=step_lib.OUT_AXES,
        )

    def _rows_to_sample(self) -> int:
        return self.batch_size() * self._updates

    def step(self, timeout: float = 1.0) -> bool:
        """One device call: `updates_per_dispatch` updates, each on a batch of its own.
        Returns False if no batch came within `timeout`."""
        item = self._next_batch(timeout)
        if item is None:
            return False
        keys, batch = item
        self._last_batch_size = keys.size // self._updates
        with self._state_lock:
            self._state, self._guard, info, published = self._step_fn(
                self._state, self._guard, batch
            )
            with self._params_lock:
                self._steps += self._updates
                self._published = published
        streak = self._finish_step(keys, info)
        if self._max_nonfinite_steps and streak >= self._max_nonfinite_steps:
            self._roll_back(streak)
        return True
