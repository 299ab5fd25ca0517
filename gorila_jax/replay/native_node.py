"""The native backend's replay node: an agent's tables in one process, with checkpoints.

Its clients call it through the program's node client: under the local
launcher a plain method call in the same process (a learner's sample is the
rows themselves, nothing serialized), under Ray an actor call whose numpy
rows travel through Ray's object store, under a restart the program client
waits for the replacement. No server, no port, no TensorFlow.
"""

import collections
import logging
import os
import shutil
import socket
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from gorila_jax.replay import api, cold, manifest, native_table
from gorila_jax.replay import tiering as tiering_lib

_SCRATCH = ".native"
# Insert calls a writer keeps in flight to a node in another process (a Ray or courier
# call each): a writer that waited for each call's round trip inserted at 0.4-1x Reverb's
# rate over Ray (bench/replay_throughput.py), Reverb's writer streams.
_CALLS_IN_FLIGHT = 4


def process_address() -> str:
    """This process, as a native node's endpoint names it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _table_file(name: str) -> str:
    return f"table-{name}.npz"


def check_memory(specs: Sequence[api.TableSpec]) -> None:
    """Raises MemoryError, with the numbers, if the tables that allocate up front need more
    memory than the host has available."""
    needed = sum(spec.max_size * spec.item_bytes for spec in specs if not spec.grows)
    import psutil  # here: a learner that never starts a node needs no psutil (bench/gpu_check.sh)

    available = psutil.virtual_memory().available
    if needed > available:
        tables = ", ".join(
            f"{spec.name}: {spec.max_size:,} items x {spec.item_bytes:,} bytes"
            for spec in specs
            if not spec.grows
        )
        raise MemoryError(
            f"the replay's tables need {needed / 2**30:.1f} GiB ({tables}) and this host has "
            f"{available / 2**30:.1f} GiB available: lower --config.max_replay_size, store "
            "observations compactly (--config.replay_obs_dtype), or shard the replay over hosts"
        )


def node_specs(
    make_tables: Callable[[], Sequence[api.TableSpec]], tiering: tiering_lib.Tiering | None
) -> list[api.TableSpec]:
    """The tables a node holds: the agent's, with a tiered table's hot part in memory.

    Raises:
      ValueError: a table that cannot be tiered.
    """
    specs = list(make_tables())
    if tiering is not None:
        tiering.sampled_spec(specs)  # raises for a table that cannot be tiered
        specs = [tiering.hot_spec(s) if s.name == tiering.table else s for s in specs]
    return specs


def _cold_store(spec: api.TableSpec, tiering: tiering_lib.Tiering | None) -> cold.ColdStore | None:
    if tiering is None or spec.name != tiering.table:
        return None
    return cold.ColdStore(
        tiering.cold_dir,
        tiering.cold_size,
        spec.item_bytes,
        spec.priority_exponent,
        tiering.cold_bytes,
        tiering.cold_compression,
    )


class NativeReplayNode:
    """Hosts the tables an agent's builder declares, as numpy arrays in this process.

    Args:
      make_tables: returns the agent's tables (`api.TableSpec`s).
      checkpoint_dir: where `checkpoint` writes (absolute); None: no checkpoints.
      restore_step: start from the checkpoint taken at this learner step;
        `manifest.NEWEST`: from the newest intact one (empty if there is none),
        as a replay node restarted after a crash does.
      preload: called with a connection to this node once its tables exist
        (after any restore), to write what the run starts with (demonstrations).
      tiering: keep the sampled table's older items in a cold tier on disk
        (`tiering.Tiering`; `native_table.NativeTable` says how); None: all in memory.
      seed: of the tables' sampling draws (None: from the OS).

    Raises:
      MemoryError: the tables cannot fit in this host's memory.
      manifest.IncompatibleCheckpoint: the checkpoint was written by Reverb, or holds
        items of another width.
    """

    def __init__(
        self,
        make_tables: Callable[[], Sequence[api.TableSpec]],
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
        preload: Callable[[api.Connection], Any] | None = None,
        tiering: tiering_lib.Tiering | None = None,
        seed: int | None = None,
    ):
        specs = node_specs(make_tables, tiering)
        check_memory(specs)
        rng = np.random.default_rng(seed)
        self._tiering = tiering
        self._tables = {
            spec.name: native_table.NativeTable(
                spec, int(rng.integers(1 << 62)), _cold_store(spec, tiering)
            )
            for spec in specs
        }
        self._checkpoint_dir = checkpoint_dir
        self._checkpoint_lock = threading.Lock()
        if checkpoint_dir is None and restore_step not in (None, manifest.NEWEST):
            raise ValueError("restore_step needs a checkpoint_dir")
        if checkpoint_dir is not None and restore_step == manifest.NEWEST:
            restore_step = manifest.newest_intact_checkpoint(checkpoint_dir)
        elif checkpoint_dir is None:
            restore_step = None
        self._restored: dict[str, Any] = {"step": restore_step, "table_sizes": {}}
        if restore_step is not None:
            self._restore(os.path.join(checkpoint_dir, str(restore_step)), restore_step)
        if preload is not None:
            preload(NativeConnection(self))

    def _restore(self, path: str, step: int) -> None:
        sizes = manifest.check_checkpoint(path)
        manifest.check_backend(path, api.NATIVE)
        tiering_lib.check_tiers_match(path, self._tiering)
        for name, table in self._tables.items():
            file = os.path.join(path, _table_file(name))
            if not os.path.exists(file):
                raise manifest.IncompatibleCheckpoint(
                    f"replay checkpoint {path} has no table {name!r} (it holds "
                    f"{sorted(sizes)}): it is a checkpoint of another agent"
                )
            with np.load(file) as state:
                width = state["items"].shape[1]
                if width != table.spec.item_bytes:
                    raise manifest.IncompatibleCheckpoint(
                        f"replay checkpoint {path}: table {name!r} holds items of {width} bytes, "
                        f"this run's agent writes {table.spec.item_bytes}: it is a checkpoint of "
                        "another agent config or environment"
                    )
                if table.cold is not None:
                    table.cold.restore(os.path.join(path, tiering_lib.COLD_CHECKPOINT))
                    self._restored["cold_items"] = table.cold.size
                table.load(dict(state))
        self._restored["table_sizes"] = {name: t.info()["size"] for name, t in self._tables.items()}
        logging.warning(
            "replay: restored the checkpoint of learner step %d, tables %s",
            step,
            self._restored["table_sizes"],
        )

    def _table(self, name: str) -> native_table.NativeTable:
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(
                f"no replay table {name!r}; this node has {sorted(self._tables)}"
            ) from None

    # ------------------------------------------------------------ what clients call

    def endpoint(self) -> api.Endpoint:
        """The native backend's, at this process (its clients call the node itself; the
        address tells them whether the node is in their own process)."""
        return api.Endpoint(api.NATIVE, process_address())

    def address(self) -> str:
        """Where the node runs, for messages."""
        return f"native:{process_address()}"

    def insert(
        self, table: str, items: np.ndarray, priorities: np.ndarray, timeout_s: float
    ) -> int:
        """`NativeTable.insert`: how many of the items went in within `timeout_s`."""
        return self._table(table).insert(items, priorities, timeout_s)

    def sample(self, table: str, count: int, timeout_s: float) -> api.Sample | None:
        """`NativeTable.sample`: `count` rows, or None if the rate limiter held them back."""
        return self._table(table).sample(count, timeout_s)

    def update_priorities(self, table: str, keys: np.ndarray, priorities: np.ndarray) -> int:
        """New priorities of the items `keys` still held; returns how many were."""
        return self._table(table).update(keys, priorities)

    def table_info(self) -> dict[str, dict[str, float]]:
        """Per table: size, inserts, samples, samples_per_insert, slack (as Reverb's node)."""
        return {name: table.info() for name, table in self._tables.items()}

    def restored_from(self) -> dict[str, Any]:
        """{"step": the checkpoint restored (None: started empty), "table_sizes": its sizes}."""
        return dict(self._restored)

    def cold_tier(self) -> dict[str, Any] | None:
        """{"table": the tiered table, "prioritized": whether its priorities matter}; None:
        not tiered."""
        if self._tiering is None:
            return None
        return {"table": self._tiering.table, "prioritized": self._tiered().spec.prioritized}

    def _tiered(self) -> native_table.NativeTable:
        if self._tiering is None:
            raise RuntimeError("this replay node has no cold tier (it was built without tiering)")
        return self._tables[self._tiering.table]

    def tier_info(self) -> dict[str, float]:
        """Items and bytes per tier and cold rows read (as Reverb's node; `moved`: evicted
        into the cold tier, `spill_items` 0: evicted items move in the insert itself)."""
        table = self._tiered()
        hot_items = table.info()["size"]
        return {
            "hot_items": hot_items,
            "hot_bytes": hot_items * table.spec.item_bytes,
            "spill_items": 0,
            "cold_items": table.cold.size,
            "cold_bytes": table.cold.bytes,
            "cold_reads": table.cold.reads,
            "moved": table.moved,
        }

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, step: int) -> dict[str, Any]:
        """Writes every table (items oldest first, priorities, rate-limiter counts) as learner
        step `step`: into a scratch directory, manifest last, then renamed to
        `<checkpoint_dir>/<step>`, so a partial one never carries a step's name.

        Returns:
          {"path": the checkpoint's directory, "table_sizes": {table: items}}.
        """
        if self._checkpoint_dir is None:
            raise RuntimeError("this replay node was built without a checkpoint_dir")
        with self._checkpoint_lock:
            scratch = os.path.join(self._checkpoint_dir, _SCRATCH, str(time.time_ns()))
            os.makedirs(scratch)
            try:
                sizes = {}
                for name, table in self._tables.items():
                    state = table.state(os.path.join(scratch, tiering_lib.COLD_CHECKPOINT))
                    sizes[name] = len(state["items"])
                    np.savez(os.path.join(scratch, _table_file(name)), **state)
                manifest.write_manifest(scratch, sizes, api.NATIVE)
                final = os.path.join(self._checkpoint_dir, str(step))
                if os.path.exists(final):
                    shutil.rmtree(final)
                os.rename(scratch, final)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
        return {"path": final, "table_sizes": sizes}

    def keep_checkpoints(self, steps: Sequence[int]) -> None:
        """Deletes the checkpoints of every step not in `steps`."""
        manifest.keep_checkpoints(self._checkpoint_dir, steps)

    def close(self) -> None:
        for table in self._tables.values():
            table.close()
            if table.cold is not None:
                table.cold.close()


