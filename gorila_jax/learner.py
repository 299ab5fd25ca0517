"""The synchronous learner node: sample -> shard -> pmapped update -> priorities -> publish."""

import functools
import queue
import threading
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import reverb

from gorila_jax import builder as builder_lib
from gorila_jax import checkpoint, parallel, precision, program, replay, types


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


class DevicePrefetcher:
    """Samples, shards and copies batches to the devices in a thread of its own.

    Keeps `size` batches ready so that the update loop only dispatches work;
    the tf.data -> numpy conversion and host->device copies overlap with it.
    When `batch_size()` changes (a growing batch), the next batches are
    sampled at the new size; up to `size` batches of the old size are still
    used first.
    """

    def __init__(
        self,
        make_batches: Callable[[int], Iterator[replay.Batch]],
        batch_size: Callable[[], int],
        devices: list,
        stop_event: threading.Event,
        size: int = 2,
    ):
        self._make_batches, self._batch_size = make_batches, batch_size
        self._devices, self._stop_event = devices, stop_event
        self._queue: queue.Queue = queue.Queue(size)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="device-prefetch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        batches, current_size = None, None
        try:
            while not self._stop_event.is_set():
                wanted_size = self._batch_size()
                if batches is None or wanted_size != current_size:
                    batches, current_size = self._make_batches(wanted_size), wanted_size
                try:
                    batch = next(batches)
                except StopIteration:  # the rate limiter held samples back; try again
                    batches = None
                    continue
                sampled = builder_lib.SampledBatch(
                    batch.data, batch.probabilities, batch.table_size
                )
                on_device = parallel.shard_to_devices(sampled, self._devices)
                self._put((batch.keys, on_device))
        except BaseException as error:  # noqa: BLE001  handed to the learner thread in get()
            self._error = error

    def _put(self, item: Any) -> None:
        while not self._stop_event.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def get(self, timeout: float) -> tuple[np.ndarray, Any] | None:
        """The next (keys, device batch), or None if none came within `timeout`."""
        if self._error is not None:
            raise RuntimeError("sampling from replay failed") from self._error
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


def sampler(
    server_address: str, table: str, codec: replay.ItemCodec, batch_size: int
) -> Iterator[replay.Batch]:
    """`replay.batches` with the batch size last, as `DevicePrefetcher` calls it."""
    return replay.batches(server_address, table, batch_size, codec)


_NAME = "learner/0"  # the learner's name in monitor reports and checkpointed counters


