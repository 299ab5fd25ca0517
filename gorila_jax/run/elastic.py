"""Elastic actors: change the actor count of a running experiment, by hand or by a policy.

By hand, from outside the process: write the wanted count into
`<logdir>/control/num_actors` (for example `echo 4 > runs/x/control/num_actors`).
The driver checks the file every poll (a `stat`, 4 times a second) and,
when its content changed, adds actors (the next unused index, so a new seed
offset) or removes the newest ones until the count matches (skipping the
last writer of a replay shard, which must stay). A file is
chosen over a socket or a Ray call because it works the same under every
launcher, needs no port, survives the driver, and a resumed run reapplies it.

By policy (`ElasticPolicy`, off by default): every `interval_s` the driver
compares the actors' throughput over the interval with a target and the
variance of a learner metric (a gradient norm) with a threshold, as the
brief sketches: add an actor when throughput is under target and the
variance is low (more data would help and the learner is steady), remove
one when the variance exceeds twice the threshold (the learner is
overwhelmed by diverse data). Both stay within [min_actors, max_actors].

Removed actors stop cleanly: their final counters stay in the monitor's
totals, so no total and no metrics row goes backwards. Optionally, an actor
that dominates the inserted data (`balance.BalanceTracker`) is replaced by a
fresh one with a new seed.
"""

import dataclasses
import logging
import math
import os
import time
from typing import Any, Callable

from gorila_jax.health import balance as balance_lib

CONTROL_DIR = "control"
NUM_ACTORS_FILE = "num_actors"

ADD, KEEP, REMOVE = 1, 0, -1
# The variance of fewer samples says nothing: no decision before this many.
MIN_VARIANCE_SAMPLES = 3


def num_actors_path(logdir: str) -> str:
    """Where a user writes the wanted actor count of the run in `logdir`."""
    return os.path.join(logdir, CONTROL_DIR, NUM_ACTORS_FILE)


@dataclasses.dataclass(frozen=True)
class ElasticPolicy:
    """When the elastic policy adds or removes an actor.

    Attributes:
      interval_s: seconds between decisions; throughput and variance are
        measured over the interval (restarted whenever the count changes).
      target_env_steps_per_s: add actors while the actors' env steps per
        second stay below this (and the variance is low).
      variance_threshold: "low" variance is below this; above twice this an
        actor is removed.
      variance_metric: the learner metric whose variance is measured, one
        value per learner report ("grad_norm": DQN's global gradient norm
        before clipping; agents that report no gradient norm can use "loss").
      min_actors, max_actors: the policy keeps the count within these.
    """

    interval_s: float
    target_env_steps_per_s: float
    variance_threshold: float
    variance_metric: str = "grad_norm"
    min_actors: int = 1
    max_actors: int = 64

    def __post_init__(self):
        if not self.interval_s > 0:
            raise ValueError(f"elastic_interval_s must be positive, got {self.interval_s}")
        if not self.target_env_steps_per_s > 0:
            raise ValueError(
                "elastic_target_env_steps_per_s must be positive when the elastic policy is on, "
                f"got {self.target_env_steps_per_s}"
            )
        if not self.variance_threshold > 0:
            raise ValueError(
                "elastic_variance_threshold must be positive when the elastic policy is on, "
                f"got {self.variance_threshold}"
            )
        if not self.variance_metric:
            raise ValueError("elastic_variance_metric must name a learner metric, got ''")
        check_bounds(self.min_actors, self.max_actors)


def check_bounds(min_actors: int, max_actors: int, num_actors: int | None = None) -> None:
    """Raises ValueError unless 1 <= min_actors <= (num_actors <=) max_actors."""
    if min_actors < 1:
        raise ValueError(f"min_actors must be at least 1, got {min_actors}")
    if max_actors < min_actors:
        raise ValueError(f"max_actors ({max_actors}) must not be below min_actors ({min_actors})")
    if num_actors is not None and not min_actors <= num_actors <= max_actors:
        raise ValueError(
            f"num_actors ({num_actors}) must be within min_actors ({min_actors}) and "
            f"max_actors ({max_actors})"
        )


