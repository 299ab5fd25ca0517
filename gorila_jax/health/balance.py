"""Data balance: each actor's share of the data inserted into and sampled from replay.

One actor that feeds much more than the others (more or faster envs, a
cheap stretch of its environment) biases what the learner sees: the brief's
"data bias". Two shares are measured per actor, over the same windows:

- inserted: from the env-step counters actors already send in their
  heartbeats. An actor writes one replay item per valid env step (n-step
  transitions) or one per `T` steps of each env (trajectories), so its share
  of env steps is its share of inserted items, up to the few in flight.
- sampled: every packed item names the actor that wrote it
  (`replay.ItemCodec`'s source trailer); each learner (the synchronous
  learner's processes, Gorila's gradient workers) counts the rows it trains
  on per actor (`SampledRows`) and reports the counts as counters
  `sampled/actor/<i>`. An actor's sampled share is its rows over all rows the
  learners sampled in the window (removed actors' items still in replay, and
  items written without a source, count in the total only).

An actor whose inserted share exceeds balance_factor / (acting actors) is
reported. Remedies (`REMEDIES`, `balance_remedy`):

- "report": nothing more.
- "replace": after PERSISTENT_WINDOWS windows in a row, the actor is
  replaced by a fresh one with a new seed (gorila_jax/run/elastic.py).
- "downweight": after PERSISTENT_WINDOWS windows in a row, the learners
  multiply the priorities they write back for that actor's items by
  `balance_weight`, for as long as it keeps dominating the inserted data. A
  prioritized table then samples its items less (by balance_weight **
  priority_exponent per item, once each has been sampled and re-prioritized
  once; new items enter with the writer's initial priority). Importance
  weights follow, as they come from Reverb's sampling probabilities: with
  full correction (beta = 1) the expected update is that of the unweighted
  table, so the remedy trades the actor's share of the samples (less
  repetition of its data) for larger importance weights on its rows.
  Uniform and queue tables have no priorities: the combination is refused
  (`check_remedy`).
"""

import math
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from gorila_jax import replay

COUNTER = "env_steps"
# Consecutive windows an actor must dominate before a remedy acts on it (`persistent`):
# one window can be skewed by a peer that was restarting meanwhile.
PERSISTENT_WINDOWS = 2
REMEDIES = ("report", "replace", "downweight")
# A learner's counter of the rows it sampled from actor "actor/<i>" is "sampled/actor/<i>";
# rows of items written without a source count as "sampled/unknown", demonstration rows
# (`replay.MixedSampler`) as "sampled/demo".
SAMPLED_PREFIX = "sampled/"
UNKNOWN_SOURCE_COUNTER = SAMPLED_PREFIX + "unknown"
DEMO_COUNTER = SAMPLED_PREFIX + "demo"
_SOURCE_COUNTERS = {replay.UNKNOWN_SOURCE: UNKNOWN_SOURCE_COUNTER, replay.DEMO_SOURCE: DEMO_COUNTER}


def sampled_counter(actor: str) -> str:
    """The learners' counter of the rows sampled from `actor` (a node name, "actor/<i>")."""
    return SAMPLED_PREFIX + actor


def actor_index(actor: str) -> int:
    """The index of actor node `actor` ("actor/<i>", as gorila_jax/acting/actor.py names it)."""
    return int(actor.rsplit("/", 1)[1])


def shares(amounts: dict[str, float]) -> dict[str, float]:
    """Each name's fraction of the total (empty when the total is not positive)."""
    total = sum(amounts.values())
    if total <= 0:
        return {}
    return {name: amount / total for name, amount in amounts.items()}


def share_limit(num_actors: int, factor: float) -> float:
    """The share above which one of `num_actors` actors dominates: factor x (1 / num_actors)."""
    return factor / num_actors


def dominant(actor_shares: dict[str, float], factor: float) -> dict[str, float]:
    """The actors whose share exceeds `share_limit`; none while fewer than two actors act."""
    if len(actor_shares) < 2:
        return {}
    limit = share_limit(len(actor_shares), factor)
    return {name: share for name, share in actor_shares.items() if share > limit}


