"""One replay shard's samples for `ShardedSampler`: pulled in a thread, buffered, taken in rows.

Each shard's Reverb dataset runs in a thread of its own (`_Puller`), so that
one waiting on a vanished server can be left behind; `ShardStream` rebuilds
it where the shard's node says it serves, keeps the rows no batch has taken
yet, and estimates the shard's priority mass from what it pulled.
"""

import collections
import logging
import math
import queue
import sys
import threading
import time
import traceback
from typing import Any, NamedTuple

import numpy as np
import reverb
import tree

from gorila_jax.replay import sampling


class Rows(NamedTuple):
    """Rows sampled from one shard, as Reverb gave them."""

    keys: np.ndarray  # [n] uint64
    probabilities: np.ndarray  # [n] float64, within the shard
    table_size: np.ndarray  # [n] int64, the shard's
    data: Any  # [n, ...] packed items (or the item pytree)


def concatenate(parts: list[Rows]) -> Rows:
    if len(parts) == 1:
        return parts[0]
    return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def slice_rows(rows: Rows, start: int, stop: int | None = None) -> Rows:
    """Rows `start` up to `stop` (None: the end)."""
    return tree.map_structure(lambda leaf: leaf[start:stop], rows)


def priority_exponent(table_info: Any) -> float | None:
    """The exponent of a table's prioritized sampler (its `reverb.Table.info`, or the
    server's `server_info()[name]`); None for any other sampler."""
    options = table_info.sampler_options
    if options.WhichOneof("distribution") != "prioritized":
        return None
    return options.prioritized.priority_exponent


_ENDED = object()  # a _Puller's last item: its dataset ended (the rate limiter held samples)


class _Puller(threading.Thread):
    """Pulls the chunks of one shard's Reverb dataset in a thread of its own.

    A Reverb dataset whose server is gone waits for it indefinitely; in this
    thread it can be abandoned when the shard turns out to serve elsewhere
    (`abandon`). Queues chunks, then `_ENDED` or the error that ended it.
    """

    def __init__(
        self,
        address: str,
        table: str,
        chunk_rows: int,
        settings: dict,
        stop: threading.Event,
        with_exponent: bool,
    ):
        super().__init__(name=f"replay-shard-{address}", daemon=True)
        self.address, self._table, self._chunk_rows = address, table, chunk_rows
        # Not `_stop`: threading.Thread has a method of that name, which `join` calls.
        self._settings, self._stop_event, self._with_exponent = settings, stop, with_exponent
        self.chunks: queue.Queue = queue.Queue(1)
        self._abandoned = threading.Event()
        self.exponent: float | None = None  # set before the first chunk is queued
        self.start()

    def abandon(self) -> None:
        self._abandoned.set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def run(self) -> None:
        # The end is announced before this thread tears its dataset down (when `run`
        # returns): a new puller samples meanwhile. The teardown waits on the Reverb
        # samplers' in-flight requests and has taken many seconds on a loaded machine;
        # `ShardStream.close` waits for it, since one still running after the server
        # stops never returns.
        try:
            if self._with_exponent:
                info = reverb.Client(self.address).server_info()[self._table]
                self.exponent = priority_exponent(info)
            samples = sampling.sample_stream(
                self.address, self._table, self._chunk_rows, **self._settings
            )
            while self._put(next(samples)):
                pass
        except StopIteration:
            self._put(_ENDED)
        except BaseException as error:  # noqa: BLE001  handed to the sampler's thread
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not (self._abandoned.is_set() or self._stop_event.is_set()):
            try:
                self.chunks.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False


