"""A run's hold on its logdir: one run at a time, and an earlier run never lost to a new one.

`hold` locks the logdir for the run's life with an OS lock (`flock`), which the kernel
drops when the holding process dies, kill -9 included: no stale lock to clear by hand.
A second run there is refused, naming the holder.

`set_aside` moves the earlier run's files out of the way of a new run (not `--resume`)
into `<logdir>/previous-<time>/`, whole and resumable on its own. `PreviousRun.settle`
deletes them once the new run has a checkpoint or a summary, and otherwise (a run that
failed before either) moves the new run's files to `<logdir>/failed-<time>/` and the
earlier run's back.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from typing import Iterator

LOCK_FILE = ".run.lock"
PREVIOUS_PREFIX = "previous-"
FAILED_PREFIX = "failed-"
# What a run writes in its logdir that is not the run's own record: the lock, and the
# third-party log, which the CLI opens (appending) before the run starts.
_STAYS = (LOCK_FILE, "third_party.log")
# What marks a logdir as holding a run: its configs, metrics, summary or checkpoints.
_RUN_FILES = ("config.json", "metrics.csv", "summary.json", "checkpoints", "roles")

_held: dict[str, int] = {}  # real path -> how many holds this process has on it


class LogdirInUse(RuntimeError):
    """Another run holds the logdir."""


def _holder(path: str) -> str:
    try:
        with open(path) as f:
            holder = json.load(f)
        started = datetime.datetime.fromtimestamp(holder["started"]).strftime("%Y-%m-%d %H:%M:%S")
        return f"pid {holder['pid']} on {holder['host']}, started {started}: {holder['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that has not yet said who it is"


@contextlib.contextmanager
def hold(logdir: str) -> Iterator[None]:
    """Holds `logdir` for the block: the one run writing there.

    A process may hold a logdir it already holds (the CLI holds it before its log file
    opens, then `run_experiment` within).

    Raises:
      LogdirInUse: another process holds it, named in the message.
    """
    os.makedirs(logdir, exist_ok=True)
    key = os.path.realpath(logdir)
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    path = os.path.join(logdir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogdirInUse(
            f"{logdir} is in use by another run ({_holder(path)}); wait for it to end, "
            "or pass another --logdir"
        ) from None
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(me).encode())
    _held[key] = 1
    try:
        yield
    finally:
        del _held[key]
        os.close(fd)  # the lock goes with the last descriptor


# The deepest path a run writes under its logdir is about 100 characters
# (checkpoints/replay/shard_<k>/<step>/<table>/... and roles/<role>/...): a logdir
# that leaves less than this under the system's path limit fails at a save, maybe the
# final one, after the whole run.
PATH_ROOM = 256


def check_writable(logdir: str) -> None:
    """Refuses a logdir a run cannot write, without creating or changing anything.

    Raises:
      ValueError: empty, a file, in a folder that cannot be written (read-only, no
        permission), a name over the file system's limit, or a path too long for the
        run's files under it.
    """
    if not logdir:
        raise ValueError("logdir must not be empty")
    path = os.path.abspath(logdir)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"logdir {logdir}: {existing} is a file, not a folder")
    name_max = os.pathconf(existing, "PC_NAME_MAX")
    path_max = os.pathconf(existing, "PC_PATH_MAX")
    for part in path.split(os.sep):
        if len(part.encode()) > name_max:
            raise ValueError(
                f"logdir {logdir[:80]}...: a folder name of {len(part.encode())} bytes, over "
                f"the file system's {name_max}"
            )
    if len(path.encode()) + PATH_ROOM > path_max:
        raise ValueError(
            f"logdir {logdir[:80]}...: {len(path.encode())} bytes long, and the run's files "
            f"under it need up to {PATH_ROOM} more, over the system's {path_max}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"logdir {logdir}: cannot write in {existing} (read-only or no permission)"
        )
    lock = os.path.join(path, LOCK_FILE)
    if os.path.exists(lock) and not os.access(lock, os.W_OK):
        raise ValueError(f"logdir {logdir}: cannot write its lock file {LOCK_FILE}")


def holds_a_run(logdir: str) -> bool:
    """Whether `logdir` has an earlier run's files (its configs, metrics or checkpoints)."""
    return any(os.path.exists(os.path.join(logdir, name)) for name in _RUN_FILES)


def _own_entries(logdir: str) -> list[str]:
    """The run's entries in `logdir`: all but the lock, the third-party log and the runs
    set aside or failed."""
    return sorted(
        name
        for name in os.listdir(logdir)
        if name not in _STAYS and not name.startswith((PREVIOUS_PREFIX, FAILED_PREFIX))
    )


def _move_entries(names: list[str], source: str, destination: str) -> None:
    os.makedirs(destination, exist_ok=True)
    for name in names:
        os.replace(os.path.join(source, name), os.path.join(destination, name))


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


class PreviousRun:
    """An earlier run set aside in `<logdir>/previous-<time>/` while a new run starts."""

    def __init__(self, logdir: str, aside: str):
        self.logdir = logdir
        self.aside = aside

    def superseded(self, new_run_saved: bool) -> bool:
        """Deletes the earlier run once the new one has saved (a checkpoint or its summary);
        returns whether it is gone."""
        if new_run_saved and os.path.isdir(self.aside):
            shutil.rmtree(self.aside)
            print(f"deleted the run set aside in {self.aside}: this run has saved", flush=True)
        return not os.path.isdir(self.aside)

    def settle(self, new_run_saved: bool) -> None:
        """At the end of the new run: delete the earlier run if the new one saved; else put
        it back, with the new run's files moved to `<logdir>/failed-<time>/`."""
        if self.superseded(new_run_saved):
            return
        failed = os.path.join(self.logdir, FAILED_PREFIX + _stamp())
        _move_entries(_own_entries(self.logdir), self.logdir, failed)
        _move_entries(sorted(os.listdir(self.aside)), self.aside, self.logdir)
        os.rmdir(self.aside)
        print(
            f"this run saved nothing: the run there before is back in {self.logdir}, "
            f"this run's files are in {failed}",
            flush=True,
        )


def set_aside(logdir: str) -> PreviousRun | None:
    """Moves an earlier run's files in `logdir` to `<logdir>/previous-<time>/` (None: none)."""
    if not (os.path.isdir(logdir) and holds_a_run(logdir)):
        return None
    aside = os.path.join(logdir, PREVIOUS_PREFIX + _stamp())
    _move_entries(_own_entries(logdir), logdir, aside)
    print(
        f"warning: starting a new run in {logdir}: the run there before is set aside in "
        f"{aside} and deleted once this run saves a checkpoint (pass --resume to continue "
        "it instead)",
        flush=True,
    )
    return PreviousRun(logdir, aside)