class LearnerNode(program.Worker):
    """Turns replay batches into updates on all local devices and serves parameters.

    Args:
      builder: the agent.
      spec: the environment's spec.
      replay_client: client of the replay node.
      monitor: client of the monitor node (or None when driven by hand).
      seed: root seed; the learner's key is fold_in(seed key, 0).
      num_devices: local devices to pmap over; 0 takes them all.
      report_interval_s: how often counters and metrics go to the monitor.
      checkpoint_dir: the run's learner checkpoint directory (absolute); None
        disables checkpoints.
      checkpoint_interval_steps: learner steps between checkpoints; the last
        one is taken when `run` ends. 0: only that last one.
      max_checkpoints_to_keep: older checkpoints (and their replay) are deleted.
      restore_step: start from the checkpoint of this learner step.
      tf32: TensorFloat-32 matmuls on GPUs (`precision.use_tf32`).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client,
        monitor: program.Client | None,
        seed: int,
        num_devices: int = 0,
        report_interval_s: float = 1.0,
        checkpoint_dir: str | None = None,
        checkpoint_interval_steps: int = 0,
        max_checkpoints_to_keep: int = 2,
        restore_step: int | None = None,
        tf32: bool = False,
    ):
        super().__init__()
        precision.use_tf32(tf32)
        self._builder, self._monitor, self._replay = builder, monitor, replay_client
        self._report_interval_s = report_interval_s
        self._devices = parallel.local_devices(num_devices)
        builder.validate(len(self._devices))
        self._server_address = replay_client.address()
        self._codec = builder.item_codec(spec)
        self._checkpoints = None
        if checkpoint_dir is not None:
            self._checkpoints = checkpoint.LearnerCheckpoints(
                checkpoint_dir, max_checkpoints_to_keep
            )
        self._checkpoint_interval = checkpoint_interval_steps
        state, self._steps = self._initial_state(spec, seed, restore_step)
        self._last_checkpoint_step = self._steps
        self._state = parallel.replicate(state, self._devices)
        self._step_fn = parallel.pmap_step(
            make_learner_step(builder.update_fns(spec), builder.actor_params),
            self._devices,
            out_axes=(0, 0, None),
        )
        # Held while the state is replaced or read for a checkpoint: a step
        # donates the old state's buffers, so a checkpoint must not read them then.
        self._state_lock = threading.Lock()
        self._params_lock = threading.Lock()
        self._published: Any = parallel.unreplicate(builder.actor_params(self._state))
        self._host_params: tuple[int, Any] | None = None
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
        # The fresh state only lends its structure, shapes and dtypes: the
        # skeleton never looks inside an agent's state.
        state, meta = self._checkpoints.restore(restore_step, jax.device_get(state))
        return state, int(meta["learner_steps"])

    def batch_size(self) -> int:
        """The global batch the schedule gives at the current learner step."""
        return builder_lib.batch_size_at(self._builder.batch_schedule, self._steps)

    def last_batch_size(self) -> int:
        """The global batch of the latest update (0 before the first)."""
        return self._last_batch_size

    def _start_sampling(self) -> None:
        make_batches = functools.partial(
            sampler, self._server_address, self._builder.sample_table, self._codec
        )
        self._prefetcher = DevicePrefetcher(
            make_batches, self.batch_size, self._devices, self._stop_event
        )
        client = reverb.Client(self._server_address)
        self._priorities = replay.PriorityUpdater(client, self._builder.sample_table)

    def step(self, timeout: float = 1.0) -> bool:
        """One update on one batch. Returns False if no batch came within `timeout`."""
        if self._prefetcher is None:
            self._start_sampling()
        item = self._prefetcher.get(timeout)
        if item is None:
            return False
        keys, batch = item
        self._last_batch_size = keys.size
        with self._state_lock:
            self._state, info, published = self._step_fn(self._state, batch)
            with self._params_lock:
                self._steps += 1
                self._published = published
        if info.priorities is not None and self._priorities is not None:
            # The updater thread waits for the device; this thread dispatches the next step.
            self._priorities.submit(keys, info.priorities)
        self._last_info = info
        return True

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:
            self._run_error = error
            raise
        finally:
            self._finished.set()

    def _run(self) -> None:
        last_report = 0.0
        while not self.stopping:
            self.step()
            if time.monotonic() - last_report >= self._report_interval_s:
                self._report()
                last_report = time.monotonic()
            interval = self._checkpoint_interval
            if interval and self._steps - self._last_checkpoint_step >= interval:
                self.save_checkpoint()
        self._report(block=True)  # the driver's summary reads the final count
        if self._checkpoints is not None:
            self._close_priorities()  # the final checkpoint holds every priority sent
            self.save_checkpoint()

    def wait_finished(self, timeout: float) -> bool:
        """Blocks until `run` has returned (after its final checkpoint), or timeout.

        Raises:
          RuntimeError: if `run` failed (the final checkpoint, for example).
        """
        finished = self._finished.wait(timeout)
        if self._run_error is not None:
            raise RuntimeError(f"{_NAME} failed: {self._run_error!r}") from self._run_error
        return finished

    def save_checkpoint(self) -> int:
        """Checkpoints replay, then the learner state, at the current learner step.

        The replay goes first and deletes its old checkpoints last: a learner
        checkpoint on disk always has its replay checkpoint beside it, even
        after a crash at any point (see `gorila_jax.checkpoint`). Counters,
        recent returns and evaluations come from the monitor; a periodic
        checkpoint sees them up to one report interval late. Learning pauses
        while the replay is written.

        Returns:
          The learner step saved.
        """
        if self._checkpoints is None:
            raise RuntimeError("this learner was built without a checkpoint_dir")
        with self._state_lock:
            step = self._steps
            replay_info = self._replay.checkpoint(step)
            state = jax.device_get(parallel.unreplicate(self._state))
            meta = self._monitor.checkpoint_state() if self._monitor is not None else {}
            meta.setdefault("node_counters", {})[_NAME] = {"learner_steps": step}
            meta.update(learner_steps=step, replay=replay_info, unix_time=time.time())
            self._checkpoints.save(step, state, meta)  # orbax deletes its old ones here
        # Only now, with the new pair complete, may the replay drop the old ones.
        self._replay.keep_checkpoints(self._checkpoints.steps())
        self._last_checkpoint_step = step
        return step

    def _report(self, block: bool = False) -> None:
        if self._monitor is None:
            return
        metrics = {}
        if self._last_info is not None:
            metrics = {k: float(np.asarray(v)[0]) for k, v in self._last_info.metrics.items()}
            metrics["batch_size"] = self._last_batch_size
        report = self._monitor.report if block else self._monitor.futures.report
        report(_NAME, {"learner_steps": self._steps}, metrics=metrics)

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
        return cached

    def _close_priorities(self) -> None:
        if self._priorities is not None:
            self._priorities.close()
            self._priorities = None

    def close(self) -> None:
        self._close_priorities()
        if self._checkpoints is not None:
            self._checkpoints.close()
