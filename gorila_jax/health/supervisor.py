"""The supervisor: finds dead, silent and stalled nodes from the monitor's reports
(`monitor.py`) and replaces them through the launcher."""

import logging
import math
import time
from typing import Any, Callable

from gorila_jax.distributed import program as program_lib


class RunFailed(RuntimeError):
    """The run cannot go on: a node failed and may not (or cannot) be restarted."""


class Supervisor:
    """Finds dead, silent and stalled nodes, and restarts them through the launcher.

    Called from the driver's loop. A node is
      dead     when the launcher reports its process gone, or its constructor
               or `run` raised;
      silent   when no heartbeat came for `heartbeat_timeout_s` (counted from
               when its current incarnation was built);
      stalled  when it heartbeats but none of its counters moved for
               `stall_timeout_s` (0 disables) of time in which other nodes'
               did (the time since the previous check counts if another
               node moved since the one before it), or it never moved within
               `startup_timeout_s` of being built.
    Silence and stalls are judged for nodes whose spec is `restartable`
    only; a death, for every node. A faulty restartable node is replaced by
    a fresh one (`RunningProgram.kill`, then `RunningProgram.restart`) with
    the spec's `restart_kwargs` of the last counters it reported before the
    kill, at most `max_restarts` times; then, or for a node that cannot be
    restarted, `check` raises `RunFailed` with the reason. A
    node of a restart group (`Program.restart_together`) is replaced with
    every member of its group, each counting one restart. Stall checks pause
    for `stall_timeout_s` after any restart: while a learner restarts, actors
    wait on the replay's rate limiter and are not at fault. Nodes added to the
    running program later are watched from the next check on, like new ones;
    removed nodes are forgotten (never restarted).

    Args:
      running: the launched program.
      monitor: client of the monitor node.
      heartbeat_timeout_s, stall_timeout_s, max_restarts: as above.
      startup_timeout_s: how long a node may take to be built and to first
        move its counters.
      clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        running: Any,
        monitor: program_lib.Client,
        heartbeat_timeout_s: float,
        stall_timeout_s: float,
        max_restarts: int,
        startup_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._running, self._monitor = running, monitor
        self._heartbeat_timeout_s, self._stall_timeout_s = heartbeat_timeout_s, stall_timeout_s
        self._max_restarts, self._startup_timeout_s = max_restarts, startup_timeout_s
        self._clock = clock
        now = clock()
        self._specs = {spec.name: spec for spec in self._active_specs()}
        self.restarts: dict[str, int] = {name: 0 for name in self._specs}
        self._started_at = {name: now for name in self._specs}
        self._built_at: dict[str, float] = {}
        self._counters: dict[str, dict[str, float]] = {}
        self._moved_at: dict[str, float] = {}
        self._beating: set[str] = set()  # nodes that heartbeat (once one did, always)
        self._last_restart = -math.inf
        self._stalled_for: dict[str, float] = {}  # flat seconds while others moved
        self._previous_check = -math.inf

    def check(self) -> list[str]:
        """Restarts every faulty node; returns what it did, one line per restart.

        Raises:
          RunFailed: a node is faulty and may not be restarted (again).
        """
        now = self._clock()
        self._follow_membership(now)
        failures = self._running.failures()
        status = self._monitor.node_status()
        done = []
        replaced: set[str] = set()  # a restart group's members are replaced once per check
        for name, spec in self._specs.items():
            if name in replaced:
                continue
            if spec.restart_kwargs is None:
                # Only a restartable node's heartbeats are judged; any node's death is.
                fault = None if name not in failures else f"died ({failures[name]})"
            else:
                fault = self._fault(name, failures.get(name), status.get(name), now)
            if fault is not None:
                # A node restarted together with others (`Program.restart_together`)
                # takes all of them along, in their order; the faulty one names the reason.
                members = [m for m in spec.restart_group if m in self._specs] or [name]
                for member in members:  # refuse before replacing any of them
                    self._refuse_restart(member, fault if member == name else f"({name} {fault})")
                for member in members:
                    self._kill(member, fault)
                # Read after the kills: a member still alive when `status` was
                # taken may have reported a later count since.
                final = self._monitor.node_status()
                for member in members:
                    reason = fault if member == name else f"replaced with {name}, which {fault}"
                    counters = (final.get(member) or {}).get("counters", {})
                    done.append(self._restart(member, reason, counters))
                replaced.update(members)
        self._previous_check = now
        return done

    def _active_specs(self) -> list[program_lib.NodeSpec]:
        active_nodes = getattr(self._running, "active_nodes", None)  # launchers that add/remove
        return active_nodes() if active_nodes is not None else self._running.program.nodes

    def _follow_membership(self, now: float) -> None:
        """Starts watching nodes added since the last check; forgets removed ones."""
        active = self._active_specs()
        for spec in active:
            if spec.name not in self._specs:
                self._specs[spec.name] = spec
                self.restarts[spec.name] = 0
                self._started_at[spec.name] = now
        names = {spec.name for spec in active}
        for name in [name for name in self._specs if name not in names]:
            del self._specs[name]
            for table in (
                self.restarts,
                self._started_at,
                self._built_at,
                self._counters,
                self._moved_at,
                self._stalled_for,
            ):
                table.pop(name, None)
            self._beating.discard(name)

    def _fault(self, name: str, failure: str | None, status: dict | None, now: float) -> str | None:
        if failure is not None:
            return f"died ({failure})"
        if name not in self._built_at:
            if not self._running.is_built(name):
                if now - self._started_at[name] > self._startup_timeout_s:
                    return f"not built within startup_timeout_s={self._startup_timeout_s:g}"
                return None
            self._built_at[name] = now
        alive_for = now - self._built_at[name]
        if status is None:
            # Nodes without a work loop (replay, monitor) never report: only
            # their process is watched. A node that did report must go on.
            if name in self._beating and self._heartbeat_timeout_s:
                if alive_for > self._heartbeat_timeout_s:
                    return f"silent: no heartbeat for {alive_for:.1f}s (heartbeat_timeout_s)"
            return None
        self._beating.add(name)
        silent = min(status["since_report_s"], alive_for)
        if self._heartbeat_timeout_s and silent > self._heartbeat_timeout_s:
            return f"silent: no heartbeat for {silent:.1f}s (heartbeat_timeout_s)"
        counters = status["counters"]
        # At the first look, movement is measured from this incarnation's first beat:
        # work done (and a hang come) between two looks still counts as having moved.
        previous = self._counters.get(name, status.get("first_counters"))
        self._counters[name] = counters
        if previous is not None and _grew(counters, previous):
            self._moved_at[name] = now
            self._stalled_for.pop(name, None)
        if not self._stall_timeout_s:
            return None
        if name not in self._moved_at:
            # Building, compiling, filling the replay: up to startup_timeout_s.
            if alive_for > max(self._stall_timeout_s, self._startup_timeout_s):
                return f"stalled: no counter moved in {alive_for:.1f}s since it started"
            return None
        flat_since = max(self._moved_at[name], self._last_restart)
        others_moved = max(
            (t for other, t in self._moved_at.items() if other != name), default=-math.inf
        )
        # Only a node that stands still while the rest of the program moves is at fault,
        # and only for the time the rest moved. When all stand still (a learner compiling,
        # actors held by the rate limiter meanwhile) nobody is; and an actor so held moves
        # a heartbeat after the learner does: a check between the two must not see 15 s of
        # its standing still against the learner's first step (CI, 2026-12-04).
        if others_moved >= self._previous_check:
            counted_from = max(self._previous_check, flat_since)
            stalled = self._stalled_for.get(name, 0.0) + max(now - counted_from, 0.0)
            self._stalled_for[name] = stalled
        stalled = self._stalled_for.get(name, 0.0)
        if stalled > self._stall_timeout_s:
            return (
                f"stalled: alive but no counter moved in {stalled:.1f}s of other nodes' work "
                "(stall_timeout_s)"
            )
        return None

    def _refuse_restart(self, name: str, fault: str) -> None:
        """Raises RunFailed if node `name` may not be restarted (again)."""
        if self._specs[name].restart_kwargs is None:
            raise RunFailed(f"node {name} {fault}; it cannot be restarted, so the run stops")
        if self.restarts[name] >= self._max_restarts:
            raise RunFailed(
                f"node {name} {fault}; it was restarted {self.restarts[name]} times already "
                f"(max_restarts={self._max_restarts}), so the run stops"
            )

    def _kill(self, name: str, fault: str) -> None:
        try:
            self._running.kill(name)
        except NotImplementedError as error:
            raise RunFailed(f"node {name} {fault}; {error}") from None

    def _restart(self, name: str, fault: str, counters: dict[str, float]) -> str:
        """Replaces node `name`; `check` has asked `_refuse_restart` for it (and its group)."""
        spec = self._specs[name]
        try:
            self._running.restart(name, spec.restart_kwargs(counters))
        except NotImplementedError as error:
            raise RunFailed(f"node {name} {fault}; {error}") from None
        self.restarts[name] += 1
        self._monitor.record_restart(name, fault)
        now = self._clock()
        self._started_at[name] = now
        self._built_at.pop(name, None)
        self._counters.pop(name, None)
        self._moved_at.pop(name, None)
        self._last_restart = now
        self._stalled_for.clear()  # every node gets stall_timeout_s anew (class docstring)
        line = f"restarted {name} ({self.restarts[name]}/{self._max_restarts}): {fault}"
        logging.warning(line)
        return line


def _grew(counters: dict[str, float], previous: dict[str, float]) -> bool:
    """Whether a counter rose since the previous beat: work done. A change is not enough,
    nor a rise from a negative "none yet": a replacement actor reports its parameter
    version as -1 until it has fetched parameters; read as movement, that ran its stall
    timeout (not its start-up allowance) while it was still compiling, and a loaded
    machine's healthy replacement was replaced again."""
    return any(
        value > previous.get(name, -math.inf) and previous.get(name, 0) >= 0
        for name, value in counters.items()
    )
