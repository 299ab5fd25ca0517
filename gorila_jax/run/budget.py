"""The end of a run's env-step budget: actors stop at it, not a driver's poll after it.

The driver polls the monitor four times a second, and the monitor's counts lag the
actors by up to one report interval: a run stopped when the monitor's total passed
`--total_env_steps` ran over it by about a second of acting (4,000 ran 5,798 and
7,587 on CartPole). Near the end, `EnvStepBudget` asks each actor for its count of
this moment and gives each a limit on its own count, the remaining env steps shared
out so that the limits add up to the budget. An actor at its limit waits
(`acting.actor.LimitedActing`); the driver stops the run once the monitor's total
reaches the budget. A run ends within one actor step per actor (its envs' rows) of
its budget.

Limits are set anew at each poll of the endgame from the actors' counts of the
moment, so the steps of an actor that was removed, or killed and restarted from its
last report, go to the others; so do those of an actor that has stood still below its
limit for `STILL_S` (hung in its environment, say), which would otherwise hold the run
short of its budget for good.
"""

import logging
import time
from typing import Any, Callable

# How near the end (in seconds of acting at the recent rate) limits start: every
# poll from then on costs two calls per actor.
ENDGAME_S = 5.0
# How long an actor below its limit may stand still before its share goes to the others:
# longer than the replay's rate limiter or a PPO queue holds a healthy actor, for each
# share taken away costs up to one step of its envs past the budget (the step it is in).
STILL_S = 5.0
_CALL_TIMEOUT_S = 5.0


class EnvStepBudget:
    """Shares out the last env steps of `total_env_steps` over the active actors.

    Args:
      total_env_steps: the run's budget.
      actor_clients: the active actors' (name, client) pairs at the moment.
      node_counters: the monitor's latest counters of every node, removed ones too.
      still_s: `STILL_S` (tests shorten it).
    """

    def __init__(
        self,
        total_env_steps: int,
        actor_clients: Callable[[], list[tuple[str, Any]]],
        node_counters: Callable[[], dict[str, dict[str, float]]],
        still_s: float = STILL_S,
    ):
        self._total = total_env_steps
        self._actor_clients, self._node_counters = actor_clients, node_counters
        self._still_s = still_s
        self._endgame = False
        self._last: tuple[float, int] | None = None  # (time, env steps) of the last poll
        self._rate: float | None = None  # env steps/s, once the monitor's counts moved
        self._limits: dict[str, int] = {}  # actor -> the limit it was given last
        self._moved_at: dict[str, tuple[int, float]] = {}  # actor -> (count, when it was new)
        self._issued = 0  # the share-outs so far: each limit carries its number

    def poll(self, env_steps: int) -> None:
        """At each poll of the driver, with the monitor's total env steps.

        Until the monitor's counts have moved once, so that no rate is known, the budget
        is shared out at every poll: a short run's actors may spend it all before their
        first report (a PPO run of 6,000 env steps was at 6,103 when the monitor first
        heard of it, and ended at 6,502). Once a rate shows the end is far, those limits
        are lifted, until the endgame.
        """
        now = time.monotonic()
        if not self._endgame:
            last, self._last = self._last, (now, env_steps)
            if last is not None and now > last[0] and env_steps > last[1]:
                self._rate = (env_steps - last[1]) / (now - last[0])
            if self._rate is not None and self._total - env_steps > self._rate * ENDGAME_S:
                if self._limits:
                    self._lift()
                return
            if self._rate is not None:
                self._endgame = True
        self._share_out()

    def _lift(self) -> None:
        """Takes the limits of the start back (None: no limit)."""
        self._issued += 1
        for _, client in self._actor_clients():
            client.futures.limit_env_steps(None, self._issued)
        self._limits = {}

    def _share_out(self) -> None:
        actors = self._actor_clients()
        if not actors:
            return
        try:
            asked = [client.futures.env_steps_now() for _, client in actors]
            counts = [int(f.result(timeout=_CALL_TIMEOUT_S)) for f in asked]
        except Exception as error:  # noqa: BLE001  a timeout is one too
            # An actor restarting: the next poll shares out again.
            logging.info("env-step limits not set this poll: %s", error)
            return
        reported = self._node_counters()
        active = {name for name, _ in actors}
        # Removed actors' final counts, and nodes other than these actors.
        elsewhere = sum(
            int(counters.get("env_steps", 0))
            for name, counters in reported.items()
            if name not in active
        )
        remaining = max(self._total - elsewhere - sum(counts), 0)
        now = time.monotonic()
        for (name, _), count in zip(actors, counts):
            if self._moved_at.get(name, (None,))[0] != count:
                self._moved_at[name] = (count, now)
        # While every actor stands still (the replay's rate limiter holds them all), the
        # share is even.
        takers = [
            i for i, (name, _) in enumerate(actors) if not self._stood_still(name, counts[i], now)
        ] or list(range(len(actors)))
        share, extra = divmod(remaining, len(takers))
        limits = list(counts)
        for rank, i in enumerate(takers):
            limits[i] += share + (1 if rank < extra else 0)
        self._issued += 1
        for (_, client), limit in zip(actors, limits):
            client.futures.limit_env_steps(limit, self._issued)
        self._limits = {name: limit for (name, _), limit in zip(actors, limits)}

    def _stood_still(self, name: str, count: int, now: float) -> bool:
        """Whether actor `name` is below the limit it was given and has not moved for
        `still_s`."""
        limit = self._limits.get(name)
        if limit is None or count >= limit:
            return False
        return now - self._moved_at[name][1] >= self._still_s
