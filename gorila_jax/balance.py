"""Data balance: each actor's share of the data inserted into replay, and dominant actors.

One actor that feeds much more than the others (more or faster envs, a
cheap stretch of its environment) biases what the learner sees: the brief's
"data bias". Shares are measured from the env-step counters actors already
send in their heartbeats. An actor writes one replay item per valid env step
(n-step transitions) or one per `T` steps of each env (trajectories), so its
share of env steps is its share of inserted items, up to the few items in
flight.

Sampled data is not tracked: a transition item is an encoded byte row
without the actor that wrote it (`replay.ItemCodec`), so a sampled batch
cannot be attributed to actors without changing the item format. Under
uniform sampling an actor's expected share of samples equals its share of
the table's items; prioritised sampling can differ.
"""

import math
import time
from typing import Callable, NamedTuple

COUNTER = "env_steps"
# Consecutive windows an actor must dominate before it is replaced (`persistent`):
# one window can be skewed by a peer that was restarting meanwhile.
PERSISTENT_WINDOWS = 2


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
      shares: each active actor's share of the window's env steps.
      dominant: the actors (with their share) above `limit`.
      limit: factor / number of active actors.
      env_steps: env steps of all active actors in the window.
      persistent: the dominant actors that dominated the previous
        PERSISTENT_WINDOWS - 1 windows too (the ones worth replacing).
    """

    shares: dict[str, float]
    dominant: dict[str, float]
    limit: float
    env_steps: float
    persistent: dict[str, float]

    @property
    def max_share(self) -> float:
        return max(self.shares.values(), default=math.nan)


def validate(factor: float, interval_s: float) -> None:
    """Raises ValueError naming the setting that cannot work."""
    if interval_s < 0:
        raise ValueError(f"balance_interval_s must not be negative, got {interval_s}")
    if not factor > 1:
        # At factor <= 1 an evenly balanced run would have every actor "dominant".
        raise ValueError(f"balance_factor must be above 1, got {factor}")


class BalanceTracker:
    """Measures the active actors' shares over windows of `interval_s`.

    A window's share counts only what each actor did within it, so a run
    that grows from 2 to 4 actors is judged on its current actors, not on
    the history of the first two. An actor joins the measurement at the
    first window end after it was added (a partial first window, jit
    compilation included, would understate it and overstate the others).
    Windows with fewer than `min_env_steps` env steps (a stalled or starting
    run), or in which an actor made no progress at all (it was restarting:
    the supervisor's business, not a bias), are not judged.

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
        self._baseline: dict[str, float] = {}  # each actor's counter at the window's start
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
          counters: the monitor's latest counters of every node.
          actors: the names of the actors acting now (removed ones excluded).
        """
        current = {name: float(counters.get(name, {}).get(COUNTER, 0)) for name in actors}
        done = {
            name: max(value - self._baseline[name], 0.0)
            for name, value in current.items()
            if name in self._baseline
        }
        self._baseline, self._window_start = current, self._clock()
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
        self.last = BalanceReport(actor_shares, found, limit, total, persistent)
        return self.last
