"""The monitor node: every node reports its counters here; the driver reads one snapshot.

Reports carry cumulative counters, so a lost report loses nothing; the time
of each node's last report is what later heartbeat checks build on.
"""

import collections
import math
import threading
import time
from typing import Any


class MonitorNode:
    """Aggregates counters, metrics, training and evaluation returns.

    Args:
      return_window: finished training episodes that the mean return covers.
      restored: what `checkpoint_state` returned when the run was checkpointed;
        counters, returns and evaluations continue from there. Counters of
        nodes that the resumed program lacks (fewer actors) stay in the totals.
    """

    def __init__(self, return_window: int = 100, restored: dict[str, Any] | None = None):
        restored = restored or {}
        self._lock = threading.Lock()
        self._counters: dict[str, dict[str, float]] = dict(restored.get("node_counters", {}))
        self._last_seen: dict[str, float] = {}
        self._metrics: dict[str, float] = {}
        self._returns: collections.deque = collections.deque(
            restored.get("recent_returns", []), maxlen=return_window
        )
        self._evals: list[dict[str, float]] = list(restored.get("evaluations", []))

    def report(
        self,
        name: str,
        counters: dict[str, float],
        metrics: dict[str, float] | None = None,
        episode_returns: list[float] | None = None,
    ) -> None:
        with self._lock:
            self._counters[name] = dict(counters)
            self._last_seen[name] = time.monotonic()
            self._metrics.update(metrics or {})
            self._returns.extend(episode_returns or [])

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
            }

    def evaluations(self) -> list[dict[str, float]]:
        with self._lock:
            return list(self._evals)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitor (JSON): counters, recent returns, evaluations."""
        with self._lock:
            return {
                "node_counters": {name: dict(c) for name, c in self._counters.items()},
                "recent_returns": list(self._returns),
                "evaluations": list(self._evals),
            }
