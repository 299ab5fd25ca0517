"""What a run shows on the console: its progress, and only the log lines that matter.

Progress: a live bar on a terminal, plain periodic lines anywhere else
(`progress_reporter` decides). Log lines: `route_third_party_logs` moves
everything other libraries write (Reverb's and XLA's C++ logs, TensorFlow's
cpu-feature notes, JAX's backend probes, Ray's startup lines, the lines Ray
forwards from its worker processes) into a file, while warnings and errors of
this codebase, and errors of anyone, stay on the console.
"""

import dataclasses
import io
import faulthandler
import logging
import os
import re
import sys
import traceback
import warnings
from typing import Any, TextIO

import rich.console
import rich.progress
import rich.text
from absl import logging as absl_logging

from gorila_jax import metrics
from gorila_jax import text as text_lib

THIRD_PARTY_LOG = "third_party.log"

# The checkout: workers of every launcher import gorila_jax and agents from it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The code whose warnings reach the console; everything else's only at ERROR and above.
_OUR_DIRS = tuple(
    os.path.join(REPO_ROOT, name) + os.sep for name in ("gorila_jax", "agents", "launch", "bench")
)


class _PlainWriter(io.TextIOBase):
    """Writes to `stream` without escape codes (a log file, a console that is no terminal)."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text_lib.plain(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def name(self) -> str:
        return self._stream.name

    def isatty(self) -> bool:
        return self._stream.isatty()


def is_ours(path: str) -> bool:
    """Whether the source file `path` belongs to this codebase."""
    return os.path.abspath(path).startswith(_OUR_DIRS)


def _matters(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
        return True
    return record.levelno >= logging.WARNING and is_ours(record.pathname)


class _ConsoleHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time, so a live progress bar, which
    swaps it for a proxy, prints the line above itself instead of through itself."""

    def __init__(self):
        super().__init__()
        self.setFormatter(absl_logging.PythonFormatter())
        self.addFilter(_matters)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        del value  # StreamHandler.__init__ sets one; this handler always uses sys.stderr


@dataclasses.dataclass(frozen=True)
class _Routing:
    """Where third-party output goes once `route_third_party_logs` ran."""

    path: str
    log: TextIO


_routing: _Routing | None = None


def third_party_log() -> TextIO | None:
    """The open third-party log file, or None where the console shows everything."""
    return _routing.log if _routing is not None else None


def show_only_what_matters() -> None:
    """Python log records reach the console only where they matter: our warnings and
    anyone's errors (XLA's backend probe, for one, does not). On its own, for the tools
    that write no run (launch.evaluate, launch.record): what is dropped goes nowhere."""
    root = logging.getLogger()
    # absl's handler (app.run installs it) writes everything to stderr.
    root.removeHandler(absl_logging.get_absl_handler())
    if not any(isinstance(handler, _ConsoleHandler) for handler in root.handlers):
        root.addHandler(_ConsoleHandler())


