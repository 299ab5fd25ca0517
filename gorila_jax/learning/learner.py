"""The synchronous learner on one host: sample -> shard -> pmapped guarded update ->
priorities -> publish, rolling back to a checkpoint when updates stay non-finite.

With `num_learner_hosts` > 1 the learner is H processes (one per host) that
join one `jax.distributed` job (`multihost_learner.MultiHostLearnerNode`).
"""

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types
from gorila_jax.distributed import program
from gorila_jax.learning import settings as learner_settings
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
      settings: devices, reports, checkpoint interval and retention, TF32, and the
        numeric guard's rollbacks (`settings.LearnerSettings`).
      start: where it keeps checkpoints and what it starts from (`sync_learner.LearnerStart`;
        the default: no checkpoints, a fresh state).
      name: the node's name (a federated run has a learner per client).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client | list[program.Client],
        monitor: program.Client | None,
        seed: int,
        settings: learner_settings.LearnerSettings = learner_settings.DEFAULTS,
        start: sync_learner.LearnerStart = sync_learner.FRESH,
        name: str = "learner/0",
    ):
        super().__init__(builder, spec, replay_client, monitor, seed, settings, start, name)
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
        if self._settings.max_nonfinite_steps and streak >= self._settings.max_nonfinite_steps:
            self._roll_back(streak)
        return True
