"""One process of a multi-host synchronous learner: every host's devices step together.

H processes (one per host) join one `jax.distributed` job and run each
guarded update (`step.make_step`) over all their devices
(`multihost.make_global_step`), each on its own share of the global batch.
"""

import functools
from typing import Any, Callable

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types
from gorila_jax.distributed import multihost, program
from gorila_jax.learning import settings as learner_settings
from gorila_jax.learning import sync_learner
from gorila_jax.learning import step as step_lib


def _paired_step(guarded_step: Callable, state_and_guard: tuple, batch: Any) -> tuple:
    """`step.make_step`'s step with (state, guard) as one input and output, the form
    `multihost.make_global_step` keeps unchanged on a stop vote."""
    state, guard = state_and_guard
    state, guard, info, published = guarded_step(state, guard, batch)
    return (state, guard), info, published


def make_global_step(builder: builder_lib.AgentBuilder, spec: types.EnvSpec) -> Callable:
    """The learner's guarded step over every process's devices, with a stop vote.

    ((state, guard), local batch, `multihost.stop_votes(...)`) ->
    ((state, guard), info, published parameters, stop); see `multihost.make_global_step`.
    """
    return multihost.make_global_step(
        functools.partial(_paired_step, step_lib.make_step(builder, spec)),
        out_axes=step_lib.OUT_AXES[1:],
    )


def check_agent(builder: builder_lib.AgentBuilder, num_hosts: int) -> None:
    """Raises ValueError for an agent setting the multi-host learner cannot run (its global
    step takes one batch per call), as `gorila.mode.check_agent` does for Gorila mode."""
    if builder.batch_plan.updates_per_dispatch != 1:
        raise ValueError(
            f"config.updates_per_dispatch={builder.batch_plan.updates_per_dispatch} runs on a "
            f"one-host learner only; num_learner_hosts={num_hosts}: set it to 1"
        )


