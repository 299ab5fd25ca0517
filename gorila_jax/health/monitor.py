"""The monitor node and node heartbeats.

Every node reports its counters here; the driver reads one snapshot.
Reports carry cumulative counters, so a lost report loses nothing. Nodes
with a work loop also send them from a `Heartbeat` thread, so the time of a
node's last report says whether its process lives, and its counters say
whether its loop still makes progress. The driver's `supervisor.Supervisor`
reads both and, through the launcher, replaces dead, silent and stalled nodes.
"""

import collections
import logging
import math
import os
import threading
import time
from typing import Any, Callable

from gorila_jax.distributed import program as program_lib

# Seconds between a node's heartbeats unless the run sets --heartbeat_interval: every
# node's default, and the run's.
HEARTBEAT_INTERVAL_S = 1.0


class MonitorNode:
    """Aggregates counters, metrics, training and evaluation returns.

    Args:
      return_window: finished training episodes that the mean return covers.
      restored: what `checkpoint_state` returned when the run was checkpointed;
        counters, returns, evaluations and the latest metrics continue from
        there (a resumed run's first rows show the checkpoint's metrics until
        each node reports again). Counters of nodes that the resumed program
        lacks (fewer actors) stay in the totals.
      roles: the roles of a program of role groups (docs/multiagent.md). The
        snapshot then has each role's figures: the learner steps of the nodes
        in its groups (`program.node_role`), its actors' env steps and episodes
        (counters `env_steps@<role>`, `episodes@<role>`), its training and
        evaluation returns; a role's nodes' metrics are kept as `<role>/<name>`.
    """

    def __init__(
        self,
        return_window: int = 100,
        restored: dict[str, Any] | None = None,
        roles: tuple[str, ...] = (),
    ):
        restored = restored or {}
        self._lock = threading.Lock()
        self._counters: dict[str, dict[str, float]] = dict(restored.get("node_counters", {}))
        self._last_seen: dict[str, float] = {}
        self._first_counters: dict[str, dict[str, float]] = {}
        self._pids: dict[str, int] = {}  # process of each heartbeating node, for operators
        # The process of each node's replaced incarnation: a beat it sends after the
        # supervisor replaced it (its kill takes effect later) is not the replacement's.
        self._replaced_pids: dict[str, int | None] = {}
        self._metrics: dict[str, float] = dict(restored.get("metrics", {}))
        self._returns: collections.deque = collections.deque(
            restored.get("recent_returns", []), maxlen=return_window
        )
        self._evals: list[dict[str, float]] = list(restored.get("evaluations", []))
        self._restarts: list[dict[str, Any]] = list(restored.get("restarts", []))
        self._retired: set[str] = set()  # removed nodes: their last counters stay in the totals
        self._roles = tuple(roles)
        restored_role_returns = restored.get("role_returns", {})
        self._role_returns = {
            role: collections.deque(restored_role_returns.get(role, []), maxlen=return_window)
            for role in self._roles
        }

    def report(
        self,
        name: str,
        counters: dict[str, float],
        metrics: dict[str, float] | None = None,
        episode_returns: list[float] | None = None,
        pid: int | None = None,
        role_returns: dict[str, list[float]] | None = None,
    ) -> None:
        """Takes node `name`'s cumulative counters, its latest metrics, and the returns of
        episodes it finished since its last report (by role for an actor of several roles)."""
        role = program_lib.node_role(name)
        if role is not None and metrics:
            metrics = {f"{role}/{key}": value for key, value in metrics.items()}
        with self._lock:
            if name in self._retired:
                return  # a late beat of a removed node must not move its final counters
            if pid is not None and pid == self._replaced_pids.get(name):
                return
            if pid is not None:
                self._pids[name] = pid
            if name not in self._last_seen:  # this incarnation's first beat
                self._first_counters[name] = dict(counters)
            self._counters[name] = dict(counters)
            self._last_seen[name] = time.monotonic()
            self._metrics.update(metrics or {})
            self._returns.extend(episode_returns or [])
            for returns_role, returns in (role_returns or {}).items():
                self._role_returns[returns_role].extend(returns)

    def node_status(self) -> dict[str, dict[str, Any]]:
        """Per reporting node: seconds since its last report, its latest counters, and
        those of its first report since it was (re)started: the supervisor measures
        movement from there, so work done before it first looked counts."""
        now = time.monotonic()
        with self._lock:
            return {
                name: {
                    "since_report_s": now - seen,
                    "counters": dict(self._counters[name]),
                    "first_counters": dict(self._first_counters[name]),
                    "pid": self._pids.get(name),
                }
                for name, seen in self._last_seen.items()
            }

    def record_restart(self, name: str, reason: str) -> None:
        """Notes that the supervisor replaced node `name`, and why."""
        with self._lock:
            self._restarts.append({"node": name, "reason": reason, "unix_time": time.time()})
            self._last_seen.pop(name, None)  # the old incarnation's heartbeats say nothing now
            self._replaced_pids[name] = self._pids.pop(name, None)

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

    def report_eval(
        self, returns: list[float], param_version: int, role: str | None = None
    ) -> None:
        """Records one greedy evaluation at the current env-step count (of `role`'s policy)."""
        with self._lock:
            record = {
                "env_steps": self._total("env_steps"),
                "learner_steps": self._total("learner_steps"),
                "param_version": param_version,
                "eval_return": float(sum(returns) / len(returns)),
                "num_episodes": len(returns),
                "unix_time": time.time(),
            }
            self._evals.append(record if role is None else {**record, "role": role})

    def _total(self, counter: str, role: str | None = None) -> float:
        """`counter` summed over nodes (over the nodes of `role`'s groups only, with `role`)."""
        return sum(
            c.get(counter, 0)
            for name, c in self._counters.items()
            if role is None or program_lib.node_role(name) == role
        )

    def _role_figures(self) -> dict[str, dict[str, float]]:
        figures = {}
        for role in self._roles:
            returns = self._role_returns[role]
            evals = [e for e in self._evals if e.get("role") == role]
            figures[role] = {
                "env_steps": int(self._total(f"env_steps{program_lib.ROLE_MARK}{role}")),
                "episodes": int(self._total(f"episodes{program_lib.ROLE_MARK}{role}")),
                "learner_steps": int(self._total("learner_steps", role)),
                "mean_return": sum(returns) / len(returns) if returns else math.nan,
                "eval_return": evals[-1]["eval_return"] if evals else math.nan,
            }
        return figures

    def snapshot(self) -> dict[str, Any]:
        """Totals over nodes, the latest metrics and evaluation, seconds since each report."""
        now = time.monotonic()
        with self._lock:
            last_eval = next((e for e in reversed(self._evals) if "role" not in e), {})
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
                "roles": self._role_figures(),
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
                "role_returns": {role: list(r) for role, r in self._role_returns.items()},
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
        # The first beat goes at once: the counters a node starts from are the
        # supervisor's baseline, so a node that works and then hangs before a
        # later beat shows as having moved (and then stalled), not as never started.
        while True:
            try:
                counters = self._counters()
                metrics = self._metrics(counters) if self._metrics is not None else None
                self._monitor.report(self._name, counters, metrics=metrics, pid=os.getpid())
            except Exception:  # noqa: BLE001  a monitor that is away misses one beat
                logging.warning("%s: heartbeat to the monitor failed", self._name, exc_info=True)
            if self._stop.wait(self._interval_s):
                return

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ends the thread and waits for a beat in flight, `timeout_s` at most: a node's
        threads end before the node is closed and the process exits."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logging.warning("%s: heartbeat thread still running after stop", self._name)
