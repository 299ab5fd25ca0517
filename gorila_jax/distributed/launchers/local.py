"""The `local` launcher: every node in this process, one thread per node.

For debugging (a breakpoint stops the whole program in one place) and for fast
tests. Each node is built in its own thread, so a constructor that calls
another node waits for that node instead of depending on construction order.
"""

import concurrent.futures
import logging
import threading
import traceback
from typing import Any

from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base

_CONSTRUCT_TIMEOUT_S = 600.0
_JOIN_TIMEOUT_S = 60.0


class _Slot:
    """One node's object and life-cycle state, shared by its thread and its clients."""

    def __init__(self, spec: program_lib.NodeSpec):
        self.spec = spec
        self.node: Any = None
        self.error: str | None = None
        self.built = threading.Event()
        self.done = threading.Event()
        self.removing = False  # set by `remove_node`: never start its `run` after this
        self.thread: threading.Thread | None = None

    def get(self) -> Any:
        if not self.built.wait(_CONSTRUCT_TIMEOUT_S):
            raise TimeoutError(
                f"node {self.spec.name} was not built within {_CONSTRUCT_TIMEOUT_S}s"
            )
        if self.node is None:
            raise program_lib.NodeError(self.spec.name, self.error or "not built")
        return self.node


class _ClientCalls:
    """The threads that run the nodes' `futures` calls, and the calls in flight."""

    def __init__(self):
        self._executor = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="client")
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future] = set()

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future:
        with self._lock:
            future = self._executor.submit(fn, *args)
            self._in_flight.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def shutdown(self, timeout_s: float) -> None:
        """Cancels the calls not started, waits for those running, then ends the threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            running = list(self._in_flight)
        _, stuck = concurrent.futures.wait(running, timeout_s)
        if stuck:
            # The threads would keep a node's calls going past its close: left to end alone.
            logging.warning("%d client calls still running after %ss", len(stuck), timeout_s)
            return
        self._executor.shutdown(wait=True)


class LocalClient(program_lib.Client):
    def __init__(self, slot: _Slot, calls: _ClientCalls):
        super().__init__(slot.spec.name)
        self._slot = slot
        self._calls = calls

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self._slot.get(), method)(*args, **kwargs)

    def _submit(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        return self._calls.submit(self._call, method, args, kwargs)


class LocalProgram(base.RunningProgram):
    def __init__(self, program: program_lib.Program):
        super().__init__(program)
        self._calls = _ClientCalls()
        # Replaced, never changed in place, when a node is added or removed:
        # other threads iterate it meanwhile.
        self._slots = {spec.name: _Slot(spec) for spec in program.nodes}
        self._stopped = False
        for slot in self._slots.values():
            self._start_thread(slot)

    def _start_thread(self, slot: _Slot) -> None:
        slot.thread = threading.Thread(
            target=self._node_main, args=(slot,), name=slot.spec.name, daemon=True
        )
        slot.thread.start()

    def _node_main(self, slot: _Slot) -> None:
        spec = slot.spec
        try:
            resolve = lambda handle: self.client(handle.name)  # noqa: E731
            args = program_lib.map_handles(resolve, spec.args)
            kwargs = program_lib.map_handles(resolve, spec.kwargs)
            slot.node = spec.constructor(*args, **kwargs)
        except BaseException:  # noqa: BLE001  reported through wait()/check()
            slot.error = traceback.format_exc()
            slot.built.set()
            slot.done.set()
            return
        slot.built.set()
        try:
            running = not (self._stopped or slot.removing)
            if spec.run_enabled and hasattr(slot.node, "run") and running:
                slot.node.run()
        except BaseException:  # noqa: BLE001
            slot.error = traceback.format_exc()
        finally:
            slot.done.set()

    def client(self, name: str) -> LocalClient:
        return LocalClient(self._slots[self.program.resolve_name(name)], self._calls)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _start_added(self, spec: program_lib.NodeSpec) -> None:
        slot = _Slot(spec)
        self._slots = {**self._slots, spec.name: slot}
        self._start_thread(slot)

    def _stop_node(self, name: str, timeout_s: float) -> None:
        slot = self._slots[name]
        slot.removing = True
        # A node still being built is stopped once built (its `run` is not started then).
        if slot.built.wait(timeout_s) and hasattr(slot.node, "stop"):
            slot.node.stop()
        slot.thread.join(timeout_s)
        if slot.thread.is_alive():
            # A thread cannot be killed: it is left to end by itself, without its slot.
            logging.warning("node %s did not stop within %ss; dropped", name, timeout_s)
        else:
            self._close(slot)
        self._slots = {key: value for key, value in self._slots.items() if key != name}

    def failures(self) -> dict[str, str]:
        return {
            slot.spec.name: slot.error for slot in self._slots.values() if slot.error is not None
        }

    def is_built(self, name: str) -> bool:
        return self._slots[self.program.resolve_name(name)].built.is_set()

    def finished(self) -> bool:
        for slot in self._slots.values():
            if slot.error is not None:
                raise program_lib.NodeError(slot.spec.name, slot.error)
        return all(slot.done.is_set() for slot in self._slots.values())

    def stop(self) -> None:
        """Stops every node, waits for their `run`s and client calls, then closes them.

        A node is closed before the nodes whose handles it holds
        (`base.close_stages`): its threads and Reverb clients end while the
        servers they use still serve, and none is left running when the
        process exits.
        """
        if self._stopped:
            return
        self._stopped = True
        for slot in self._slots.values():
            if slot.built.is_set() and hasattr(slot.node, "stop"):
                slot.node.stop()
        for slot in self._slots.values():
            slot.thread.join(_JOIN_TIMEOUT_S)
            if slot.thread.is_alive():
                logging.warning("node %s did not stop within %ss", slot.spec.name, _JOIN_TIMEOUT_S)
        # Calls in flight (a parameter pull, a report) end before the nodes they call close.
        self._calls.shutdown(_JOIN_TIMEOUT_S)
        slots = self._slots  # replaced, never changed in place: this is one snapshot
        for stage in base.close_stages([slot.spec for slot in slots.values()]):
            for spec in stage:
                self._close(slots[spec.name])

    @staticmethod
    def _close(slot: _Slot) -> None:
        if slot.node is not None and hasattr(slot.node, "close"):
            try:
                slot.node.close()
            except Exception:  # noqa: BLE001  one bad close must not leak the rest
                logging.exception("closing node %s failed", slot.spec.name)


def launch(program: program_lib.Program) -> LocalProgram:
    """Starts every node of `program` in this process."""
    return LocalProgram(program)
