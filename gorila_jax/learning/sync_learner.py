"""What the synchronous learners share: state, numeric guard, published parameters, checkpoints.

`learner.LearnerNode` runs on one host's devices; `multihost_learner.MultiHostLearnerNode`
is one of H processes stepping over every host's devices together.
"""

import dataclasses
import logging
import threading
import time
from typing import Any, ContextManager

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision, types
from gorila_jax.distributed import program
from gorila_jax.learning import settings as learner_settings
from gorila_jax.learning import replay_learner
from gorila_jax.learning import step as step_lib

NEWEST = -1  # restore_step: the newest checkpoint that loads


@dataclasses.dataclass(frozen=True)
class LearnerStart:
    """Where a learner keeps its checkpoints and what it starts from.

    Attributes:
      checkpoint_dir: its checkpoint directory (absolute); None: no checkpoints.
      restore_step: start from the checkpoint of this learner step; `NEWEST`: the newest
        one that loads (a fresh state if none does); None: a fresh state.
      restored_counters: the counters it reported last (a restart after a crash, or a
        resume's checkpoint): learner steps, which are also the parameter version actors
        compare against, go on from there instead of going back to the checkpoint's; the
        updates in between are lost, not uncounted.
    """

    checkpoint_dir: str | None = None
    restore_step: int | None = None
    restored_counters: dict[str, float] | None = None

    def restarted(self, counters: dict[str, float]) -> "LearnerStart":
        """A replacement's start after a fault: its newest checkpoint (if it keeps any),
        its counts going on from `counters`."""
        restore = None if self.checkpoint_dir is None else NEWEST
        return LearnerStart(self.checkpoint_dir, restore, counters)

    def restart_kwargs(self, counters: dict[str, float]) -> dict[str, Any]:
        """For `program.NodeSpec.restartable`: the replacement's `start`."""
        return {"start": self.restarted(counters)}


FRESH = LearnerStart()


class NumericalFault(RuntimeError):
    """Updates stayed non-finite and there is no checkpoint to roll back to."""