class ShardStream:
    """One shard's samples, pulled in chunks, with the rows that no batch has taken yet.

    Its Reverb dataset (`_Puller`) is built at the first pull, and built
    again, at the address the shard's node gives then, after it ended (the
    rate limiter held samples back, or the connection failed). A dataset
    that brings nothing for `probe_after_s` makes it ask the node where the
    shard serves: if elsewhere (restarted on another host), it samples
    there; at the same address Reverb reconnects by itself. Rows already
    pulled stay.
    """

    def __init__(
        self,
        node: Any,
        table: str,
        chunk_rows: int,
        estimate_mass: bool,
        settings: dict,
        stop: threading.Event,
        probe_after_s: float,
    ):
        self._node, self._table, self._chunk_rows = node, table, chunk_rows
        self._estimate_mass, self._settings, self._stop = estimate_mass, settings, stop
        self._wait_s = settings["rate_limiter_timeout_ms"] / 1000
        self._probe_after_s = probe_after_s
        self._puller: _Puller | None = None
        # Pullers replaced by a new one whose threads may still be ending: those whose
        # dataset ended, and those left on a server the shard moved away from
        # (`abandoned`). `close` waits for each, an abandoned one briefly.
        self._previous: list[_Puller] = []
        self._waiting_since: float | None = None
        self._rows: collections.deque[Rows] = collections.deque()
        self._offset = 0  # rows of the oldest chunk already taken
        self.buffered = 0
        self.mass: float | None = None  # None until a sample tells it
        self.table_size = 0

    def know_mass(self) -> bool:
        """Whether the shard's mass is known, pulling a chunk to learn it if not (False: none
        came for a while)."""
        return self.mass is not None or self.fill(1)

    def fill(self, count: int) -> bool:
        """Pulls chunks until `count` rows are buffered; False if none came for a while
        (the caller may stop, or call again).

        Raises:
          sampling.CONNECTION_ERRORS: the shard is unreachable (the next fill rebuilds).
        """
        while self.buffered < count:
            if self._puller is None:
                self._puller = _Puller(
                    self._node.address(),
                    self._table,
                    self._chunk_rows,
                    self._settings,
                    self._stop,
                    with_exponent=self._estimate_mass,
                )
            try:
                item = self._puller.chunks.get(timeout=self._wait_s)
            except queue.Empty:
                self._probe_if_stuck()
                return False
            self._waiting_since = None
            if item is _ENDED or isinstance(item, BaseException):
                self._retire_puller()
                if item is _ENDED:
                    return False
                raise item
            info = item.info
            self._rows.append(Rows(info.key, info.probability, info.table_size, item.data))
            self.buffered += len(info.key)
            self._update_mass(info, self._puller.exponent)
        return True

    def _probe_if_stuck(self) -> None:
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since < self._probe_after_s:
            return
        self._waiting_since = now
        address = self._node.address()
        if address == self._puller.address:
            logging.warning("replay shard at %s brings no samples; waiting for it", address)
            return
        logging.warning(
            "replay shard moved from %s to %s; sampling there", self._puller.address, address
        )
        self._puller.abandon()  # its thread may stay blocked on the old server
        self._retire_puller()

    def _retire_puller(self) -> None:
        self._previous = [p for p in self._previous if p.is_alive()] + [self._puller]
        self._puller = None

    def close(self, deadline: float) -> None:
        """Ends its dataset's thread and waits for it, until `deadline` (time.monotonic())
        at most; rows pulled but not taken are dropped.

        Call it while the shard's server still serves: the thread then ends
        within about the rate limiter's timeout. A thread left waiting on a
        server that stops never ends: Reverb's reconnect attempts in it keep
        costing CPU, and one that returns while the interpreter finalizes
        aborts the process (see `prefetch.DevicePrefetcher.close`).
        """
        pullers = self._previous + ([self._puller] if self._puller is not None else [])
        self._puller, self._previous = None, []
        on_a_server_left = [puller.abandoned for puller in pullers]
        for puller in pullers:
            puller.abandon()
        for puller, left in zip(pullers, on_a_server_left):
            remaining = max(0.0, deadline - time.monotonic())
            if left:  # on a server that moved away and may never answer again
                remaining = min(remaining, self._wait_s + 2.0)
            puller.join(remaining)
            if puller.is_alive():
                frame = sys._current_frames().get(puller.ident)
                logging.warning(
                    "replay shard %s: sampling thread still running after close, in:\n%s",
                    puller.address,
                    "".join(traceback.format_stack(frame)) if frame else "(no Python frame)",
                )

    def _update_mass(self, info: Any, exponent: float | None) -> None:
        self.table_size = int(info.table_size[-1])
        if not self._estimate_mass:
            return
        if exponent is None:  # uniform or FIFO: every item weighs the same
            mass = float(self.table_size)
        else:
            sampled = info.probability > 0
            masses = info.priority[sampled] ** exponent / info.probability[sampled]
            mass = float(np.mean(masses)) if masses.size else 0.0
        if mass > 0 and math.isfinite(mass):
            self.mass = mass

    def take(self, count: int) -> Rows:
        """The `count` oldest buffered rows (`fill` first)."""
        parts = []
        while count:
            oldest = self._rows[0]
            size = len(oldest.keys)
            start = self._offset
            stop = min(size, start + count)
            whole = start == 0 and stop == size
            parts.append(oldest if whole else slice_rows(oldest, start, stop))
            count -= stop - start
            self.buffered -= stop - start
            if stop == size:
                self._rows.popleft()
                self._offset = 0
            else:
                self._offset = stop
        return concatenate(parts)
