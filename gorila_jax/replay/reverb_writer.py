"""The Reverb backend's writer: batched inserts through Reverb's C++ trajectory writer."""

import logging
import threading
import time

import numpy as np
import reverb
import tree

from gorila_jax import types
from gorila_jax.replay import api, tiers


class ReverbConnection:
    """An actor's connection to a Reverb replay node (`api.Connection`).

    Args:
      client: a Reverb client of the node's server; a `server.ReplayClient`
        lets its writers follow a node restarted at another address.
    """

    def __init__(self, client: reverb.Client):
        self.client = client

    def writer(
        self, table: str, max_pending: int = 32, stop_event: threading.Event | None = None
    ) -> "TransitionWriter":
        return TransitionWriter(self.client, table, max_pending, stop_event)

    def table_size(self, table: str) -> int:
        return int(self.client.server_info()[table].current_size)


class TransitionWriter:
    """Inserts one item per row of a batch into a Reverb table.

    Uses the C++ trajectory writer under `reverb.TrajectoryWriter` directly:
    the Python wrapper re-flattens the structure and re-slices its history for
    every step, which halves insert throughput (bench/actor_throughput.py).
    Items are confirmed in groups: `flush` waits only when `max_pending`
    items are in flight (Reverb warns about unconfirmed items beyond ~50),
    and it is where the table's rate limiter pushes back on a fast actor.

    A writer whose client is a `server.ReplayClient` follows a replay node
    that was restarted at another address: when a flush has been blocked for
    `probe_after_s` and the server does not answer, it asks the node where
    it serves now and, if that changed, writes there (the items still
    unconfirmed are lost, counted in `items_lost`). Probes back off (doubling,
    up to 8 * `probe_after_s`) while the server stays away. At the same
    address, Reverb's own connection reconnects and resends them.
    """

    def __init__(
        self,
        client: reverb.Client,
        table: str,
        max_pending: int = 32,
        stop_event: threading.Event | None = None,
        timeout_ms: int = 500,
        probe_after_s: float = 10.0,
    ):
        self._table = table
        self._client = client
        # A tiered replay's spill queue gets every item too (gorila_jax/replay/tiers.py).
        self._tables = [table]
        if tiers.spill_table(table) in client.server_info():
            self._tables.append(tiers.spill_table(table))
        self._writer = client.trajectory_writer(num_keep_alive_refs=1)
        self._max_pending = max_pending
        self._pending = 0
        self._stop_event = stop_event or threading.Event()
        self._timeout_ms = timeout_ms
        self._probe_after_s = probe_after_s
        self._probe_interval_s = probe_after_s
        self.items_lost = 0

    def write(self, batch: types.PyTree, priorities: np.ndarray) -> None:
        """Writes batch[i] as one item with priority priorities[i]; may block (rate limiter)."""
        columns = tree.flatten(batch)
        squeeze = [True] * len(columns)
        cpp_writer = self._writer._writer  # see the class docstring
        for i, priority in enumerate(np.asarray(priorities, np.float64).tolist()):
            refs = [[ref] for ref in cpp_writer.Append([column[i] for column in columns])]
            for table in self._tables:
                cpp_writer.CreateItem(table, priority, refs, squeeze)
            self._pending += len(self._tables)
            if self._pending >= self._max_pending:
                self.flush(block_until_num_items=self._max_pending // 2)

    def flush(self, block_until_num_items: int = 0) -> None:
        """Waits until at most `block_until_num_items` items are unconfirmed.

        Raises:
          Stopped: if the stop event is set while the rate limiter holds inserts.
        """
        blocked_since = time.monotonic()
        while True:
            try:
                self._writer.flush(block_until_num_items, timeout_ms=self._timeout_ms)
                self._pending = block_until_num_items
                self._probe_interval_s = self._probe_after_s
                return
            except reverb.errors.DeadlineExceededError:
                if self._stop_event.is_set():
                    raise api.Stopped() from None
                if time.monotonic() - blocked_since >= self._probe_interval_s:
                    self._follow_server()
                    blocked_since = time.monotonic()

    def _follow_server(self) -> None:
        """Moves to the replay node's new address if its server is gone from the old one.

        A server that answers only holds our inserts back (its rate limiter):
        nothing to do. One that does not answer is asked for again through
        the replay node (`server.ReplayClient`), which waits for a restart.
        """
        current_address = getattr(self._client, "current_address", None)
        if current_address is None:
            return  # a plain reverb.Client: Reverb reconnects to the same address only
        try:
            self._client.server_info(timeout=2)
            return
        except Exception:  # noqa: BLE001  unreachable, whatever the error says
            pass
        address = current_address()
        if address == self._client.server_address:
            self._probe_interval_s = min(2 * self._probe_interval_s, 8 * self._probe_after_s)
            logging.warning("replay at %s does not answer; waiting for it", address)
            return
        logging.warning(
            "replay moved from %s to %s; writing there (%d unconfirmed items lost)",
            self._client.server_address,
            address,
            self._pending,
        )
        self._writer.close()
        self._client = self._client.at(address)
        self._writer = self._client.trajectory_writer(num_keep_alive_refs=1)
        self.items_lost += self._pending
        self._pending = 0
        self._probe_interval_s = self._probe_after_s

    def close(self) -> None:
        """Confirms the items in flight, then closes: a clean stop loses no written item.

        If the node is stopping and the rate limiter still holds inserts, the
        items still in flight are given up after one timeout instead of hanging.
        """
        try:
            self.flush()
        except api.Stopped:
            pass
        finally:
            self._writer.close()
