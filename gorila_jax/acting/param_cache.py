"""A per-host parameter cache: the brief's edge server between the learner and a host's actors.

Without it every actor pulls every new parameter version from the learner (or
the Gorila shards), so the learner sends each version once per actor. A host's
actors read from their host's `ParameterCache` instead; the cache fetches each
version from upstream at most once, so the learner sends it once per host.

Refresh rule: on demand, one fetch at a time (single flight).
- An actor that holds an older version than the cache's copy gets the copy
  at once, without any upstream call.
- An actor that already holds the cache's version (or a newer one) makes the
  cache ask upstream for something newer than its copy, unless a fetch is in
  flight: then it waits for that one instead of starting a second. So N actors
  asking at once cause one upstream call, and an actor never waits longer than
  one upstream call, which is what its own pull from the learner would cost.
- `min_fetch_interval_s` > 0 caps the upstream calls per host: an actor that
  holds the cache's version within that time of the last fetch gets None (as
  from a learner with nothing newer) and asks again at its next pull.
Fetches ask upstream for "newer than my copy", so a version is never sent to
the cache twice, and a check that finds nothing newer costs no parameter bytes.
A restarted cache starts empty: its first request fetches the newest version.
"""

import concurrent.futures
import logging
import math
import threading
import time
from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server
from gorila_jax.health import monitor as monitor_lib

GROUP = "param_cache"


def tree_nbytes(tree: Any) -> int:
    """Bytes of a pytree's array leaves: what sending it by value costs."""
    return sum(int(np.asarray(leaf).nbytes) for leaf in jax.tree.leaves(tree))


class ParameterCache(program.Worker):
    """One host's copy of the newest parameters, served with the learner's `get_params` contract.

    Args:
      upstream: where parameters come from: the learner's client, or the list
        of Gorila shard clients (read through `parameter_server.parameter_source`).
      builder, spec, seed: the agent, env spec and root seed (Gorila mode needs
        them for the shards' layout).
      host_index: which actor host this cache serves; its node name is
        `param_cache/<host_index>`.
      monitor: gets the cache's counters every `heartbeat_interval_s` (may be None).
      min_fetch_interval_s: the least time between two upstream fetches started
        on an up-to-date actor's request (see the module docstring); 0: none.
      restored_counters: the counters a restarted cache's predecessor reported
        last; the byte totals continue from them. The parameters do not: a
        restarted cache starts empty.
    """

    def __init__(
        self,
        upstream: program.Client | list[program.Client],
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        seed: int,
        host_index: int,
        monitor: program.Client | None = None,
        heartbeat_interval_s: float = monitor_lib.HEARTBEAT_INTERVAL_S,
        min_fetch_interval_s: float = 0.0,
        restored_counters: dict[str, int] | None = None,
    ):
        super().__init__()
        if min_fetch_interval_s < 0:
            raise ValueError(
                f"min_fetch_interval_s must not be negative, got {min_fetch_interval_s}"
            )
        self.name = f"{GROUP}/{host_index}"
        # In Gorila mode the cache is one delta receiver of the shards, under its node name.
        self._upstream = parameter_server.parameter_source(upstream, builder, spec, seed, self.name)
        self._monitor, self._heartbeat_interval_s = monitor, heartbeat_interval_s
        self._min_fetch_interval_s = min_fetch_interval_s
        self._lock = threading.Lock()
        self._copy: tuple[int, Any] | None = None
        self._copy_nbytes = 0
        self._fetch: concurrent.futures.Future | None = None
        self._fetch_started = -math.inf
        # The fetch runs in a thread of the cache, not in the thread of the
        # request that started it: a waiter that gives up never cancels it.
        self._fetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        restored = restored_counters or {}
        self._counters = {
            name: int(restored.get(name, 0))
            for name in ("requests", "replies", "bytes_served", "fetches", "bytes_received")
        }

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """(version, params) newer than `newer_than`, or None: the learner's contract.

        Raises:
          Whatever the upstream call this request waited for raised.
        """
        with self._lock:
            self._counters["requests"] += 1
            answer = self._answer(newer_than)
            if answer is not None:
                return answer
            fetch = self._fetch_for(newer_than)
        if fetch is None:
            return None
        fetch.result()  # one upstream call at most: the one in flight when we asked
        with self._lock:
            return self._answer(newer_than)

    def _answer(self, newer_than: int) -> tuple[int, Any] | None:
        """The copy if it is newer than `newer_than` (counted as served); the lock is held."""
        if self._copy is None or self._copy[0] <= newer_than:
            return None
        self._counters["replies"] += 1
        self._counters["bytes_served"] += self._copy_nbytes
        return self._copy

    def _fetch_for(self, newer_than: int) -> concurrent.futures.Future | None:
        """The upstream fetch a request that the copy cannot answer waits for; the lock is held.

        None: the last fetch started less than `min_fetch_interval_s` ago, and
        the asker already holds a version (a first request always fetches).
        """
        if self._fetch is not None and not self._fetch.done():
            return self._fetch
        now = time.monotonic()
        # newer_than -1 reaches here only while the cache is empty: that asker has nothing.
        if newer_than >= 0 and now - self._fetch_started < self._min_fetch_interval_s:
            return None
        self._fetch_started = now
        self._fetch = self._fetcher.submit(self._fetch_newer)
        return self._fetch

    def _fetch_newer(self) -> None:
        """Asks upstream for a version newer than the copy and keeps it (one call)."""
        with self._lock:
            held = -1 if self._copy is None else self._copy[0]
        answer = self._upstream.get_params(held)
        if answer is None:
            return  # nothing newer upstream: no parameter bytes moved
        nbytes = tree_nbytes(answer[1])
        with self._lock:
            # Gorila's summed version can go down when a shard restores a
            # checkpoint; the restored parameters replace the copy all the same.
            self._copy, self._copy_nbytes = (int(answer[0]), answer[1]), nbytes
            self._counters["fetches"] += 1
            self._counters["bytes_received"] += nbytes

    def version(self) -> int:
        """The version of the cached copy; -1 while empty."""
        with self._lock:
            return -1 if self._copy is None else self._copy[0]

    def counters(self) -> dict[str, int]:
        """Requests and replies from actors, bytes served them, fetches and bytes from upstream."""
        with self._lock:
            return dict(self._counters)

    def run(self) -> None:
        # The cache has no work loop; its heartbeat says the process answers,
        # and "requests" moves as long as its actors act.
        heartbeat = monitor_lib.Heartbeat(
            self._monitor, self.name, self.counters, self._heartbeat_interval_s
        ).start()
        try:
            self._stop_event.wait()
        finally:
            heartbeat.stop()

    def close(self) -> None:
        """Waits for the upstream fetch in flight and ends the cache's threads."""
        self._fetcher.shutdown(wait=True, cancel_futures=True)
        parameter_server.close_source(self._upstream)
        logging.info("%s: %s", self.name, self.counters())
