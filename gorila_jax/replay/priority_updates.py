"""New priorities back to the replay shards, from a thread of the learner's."""

import logging
import queue
import threading
from typing import Any, Sequence

import numpy as np

from gorila_jax.replay import api


class PriorityUpdater:
    """Sends new priorities to the replay from a thread, so the learner never waits on it.

    `submit` takes priorities that may still be computing on a device; the
    thread does the device->host copy, so the learner can dispatch its next
    update at once. A bounded queue keeps memory flat if the replay falls behind.
    With a sharded replay each item's priority goes to the shard that holds
    it (`api.SampledKeys`), in one call per shard.

    Args:
      clients: what sends one shard's updates (`mutate_priorities(table, {key: priority})`:
        a Reverb client, `native_node.NativePriorities`), or one per shard, in shard order.
        A `ReplayClient` whose update fails asks its node where it serves now,
        so that the next updates reach a shard restarted elsewhere.
      table: the table the keys were sampled from.
      hot_priorities: {shard: its replay node} of tiered shards whose items take their
        newest priority to the cold tier: each also gets its rows' content hashes and new
        priorities (`ReplayNode.note_priorities`; keys need `hashes`).
    """

    def __init__(
        self,
        clients: Any | Sequence[Any],
        table: str,
        max_queued: int = 8,
        hot_priorities: dict[int, Any] | None = None,
    ):
        self._clients = list(clients) if isinstance(clients, (list, tuple)) else [clients]
        self._hot_priorities = hot_priorities or {}
        self._table = table
        self._queue: queue.Queue = queue.Queue(max_queued)
        self.updates_sent = 0  # mutate calls that succeeded (one per shard a batch touches)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="priority-updater", daemon=True)
        self._thread.start()

    def submit(
        self,
        keys: np.ndarray | api.SampledKeys,
        priorities: Any,
        scale: np.ndarray | None = None,
        bonus: np.ndarray | None = None,
    ) -> None:
        """Queues new priorities for the sampled items `keys` (a key array: a single replay).

        Args:
          keys: the items, as `row_keys` gives them.
          priorities: [B] new priorities, possibly still computing on a device.
          scale: [B] host factors the priorities are multiplied by once they
            are on the host (a dominant actor's items: `balance.SampledRows`).
          bonus: [B] host terms added to the priorities before `scale` (duplicate
            transitions: `replay.DuplicateCounter`).
        """
        self._queue.put((keys, priorities, scale, bonus))

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                self._update(*work)
            except Exception:  # noqa: BLE001  the thread must live on: `close` waits for it
                logging.exception("priority update to table %s failed", self._table)

    def _update(
        self, keys: np.ndarray | api.SampledKeys, priorities: Any, scale: Any, bonus: Any
    ) -> None:
        shards = demo = hashes = None
        if isinstance(keys, api.SampledKeys):
            keys, shards, demo, hashes = keys.keys, keys.shards, keys.demo, keys.hashes
            shards = None if shards is None else shards.reshape(-1)
            hashes = None if hashes is None else hashes.reshape(-1)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if bonus is not None:
            priorities = priorities + np.asarray(bonus, np.float64).reshape(-1)
        if scale is not None:
            priorities = priorities * np.asarray(scale, np.float64).reshape(-1)
        keys = keys.reshape(-1)
        # A skipped (non-finite) update: the items keep their old ones. Demonstration
        # rows' keys are the demonstration table's, which has no priorities.
        sent = np.isfinite(priorities)
        if demo is not None:
            sent &= ~np.asarray(demo, bool).reshape(-1)
        if not sent.all():
            keys, priorities = keys[sent], priorities[sent]
            shards = None if shards is None else shards[sent]
            hashes = None if hashes is None else hashes[sent]
        if shards is None:
            shards = np.zeros(keys.shape, np.int32)
        for shard in np.unique(shards).tolist():
            owned = shards == shard
            self._send(shard, keys[owned], priorities[owned])
            if shard in self._hot_priorities and hashes is not None:
                self._note(shard, hashes[owned], priorities[owned])

    def _note(self, shard: int, hashes: np.ndarray, priorities: np.ndarray) -> None:
        try:
            self._hot_priorities[shard].note_priorities(hashes, priorities)
        except Exception:  # noqa: BLE001  a lost note: the item moves with an older priority
            logging.exception("replay shard %d: hot priorities not noted", shard)

    def _send(self, shard: int, keys: np.ndarray, priorities: np.ndarray) -> None:
        if not keys.size:
            return
        client = self._clients[shard]
        try:
            client.mutate_priorities(
                self._table, updates=dict(zip(keys.tolist(), priorities.tolist()))
            )
            self.updates_sent += 1
        except Exception:  # noqa: BLE001  a lost update only leaves old priorities
            logging.exception("priority update to table %s (shard %d) failed", self._table, shard)
            if hasattr(client, "current_address"):  # a Reverb `server.ReplayClient`
                try:
                    self._clients[shard] = client.at(client.current_address())
                except Exception:  # noqa: BLE001  the node is unreachable too: retry next time
                    logging.exception("replay shard %d: no current address", shard)

    def close(self, timeout_s: float = 30.0) -> None:
        """Sends what is queued, then ends the thread and waits for it (once; later calls
        return at once).

        Call it before the replay's servers stop: a thread still inside
        `mutate_priorities` then, or when the interpreter finalizes, can
        abort the process (see `prefetch.DevicePrefetcher.close`).
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)  # the thread lives until it takes this (see `_loop`)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logging.warning(
                "priority updates to table %s still running after %.0fs", self._table, timeout_s
            )