class NativeConnection:
    """An actor's connection to a native replay node (`api.Connection`).

    Args:
      node: the node, or a program client of it (any launcher's).
      remote: the node runs in another process: writers keep several insert calls in
        flight (`node.futures`) instead of waiting for each.
    """

    def __init__(self, node: Any, remote: bool = False):
        self.node, self.remote = node, remote

    def writer(
        self, table: str, max_pending: int = 32, stop_event: threading.Event | None = None
    ) -> "NativeWriter":
        in_flight = _CALLS_IN_FLIGHT if self.remote else 0
        return NativeWriter(self.node, table, max_pending, stop_event, calls_in_flight=in_flight)

    def table_size(self, table: str) -> int:
        return int(self.node.table_info()[table]["size"])


class NativeWriter:
    """Inserts items into a native node's table, `max_pending` at a time (`api.Writer`).

    Items wait here until `max_pending` have been written, then go in one
    call: under Ray one actor call per group, not per item. With
    `calls_in_flight`, up to that many calls are under way at once (a node in
    another process), and a write waits only for the oldest beyond them. The
    table's rate limiter holds a call back: what it did not take within
    `timeout_s` is sent again until all went in, or the stop event is set
    (`api.Stopped`).
    """

    def __init__(
        self,
        node: Any,
        table: str,
        max_pending: int = 32,
        stop_event: threading.Event | None = None,
        timeout_s: float = 0.5,
        calls_in_flight: int = 0,
    ):
        self._node, self._table = node, table
        self._max_pending, self._timeout_s = max_pending, timeout_s
        self._stop_event = stop_event or threading.Event()
        self._calls_in_flight = calls_in_flight
        self._in_flight: collections.deque = collections.deque()
        self._items: list[np.ndarray] = []
        self._priorities: list[np.ndarray] = []
        self._pending = 0
        self.items_lost = 0  # none: a restarted node's client resends the call

    def write(self, items: np.ndarray, priorities: np.ndarray) -> None:
        self._items.append(np.asarray(items))
        self._priorities.append(np.asarray(priorities, np.float64).reshape(-1))
        self._pending += len(items)
        if self._pending >= self._max_pending:
            self._send()

    def _take_pending(self) -> tuple[np.ndarray, np.ndarray]:
        items = np.concatenate(self._items) if len(self._items) > 1 else self._items[0]
        priorities = np.concatenate(self._priorities)
        self._items, self._priorities, self._pending = [], [], 0
        return items, priorities

    def _send(self) -> None:
        if not self._pending:
            return
        items, priorities = self._take_pending()
        if not self._calls_in_flight:
            self._insert_all(items, priorities)
            return
        call = self._node.futures.insert(self._table, items, priorities, self._timeout_s)
        self._in_flight.append((call, items, priorities))
        while len(self._in_flight) > self._calls_in_flight:
            self._settle()

    def _settle(self) -> None:
        """Waits for the oldest call in flight; sends again what the rate limiter left."""
        call, items, priorities = self._in_flight.popleft()
        done = call.result()
        if done < len(items):
            self._insert_all(items[done:], priorities[done:])

    def _insert_all(self, items: np.ndarray, priorities: np.ndarray) -> None:
        done = 0
        while done < len(items):
            done += self._node.insert(self._table, items[done:], priorities[done:], self._timeout_s)
            if done < len(items) and self._stop_event.is_set():
                # Kept for a flush after the stop is lifted (never, for a stopping actor).
                self._items, self._priorities = [items[done:]], [priorities[done:]]
                self._pending = len(items) - done
                raise api.Stopped()

    def flush(self) -> None:
        """Inserts every item written; raises `api.Stopped` if stopped while held back."""
        self._send()
        while self._in_flight:
            self._settle()

    def close(self) -> None:
        try:
            self.flush()
        except api.Stopped:
            pass


class NativePriorities:
    """What `priority_updates.PriorityUpdater` sends a shard's new priorities through."""

    def __init__(self, node: Any):
        self._node = node

    def mutate_priorities(self, table: str, updates: dict[int, float]) -> None:
        keys = np.fromiter(updates.keys(), np.uint64, len(updates))
        priorities = np.fromiter(updates.values(), np.float64, len(updates))
        self._node.update_priorities(table, keys, priorities)
