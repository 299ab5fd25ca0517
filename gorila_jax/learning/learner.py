"""The synchronous learner node: sample -> shard -> pmapped update -> priorities -> publish.

With `num_learner_hosts` > 1 the learner is H processes (one per host) that
join one `jax.distributed` job and run each update over every host's devices
(`multihost.make_global_step`); see `LearnerNode`.
"""

import functools
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision, replay, types
from gorila_jax.distributed import multihost, program
from gorila_jax.health import balance
from gorila_jax.health import monitor as monitor_lib
from gorila_jax.learning import checkpoint


def make_learner_step(update_fns: builder_lib.UpdateFns, actor_params: Callable[[Any], Any]):
    """Composes the agent's per-device functions into one step for pmap.

    The step also returns the parameters actors need as a separate output:
    a buffer of its own, still valid after the next step donates the state.
    """

    def learner_step(state, batch: builder_lib.SampledBatch):
        if update_fns.update is not None:
            state, info = update_fns.update(state, batch)
        else:
            grads, info = update_fns.compute_grads(state, batch)
            state = update_fns.apply_grads(state, grads)
        return state, info, actor_params(state)

    return learner_step


class NumericGuard(NamedTuple):
    """The learner's numerical-fault state beside the agent's, replicated on every device.

    Attributes:
      skipped_steps: [] int32 updates skipped for a non-finite loss, gradient or state.
      streak: [] int32 consecutive skipped updates (0 after a finite one).
      lr_scale: [] float32 fraction of its full step that each update takes
        (lowered after a rollback; see `scale_update`).
    """

    skipped_steps: jax.Array
    streak: jax.Array
    lr_scale: jax.Array