def decide(num_actors: int, env_steps_per_s: float, variance: float, policy: ElasticPolicy) -> int:
    """ADD, REMOVE or KEEP one actor, from the last interval's throughput and variance.

    A count outside [min_actors, max_actors] (set by hand) moves one step
    back inside; a NaN variance (too few learner reports) decides nothing.
    """
    if num_actors < policy.min_actors:
        return ADD
    if num_actors > policy.max_actors:
        return REMOVE
    if math.isnan(variance):
        return KEEP
    if variance > 2 * policy.variance_threshold:
        return REMOVE if num_actors > policy.min_actors else KEEP
    low_variance = variance < policy.variance_threshold
    if env_steps_per_s < policy.target_env_steps_per_s and low_variance:
        return ADD if num_actors < policy.max_actors else KEEP
    return KEEP


def sample_variance(values: list[float]) -> float:
    """Unbiased variance; NaN with fewer than MIN_VARIANCE_SAMPLES values."""
    if len(values) < MIN_VARIANCE_SAMPLES:
        return math.nan
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def parse_count(text: str) -> int:
    """The count in a control file's text.

    Raises:
      ValueError: the text is not one whole number of at least 1.
    """
    try:
        count = int(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()[:40]!r} is not a whole number") from None
    if count < 1:
        raise ValueError(f"{count} is below 1 (a run needs an actor)")
    return count


