"""Client-level differential privacy for federated rounds (DP-FedAvg, McMahan et al.,
2018), with the privacy spent accounted by Google's `dp_accounting` library (its exact
privacy loss of the Gaussian mechanism).

Each round, each participating client clips its model update to L2 norm
`clip_norm` and adds Gaussian noise of standard deviation
`noise_multiplier * clip_norm / sqrt(participants)`. Under secure aggregation the
coordinator sees only the sum, whose noise then has standard deviation
`noise_multiplier * clip_norm`: the Gaussian mechanism on a sum in which one
client's part is at most `clip_norm`. That is what the accountant composes, once
per round (every client takes part in every round: no sampling amplification).
The noise is split this way so that no client's update leaves it noiseless
and no single client carries the whole noise; it assumes that clients add it
honestly.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

# dp_accounting (with scipy and mpmath) is imported where epsilon is computed: every
# run imports this module through its settings, and start-up time is a run's time.


class PrivacyBudgetExceeded(Exception):
    """A run whose rounds would spend more than the target epsilon."""


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """clip_norm: the L2 bound of one client's update per round.
    noise_multiplier: the sum's noise standard deviation over `clip_norm`.
    target_delta: the delta of the reported (epsilon, delta).
    target_epsilon: the most epsilon a run may spend; None: no limit."""

    clip_norm: float
    noise_multiplier: float
    target_delta: float = 1e-5
    target_epsilon: float | None = None

    def __post_init__(self):
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not self.noise_multiplier > 0:
            raise ValueError(
                f"noise_multiplier must be > 0 for a differentially private run, "
                f"got {self.noise_multiplier}"
            )
        if not 0 < self.target_delta < 1:
            raise ValueError(f"target_delta must be in (0, 1), got {self.target_delta}")
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError(f"target_epsilon must be > 0, got {self.target_epsilon}")


def _round_noise(noise_multiplier: float, rounds: int) -> float:
    """The noise multiplier of one Gaussian mechanism equal to `rounds` rounds at
    `noise_multiplier`: composing T Gaussian mechanisms of sensitivity 1 and noise sigma is
    exactly one of sensitivity sqrt(T), i.e. noise sigma / sqrt(T) (Dong, Roth and Su's
    Gaussian DP, Corollary 3.3). One event has a closed form; composing 1000 rounds in
    the privacy loss distribution accountant took 50 s, and a budget check composed
    dozens of round counts."""
    return noise_multiplier / math.sqrt(rounds)


def _gaussian(noise_multiplier: float):
    from dp_accounting.pld import privacy_loss_mechanism

    return privacy_loss_mechanism.GaussianPrivacyLoss(noise_multiplier, sensitivity=1.0)


def _gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The smallest epsilon at which one Gaussian mechanism is (epsilon, delta)-DP, from the
    library's exact hockey-stick divergence (Balle and Wang's analytic Gaussian)."""
    from scipy import optimize

    mechanism = _gaussian(noise_multiplier)
    excess = lambda epsilon: mechanism.get_delta_for_epsilon(epsilon) - delta  # noqa: E731
    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2
    # The bracket's upper end: never less than is spent.
    return float(optimize.brentq(excess, 0.0, high, xtol=1e-9, rtol=1e-9)) * (1 + 1e-9)


def epsilon_after(settings: PrivacySettings, rounds: int) -> float:
    """The epsilon spent by `rounds` rounds at `settings.target_delta` (tight for the
    Gaussian mechanism)."""
    if rounds <= 0:
        return 0.0
    return _gaussian_epsilon(_round_noise(settings.noise_multiplier, rounds), settings.target_delta)


def _one_round_noise(settings: PrivacySettings) -> float:
    """The smallest noise multiplier whose single round stays within the target epsilon."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_mechanism

    guarantee = common.DifferentialPrivacyParameters(settings.target_epsilon, settings.target_delta)
    return float(
        privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
            guarantee, sensitivity=1.0
        ).standard_deviation
    )


def max_rounds(settings: PrivacySettings, upper: int = 1 << 20) -> int:
    """The most rounds whose epsilon stays within `settings.target_epsilon` (0 if even one
    round exceeds it); `upper` if there is no target or it allows that many."""
    if settings.target_epsilon is None:
        return upper
    # T rounds at sigma spend what one round at sigma / sqrt(T) does: the answer is about
    # (sigma / sigma_1)^2, sigma_1 the noise one round needs; the accountant settles the
    # last round either way (its discretization is pessimistic by a little).
    within = lambda rounds: epsilon_after(settings, rounds) <= settings.target_epsilon  # noqa: E731
    rounds = min(upper, int((settings.noise_multiplier / _one_round_noise(settings)) ** 2))
    while rounds > 0 and not within(rounds):
        rounds -= 1
    while rounds < upper and within(rounds + 1):
        rounds += 1
    return rounds


def check_budget(settings: PrivacySettings, rounds: int) -> float:
    """The epsilon of `rounds` rounds; raises if it exceeds the target.

    Raises:
      PrivacyBudgetExceeded: naming the rounds the target allows and the noise
        multiplier that `rounds` would need.
    """
    spent = epsilon_after(settings, rounds)
    if settings.target_epsilon is None or spent <= settings.target_epsilon:
        return spent
    allowed = max_rounds(settings, upper=rounds)
    needed = _one_round_noise(settings) * math.sqrt(rounds)
    raise PrivacyBudgetExceeded(
        f"{rounds} rounds at noise multiplier {settings.noise_multiplier} spend epsilon "
        f"{spent:.3g} (delta {settings.target_delta:g}), over the target "
        f"{settings.target_epsilon:g}: the target allows {allowed} rounds at this noise, "
        f"or {rounds} rounds at a noise multiplier of {needed:.3g} or more"
    )


def clip(update: np.ndarray, clip_norm: float) -> tuple[np.ndarray, float]:
    """`update` scaled down to L2 norm `clip_norm` if longer; (clipped, its norm before)."""
    update = np.asarray(update, np.float64)
    norm = float(np.linalg.norm(update))
    if not math.isfinite(norm):
        raise ValueError("cannot clip an update with NaN or infinite values")
    return (update * (clip_norm / norm) if norm > clip_norm else update), norm


def privatize(
    update: np.ndarray,
    settings: PrivacySettings,
    num_participants: int,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, float]:
    """A client's update clipped and with its share of the round's noise added;
    (the update to send, its norm before clipping).

    `rng` defaults to one seeded from the operating system's entropy: noise that
    others could reproduce would protect nothing.
    """
    clipped, norm = clip(update, settings.clip_norm)
    rng = rng or np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    stddev = settings.noise_multiplier * settings.clip_norm / math.sqrt(num_participants)
    return clipped + rng.normal(0.0, stddev, clipped.shape), norm