class SyncLearnerNode(replay_learner.ReplayLearnerNode):
    """Turns replay batches into guarded updates (`step.make_step`) and serves parameters.

    Holds the agent's state and its `step.NumericGuard` replicated on the local
    devices, the parameters the latest update published, and the learner
    step count, which is also the parameter version actors compare against.
    Only the chief publishes, reports metrics and checkpoints (a one-host
    learner is its own chief). Args as `learner.LearnerNode`'s (its settings in
    `settings.LearnerSettings`), plus:

    Args:
      name: the node's name ("learner/<process index>").
      num_processes: learner processes that each sample a share of every batch.
      is_chief: whether this process publishes, reports and checkpoints.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client | list[program.Client],
        monitor: program.Client | None,
        seed: int,
        settings: learner_settings.LearnerSettings,
        start: LearnerStart,
        name: str,
        num_processes: int = 1,
        is_chief: bool = True,
    ):
        precision.use_tf32(settings.tf32)
        self._is_chief, self._num_processes = is_chief, num_processes
        devices = parallel.local_devices(settings.num_devices)
        builder.validate(num_processes * len(devices))
        if not is_chief:  # the chief alone keeps and reads checkpoints
            start = LearnerStart(restored_counters=start.restored_counters)
        super().__init__(
            builder,
            spec,
            replay_client,
            monitor,
            name,
            devices,
            settings,
            start.checkpoint_dir,
            start.restored_counters,
        )
        self._noise_key = jax.random.fold_in(jax.random.PRNGKey(seed), 2**20)
        self._guard_meta: dict[str, float] = {}
        self.rollbacks = 0
        # Which checkpoint this incarnation started from (-1: none); in its heartbeats.
        self._started_from = -1
        self._place_state(spec, seed, start.restore_step, start.restored_counters)
        # Held while the state is replaced or read for a checkpoint: a step
        # donates the old state's buffers, so a checkpoint must not read them then.
        self._state_lock = threading.Lock()
        self._params_lock = threading.Lock()
        self._published: Any = None
        if is_chief:
            self._published = parallel.unreplicate(builder.state_access.actor_params(self._state))
        self._host_params: tuple[int, Any] | None = None
        # Parameter bytes sent to readers (actors, evaluator, per-host caches),
        # so the saving of a per-host cache (gorila_jax/acting/param_cache.py) is measured.
        self._params_bytes_served = 0
        self._last_info: builder_lib.StepInfo | None = None
        self._last_batch_size = 0
        self._last_report = 0.0

    def _place_state(
        self,
        spec: types.EnvSpec,
        seed: int,
        restore_step: int | None,
        restored_counters: dict[str, float] | None,
    ) -> None:
        """Puts the starting state and guard on the devices and sets the step count."""
        state, self._steps = self._initial_state(spec, seed, restore_step)
        self._steps = max(self._steps, int((restored_counters or {}).get("learner_steps", 0)))
        state = self._agreed(state)
        self._last_checkpoint_step = self._steps
        self._state = parallel.replicate(state, self._devices)
        self._guard = parallel.replicate(
            step_lib.init_guard(
                int(self._guard_meta.get("skipped_steps", 0)),
                float(self._guard_meta.get("lr_scale", 1.0)),
            ),
            self._devices,
        )

    def _agreed(self, state: Any) -> Any:
        """The state every process starts from; a one-host learner's own."""
        return state

    def _roll_back(self, streak: int) -> None:
        """Restores the newest checkpoint that loads, with a lower learning-rate scale (and
        noise on the parameters, if set); in every process of a multi-host learner alike.

        Learner steps keep counting up (no counter goes backwards); only the
        agent's state returns to the checkpoint's.

        Raises:
          NumericalFault: there is no checkpoint to return to, or none loads.
        """
        why = f"{streak} consecutive non-finite updates (max_nonfinite_steps)"
        with self._state_lock:
            target = jax.device_get(parallel.unreplicate(self._state))
            guard = jax.device_get(parallel.unreplicate(self._guard))
            newest = None  # only the chief has checkpoints; `_agreed_rollback` shares its pick
            if self._checkpoints is not None and self._checkpoints.steps():
                newest = self._checkpoints.restore_newest(target, self._name)
            step, state = (newest[0], self._perturbed(newest[1])) if newest else (-1, target)
            step, state = self._agreed_rollback(step, state)
            if step < 0:
                raise NumericalFault(f"{self._name}: {why} and no checkpoint to roll back to")
            lr_scale = float(guard.lr_scale) * self._settings.rollback_lr_factor
            self._state = parallel.replicate(state, self._devices)
            self._guard = parallel.replicate(
                step_lib.init_guard(int(guard.skipped_steps), lr_scale), self._devices
            )
            self.rollbacks += 1
            if self._is_chief:
                with self._params_lock:
                    self._published = parallel.unreplicate(
                        self._builder.state_access.actor_params(self._state)
                    )
            self._last_info = None  # the step in flight ran on the abandoned state
        logging.warning(
            "%s: %s; rolled back to the checkpoint of step %d, learning-rate scale now %g",
            self._name,
            why,
            step,
            lr_scale,
        )

    def _agreed_rollback(self, step: int, state: Any) -> tuple[int, Any]:
        """The checkpoint step (-1: none) and state every process rolls back to."""
        return step, state

    def _perturbed(self, state: Any) -> Any:
        """`state` with noise added to the agent's trainable parameters (if configured)."""
        if not self._settings.rollback_param_noise:
            return state
        self._noise_key, key = jax.random.split(self._noise_key)
        leaves, treedef = jax.tree.flatten(self._builder.trainable_params(state))
        keys = iter(jax.random.split(key, len(leaves)))
        noisy = [
            leaf
            + self._settings.rollback_param_noise
            * np.asarray(jax.random.normal(next(keys), leaf.shape, leaf.dtype))
            if np.issubdtype(leaf.dtype, np.floating)
            else leaf
            for leaf in leaves
        ]
        return self._builder.state_access.with_trainable_params(
            state, jax.tree.unflatten(treedef, noisy)
        )

    def _initial_state(self, spec: types.EnvSpec, seed: int, restore_step: int | None):
        """(state, learner steps): the agent's fresh state, or the one saved at `restore_step`."""
        state = builder_lib.initial_train_state(self._builder, spec, seed)
        if restore_step is None:
            return state, 0
        if self._checkpoints is None:
            raise ValueError("restore_step needs a checkpoint_dir")
        if restore_step == NEWEST:
            return self._restore_newest(state)
        # The fresh state only lends its structure, shapes and dtypes: the
        # skeleton never looks inside an agent's state.
        state, meta = self._checkpoints.restore(restore_step, jax.device_get(state))
        return state, self._resumed_from(restore_step, meta)

    def _restore_newest(self, fresh: Any) -> tuple[Any, int]:
        newest = self._checkpoints.restore_newest(jax.device_get(fresh), self._name)
        if newest is None:
            logging.warning("%s: restarted without a checkpoint to load: fresh state", self._name)
            return fresh, 0
        step_saved, state, meta = newest
        logging.warning("%s: restarted from the checkpoint of step %d", self._name, step_saved)
        return state, self._resumed_from(step_saved, meta)

    def _resumed_from(self, step_saved: int, meta: dict[str, Any]) -> int:
        """Takes the guard settings and rollbacks of checkpoint `step_saved`; its learner steps."""
        self._started_from = step_saved
        self._guard_meta = meta.get("numeric_guard", {})
        self.rollbacks = int(self._guard_meta.get("rollbacks", 0))
        return int(meta["learner_steps"])

    def batch_size(self) -> int:
        """The global batch the schedule gives at the current learner step."""
        return self._builder.batch_plan.batch_size_at(self._steps)

    def last_batch_size(self) -> int:
        """The global batch of the latest update (0 before the first)."""
        return self._last_batch_size

    def _finish_step(self, keys: np.ndarray, info: builder_lib.StepInfo) -> int:
        """Accounts for the update just dispatched; returns the streak of non-finite updates
        the one before it ended (read only now: that waits only for the previous update,
        while this one is already queued on the devices)."""
        self._account(keys, info.priorities)
        previous, self._last_info = self._last_info, info
        if previous is None or not self._settings.max_nonfinite_steps:
            return 0
        return int(np.asarray(previous.metrics["nonfinite_streak"])[0])

    def numeric_status(self) -> dict[str, float]:
        """Skipped updates in total, the current streak, the learning-rate scale, rollbacks."""
        with self._state_lock:
            guard = jax.device_get(parallel.unreplicate(self._guard))
        return {
            "skipped_steps": int(guard.skipped_steps),
            "streak": int(guard.streak),
            "lr_scale": float(guard.lr_scale),
            "rollbacks": self.rollbacks,
        }

    def _heartbeat_counters(self) -> dict[str, int]:
        # Every process counts the rows it sampled itself (balance.SampledRows).
        return {
            "learner_steps": self._steps,
            "started_from_step": self._started_from,
            **self._sampled.counters(),
        }

    def _between_steps(self) -> None:
        if time.monotonic() - self._last_report >= self._settings.heartbeat_interval_s:
            self._report()
            self._last_report = time.monotonic()
        interval = self._settings.checkpoint_interval_steps
        if interval and self._is_chief and self._steps - self._last_checkpoint_step >= interval:
            self.save_checkpoint()

    def _report(self, block: bool = False) -> None:
        if self._monitor is None:
            return
        metrics = {}
        if self._last_info is not None:
            metrics = {k: float(np.asarray(v)[0]) for k, v in self._last_info.metrics.items()}
            metrics["batch_size"] = self._last_batch_size
        metrics["params_bytes_served"] = float(self.params_bytes_served())
        metrics.update(self._replay_metrics())
        report = self._monitor.report if block else self._monitor.futures.report
        report(
            self._name,
            self._heartbeat_counters(),
            metrics=metrics,
            episode_returns=self._take_episode_returns(),
        )

    def _take_episode_returns(self) -> list[float] | None:
        """Returns of the episodes finished since the last report: none for a learner that
        does not act (an Anakin learner's own envs' are)."""
        return None

    def _checkpoint_lock(self) -> ContextManager:
        # Learning pauses while the replay is written.
        return self._state_lock

    def _checkpoint_contents(self) -> tuple[int, Any, dict[str, Any]]:
        guard = jax.device_get(parallel.unreplicate(self._guard))
        node_meta = {
            "counters": {**self._sampled.counters(), "learner_steps": self._steps},
            "numeric_guard": {
                "skipped_steps": int(guard.skipped_steps),
                "lr_scale": float(guard.lr_scale),
                "rollbacks": self.rollbacks,
            },
        }
        return self._steps, jax.device_get(parallel.unreplicate(self._state)), node_meta

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """(version, numpy params) of the latest update, or None if not newer than `newer_than`."""
        with self._params_lock:
            version, params = self._steps, self._published
        if version <= newer_than:
            return None
        cached = self._host_params
        if cached is None or cached[0] < version:
            cached = (version, jax.device_get(params))
            self._host_params = cached
        nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(cached[1]))
        with self._params_lock:
            self._params_bytes_served += nbytes
        return cached

    def params_bytes_served(self) -> int:
        """Bytes of the parameters `get_params` returned so far (None answers cost none)."""
        with self._params_lock:
            return self._params_bytes_served
