"""The monitor node, node heartbeats, and the supervisor that restarts faulty nodes.

Every node reports its counters here; the driver reads one snapshot.
Reports carry cumulative counters, so a lost report loses nothing. Nodes
with a work loop also send them from a `Heartbeat` thread, so the time of a
node's last report says whether its process lives, and its counters say
whether its loop still makes progress. The driver's `Supervisor` reads both
and, through the launcher, replaces dead, silent and stalled nodes.
"""

import collections
import logging
import math
import os
import threading
import time
from typing import Any, Callable

from gorila_jax.distributed import program as program_lib


class MonitorNode:
    """Aggregates counters, metrics, training and evaluation returns.

    Args:
      return_window: finished training episodes that the mean return covers.
      restored: what `checkpoint_state` returned when the run was checkpointed;
        counters, returns, evaluations and the latest metrics continue from
        there (a resumed run's first rows show the checkpoint's metrics until
        each node reports again). Counters of nodes that the resumed program
        lacks (fewer actors) stay in the totals.
    """

    def __init__(self, return_window: int = 100, restored: dict[str, Any] | None = None):
        restored = restored or {}
        self._lock = threading.Lock()
        self._counters: dict[str, dict[str, float]] = dict(restored.get("node_counters", {}))
        self._last_seen: dict[str, float] = {}
        self._pids: dict[str, int] = {}  # process of each heartbeating node, for operators
        self._metrics: dict[str, float] = dict(restored.get("metrics", {}))
        self._returns: collections.deque = collections.deque(
            restored.get("recent_returns", []), maxlen=return_window
        )
        self._evals: list[dict[str, float]] = list(restored.get("evaluations", []))
        self._restarts: list[dict[str, Any]] = list(restored.get("restarts", []))
        self._retired: set[str] = set()  # removed nodes: their last counters stay in the totals

    def report(
        self,
        name: str,
        counters: dict[str, float],
        metrics: dict[str, float] | None = None,
        episode_returns: list[float] | None = None,
        pid: int | None = None,
    ) -> None:
        with self._lock:
            if name in self._retired:
                return  # a late beat of a removed node must not move its final counters
            if pid is not None:
                self._pids[name] = pid
            self._counters[name] = dict(counters)
            self._last_seen[name] = time.monotonic()
            self._metrics.update(metrics or {})
            self._returns.extend(episode_returns or [])

    def node_status(self) -> dict[str, dict[str, Any]]:
        """Per reporting node: seconds since its last report, and its latest counters."""
        now = time.monotonic()
        with self._lock:
            return {
                name: {
                    "since_report_s": now - seen,
                    "counters": dict(self._counters[name]),
                    "pid": self._pids.get(name),
                }
                for name, seen in self._last_seen.items()
            }

    def record_restart(self, name: str, reason: str) -> None:
        """Notes that the supervisor replaced node `name`, and why."""
        with self._lock:
            self._restarts.append({"node": name, "reason": reason, "unix_time": time.time()})
            self._last_seen.pop(name, None)  # the old incarnation's heartbeats say nothing now

    def retire(self, name: str) -> None:
        """Notes that node `name` was removed from the run (after its final report).

        Its counters stay in the totals, so no total goes backwards; it is no
        longer listed in `node_status`, and reports still in flight from it
        are ignored.
        """
        with self._lock:
            self._retired.add(name)
            self._last_seen.pop(name, None)

    def node_counters(self) -> dict[str, dict[str, float]]:
        """The latest counters of every node that ever reported, removed ones included."""
        with self._lock:
            return {name: dict(counters) for name, counters in self._counters.items()}

    def restarts(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._restarts)

    def report_eval(self, returns: list[float], param_version: int) -> None:
        """Records one greedy evaluation at the current env-step count."""
        with self._lock:
            self._evals.append(
                {
                    "env_steps": self._total("env_steps"),
                    "learner_steps": self._total("learner_steps"),
                    "param_version": param_version,
                    "eval_return": float(sum(returns) / len(returns)),
                    "num_episodes": len(returns),
                    "unix_time": time.time(),
                }
            )

    def _total(self, counter: str) -> float:
        return sum(c.get(counter, 0) for c in self._counters.values())

    def snapshot(self) -> dict[str, Any]:
        """Totals over nodes, the latest metrics and evaluation, seconds since each report."""
        now = time.monotonic()
        with self._lock:
            last_eval = self._evals[-1] if self._evals else {}
            return {
                "env_steps": int(self._total("env_steps")),
                "episodes": int(self._total("episodes")),
                "learner_steps": int(self._total("learner_steps")),
                "mean_return": (
                    sum(self._returns) / len(self._returns) if self._returns else math.nan
                ),
                "eval_return": last_eval.get("eval_return", math.nan),
                "num_evals": len(self._evals),
                "metrics": dict(self._metrics),
                "since_report_s": {name: now - t for name, t in self._last_seen.items()},
                "restarts": len(self._restarts),
            }

    def evaluations(self) -> list[dict[str, float]]:
        with self._lock:
            return list(self._evals)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitor (JSON): counters, recent returns, evaluations."""
        with self._lock:
            return {
                "node_counters": {name: dict(c) for name, c in self._counters.items()},
                "metrics": dict(self._metrics),
                "recent_returns": list(self._returns),
                "evaluations": list(self._evals),
                "restarts": list(self._restarts),
            }


def continue_counters(counters: dict[str, float]) -> dict[str, Any]:
    """Restart kwargs of a node that picks up its counters where its predecessor left them."""
    return {"restored_counters": {name: int(value) for name, value in counters.items()}}


class Heartbeat:
    """Sends a node's counters to the monitor every `interval_s`, from a thread of its own.

    Apart from the node's work loop on purpose: a loop stuck in a hung
    environment still heartbeats, with counters that no longer move, which
    the supervisor tells apart from a dead process. With `metrics`, each beat
    also carries `metrics(counters)`, made from the same counters, so a
    metric derived from a counter never lags it in the monitor.
    """

    def __init__(
        self,
        monitor: program_lib.Client | None,
        name: str,
        counters: Callable[[], dict[str, float]],
        interval_s: float,
        metrics: Callable[[dict[str, float]], dict[str, float]] | None = None,
    ):
        self._monitor, self._name, self._counters = monitor, name, counters
        self._metrics = metrics
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> "Heartbeat":
        if self._monitor is not None:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                counters = self._counters()
                metrics = self._metrics(counters) if self._metrics is not None else None
                self._monitor.report(self._name, counters, metrics=metrics, pid=os.getpid())
            except Exception:  # noqa: BLE001  a monitor that is away misses one beat
                logging.warning("%s: heartbeat to the monitor failed", self._name, exc_info=True)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ends the thread and waits for a beat in flight, `timeout_s` at most: a node's
        threads end before the node is closed and the process exits."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logging.warning("%s: heartbeat thread still running after stop", self._name)


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
               `stall_timeout_s` (0 disables) while another node's did move
               in that time, or it never moved within `startup_timeout_s`
               of being built.
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
        previous = self._counters.get(name)
        self._counters[name] = counters
        if previous is not None and counters != previous:
            self._moved_at[name] = now
        if not self._stall_timeout_s:
            return None
        if name not in self._moved_at:
            # Building, compiling, filling the replay: up to startup_timeout_s.
            if alive_for > max(self._stall_timeout_s, self._startup_timeout_s):
                return f"stalled: no counter moved in {alive_for:.1f}s since it started"
            return None
        flat = now - max(self._moved_at[name], self._last_restart)
        others_moved = max(
            (t for other, t in self._moved_at.items() if other != name), default=-math.inf
        )
        # Only a node that stands still while the rest of the program moves is
        # at fault; when all stand still (a learner compiling, actors held by
        # the rate limiter meanwhile) nobody is.
        if flat > self._stall_timeout_s and others_moved >= now - self._stall_timeout_s:
            return f"stalled: alive but no counter moved for {flat:.1f}s (stall_timeout_s)"
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
        line = f"restarted {name} ({self.restarts[name]}/{self._max_restarts}): {fault}"
        logging.warning(line)
        return line