def route_third_party_logs(logdir: str) -> str:
    """Sends other libraries' output of this process to `<logdir>/third_party.log`.

    C++ libraries write their logs to file descriptor 2 directly, so fd 2 itself
    goes to the file; Python's `sys.stderr` moves to a copy of the console's
    descriptor, so tracebacks, `error:` lines and our own warnings still show.
    Python log records go to the file, and those that `_matters` accepts to the
    console too. Call it once, before the run's nodes start (the Ray launcher
    reads `third_party_log` to route its workers' lines).

    Returns:
      The log file's path.
    """
    global _routing
    if _routing is not None:
        return _routing.path
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, THIRD_PARTY_LOG)
    log_file = open(path, "a", buffering=1)
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(log_file.fileno(), 2)
    # Escape codes (Ray's errors carry colour) stay out of the file, and off a console
    # that is not a terminal. C++ libraries' lines reach fd 2 unfiltered: they carry none.
    log = _PlainWriter(log_file)
    sys.stderr = console if console.isatty() else _PlainWriter(console)
    # A crash in C++ (SIGABRT, SIGSEGV) would otherwise end the run with nothing on the
    # console: absl pointed faulthandler at fd 2, which is the file now.
    faulthandler.enable(file=console, all_threads=True)

    root = logging.getLogger()
    show_only_what_matters()
    to_file = logging.StreamHandler(log)
    to_file.setFormatter(absl_logging.PythonFormatter())
    root.addHandler(to_file)
    # The file keeps INFO too (absl's default verbosity under app.run).
    root.setLevel(min(root.getEffectiveLevel(), logging.INFO))

    def show_warning(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        (sys.stderr if is_ours(filename) else log).write(text)

    warnings.showwarning = show_warning

    def unraisable_to_file(unraisable: Any) -> None:
        # Errors in finalizers (a zipfile's __del__ after a failed save, on Python 3.10)
        # are library noise: the file keeps them, the console has the run's own error.
        log.write(f"Exception ignored in: {unraisable.object!r}\n")
        log.write(
            "".join(
                traceback.format_exception(
                    unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
                )
            )
        )

    sys.unraisablehook = unraisable_to_file
    _routing = _Routing(path, log)
    route_ray_logger()
    return path


def route_ray_logger() -> None:
    """Under `route_third_party_logs`, Ray's driver log records go where the others' go.

    Ray's logger has a console handler of its own, installed when Ray is imported,
    and does not propagate. Ray is imported only by the ray launcher, after the
    routing began: the launcher calls this then, before `ray.init` logs anything.
    """
    if _routing is None or "ray" not in sys.modules:
        return
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        ray_logger.removeHandler(handler)
    ray_logger.propagate = True


# A Python log line as a Ray worker prints it: logging's default format
# ("WARNING:root:...") or absl's ("W1201 18:31:19.27 1398 learner.py:12] ...").
_WORKER_WARNING = re.compile(
    r"^(?:(WARNING|ERROR|CRITICAL):([\w.]+):"  # logging's default format
    r"|([WEF])\d{4} \S+\s+\d+ ([\w.]+):\d+\])"  # absl's
)
_OUR_MODULE_FILES = frozenset(
    name
    for directory in _OUR_DIRS
    for _, _, files in os.walk(directory)
    for name in files
    if name.endswith(".py")
)


def worker_line_matters(line: str) -> bool:
    """Whether a line a Ray worker wrote belongs on the console: an error, or a warning
    of our code."""
    match = _WORKER_WARNING.match(line)
    if match is None:
        return False
    level, logger, letter, filename = match.groups()
    if level is not None:
        # absl's functions, which our modules call, log as "root" in a Ray worker.
        return level != "WARNING" or logger in ("root", "absl")
    return letter != "W" or filename in _OUR_MODULE_FILES


class LineProgress:
    """Progress as plain lines, one per metrics row (logs, pipes, CI)."""

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        pass

    def message(self, line: str) -> None:
        """A line of the run's own (a restart, an actor added)."""
        print(line, flush=True)

    def poll(self, snapshot: dict[str, Any]) -> None:
        """The monitor's newest counters; lines come only with rows."""

    def row(self, row: dict[str, Any], suffix: str = "") -> None:
        """A metrics row, with `suffix` (the Gorila counters) after the line."""
        print(metrics.progress_line(row) + suffix, flush=True)


def _number(value: float, fmt: str) -> str:
    return "-" if value != value else format(value, fmt)  # NaN: nothing measured yet


class _BarOverStats(rich.progress.Progress):
    """The bar, and under it a line of rates and returns: one line of both would not fit
    an 80-column terminal."""

    stats = ""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        yield rich.text.Text(self.stats, no_wrap=True, overflow="ellipsis")


class BarProgress:
    """A live bar over the env-step budget with ETA, rates and returns (terminals).

    Lines printed while it runs (`message`, print, warnings) appear above it.
    """

    def __init__(self, total_env_steps: int, file: TextIO | None = None):
        self._progress = _BarOverStats(
            rich.progress.TextColumn("env steps"),
            rich.progress.BarColumn(),
            rich.progress.MofNCompleteColumn(),
            rich.progress.TextColumn("ETA"),
            rich.progress.TimeRemainingColumn(),
            console=rich.console.Console(file=file or sys.stdout),
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("train", total=total_env_steps)
        self._rates = "- env steps/s | - updates/s"
        self._returns = "return - | greedy -"

    def __enter__(self) -> "BarProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        # A run that stops early (wall time, eval target, Ctrl-C) leaves its bar where it got.
        self._progress.stop()

    def message(self, line: str) -> None:
        self._progress.console.print(line, markup=False, highlight=False)

    def poll(self, snapshot: dict[str, Any]) -> None:
        self._returns = (
            f"return {_number(snapshot['mean_return'], '.1f')} | "
            f"greedy {_number(snapshot['eval_return'], '.1f')}"
        )
        self._show(snapshot["env_steps"])

    def row(self, row: dict[str, Any], suffix: str = "") -> None:
        del suffix  # the bar stays two lines; metrics.csv has the Gorila counters
        self._rates = (
            f"{row['env_steps_per_s']:,.0f} env steps/s | "
            f"{row['learner_steps_per_s']:,.1f} updates/s"
        )
        self._show(row["env_steps"])

    def _show(self, env_steps: int) -> None:
        self._progress.stats = f"{self._rates} | {self._returns}"
        self._progress.update(self._task, completed=env_steps)


def progress_reporter(total_env_steps: int) -> LineProgress | BarProgress:
    """A bar when stdout is a terminal, plain lines otherwise."""
    if sys.stdout.isatty():
        return BarProgress(total_env_steps)
    return LineProgress()
