"""Client-level differential privacy for federated rounds (DP-FedAvg, McMahan et al.,
2018), with the privacy spent accounted by Google's `dp_accounting` library.

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


def epsilon_after(settings: PrivacySettings, rounds: int) -> float:
    """The epsilon spent by `rounds` rounds at `settings.target_delta` (the privacy loss
    distribution accountant: tight for the Gaussian mechanism)."""
    if rounds <= 0:
        return 0.0
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(settings.noise_multiplier), rounds)
    return float(accountant.get_epsilon(settings.target_delta))


def max_rounds(settings: PrivacySettings, upper: int = 1 << 20) -> int:
    """The most rounds whose epsilon stays within `settings.target_epsilon` (0 if even one
    round exceeds it); `upper` if there is no target or it allows that many."""
    if settings.target_epsilon is None:
        return upper
    # Epsilon grows with rounds. Doubling first keeps every probe within twice the answer:
    # a first probe at upper / 2 composed 2^19 rounds at noise 1, whose privacy loss
    # distribution asked for 40 GiB.
    low, high = 0, 1
    while high < upper and epsilon_after(settings, high) <= settings.target_epsilon:
        low, high = high, min(2 * high, upper)
    if high == upper and epsilon_after(settings, upper) <= settings.target_epsilon:
        return upper
    high -= 1  # the largest within is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if epsilon_after(settings, middle) <= settings.target_epsilon:
            low = middle
        else:
            high = middle - 1
    return low


def check_budget(settings: PrivacySettings, rounds: int) -> float:
    """The epsilon of `rounds` rounds; raises if it exceeds the target.

    Raises:
      PrivacyBudgetExceeded: naming the rounds the target allows and the noise
        multiplier that `rounds` would need.
    """
    spent = epsilon_after(settings, rounds)
    if settings.target_epsilon is None or spent <= settings.target_epsilon:
        return spent
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    allowed = max_rounds(settings, upper=rounds)
    needed = dp_accounting.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant,
        lambda sigma: dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(sigma), rounds
        ),
        settings.target_epsilon,
        settings.target_delta,
    )
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
