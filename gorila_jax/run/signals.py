"""Ctrl-C and SIGTERM during a run: the first stops it cleanly, with its final checkpoint."""

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator


class Terminated(KeyboardInterrupt):
    """The run was stopped by SIGTERM: as by Ctrl-C, but the CLI exits 143 (128 + 15)."""


class RunSignals:
    """Ctrl-C and SIGTERM while the run is on: the first asks the driver to stop the run
    (`requested`, seen at its next poll). One more of either, or the first once the run
    stops by itself (`stopping`), is said and ignored (a key pressed twice), so the final
    checkpoint and the summary are still written; the next one aborts them, as
    KeyboardInterrupt (SIGTERM as `Terminated`).

    The first does not raise: an exception at whatever point the main thread was (inside
    a client call, holding a lock of a thread pool) could leave that state half done; a
    run stopped so once wrote its summary and then never exited.
    """

    def __init__(self):
        self.received: list[int] = []
        self.stopping = False
        self._ignored = False

    @property
    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return bool(self.received)

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if len(self.received) == 1 and not self.stopping:
            return
        if not self._ignored:
            self._ignored = True
            print(
                "stopping already: the final checkpoint and summary come first "
                "(one more Ctrl-C aborts them)",
                file=sys.stderr,
                flush=True,
            )
            return
        if signum == signal.SIGTERM:
            raise Terminated(f"signal {signum}")
        raise KeyboardInterrupt(f"signal {signum}")

    @property
    def terminated(self) -> bool:
        """Whether the run was stopped by SIGTERM (the CLI then exits 143, not 130)."""
        return bool(self.received) and self.received[0] == signal.SIGTERM


@contextlib.contextmanager
def run_signals() -> Iterator[RunSignals]:
    """`RunSignals` handles SIGINT and SIGTERM for the block (from the main thread only:
    signal handlers cannot be installed from others)."""
    signals = RunSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {
        number: signal.signal(number, signals) for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield signals
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