def init_guard(skipped_steps: int = 0, lr_scale: float = 1.0) -> NumericGuard:
    return NumericGuard(
        jnp.asarray(skipped_steps, jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.asarray(lr_scale, jnp.float32),
    )


def _all_finite(*trees: Any) -> jax.Array:
    """[] bool, the same on every device: no NaN or inf in the floating leaves of `trees`."""
    leaves = [x for x in jax.tree.leaves(trees) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return precision.all_finite(leaves) if leaves else jnp.array(True)


def scale_update(old: Any, new: Any, scale: jax.Array) -> Any:
    """Moves every floating leaf `scale` of the way from `old` to `new`; other leaves to `new`.

    The skeleton's learning-rate knob, for any agent and optimizer: the
    parameters take `scale` of the step the optimizer computed (exactly a
    learning rate times `scale` for one update), optimizer moments and
    target networks follow as slowly. `new` comes back bit for bit at 1.
    """

    def move(o, n):
        if not jnp.issubdtype(n.dtype, jnp.inexact):
            return n
        return jnp.where(scale == 1.0, n, (o + scale.astype(n.dtype) * (n - o)).astype(n.dtype))

    return jax.tree.map(move, old, new)


def make_guarded_step(update_fns: builder_lib.UpdateFns, actor_params: Callable[[Any], Any]):
    """`make_learner_step` with numerical-fault protection, for pmap.

    (state, guard, batch) -> (state, guard, info, actor params). An update
    whose loss or gradients (or, for an agent's whole `update`, new state)
    hold a NaN or inf is skipped: the state comes back bit for bit, the guard
    counts it, and its priorities are NaN (the priority updater drops them,
    so the items keep their old ones). A step that the agent skipped itself
    (`precision.CheckedGrads.finite` False: a float16 overflow, handled by
    its loss scale) passes through. Metrics gain `nonfinite_skipped_steps`,
    `nonfinite_streak` and `lr_scale`.
    """

    def guarded_step(state, guard: NumericGuard, batch: builder_lib.SampledBatch):
        if update_fns.update is not None:
            new, info = update_fns.update(state, batch)
            finite = _all_finite(new, info.metrics.get("loss"))
        else:
            grads, info = update_fns.compute_grads(state, batch)
            new = update_fns.apply_grads(state, grads)
            if isinstance(grads, precision.CheckedGrads):
                finite = jnp.logical_not(grads.finite) | _all_finite(
                    grads.grads, info.metrics.get("loss")
                )
            else:
                finite = _all_finite(grads, info.metrics.get("loss"))
        new = precision.select_tree(finite, scale_update(state, new, guard.lr_scale), state)
        skipped = jnp.logical_not(finite).astype(jnp.int32)
        guard = NumericGuard(
            guard.skipped_steps + skipped, (guard.streak + 1) * skipped, guard.lr_scale
        )
        metrics = {
            **info.metrics,
            "nonfinite_skipped_steps": guard.skipped_steps.astype(jnp.float32),
            "nonfinite_streak": guard.streak.astype(jnp.float32),
            "lr_scale": guard.lr_scale,
        }
        priorities = info.priorities
        if priorities is not None:
            priorities = jnp.where(finite, priorities, jnp.nan)
        return new, guard, builder_lib.StepInfo(priorities, metrics), actor_params(new)

    return guarded_step


def _guarded_pair_step(guarded_step: Callable, state_and_guard: tuple, batch: Any) -> tuple:
    """`make_guarded_step` with (state, guard) as one input and output, the form
    `multihost.make_global_step` keeps unchanged on a stop vote."""
    state, guard = state_and_guard
    state, guard, info, published = guarded_step(state, guard, batch)
    return (state, guard), info, published


class NumericalFault(RuntimeError):
    """Updates stayed non-finite and there is no checkpoint to roll back to."""


_FIRST_RETRY_S, _MAX_RETRY_S = 0.5, 8.0  # DevicePrefetcher's backoff on connection errors
# How long `DevicePrefetcher.close` waits for its thread, which closes the
# sampler (every shard's dataset thread) on its way out; see `close`.
_CLOSE_TIMEOUT_S = 60.0


class DevicePrefetcher:
    """Samples, shards and copies batches to the devices in a thread of its own.

    Keeps `size` batches ready so that the update loop only dispatches work;
    the tf.data -> numpy conversion and host->device copies overlap with it.
    When `batch_size()` changes (a growing batch), the next batches are
    sampled at the new size; up to `size` batches of the old size are still
    used first. A connection error (`replay.CONNECTION_ERRORS`) makes it
    sample again with backoff; other errors reach the learner in `get`.

    Its thread ends when `stop_event` is set or `close` is called; `close`
    also waits for it. The owner must call `close` before the replay's
    servers stop and before the process exits (see `close`).

    Args:
      make_batches: batch size -> batches; or a `replay.ShardedSampler`,
        whose `batches` it calls and which its thread closes when it ends.
      batch_size: the batch size to sample next.
      devices: where batches go (`parallel.shard_to_devices`).
      stop_event: the owning node's stop signal.
      size: batches kept ready.
    """

    def __init__(
        self,
        make_batches: Callable[[int], Iterator[replay.Batch]] | replay.ShardedSampler,
        batch_size: Callable[[], int],
        devices: list,
        stop_event: threading.Event,
        size: int = 2,
    ):
        self._close_sampler: Callable[[], None] | None = None
        if isinstance(make_batches, replay.ShardedSampler):
            make_batches, self._close_sampler = make_batches.batches, make_batches.close
        self._make_batches, self._batch_size = make_batches, batch_size
        self._devices, self._stop_event = devices, stop_event
        self._closing = threading.Event()
        self._queue: queue.Queue = queue.Queue(size)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="device-prefetch", daemon=True)
        self._thread.start()

    def _ending(self) -> bool:
        return self._stop_event.is_set() or self._closing.is_set()

    def _loop(self) -> None:
        try:
            self._sample_until_ended()
        except BaseException as error:  # noqa: BLE001  handed to the learner thread in get()
            self._error = error
        finally:
            # This thread is the sampler's only user, so it closes it: every
            # shard's dataset thread is joined before `close` returns.
            if self._close_sampler is not None:
                try:
                    self._close_sampler()
                except Exception:  # noqa: BLE001  the sampler's threads end with the stop event
                    logging.exception("closing the replay sampler failed")

    def _sample_until_ended(self) -> None:
        batches, current_size = None, None
        retry_s = _FIRST_RETRY_S
        while not self._ending():
            wanted_size = self._batch_size()
            if batches is None or wanted_size != current_size:
                batches, current_size = self._make_batches(wanted_size), wanted_size
            try:
                batch = next(batches)
            except StopIteration:  # the rate limiter held samples back; try again
                batches = None
                continue
            except replay.CONNECTION_ERRORS as error:
                # The replay server went away (it is being restarted): sample
                # again, backing off, instead of failing the learner.
                batches = None
                logging.warning(
                    "replay unreachable (%s); sampling again in %.1fs",
                    str(error).splitlines()[0][:200],
                    retry_s,
                )
                self._closing.wait(retry_s)
                retry_s = min(2 * retry_s, _MAX_RETRY_S)
                continue
            retry_s = _FIRST_RETRY_S
            sampled = builder_lib.SampledBatch(batch.data, batch.probabilities, batch.table_size)
            on_device = parallel.shard_to_devices(sampled, self._devices)
            self._put((replay.row_keys(batch, with_sources=True), on_device))

    def _put(self, item: Any) -> None:
        while not self._ending():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def get(self, timeout: float) -> tuple[np.ndarray, Any] | None:
        """The next (keys, device batch), or None if none came within `timeout`.

        keys: the batch's item keys, with their shards for a sharded replay and
        the actor that wrote each item (`replay.row_keys`), as the priority
        updater takes them and `balance.SampledRows` counts them.
        """
        if self._error is not None:
            raise RuntimeError("sampling from replay failed") from self._error
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """Ends the thread and waits for it, its sampler's threads included.

        The thread may be inside a Reverb dataset's `next` (native code that
        released the GIL). Left running, it may come back from there after
        the replay server stopped, or while the interpreter finalizes, and
        CPython 3.11 then ends it with `pthread_exit`, whose forced unwind
        through Reverb's and TensorFlow's C++ frames aborts the whole process
        ("FATAL: exception not rethrown"). Waiting takes about one rate-limiter
        timeout of the sampler's datasets, longer on a loaded machine.
        """
        self._closing.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logging.warning(
                "replay sampling thread did not end within %.0fs; the process may abort at exit",
                timeout_s,
            )


def sampler(
    replay_shards: replay.ReplayShards,
    table: str,
    codec: replay.ItemCodec,
    stop_event: threading.Event,
) -> replay.ShardedSampler:
    """The sampler of batches across every replay shard, as `DevicePrefetcher` takes it.

    Each shard's address is asked of its node whenever its dataset is
    (re)built, so a shard restarted at another address is sampled again.
    The shards' sampling threads end once `stop_event` is set, and are
    joined when the prefetcher that drives the sampler closes.
    """
    return replay_shards.sampler(table, codec, stop_event)


def end_sampling(
    prefetcher: DevicePrefetcher | None, priorities: replay.PriorityUpdater | None
) -> None:
    """Joins a learner's sampling threads, then sends its queued priorities and joins
    their thread: in that order, no batch is taken after the last priorities.
    What the sync learner and Gorila workers do before a final checkpoint and on close."""
    if prefetcher is not None:
        prefetcher.close()
    if priorities is not None:
        priorities.close()


NEWEST = -1  # restore_step: the newest checkpoint that loads


class LearnerNode(program.Worker):
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
        updates, roll back to the newest checkpoint (`NumericGuard`); 0 never.
      rollback_lr_factor: each rollback multiplies the learning-rate scale by this.
      rollback_param_noise: after a rollback, add Gaussian noise of this
        standard deviation to the trainable parameters (0: none), so the
        same batches do not lead to the same divergence.
      num_learner_hosts: learner processes (H) in one `jax.distributed` job;
        1 is the single-process learner. With H > 1, process p (node
        "learner/p") joins the job before it touches any device, takes the
        chief's (process 0's) initial or restored state, samples its
        `multihost.local_batch_size` share of every global batch, updates the
        priorities of exactly the items it sampled, and steps in lockstep
        with the others: a stop asked of any process stops all of them after
        the same update (stop votes). Only the chief publishes parameters
        (`get_params`), reports metrics and saves and restores checkpoints
        (`checkpoint_dir` is ignored in the others): it reads a checkpoint
        alone and broadcasts it to the others. While it saves, the others
        wait in the next update's collectives. `num_devices` must be 0 or
        all of the host's devices. One process is never restarted alone (it
        cannot rejoin the others' job): the wiring restarts the whole group
        (`program.Program.restart_together`). A numerical fault is not rolled
        back; it fails every process at the same step.
      learner_process_id: this process's index p, 0 .. H - 1.
      rendezvous: client of the `multihost.Rendezvous` node through which the
        chief tells the others the coordinator address it picked (H > 1).
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
        num_learner_hosts: int = 1,
        learner_process_id: int = 0,
        rendezvous: program.Client | None = None,
    ):
        super().__init__()
        self._process_group: multihost.ProcessGroup | None = None
        if num_learner_hosts > 1:
            # First of all: jax.distributed must be joined before any device is touched.
            self._process_group = multihost.join(rendezvous, num_learner_hosts, learner_process_id)
        self._is_chief = self._process_group is None or self._process_group.is_chief
        self._name = f"learner/{learner_process_id}"
        if max_nonfinite_steps < 0:
            raise ValueError(f"max_nonfinite_steps must not be negative, got {max_nonfinite_steps}")
        if not 0 < rollback_lr_factor <= 1:
            raise ValueError(f"rollback_lr_factor must be in (0, 1], got {rollback_lr_factor}")
        if rollback_param_noise < 0:
            raise ValueError(
                f"rollback_param_noise must not be negative, got {rollback_param_noise}"
            )
        self._max_nonfinite_steps = max_nonfinite_steps
        self._rollback_lr_factor = rollback_lr_factor
        self._rollback_param_noise = rollback_param_noise
        self._noise_key = jax.random.fold_in(jax.random.PRNGKey(seed), 2**20)
        precision.use_tf32(tf32)
        self._builder, self._monitor = builder, monitor
        self._replay = replay.ReplayShards(replay_client)
        self._report_interval_s = report_interval_s
        self._devices = parallel.local_devices(num_devices)
        self._num_processes = num_learner_hosts
        if num_learner_hosts > 1 and len(self._devices) != jax.local_device_count():
            raise ValueError(
                f"num_learner_devices={num_devices}: with num_learner_hosts={num_learner_hosts} "
                f"every learner process uses all its devices ({jax.local_device_count()}); use 0"
            )
        builder.validate(num_learner_hosts * len(self._devices))
        self._codec = builder.item_codec(spec)
        self._checkpoints = None
        if checkpoint_dir is not None and self._is_chief:
            self._checkpoints = checkpoint.LearnerCheckpoints(
                checkpoint_dir, max_checkpoints_to_keep
            )
        self._checkpoint_interval = checkpoint_interval_steps
        self._guard_meta: dict[str, float] = {}
        self.rollbacks = 0
        # Which checkpoint this incarnation started from (-1: none); in its heartbeats.
        self._started_from = -1
        state, self._steps = self._initial_state(
            spec, seed, restore_step if self._is_chief else None
        )
        self._steps = max(self._steps, int((restored_counters or {}).get("learner_steps", 0)))
        # Rows trained on per source actor, and the data-balance priority weights.
        self._sampled = balance.SampledRows(restored_counters)
        if self._process_group is not None:
            state = self._agree_with_chief(state)
            self.local_batch_size()  # a global batch that does not split fails here, by name
        self._last_checkpoint_step = self._steps
        self._state = parallel.replicate(state, self._devices)
        self._guard = parallel.replicate(
            init_guard(
                int(self._guard_meta.get("skipped_steps", 0)),
                float(self._guard_meta.get("lr_scale", 1.0)),
            ),
            self._devices,
        )
        guarded_step = make_guarded_step(builder.update_fns(spec), builder.actor_params)
        if self._process_group is None:
            self._step_fn = parallel.pmap_step(
                guarded_step, self._devices, out_axes=(0, 0, 0, None)
            )
        else:
            self._global_step = multihost.make_global_step(
                functools.partial(_guarded_pair_step, guarded_step), out_axes=(0, 0, None)
            )
        # The multi-host learner's latest (keys, device batch): what it feeds a stop-vote step.
        self._last_item: tuple[np.ndarray, Any] | None = None
        self._stop_agreed = False  # the multi-host learner's processes all voted to stop
        # Held while the state is replaced or read for a checkpoint: a step
        # donates the old state's buffers, so a checkpoint must not read them then.
        self._state_lock = threading.Lock()
        self._params_lock = threading.Lock()
        self._published: Any = None
        if self._is_chief:
            self._published = parallel.unreplicate(builder.actor_params(self._state))
        self._host_params: tuple[int, Any] | None = None
        # Parameter bytes sent to readers (actors, evaluator, per-host caches),
        # so the saving of a per-host cache (gorila_jax/acting/param_cache.py) is measured.
        self._params_bytes_served = 0
        self._prefetcher: DevicePrefetcher | None = None
        self._priorities: replay.PriorityUpdater | None = None
        self._last_info: builder_lib.StepInfo | None = None
        self._last_batch_size = 0
        self._finished = threading.Event()
        self._run_error: BaseException | None = None

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
        self._started_from = restore_step
        self._guard_meta = meta.get("numeric_guard", {})
        self.rollbacks = int(self._guard_meta.get("rollbacks", 0))
        return state, int(meta["learner_steps"])

    def _restore_newest(self, fresh: Any) -> tuple[Any, int]:
        newest = self._checkpoints.restore_newest(jax.device_get(fresh), self._name)
        if newest is None:
            logging.warning("%s: restarted without a checkpoint to load: fresh state", self._name)
            return fresh, 0
        step, state, meta = newest
        self._guard_meta = meta.get("numeric_guard", {})
        self.rollbacks = int(self._guard_meta.get("rollbacks", 0))
        self._started_from = step
        logging.warning("%s: restarted from the checkpoint of step %d", self._name, step)
        return state, int(meta["learner_steps"])

    def batch_size(self) -> int:
        """The global batch the schedule gives at the current learner step."""
        return builder_lib.batch_size_at(self._builder.batch_schedule, self._steps)

    def local_batch_size(self) -> int:
        """The rows this process samples per update: its share of the global batch.

        Every process computes it from the same step count, so all feed
        batches of one shape to each global step.
        """
        return multihost.local_batch_size(
            self.batch_size(), self._num_processes, len(self._devices)
        )

    def _agree_with_chief(self, state: Any) -> Any:
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
        return state

    def last_batch_size(self) -> int:
        """The global batch of the latest update (0 before the first)."""
        return self._last_batch_size

    def _start_sampling(self) -> None:
        make_batches = sampler(
            self._replay, self._builder.sample_table, self._codec, self._stop_event
        )
        rows = self.batch_size if self._process_group is None else self.local_batch_size
        self._prefetcher = DevicePrefetcher(make_batches, rows, self._devices, self._stop_event)
        self._priorities = self._replay.priority_updater(self._builder.sample_table)

    def step(self, timeout: float = 1.0) -> bool:
        """One update on one batch. Returns False if no batch came within `timeout`."""
        if self._prefetcher is None:
            self._start_sampling()
        if self._process_group is not None:
            return self._global_step_once(timeout)
        item = self._prefetcher.get(timeout)
        if item is None:
            return False
        keys, batch = item
        self._last_batch_size = keys.size
        with self._state_lock:
            self._state, self._guard, info, published = self._step_fn(
                self._state, self._guard, batch
            )
            with self._params_lock:
                self._steps += 1
                self._published = published
        scale = self._sampled.count(keys)
        if info.priorities is not None and self._priorities is not None:
            # The updater thread waits for the device; this thread dispatches the next step.
            self._priorities.submit(keys, info.priorities, scale)
        # The previous step's streak: reading it waits only for that step,
        # while this one is already queued on the devices.
        previous, self._last_info = self._last_info, info
        if previous is not None and self._max_nonfinite_steps:
            streak = int(np.asarray(previous.metrics["nonfinite_streak"])[0])
            if streak >= self._max_nonfinite_steps:
                self._roll_back(streak)
        return True

    def _global_step_once(self, timeout: float) -> bool:
        """One update of the multi-host learner, in lockstep with the other processes.

        A process enters the global step only with a batch of the current
        local size, or to vote stop: every process then runs the same
        updates, and one that entered never waits for one that will not come
        (the driver stops every learner process). Returns False when no
        batch came within `timeout` or the processes agreed to stop.
        """
        item = None
        while item is None and not self.stopping:
            item = self._prefetcher.get(timeout)
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
        scale = self._sampled.count(keys)
        if info.priorities is not None and self._priorities is not None:
            # This process's rows of the global batch: exactly the items it sampled.
            self._priorities.submit(keys, info.priorities, scale)
        previous, self._last_info = self._last_info, info
        if previous is not None and self._max_nonfinite_steps:
            streak = int(np.asarray(previous.metrics["nonfinite_streak"])[0])
            if streak >= self._max_nonfinite_steps:
                # The streak is global (pmax), so every process raises at the same step.
                raise NumericalFault(
                    f"{self._name}: {streak} consecutive non-finite updates "
                    "(max_nonfinite_steps); a multi-host learner does not roll back"
                )
        return True

    def _placeholder_batch(self) -> Any:
        """A zero batch of the local shape and dtypes, for a stop vote before any real batch."""
        rows = self.local_batch_size()
        data = self._codec.decode(np.zeros((rows, self._codec.num_bytes), np.uint8))
        sampled = builder_lib.SampledBatch(data, np.ones(rows, np.float64), np.ones(rows, np.int64))
        return parallel.shard_to_devices(sampled, self._devices)

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

    def _roll_back(self, streak: int) -> None:
        """Restores the newest checkpoint that loads, with a lower learning-rate scale.

        Learner steps keep counting up (no counter goes backwards); only the
        agent's state returns to the checkpoint's.

        Raises:
          NumericalFault: there is no checkpoint to return to.
        """
        why = f"{streak} consecutive non-finite updates (max_nonfinite_steps)"
        if self._checkpoints is None or not self._checkpoints.steps():
            raise NumericalFault(f"{self._name}: {why} and no checkpoint to roll back to")
        with self._state_lock:
            target = jax.device_get(parallel.unreplicate(self._state))
            guard = jax.device_get(parallel.unreplicate(self._guard))
            newest = self._checkpoints.restore_newest(target, self._name)
            if newest is None:
                raise NumericalFault(f"{self._name}: {why} and no checkpoint loads")
            step, state, _ = newest
            state = self._perturbed(state)
            lr_scale = float(guard.lr_scale) * self._rollback_lr_factor
            self._state = parallel.replicate(state, self._devices)
            self._guard = parallel.replicate(
                init_guard(int(guard.skipped_steps), lr_scale), self._devices
            )
            self.rollbacks += 1
            with self._params_lock:
                self._published = parallel.unreplicate(self._builder.actor_params(self._state))
            self._last_info = None  # the step in flight ran on the abandoned state
        logging.warning(
            "%s: %s; rolled back to the checkpoint of step %d, learning-rate scale now %g",
            self._name,
            why,
            step,
            lr_scale,
        )

    def _perturbed(self, state: Any) -> Any:
        """`state` with noise added to the agent's trainable parameters (if configured)."""
        if not self._rollback_param_noise:
            return state
        try:
            trainable = {
                id(leaf) for leaf in jax.tree.leaves(self._builder.trainable_params(state))
            }
        except (AttributeError, NotImplementedError):
            logging.warning("%s: the agent names no trainable parameters; no noise", self._name)
            return state
        self._noise_key, key = jax.random.split(self._noise_key)
        leaves, treedef = jax.tree.flatten(state)
        keys = iter(jax.random.split(key, len(leaves)))
        noisy = [
            leaf
            + self._rollback_param_noise
            * np.asarray(jax.random.normal(next(keys), leaf.shape, leaf.dtype))
            if id(leaf) in trainable and np.issubdtype(leaf.dtype, np.floating)
            else leaf
            for leaf in leaves
        ]
        return jax.tree.unflatten(treedef, noisy)

    def run(self) -> None:
        # Beats while the first step compiles and while replay is below its minimum.
        heartbeat = monitor_lib.Heartbeat(
            self._monitor, self._name, self._heartbeat_counters, self._report_interval_s
        ).start()
        try:
            self._run()
        except BaseException as error:
            self._run_error = error
            raise
        finally:
            self._end_sampling()  # after a failure too: no sampling thread outlives `run`
            heartbeat.stop()
            self._finished.set()

    def _heartbeat_counters(self) -> dict[str, int]:
        # Every process counts the rows it sampled itself (balance.SampledRows).
        sampled = self._sampled.counters()
        if self._process_group is None:
            return {
                "learner_steps": self._steps,
                "started_from_step": self._started_from,
                **sampled,
            }
        # The monitor sums "learner_steps" over nodes: only the chief counts the job's updates.
        steps_key = "learner_steps" if self._is_chief else "process_learner_steps"
        return {steps_key: self._steps, "started_from_step": self._started_from, **sampled}

    def set_sample_weights(self, weights: dict[int, float]) -> None:
        """Data balance ("downweight"): new priorities of actor i's items are multiplied by
        weights[i] from the next update on (`balance.SampledRows.set_weights`)."""
        self._sampled.set_weights(weights)

    def _done(self) -> bool:
        if self._process_group is None:
            return self.stopping
        # A stopping process must still take part in one more (voted) step, or the
        # others would wait for it in that step's collectives forever.
        return self._stop_agreed

    def _run(self) -> None:
        last_report = 0.0
        while not self._done():
            self.step()
            if time.monotonic() - last_report >= self._report_interval_s:
                self._report()
                last_report = time.monotonic()
            interval = self._checkpoint_interval
            if interval and self._is_chief and self._steps - self._last_checkpoint_step >= interval:
                self.save_checkpoint()
        # Sampling and priority updates end here, while the replay still
        # serves: the final checkpoint holds every priority sent, and no
        # thread of this node talks to Reverb once `wait_finished` says done.
        self._end_sampling()
        self._report(block=True)  # the driver's summary reads the final count
        if self._checkpoints is not None:
            self.save_checkpoint()

    def wait_finished(self, timeout: float) -> bool:
        """Blocks until `run` has returned (after its final checkpoint), or timeout.

        Raises:
          RuntimeError: if `run` failed (the final checkpoint, for example).
        """
        finished = self._finished.wait(timeout)
        if self._run_error is not None:
            raise RuntimeError(f"{self._name} failed: {self._run_error!r}") from self._run_error
        return finished

    def save_checkpoint(self) -> int:
        """Checkpoints replay, then the learner state, at the current learner step.

        The replay goes first and deletes its old checkpoints last: a learner
        checkpoint on disk always has its replay checkpoint beside it, even
        after a crash at any point (see `gorila_jax.learning.checkpoint`). Counters,
        recent returns and evaluations come from the monitor; a periodic
        checkpoint sees them up to one report interval late. Learning pauses
        while the replay is written.

        Returns:
          The learner step saved.
        """
        if not self._is_chief:
            raise RuntimeError(f"{self._name} is not the chief: only learner/0 checkpoints")
        if self._checkpoints is None:
            raise RuntimeError("this learner was built without a checkpoint_dir")
        with self._state_lock:
            step = self._steps
            replay_info = self._replay.checkpoint(step)
            state = jax.device_get(parallel.unreplicate(self._state))
            meta = self._monitor.checkpoint_state() if self._monitor is not None else {}
            meta.setdefault("node_counters", {})[self._name] = {
                **self._sampled.counters(),
                "learner_steps": step,
            }
            guard = jax.device_get(parallel.unreplicate(self._guard))
            meta["numeric_guard"] = {
                "skipped_steps": int(guard.skipped_steps),
                "lr_scale": float(guard.lr_scale),
                "rollbacks": self.rollbacks,
            }
            meta.update(learner_steps=step, replay=replay_info, unix_time=time.time())
            self._checkpoints.save(step, state, meta)  # deletes its old ones here
        # Only now, with the new pair complete, may the replay drop the old ones.
        self._replay.keep_checkpoints(self._checkpoints.steps())
        self._last_checkpoint_step = step
        return step

    def _report(self, block: bool = False) -> None:
        if self._monitor is None:
            return
        if not self._is_chief:
            # Counters only (its heartbeat's); the job's metrics are the chief's.
            report = self._monitor.report if block else self._monitor.futures.report
            report(self._name, self._heartbeat_counters())
            return
        metrics = {}
        if self._last_info is not None:
            metrics = {k: float(np.asarray(v)[0]) for k, v in self._last_info.metrics.items()}
            metrics["batch_size"] = self._last_batch_size
        metrics["params_bytes_served"] = float(self.params_bytes_served())
        report = self._monitor.report if block else self._monitor.futures.report
        report(self._name, self._heartbeat_counters(), metrics=metrics)

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """(version, numpy params) of the latest update, or None if not newer than `newer_than`.

        Raises:
          RuntimeError: in a multi-host learner's non-chief process, which publishes nothing.
        """
        if not self._is_chief:
            raise RuntimeError(f"{self._name} is not the chief: read parameters from learner/0")
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

    def _end_sampling(self) -> None:
        """`end_sampling` of this node's; a later `step` starts sampling again.
        Safe to call more than once."""
        prefetcher, priorities = self._prefetcher, self._priorities
        self._prefetcher = self._priorities = None
        end_sampling(prefetcher, priorities)

    def close(self) -> None:
        """Ends sampling and priority updates (if `run` has not), then closes the checkpoints.

        Before the replay's servers stop: the launchers close a node before
        the nodes whose handles it holds.
        """
        self._end_sampling()
        if self._checkpoints is not None:
            self._checkpoints.close()
