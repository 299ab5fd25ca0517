"""Replay batches for a learner: sampled, sharded and copied to its devices in a thread.

The synchronous learner and the Gorila gradient workers sample through
`DevicePrefetcher` and end their sampling with `end_sampling`.
"""

import logging
import queue
import threading
from typing import Any, Callable, Iterator

import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, replay

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
    used first. A lost connection (the sampler's `connection_errors`, Reverb's
    only) makes it sample again with backoff; other errors reach the learner in `get`.

    Its thread ends when `stop_event` is set or `close` is called; `close`
    also waits for it. The owner must call `close` before the replay's
    servers stop and before the process exits (see `close`).

    Args:
      make_batches: batch size -> batches; or a sampler (`replay.ReplayShards.sampler`
        of either backend), whose `batches` it calls and which its thread closes when
        it ends.
      batch_size: the batch size to sample next.
      devices: where batches go (`parallel.shard_to_devices`).
      stop_event: the owning node's stop signal.
      size: batches kept ready.
      connection_errors: with a `make_batches` function, the errors that mean the
        replay went away (a sampler brings its own).
    """

    def __init__(
        self,
        make_batches: Callable[[int], Iterator[replay.Batch]] | Any,
        batch_size: Callable[[], int],
        devices: list,
        stop_event: threading.Event,
        size: int = 2,
        connection_errors: tuple[type[BaseException], ...] = (),
    ):
        self._close_sampler: Callable[[], None] | None = None
        if hasattr(make_batches, "batches"):  # a sampler of any backend
            connection_errors = make_batches.connection_errors
            make_batches, self._close_sampler = make_batches.batches, make_batches.close
        self._connection_errors = connection_errors
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
            except self._connection_errors as error:
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
            sampled = builder_lib.SampledBatch(
                batch.data, batch.probabilities, batch.table_size, batch.demo
            )
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
    content_hashes: bool = False,
    demo_fraction: float = 0.0,
) -> Any:
    """The sampler of batches across every replay shard (`replay.ReplayShards.sampler`, of
    the run's backend), as `DevicePrefetcher` takes it.

    Reverb: each shard's address is asked of its node whenever its dataset is
    (re)built, so a shard restarted at another address is sampled again; the
    native backend calls each shard through its node's client, which follows a
    restart by itself.
    The shards' sampling threads end once `stop_event` is set, and are
    joined when the prefetcher that drives the sampler closes. With
    `content_hashes`, batches carry their items' content hashes; with `demo_fraction`,
    that share of every batch comes from the demonstration table (`replay.MixedSampler`).
    """
    return replay_shards.sampler(table, codec, stop_event, content_hashes, demo_fraction)


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
