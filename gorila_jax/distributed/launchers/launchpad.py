"""The `launchpad` launcher: every node a dm-launchpad courier node.

Runs on the DeepMind dependency set only (Python 3.10, requirements-deepmind.txt;
BUILD_NOTES.md says why): dm-launchpad 0.5.2's courier is built against
TensorFlow 2.8, and has no wheel for the default set's Python 3.12+.

The project's own `Program` becomes an `lp.Program` with the same groups and
node names: each node is an `lp.CourierNode` hosting a
`launchpad_nodes.NodeHost`, and `lp.launch` starts them as threads of this
process (`local_mt`) or as a process each (`local_mp`). Nodes are then built as
under Ray, in two phases (every host started, then every node constructed with
clients of the others), so handles may point in any direction; a handle
becomes a `launchpad_nodes.LaunchpadClient`.

What Launchpad does not do here, and the ray launcher does: restart a killed
node, add or remove nodes while running (elastic actors), reserve placement,
join a cluster. A run says so when it starts (`launchers.LAUNCHPAD_LIMITS`).
"""

import concurrent.futures
import contextlib
import io
import logging
import os
import signal
import threading
from typing import Any, Iterator

import launchpad as lp
import psutil
from launchpad.launch.run_locally import launch_local_output_to_files

from gorila_jax import console
from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base, launchpad_nodes

_STOP_TIMEOUT_S = 60.0
_EXIT_TIMEOUT_S = 30.0
# The signals whose handlers `lp.launch` replaces in the launching process (its worker
# manager's, which would end this process on Ctrl-C before the driver checkpoints).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1)


class LaunchpadProgram(base.RunningProgram):
    """The program's nodes as Launchpad courier nodes, launched with `launch_type`.

    Args:
      program: the graph to run.
      launch_type: "local_mt" (a thread per node, this process) or "local_mp"
        (a process per node).
      log_dir: where `local_mp` writes each node process's output (a file per node).
    """

    def __init__(self, program: program_lib.Program, launch_type: str, log_dir: str):
        super().__init__(program)
        self._stopped = False
        lp_program = lp.Program(program.name)
        courier_nodes = {}
        for group, specs in program.groups.items():
            with lp_program.group(group):
                for spec in specs:
                    node = lp.CourierNode(launchpad_nodes.NodeHost, spec.name)
                    lp_program.add_node(node)
                    courier_nodes[spec.name] = node
        before = {child.pid for child in psutil.Process().children()}
        self._manager = _launch(lp_program, launch_type, log_dir)
        self._processes = [p for p in psutil.Process().children() if p.pid not in before]
        self._addresses = {
            name: node.courier_address.resolve() for name, node in courier_nodes.items()
        }
        # `finished` asks every host at each poll: one channel per host, not one per call.
        self._probes = {
            name: launchpad_nodes.host_client(address, 10.0, probe=True)
            for name, address in self._addresses.items()
        }
        # One client per node for the program's life. A courier client freed on the
        # thread that delivers its own call's result (a one-off client's last reference
        # is its future's) joins that thread in `__del__`: "Resource deadlock avoided",
        # then std::terminate aborted the driver (1 run in 12 under load).
        # So is each host client that builds and starts a node (its calls end later).
        self._clients: dict[str, launchpad_nodes.LaunchpadClient] = {}
        self._starters: dict[str, Any] = {}
        self._construct: dict[str, concurrent.futures.Future] = {}
        for spec in program.nodes:
            self._start(spec)

    def _start(self, spec: program_lib.NodeSpec) -> None:
        resolve = lambda handle: self.client(handle.name)  # noqa: E731
        host = self._starters[spec.name] = launchpad_nodes.host_client(self._addresses[spec.name])
        self._construct[spec.name] = host.futures.construct(
            spec.constructor,
            program_lib.map_handles(resolve, spec.args),
            program_lib.map_handles(resolve, spec.kwargs),
        )
        if spec.run_enabled:
            # Waits in the host until the node is built; its outcome shows in `status`.
            host.futures.start_node_run()

    def client(self, name: str) -> launchpad_nodes.LaunchpadClient:
        name = self.program.resolve_name(name)
        if name not in self._clients:
            self._clients[name] = launchpad_nodes.LaunchpadClient(name, self._addresses[name])
        return self._clients[name]

    @property
    def stopped(self) -> bool:
        return self._stopped

    def process_ids(self) -> dict[str, int]:
        found = {}
        for name, future in self._construct.items():
            if future.done() and future.exception() is None:
                found[name] = future.result()
        return found

    def is_built(self, name: str) -> bool:
        return self._construct[self.program.resolve_name(name)].done()

    def finished(self) -> bool:
        done = True
        for spec in self.active_nodes():
            construct = self._construct[spec.name]
            if not construct.done():
                done = False
                continue
            if construct.exception() is not None:
                raise program_lib.NodeError(
                    spec.name, f"construction failed: {construct.exception()}"
                )
            try:
                status = self._probes[spec.name].status()
            except Exception as error:  # noqa: BLE001  courier's error for a process gone
                raise program_lib.NodeError(
                    spec.name, f"its Launchpad node does not answer: {error}"
                ) from None
            if status["run_error"]:
                raise program_lib.NodeError(spec.name, status["run_error"])
            done = done and not status["running"]
        return done

    def stop(self) -> None:
        """Stops every node and waits for their `run`s, closes them in stages, ends the hosts.

        The order is the ray launcher's (`base.close_stages`); then each host's
        server stops, and a `local_mp` node process that has not exited within
        `_EXIT_TIMEOUT_S` is killed: no process outlives the program.
        """
        if self._stopped:
            return
        self._stopped = True
        hosts = {
            name: launchpad_nodes.host_client(address, _STOP_TIMEOUT_S, probe=True)
            for name, address in self._addresses.items()
        }
        try:
            _wait_all([host.futures.stop() for host in hosts.values()])
            _wait_all([host.futures.wait_run(_STOP_TIMEOUT_S) for host in hosts.values()])
            for stage in base.close_stages(self.active_nodes()):
                _wait_all([hosts[spec.name].futures.close() for spec in stage])
        except Exception:  # noqa: BLE001  the hosts are ended below regardless
            logging.exception("orderly stop of program %s failed", self.program.name)
        for host in hosts.values():
            try:
                host.shutdown()
            except Exception:  # noqa: BLE001  a process already gone
                pass
        _, alive = psutil.wait_procs(self._processes, timeout=_EXIT_TIMEOUT_S)
        for process in alive:
            logging.warning("Launchpad node process %d did not exit; killing it", process.pid)
            for member in [*process.children(recursive=True), process]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        psutil.wait_procs(alive, timeout=_EXIT_TIMEOUT_S)
        self._manager.wait(raise_error=False)  # reaps the processes, joins `local_mt`'s threads


