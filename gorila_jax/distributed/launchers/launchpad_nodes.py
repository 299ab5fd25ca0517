"""The courier object that hosts a node under dm-launchpad, and the client that calls it.

Both travel between processes: `NodeHost` is built by Launchpad inside the
node's process (or thread, under `local_mt`) and serves its public methods over
courier; a `LaunchpadClient` holds only a node name and a courier address, so it
pickles into the nodes that hold a handle of the node it calls.
"""

import concurrent.futures
import pickle
import signal
import threading
import traceback
from typing import Any

import courier

from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base


class NodeHost(base.HostedNode):
    """One node inside a Launchpad `CourierNode`, built and driven by the launcher.

    Launchpad builds the host with the node's name only; the launcher then
    calls `construct` with the node's constructor and arguments (handles
    already replaced by clients, so handles may point in any direction), and
    `start_node_run` for nodes with a `run` loop. The host's own `run` is what
    Launchpad calls: it serves until `shutdown`, so a node's process lives as
    long as the program, not as long as its `run` loop.
    """

    def __init__(self, name: str):
        super().__init__(name)
        self._run_error: str | None = None
        self._run_thread: threading.Thread | None = None
        self._exit = threading.Event()
        self._server: Any = None
        if threading.current_thread() is threading.main_thread():
            # A node process of `local_mp` shares the terminal's process group: Ctrl-C
            # reaches it too, and Launchpad's handler would end it before the driver
            # has checkpointed. The driver alone decides when nodes stop (as under Ray).
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def set_courier_server(self, server: Any) -> None:
        """Launchpad hands us the server so that `run` decides when it stops."""
        self._server = server

    def run(self) -> None:
        """Launchpad's entry point: serve calls until the launcher says `shutdown`."""
        self._server.Start()
        try:
            self._exit.wait()
        finally:
            self._server.Stop()

    def shutdown(self) -> None:
        """Ends `run` (and with it the node's process under `local_mp`)."""
        self._exit.set()

    def call(self, method: str, arguments: bytes) -> tuple[bool, Any]:
        """(True, result) of the node's `method`, or (False, the exception it raised).

        `arguments` is the pickled (args, kwargs) (`LaunchpadClient`). Courier
        would turn the node's exception into one of its own; carried back as a
        value, the caller gets the node's own exception type.
        """
        try:
            args, kwargs = pickle.loads(arguments)
            return True, getattr(self._get(), method)(*args, **kwargs)
        except Exception as error:  # noqa: BLE001  re-raised by the client
            return False, error

    def start_node_run(self) -> None:
        """Starts the node's `run` loop in a thread of its own."""
        node = self._get()
        if not hasattr(node, "run") or self._run_thread is not None:
            return

        def run() -> None:
            try:
                node.run()
            except BaseException as error:  # noqa: BLE001  reported by `status`
                self._run_error = "".join(
                    traceback.format_exception_only(type(error), error)
                ).strip()[-2000:]

        with self._stop_lock:  # a `stop` before this point: `wait_run` will find no thread
            if self.stop_requested:
                return
            self._run_thread = threading.Thread(target=run, name=self._name, daemon=True)
            self._run_thread.start()

    def status(self) -> dict[str, Any]:
        """Whether the node's `run` is still going, and how it failed (construction shows in
        the launcher's `construct` call)."""
        return {
            "running": self._run_thread is not None and self._run_thread.is_alive(),
            "run_error": self._run_error,
        }

    def wait_run(self, timeout_s: float) -> bool:
        """True once the node's `run` has returned (or it has none)."""
        with self._stop_lock:
            thread = self._run_thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()


def host_client(address: str, timeout_s: float | None = None, probe: bool = False) -> Any:
    """A courier client of the `NodeHost` at `address`; a `probe` fails at once if the
    host's process is gone instead of waiting for it to come up."""
    return courier.Client(address, call_timeout=timeout_s, wait_for_ready=not probe)


def _pickled(args: tuple, kwargs: dict) -> bytes:
    """A call's arguments as one pickle: courier (dm-launchpad 0.5.2, numpy 1.26) never
    returns from a call that passes a numpy array as an argument (results pass), and the
    native replay's writers and learners pass rows and priorities."""
    return pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)


class LaunchpadClient(program_lib.Client):
    """Calls a node hosted by a `NodeHost` over courier; picklable (name and address only).

    Its own attributes are private: any public name would hide the node's method of
    that name.
    """

    def __init__(self, node_name: str, address: str):
        super().__init__(node_name)
        self._address = address
        self._courier: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_courier": None}  # a courier client holds a channel

    def _host(self) -> Any:
        if self._courier is None:  # made on first use in each process
            self._courier = host_client(self._address)
        return self._courier

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        ok, value = self._host().call(method, _pickled(args, kwargs))
        if not ok:
            raise value
        return value

    def _submit(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        outer: concurrent.futures.Future = concurrent.futures.Future()

        def settle(done: concurrent.futures.Future) -> None:
            error = done.exception()
            if error is not None:
                outer.set_exception(error)
                return
            ok, value = done.result()
            if ok:
                outer.set_result(value)
            else:
                outer.set_exception(value)

        self._host().futures.call(method, _pickled(args, kwargs)).add_done_callback(settle)
        return outer
