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
from gorila_jax import parallel, program, replay, types


def make_learner_step(update_fns: builder_lib.UpdateFns, actor_params: Callable[[Any], Any]):
    """Composes the agent's per-device functions into one step for pmap.

    The step also returns the parameters actors need as a separate output:
    a buffer of its own, still valid after the next step donates the state.
    """

    def learner_step(state, batch: builder_lib.SampledBatch):
        grads, info = update_fns.compute_grads(state, batch)
        state = update_fns.apply_grads(state, grads)
        return state, info, actor_params(state)

    return learner_step


class DevicePrefetcher:
    """Samples, shards and copies batches to the devices in a thread of its own.

    Keeps `size` batches ready so that the update loop only dispatches work;
    the tf.data -> numpy conversion and host->device copies overlap with it.
    """

    def __init__(
        self,
        make_batches: Callable[[], Iterator[replay.Batch]],
        devices: list,
        stop_event: threading.Event,
        size: int = 2,
    ):
        self._make_batches, self._devices, self._stop_event = make_batches, devices, stop_event
        self._queue: queue.Queue = queue.Queue(size)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="device-prefetch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        batches = None
        try:
            while not self._stop_event.is_set():
                if batches is None:
                    batches = self._make_batches()
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
    ):
        super().__init__()
        self._builder, self._monitor = builder, monitor
        self._report_interval_s = report_interval_s
        available = jax.local_devices()
        if num_devices > len(available):
            raise ValueError(
                f"num_learner_devices={num_devices} but this host has {len(available)} devices"
            )
        self._devices = available[: num_devices or None]
        builder.validate(len(self._devices))
        self._server_address = replay_client.address()
        self._codec = builder.item_codec(spec)
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
        self._state = parallel.replicate(builder.init_train_state(key, spec), self._devices)
        self._step_fn = parallel.pmap_step(
            make_learner_step(builder.update_fns(spec), builder.actor_params),
            self._devices,
            out_axes=(0, 0, None),
        )
        self._steps = 0
        self._params_lock = threading.Lock()
        self._published: Any = parallel.unreplicate(builder.actor_params(self._state))
        self._host_params: tuple[int, Any] | None = None
        self._prefetcher: DevicePrefetcher | None = None
        self._priorities: replay.PriorityUpdater | None = None
        self._last_info: builder_lib.StepInfo | None = None

    def _start_sampling(self) -> None:
        make_batches = functools.partial(
            replay.batches,
            self._server_address,
            self._builder.sample_table,
            self._builder.batch_size,
            self._codec,
        )
        self._prefetcher = DevicePrefetcher(make_batches, self._devices, self._stop_event)
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
        self._state, info, published = self._step_fn(self._state, batch)
        if info.priorities is not None:
            # The updater thread waits for the device; this thread dispatches the next step.
            self._priorities.submit(keys, info.priorities)
        self._last_info = info
        with self._params_lock:
            self._steps += 1
            self._published = published
        return True

    def run(self) -> None:
        last_report = 0.0
        while not self.stopping:
            self.step()
            if time.monotonic() - last_report >= self._report_interval_s:
                self._report()
                last_report = time.monotonic()
        self._report()

    def _report(self) -> None:
        if self._monitor is None:
            return
        metrics = {}
        if self._last_info is not None:
            metrics = {k: float(np.asarray(v)[0]) for k, v in self._last_info.metrics.items()}
        self._monitor.futures.report("learner/0", {"learner_steps": self._steps}, metrics=metrics)

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

    def close(self) -> None:
        if self._priorities is not None:
            self._priorities.close()