class ActorScaler:
    """The driver's side of elastic actors: control file, policy and data-balance remedy.

    Args:
      logdir: the run's logdir (its control file is `num_actors_path(logdir)`).
      add_actor: starts one more actor; returns its name.
      remove_actor: stops the actor of that name cleanly.
      active_actors: the names of the actors acting now, oldest first.
      min_actors, max_actors: bounds of every count this sets (the control
        file's too: a count outside them is clamped, with a warning).
      policy: the elastic policy, or None (off).
      balance: measures each actor's share of inserted and sampled data, or None (off).
      replace_dominant: replace an actor that dominated the inserted data in
        `balance.PERSISTENT_WINDOWS` windows in a row by a fresh one (the next
        unused index: a new seed).
      sample_weights: the "downweight" remedy, or None (off): called with
        {actor index: balance_weight} for the actors that dominated
        `balance.PERSISTENT_WINDOWS` windows in a row and still dominate
        (`balance.next_weights`); it hands them to every learner, which then
        multiplies the priorities of those actors' items by the weight. Sent
        again after every judged window while any actor is weighted, so a
        restarted learner gets them back.
      balance_weight: the weight `sample_weights` hands out.
      apply_existing: act on a control file that exists already (a resumed
        run); otherwise only a later change counts, so a file left by an
        earlier run in the same logdir does not resize a new one.
      clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        logdir: str,
        add_actor: Callable[[], str],
        remove_actor: Callable[[str], None],
        active_actors: Callable[[], list[str]],
        min_actors: int = 1,
        max_actors: int = 64,
        policy: ElasticPolicy | None = None,
        balance: balance_lib.BalanceTracker | None = None,
        replace_dominant: bool = False,
        apply_existing: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sample_weights: Callable[[dict[int, float]], None] | None = None,
        balance_weight: float = 0.5,
    ):
        check_bounds(min_actors, max_actors)
        self._path = num_actors_path(logdir)
        self._add, self._remove, self._active = add_actor, remove_actor, active_actors
        self._min_actors, self._max_actors = min_actors, max_actors
        self._policy, self._balance = policy, balance
        self._replace_dominant = replace_dominant
        self._sample_weights, self._balance_weight = sample_weights, balance_weight
        self._weighted: dict[str, float] = {}  # actor -> the weight the learners apply
        self._clock = clock
        self._control_text = None if apply_existing else self._read_control_file()
        self._variance_samples: list[float] = []
        self._sampled_at_step = -1
        self._warned_metric = False
        self._window_start: tuple[float, float] | None = None  # (time, env steps)

    def poll(
        self, snapshot: dict[str, Any], node_counters: Callable[[], dict[str, dict]]
    ) -> list[str]:
        """One driver poll: applies a changed control file, the policy, the balance check.

        Args:
          snapshot: the monitor's snapshot (totals and the learner's metrics).
          node_counters: the monitor's latest counters of every node (called
            only when a balance window ends).

        Returns:
          One line per change made or problem found, for the console.
        """
        lines = self._follow_control_file()
        if self._policy is not None:
            lines += self._follow_policy(snapshot)
        if self._balance is not None:
            lines += self._follow_balance(node_counters)
        return lines

    def row_fields(self) -> dict[str, float]:
        """Columns for the metrics row: actor count and the latest balance measurement."""
        fields: dict[str, float] = {"num_actors": len(self._active())}
        last = self._balance.last if self._balance is not None else None
        if last is not None:
            fields["insert_share_max"] = last.max_share
            fields["insert_share_limit"] = last.limit
            fields["dominant_actors"] = len(last.dominant)
            if last.sample_shares:
                fields["sample_share_max"] = last.max_sample_share
            if last.top_dominant in last.sample_shares:
                # What the remedy is about: the most dominant actor's share of the samples.
                fields["dominant_sample_share"] = last.sample_shares[last.top_dominant]
        if self._sample_weights is not None:
            fields["downweighted_actors"] = len(self._weighted)
        return fields

    def set_count(self, wanted: int, why: str) -> list[str]:
        """Adds or removes (the newest that may go) actors until `wanted` act; returns what it did.

        A change that fails (a full Ray cluster) is reported and leaves the
        run as it is: resizing never ends a run.
        """
        wanted = min(max(wanted, self._min_actors), self._max_actors)
        lines = []
        try:
            while len(self._active()) < wanted:
                lines.append(f"elastic: added {self._add()} ({why})")
            while len(self._active()) > wanted:
                lines.append(f"elastic: removed {self._remove_newest_removable()} ({why})")
        except Exception as error:  # noqa: BLE001  reported; the run goes on
            lines.append(f"elastic: could not reach {wanted} actors ({why}): {error}")
            logging.warning(lines[-1])
        if lines:
            self._window_start = None  # the measurement mixed two counts: start over
            self._variance_samples = []
        return lines

    def _remove_newest_removable(self) -> str:
        """Removes the newest actor that may go; returns its name.

        `remove_actor` raises ValueError, changing nothing, for an actor that
        may not go (the last writer of a replay shard); the next newest is tried.
        """
        refusals = []
        for name in reversed(self._active()):
            try:
                self._remove(name)
                return name
            except ValueError as refusal:
                refusals.append(str(refusal))
        raise ValueError("no actor may be removed: " + "; ".join(refusals))

    def _read_control_file(self) -> str | None:
        """The control file's text (the content last acted on is compared); None: no file."""
        try:
            with open(self._path) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            return f"<unreadable: {error}>"

    def _follow_control_file(self) -> list[str]:
        text = self._read_control_file()
        if text is None or text == self._control_text:
            return []
        self._control_text = text
        try:
            wanted = parse_count(text)
        except ValueError as error:
            line = f"elastic: ignored {self._path}: {error}"
            logging.warning(line)
            return [line]
        lines = []
        if not self._min_actors <= wanted <= self._max_actors:
            clamped = min(max(wanted, self._min_actors), self._max_actors)
            lines.append(
                f"elastic: {self._path} asks for {wanted} actors; using {clamped} "
                f"(min_actors={self._min_actors}, max_actors={self._max_actors})"
            )
            logging.warning(lines[-1])
        return lines + self.set_count(wanted, f"{self._path} asks for {wanted}")

    def _follow_policy(self, snapshot: dict[str, Any]) -> list[str]:
        policy = self._policy
        now, env_steps = self._clock(), snapshot["env_steps"]
        value = snapshot["metrics"].get(policy.variance_metric)
        if value is not None and snapshot["learner_steps"] != self._sampled_at_step:
            self._sampled_at_step = snapshot["learner_steps"]  # one sample per learner report
            if math.isfinite(value):
                self._variance_samples.append(float(value))
        if self._window_start is None:
            self._window_start = (now, env_steps)
            return []
        started, started_steps = self._window_start
        if now - started < policy.interval_s:
            return []
        lines = []
        if value is None and not self._warned_metric and snapshot["learner_steps"] > 0:
            self._warned_metric = True
            reported = ", ".join(sorted(snapshot["metrics"])) or "none yet"
            lines.append(
                f"elastic: the learner reports no metric {policy.variance_metric!r} "
                f"(it reports: {reported}); set elastic_variance_metric to one of them"
            )
            logging.warning(lines[-1])
        throughput = (env_steps - started_steps) / (now - started)
        variance = sample_variance(self._variance_samples)
        count = len(self._active())
        decision = decide(count, throughput, variance, policy)
        self._window_start, self._variance_samples = (now, env_steps), []
        if decision == KEEP:
            return lines
        why = (
            f"policy: {throughput:,.0f} env steps/s (target {policy.target_env_steps_per_s:g}), "
            f"{policy.variance_metric} variance {variance:.3g} "
            f"(threshold {policy.variance_threshold:g})"
        )
        return lines + self.set_count(count + decision, why)

    def _replace(self, name: str) -> str:
        """Removes actor `name`, then adds a fresh one (in the place it left, under Ray)."""
        try:
            self._remove(name)
            return f"elastic: replaced {name} by {self._add()} (a new seed), to rebalance data"
        except Exception as error:  # noqa: BLE001  reported; the run goes on
            logging.warning("elastic: replacing %s failed: %s", name, error)
            return f"elastic: replacing {name} failed: {error}"

    def _follow_balance(self, node_counters: Callable[[], dict[str, dict]]) -> list[str]:
        if not self._balance.due():
            return []  # node_counters is a round trip to the monitor: only when needed
        report = self._balance.update(node_counters(), self._active())
        if report is None:
            return []
        lines = []
        for name, share in report.dominant.items():
            sampled = ""
            if name in report.sample_shares:
                sampled = f" (and {report.sample_shares[name]:.0%} of the rows learners sampled)"
            lines.append(
                f"data balance: {name} inserted {share:.0%} of the last window's data{sampled}, "
                f"above {report.limit:.0%} (balance_factor / {len(report.shares)} actors)"
            )
            logging.warning(lines[-1])
            if self._replace_dominant and name in report.persistent and name in self._active():
                lines.append(self._replace(name))
        if self._sample_weights is not None:
            lines += self._reweigh(report)
        return lines

    def _reweigh(self, report: balance_lib.BalanceReport) -> list[str]:
        """The "downweight" remedy after a judged window: new weights to the learners."""
        weights = balance_lib.next_weights(report, self._weighted, self._balance_weight)
        lines = [
            f"data balance: learners now multiply the priorities of {name}'s items by "
            f"{weights[name]:g} (balance_weight), so that it is sampled less"
            for name in weights.keys() - self._weighted.keys()
        ]
        lines += [
            f"data balance: {name} no longer dominates; its items' priorities are no longer lowered"
            for name in self._weighted.keys() - weights.keys()
        ]
        if weights or self._weighted:
            try:
                self._sample_weights(
                    {balance_lib.actor_index(name): weight for name, weight in weights.items()}
                )
            except Exception as error:  # noqa: BLE001  sent again after the next window
                lines.append(f"data balance: sending priority weights failed: {error}")
        self._weighted = weights
        for line in lines:
            logging.warning(line)
        return lines