class BalanceReport(NamedTuple):
    """One measurement window.

    Attributes:
      shares: each active actor's share of the window's env steps (inserted data).
      dominant: the actors (with their inserted share) above `limit`.
      limit: factor / number of active actors.
      env_steps: env steps of all active actors in the window.
      persistent: the dominant actors that dominated the previous
        PERSISTENT_WINDOWS - 1 windows too (the ones a remedy acts on).
      sample_shares: each active actor's share of the rows all learners
        sampled in the window; empty when they sampled none.
      rows_sampled: rows all learners sampled in the window, of any actor.
    """

    shares: dict[str, float]
    dominant: dict[str, float]
    limit: float
    env_steps: float
    persistent: dict[str, float]
    sample_shares: dict[str, float]
    rows_sampled: float

    @property
    def max_share(self) -> float:
        return max(self.shares.values(), default=math.nan)

    @property
    def max_sample_share(self) -> float:
        return max(self.sample_shares.values(), default=math.nan)

    @property
    def top_dominant(self) -> str | None:
        """The dominant actor with the largest inserted share (None: nobody dominates)."""
        return max(self.dominant, key=self.dominant.get, default=None)


def validate(factor: float, interval_s: float, remedy: str = "report", weight: float = 0.5) -> None:
    """Raises ValueError naming the setting that cannot work."""
    if interval_s < 0:
        raise ValueError(f"balance_interval_s must not be negative, got {interval_s}")
    if not factor > 1:
        # At factor <= 1 an evenly balanced run would have every actor "dominant".
        raise ValueError(f"balance_factor must be above 1, got {factor}")
    if remedy not in REMEDIES:
        raise ValueError(f"balance_remedy must be one of {REMEDIES}, got {remedy!r}")
    if not 0 < weight < 1:
        # 1 would change nothing; 0 would stop sampling the actor's items for good.
        raise ValueError(f"balance_weight must be in (0, 1), got {weight}")


def check_remedy(remedy: str, sampled: Any) -> None:
    """Raises ValueError if `remedy` cannot act on the agent's sampled table.

    Args:
      remedy: one of REMEDIES.
      sampled: the `replay.TableSpec` the learners sample (`ReplayLayout.sampled`).
    """
    if remedy == "downweight" and not sampled.prioritized:
        raise ValueError(
            "balance_remedy='downweight' lowers the priorities of a dominant actor's "
            f"items, but this agent's table {sampled.name!r} samples by {sampled.kind!r}, "
            "without priorities; use balance_remedy='report' or 'replace'"
        )


def _sampled_rows(counters: dict[str, dict[str, float]], key: str | None) -> float:
    """Rows all nodes sampled from one actor (counter `key`), or of any source (None)."""
    rows = 0.0
    for node_counters in counters.values():
        for name, value in node_counters.items():
            if name == key or (key is None and name.startswith(SAMPLED_PREFIX)):
                rows += float(value)
    return rows