class MultiHostLearnerNode(sync_learner.SyncLearnerNode):
    """Process p (node "learner/p") of a learner that spans H hosts.

    It joins the job before it touches any device, takes the chief's (process
    0's) initial or restored state, samples its `multihost.local_batch_size`
    share of every global batch, updates the priorities of exactly the items
    it sampled, and steps in lockstep with the others: a stop asked of any
    process stops all of them after the same update (stop votes). Only the
    chief publishes parameters (`get_params`), reports metrics and saves and
    restores checkpoints (`start.checkpoint_dir` is ignored in the others): it reads
    a checkpoint alone and broadcasts it to the others. While it saves, the
    others wait in the next update's collectives. `num_devices` must be 0 or
    all of the host's devices. One process is never restarted alone (it
    cannot rejoin the others' job): the wiring restarts the whole group
    (`program.Program.restart_together`). A numerical fault is rolled back
    in every process after the same step, to the chief's newest checkpoint.

    Args:
      builder ... start: as `learner.LearnerNode`'s.
      num_learner_hosts: learner processes (H) in the job, at least 2.
      learner_process_id: this process's index p, 0 .. H - 1.
      rendezvous: client of the `multihost.Rendezvous` node through which the
        chief tells the others the coordinator address it picked.
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
        num_learner_hosts: int = 2,
        learner_process_id: int = 0,
        rendezvous: program.Client | None = None,
    ):
        # First of all: jax.distributed must be joined before any device is touched.
        group = multihost.join(rendezvous, num_learner_hosts, learner_process_id)
        if len(parallel.local_devices(settings.num_devices)) != jax.local_device_count():
            raise ValueError(
                f"num_learner_devices={settings.num_devices}: with num_learner_hosts="
                f"{num_learner_hosts} every learner process uses all its devices "
                f"({jax.local_device_count()}); use 0"
            )
        super().__init__(
            builder,
            spec,
            replay_client,
            monitor,
            seed,
            settings,
            start,
            name=f"learner/{learner_process_id}",
            num_processes=num_learner_hosts,
            is_chief=group.is_chief,
        )
        self._global_step = make_global_step(builder, spec)
        # The latest (keys, device batch): what this process feeds a stop-vote step.
        self._last_item: tuple[np.ndarray, Any] | None = None
        self._stop_agreed = False  # the processes all voted to stop

    def _agreed(self, state: Any) -> Any:
        """The chief's state, step count and numeric-guard settings, in every process.

        The chief alone reads checkpoints; a fresh state would agree anyway
        (same seed), but a restored one exists only on its host.
        """
        guard = self._guard_meta
        shared = multihost.broadcast_from_chief(
            (
                jax.device_get(state),
                np.asarray(self._steps, np.int32),
                np.asarray(self._started_from, np.int32),
                np.asarray(guard.get("skipped_steps", 0), np.int32),
                np.asarray(guard.get("lr_scale", 1.0), np.float32),
            )
        )
        state, steps, started_from, skipped, lr_scale = shared
        self._steps, self._started_from = int(steps), int(started_from)
        self._guard_meta = {**guard, "skipped_steps": int(skipped), "lr_scale": float(lr_scale)}
        self.local_batch_size()  # a global batch that does not split fails here, by name
        return state

    def local_batch_size(self) -> int:
        """The rows this process samples per update: its share of the global batch.

        Every process computes it from the same step count, so all feed
        batches of one shape to each global step.
        """
        return multihost.local_batch_size(
            self.batch_size(), self._num_processes, len(self._devices)
        )

    def _rows_to_sample(self) -> int:
        return self.local_batch_size()

    def _done(self) -> bool:
        # A stopping process must still take part in one more (voted) step, or the
        # others would wait for it in that step's collectives forever.
        return self._stop_agreed

    def step(self, timeout: float = 1.0) -> bool:
        """One update, in lockstep with the other processes.

        A process enters the global step only with a batch of the current
        local size, or to vote stop: every process then runs the same
        updates, and one that entered never waits for one that will not come
        (the driver stops every learner process). Returns False when no
        batch came within `timeout` or the processes agreed to stop.
        """
        item = None
        while item is None and not self.stopping:
            item = self._next_batch(timeout)
            if item is None:
                return False  # back to the run loop (reports, stop checks); nobody stepped
            if item[0].size != self.local_batch_size():
                item = None  # sampled before a batch-size change: every process drops it
        stopping = self.stopping
        if stopping:
            # Any batch of the agreed shape will do: the voted step changes nothing.
            item = self._last_item or (None, self._placeholder_batch())
        keys, batch = item
        with self._state_lock:
            (state, guard), info, published, stop = self._global_step(
                (self._state, self._guard), batch, multihost.stop_votes(stopping)
            )
            self._state, self._guard = state, guard
            if bool(stop):
                # Another process (or this one) is stopping: this update was discarded.
                self._stop_agreed = True
                self._stop_event.set()
                return False
            with self._params_lock:
                self._steps += 1
                if self._is_chief:
                    self._published = published
        self._last_item = item
        self._last_batch_size = keys.size * self._num_processes
        # This process's rows of the global batch: exactly the items it sampled.
        streak = self._finish_step(keys, info)
        if self._settings.max_nonfinite_steps and streak >= self._settings.max_nonfinite_steps:
            # The streak is global (pmax), so every process rolls back after the same step.
            self._roll_back(streak)
        return True

    def _agreed_rollback(self, step: int, state: Any) -> tuple[int, Any]:
        """The chief's checkpoint step and (perturbed) state, in every process: it alone
        reads checkpoints, as at the start (`_agreed`)."""
        state, step = multihost.broadcast_from_chief((state, np.asarray(step, np.int32)))
        return int(step), state

    def _placeholder_batch(self) -> Any:
        """A zero batch of the local shape and dtypes, for a stop vote before any real batch."""
        rows = self.local_batch_size()
        data = self._codec.decode(np.zeros((rows, self._codec.num_bytes), np.uint8))
        sampled = builder_lib.SampledBatch(data, np.ones(rows, np.float64), np.ones(rows, np.int64))
        return parallel.shard_to_devices(sampled, self._devices)

    def _heartbeat_counters(self) -> dict[str, int]:
        counters = super()._heartbeat_counters()
        if not self._is_chief:
            # The monitor sums "learner_steps" over nodes: only the chief counts the job's updates.
            counters["process_learner_steps"] = counters.pop("learner_steps")
        return counters

    def _report(self, block: bool = False) -> None:
        if self._is_chief or self._monitor is None:
            super()._report(block)
            return
        # Counters only (its heartbeat's); the job's metrics are the chief's.
        report = self._monitor.report if block else self._monitor.futures.report
        report(self._name, self._heartbeat_counters())

    def save_checkpoint(self) -> int:
        if not self._is_chief:
            raise RuntimeError(f"{self._name} is not the chief: only learner/0 checkpoints")
        return super().save_checkpoint()

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """As `learner.LearnerNode.get_params`, in the chief.

        Raises:
          RuntimeError: in a non-chief process, which publishes nothing.
        """
        if not self._is_chief:
            raise RuntimeError(f"{self._name} is not the chief: read parameters from learner/0")
        return super().get_params(newer_than)