def _wait_all(futures: list[concurrent.futures.Future]) -> None:
    done, _ = concurrent.futures.wait(futures, timeout=_STOP_TIMEOUT_S)
    for future in done:
        if future.exception() is not None:
            logging.warning("stopping a node: %s", future.exception())


def _launch(lp_program: Any, launch_type: str, log_dir: str) -> Any:
    """`lp.launch`, keeping this process's signal handlers and console."""
    options: dict[str, Any] = {}
    if launch_type == "local_mp":
        os.makedirs(log_dir, exist_ok=True)
        # Read by Launchpad once, when the module is imported: set for this launch.
        launch_local_output_to_files._LOGGING_DIR = log_dir  # noqa: SLF001
        options["terminal"] = "output_to_files"
    else:
        options["serialize_py_nodes"] = False
    saved = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    out = io.StringIO()
    try:
        with _pythonpath(), contextlib.redirect_stdout(out):
            return lp.launch(lp_program, launch_type=launch_type, **options)
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for line in out.getvalue().splitlines():
            logging.info("launchpad: %s", line)


@contextlib.contextmanager
def _pythonpath() -> Iterator[None]:
    """Node processes import gorila_jax and agents from this checkout."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (console.REPO_ROOT, old) if p)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def launch(
    program: program_lib.Program,
    launch_type: str = "local_mp",
    log_dir: str | None = None,
) -> LaunchpadProgram:
    """Starts every node of `program` under dm-launchpad.

    Args:
      program: the graph to run.
      launch_type: "local_mp" (a process per node) or "local_mt" (a thread each).
      log_dir: where `local_mp` writes each node process's output; None: a
        `launchpad` folder in the working directory's `runs/`.

    Raises:
      ValueError: an unknown `launch_type`.
    """
    if launch_type not in base.LAUNCHPAD_LAUNCH_TYPES:
        raise ValueError(
            f"unknown launchpad launch type {launch_type!r}; "
            f"choose one of {base.LAUNCHPAD_LAUNCH_TYPES}"
        )
    return LaunchpadProgram(program, launch_type, log_dir or os.path.join("runs", "launchpad"))