class BalanceTracker:
    """Measures the active actors' inserted and sampled shares over windows of `interval_s`.

    A window's share counts only what each actor did within it, so a run
    that grows from 2 to 4 actors is judged on its current actors, not on
    the history of the first two. An actor joins the measurement at the
    first window end after it was added (a partial first window, jit
    compilation included, would understate it and overstate the others).
    Windows with fewer than `min_env_steps` env steps (a stalled or starting
    run), or in which an actor made no progress at all (it was restarting:
    the supervisor's business, not a bias), are not judged. Dominance is
    judged on inserted shares; sampled shares are measured alongside.

    Args:
      factor: an actor dominates when its share exceeds factor / active actors.
      interval_s: length of a window.
      min_env_steps: the least env steps of all actors for a window to count.
      clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        factor: float,
        interval_s: float,
        min_env_steps: float = 1000,
        clock: Callable[[], float] = time.monotonic,
    ):
        validate(factor, interval_s)
        self._factor, self._interval_s = factor, interval_s
        self._min_env_steps = min_env_steps
        self._clock = clock
        self._window_start = clock()
        # Each actor's (env steps, sampled rows) at the window's start, and all rows sampled.
        self._baseline: dict[str, tuple[float, float]] = {}
        self._rows_baseline = 0.0
        self._streaks: dict[str, int] = {}  # consecutive dominant windows per actor
        self.last: BalanceReport | None = None

    def due(self) -> bool:
        """True once the current window has lasted `interval_s`."""
        return self._clock() - self._window_start >= self._interval_s

    def update(
        self, counters: dict[str, dict[str, float]], actors: list[str]
    ) -> BalanceReport | None:
        """Ends the current window; its report, or None if it had too little data to judge.

        Args:
          counters: the monitor's latest counters of every node (actors' env
            steps; learners' `sampled/actor/<i>` rows).
          actors: the names of the actors acting now (removed ones excluded).
        """
        current = {
            name: (
                float(counters.get(name, {}).get(COUNTER, 0)),
                _sampled_rows(counters, sampled_counter(name)),
            )
            for name in actors
        }
        rows_now = _sampled_rows(counters, None)
        # Counters only grow, but a learner resumed from a checkpoint counts its
        # rows from 0 again: a negative difference is no data, not negative data.
        done, sampled = {}, {}
        for name, (env_steps, rows) in current.items():
            if name in self._baseline:
                done[name] = max(env_steps - self._baseline[name][0], 0.0)
                sampled[name] = max(rows - self._baseline[name][1], 0.0)
        rows_sampled = max(rows_now - self._rows_baseline, 0.0)
        self._baseline, self._rows_baseline = current, rows_now
        self._window_start = self._clock()
        total = sum(done.values())
        if total < self._min_env_steps or 0.0 in done.values():
            self._streaks = {}
            return None
        actor_shares = shares(done)
        found = dominant(actor_shares, self._factor)
        self._streaks = {name: self._streaks.get(name, 0) + 1 for name in found}
        persistent = {
            name: share
            for name, share in found.items()
            if self._streaks[name] >= PERSISTENT_WINDOWS
        }
        limit = share_limit(len(actor_shares), self._factor)
        sample_shares = {}
        if rows_sampled > 0:
            sample_shares = {name: rows / rows_sampled for name, rows in sampled.items()}
        self.last = BalanceReport(
            actor_shares, found, limit, total, persistent, sample_shares, rows_sampled
        )
        return self.last


def next_weights(
    report: BalanceReport, weighted: dict[str, float], weight: float
) -> dict[str, float]:
    """The actors whose items' priorities the learners scale after window `report`.

    An actor gets `weight` once it dominated PERSISTENT_WINDOWS windows in a
    row, and keeps it while it still dominates the inserted data (lowering
    what the learners sample leaves what it inserts as it was); it loses it
    in the first judged window in which it no longer dominates, or once it
    is no longer acting.

    Args:
      report: the window just judged.
      weighted: the actors weighted until now, with their weights.
      weight: `balance_weight`.
    """
    return {
        name: weighted.get(name, weight)
        for name in report.dominant
        if name in report.persistent or name in weighted
    }


class SampledRows:
    """A learner's side of data balance: rows sampled per source actor, and priority weights.

    The learner counts every batch it trains on (`count`) and reports
    `counters()` with its heartbeat; the driver's `BalanceTracker` sums them
    over learners. With the "downweight" remedy the driver sets the weights
    of dominant actors (`set_weights`), and `count` returns the factors the
    learner multiplies the batch's new priorities by. Thread-safe: counted in
    the learner's thread, read by its heartbeat thread, set through a call.

    Args:
      restored_counters: the counters this learner reported last (a
        restarted learner continues them).
    """

    def __init__(self, restored_counters: dict[str, float] | None = None):
        self._lock = threading.Lock()
        self._rows: dict[int, int] = {}  # actor index (UNKNOWN_SOURCE: none) -> rows
        sources = {name: source for source, name in _SOURCE_COUNTERS.items()}
        for name, value in (restored_counters or {}).items():
            if name in sources:
                self._rows[sources[name]] = int(value)
            elif name.startswith(SAMPLED_PREFIX):
                self._rows[actor_index(name)] = int(value)
        self._weights: dict[int, float] = {}

    def count(self, keys: Any) -> np.ndarray | None:
        """Counts the rows of one sampled batch by source actor.

        Args:
          keys: the batch's `replay.SampledKeys` (a plain key array names no
            sources: nothing is counted).

        Returns:
          [B] factors for the batch's new priorities, or None when no actor
          is weighted (or the sources are unknown).
        """
        sources = getattr(keys, "sources", None)
        if sources is None:
            return None
        sources = np.asarray(sources).reshape(-1)
        indices, counts = np.unique(sources, return_counts=True)
        with self._lock:
            for index, rows in zip(indices.tolist(), counts.tolist()):
                self._rows[index] = self._rows.get(index, 0) + rows
            weights = self._weights
        if not weights:
            return None
        scale = np.ones(len(sources))
        for index, weight in weights.items():
            scale[sources == index] = weight
        return scale

    def counters(self) -> dict[str, int]:
        """{"sampled/actor/<i>": rows sampled from actor i, "sampled/unknown": ...,
        "sampled/demo": ...}."""
        with self._lock:
            rows = dict(self._rows)
        return {
            _SOURCE_COUNTERS.get(index, sampled_counter(f"actor/{index}")): count
            for index, count in rows.items()
        }

    def set_weights(self, weights: dict[int, float]) -> None:
        """From now on, new priorities of actor i's items are multiplied by weights[i]."""
        for index, weight in weights.items():
            if not 0 < weight <= 1:
                raise ValueError(f"balance_weight of actor {index} must be in (0, 1], got {weight}")
        with self._lock:
            self._weights = {int(index): float(weight) for index, weight in weights.items()}

    def weights(self) -> dict[int, float]:
        with self._lock:
            return dict(self._weights)
