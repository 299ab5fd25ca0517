"""Secure aggregation's masks and the privacy accountant (gorila_jax/federated)."""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from gorila_jax.federated import privacy, secure_aggregation as secagg


def _round(updates: dict[int, np.ndarray], round_id=0, attempt=0, clients=None):
    clients = clients or {i: secagg.MaskingClient(i) for i in updates}
    keys = {i: clients[i].public_key() for i in updates}
    return clients, {i: clients[i].mask(u, round_id, attempt, keys) for i, u in updates.items()}


def test_the_masks_cancel_and_the_coordinator_gets_the_plain_sum():
    rng = np.random.default_rng(0)
    updates = {i: rng.normal(0, 0.1, 10_000) for i in range(4)}
    _, masked = _round(updates)
    total = secagg.masked_sum(masked, set(updates))
    # Exactly the sum of the fixed-point encodings ...
    encoded = sum(secagg.encode(u, 4).view(np.int64) for u in updates.values())
    np.testing.assert_array_equal(total, encoded / 2.0**secagg.FRACTION_BITS)
    # ... which is the float sum within the encoding's rounding.
    np.testing.assert_allclose(total, sum(updates.values()), atol=4 * 2.0**-secagg.FRACTION_BITS)


def test_a_masked_update_is_indistinguishable_from_uniform_noise():
    # The keys are fresh each run, so each p-value below is uniform on [0, 1] when the
    # masks are: over 300 rounds their p-values were (a KS test of them: 0.46 and
    # 0.75), and at 1e-3 one of these 4 checks failed one clean-clone CI run in about
    # 250. At 1e-6 on 100k words a bias is still seen: the KS test's bound is then
    # a 0.0085 gap in the top bits' distribution (0.0145 was the 1e-3 failure's).
    n = 100_000
    # The most recognisable update there is: all zeros, or a constant.
    for update in (np.zeros(n), np.full(n, 0.5)):
        _, masked = _round({0: update, 1: np.zeros(n), 2: np.zeros(n)})
        words = masked[0]
        # Uniform over the 64-bit ring: its top 16 bits uniform over 2^16 values...
        top = (words >> np.uint64(48)).astype(np.float64) / 2.0**16
        assert stats.kstest(top, "uniform").pvalue > 1e-6
        # ... its low byte (where a small update's own bits would sit) too, ...
        low = np.bincount((words & np.uint64(0xFF)).astype(np.int64), minlength=256)
        assert stats.chisquare(low).pvalue > 1e-6
        # ... and nothing of the update's value left in it (0.02 is 6 standard errors).
        assert abs(np.corrcoef(words.astype(np.float64), np.arange(n))[0, 1]) < 0.02


def test_a_dropped_client_refuses_the_round_and_a_redo_among_the_others_sums_them():
    rng = np.random.default_rng(1)
    updates = {i: rng.normal(0, 1, 100) for i in range(3)}
    clients, masked = _round(updates)
    del masked[2]  # client 2's masked update never arrived
    with pytest.raises(secagg.RoundRefused, match=r"missing from clients \[2\].*redo the round"):
        secagg.masked_sum(masked, {0, 1, 2})
    # The redo: the clients left, masks of a new attempt (never the first attempt's again).
    survivors = {i: updates[i] for i in (0, 1)}
    _, redone = _round(survivors, attempt=1, clients=clients)
    assert not np.array_equal(redone[0], masked[0])
    total = secagg.masked_sum(redone, {0, 1})
    np.testing.assert_allclose(total, updates[0] + updates[1], atol=1e-6)


def test_bad_rounds_and_updates_are_refused_with_a_reason():
    with pytest.raises(secagg.RoundRefused, match="at least 3 clients; 2 took part"):
        secagg.masked_sum({0: np.zeros(1, np.uint64), 1: np.zeros(1, np.uint64)}, {0, 1}, 3)
    with pytest.raises(ValueError, match="NaN or infinite"):
        secagg.encode(np.array([0.0, np.nan]), 2)
    with pytest.raises(ValueError, match="too large for a secure sum over 4 clients"):
        secagg.encode(np.array([2.0**37]), 4)
    client = secagg.MaskingClient(5)
    with pytest.raises(secagg.RoundRefused, match="client 5 is not among"):
        client.mask(np.zeros(3), 0, 0, {0: secagg.MaskingClient(0).public_key()})


def _analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle and Wang (2018), Theorem 8: the Gaussian mechanism of sensitivity 1 and noise
    sigma is (epsilon, delta)-DP exactly when
    Phi(1/(2 sigma) - epsilon sigma) - e^epsilon Phi(-1/(2 sigma) - epsilon sigma) <= delta."""

    def excess(epsilon):
        return (
            stats.norm.cdf(0.5 / sigma - epsilon * sigma)
            - math.exp(epsilon) * stats.norm.cdf(-0.5 / sigma - epsilon * sigma)
            - delta
        )

    return optimize.brentq(excess, 1e-9, 100.0)


@pytest.mark.parametrize("noise_multiplier, rounds", [(1.0, 1), (4.0, 10), (20.0, 50)])
def test_the_accountant_matches_the_gaussian_mechanisms_exact_epsilon(noise_multiplier, rounds):
    # T rounds of the Gaussian mechanism at noise sigma are one at sigma / sqrt(T):
    # an exact reference for the accountant, independent of the library.
    settings = privacy.PrivacySettings(clip_norm=1.0, noise_multiplier=noise_multiplier)
    spent = privacy.epsilon_after(settings, rounds)
    exact = _analytic_gaussian_epsilon(noise_multiplier / math.sqrt(rounds), 1e-5)
    assert spent >= exact * (1 - 1e-3)  # never reports less than is spent
    assert spent == pytest.approx(exact, rel=0.02)


@pytest.mark.parametrize("noise_multiplier, rounds", [(1.0, 5), (4.0, 40)])
def test_rounds_folded_into_one_event_spend_what_the_accountant_composes(noise_multiplier, rounds):
    # epsilon_after accounts T rounds as one Gaussian event of noise sigma / sqrt(T);
    # the library composing the T events itself must agree (it takes far longer).
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    composed = accountant.get_epsilon(1e-5)
    settings = privacy.PrivacySettings(clip_norm=1.0, noise_multiplier=noise_multiplier)
    assert privacy.epsilon_after(settings, rounds) == pytest.approx(composed, rel=0.01)


def test_a_run_over_the_target_epsilon_is_refused_with_what_it_would_take():
    settings = privacy.PrivacySettings(clip_norm=1.0, noise_multiplier=20.0, target_epsilon=0.5)
    allowed = privacy.max_rounds(settings)
    assert allowed > 0
    assert privacy.check_budget(settings, allowed) <= 0.5
    with pytest.raises(
        privacy.PrivacyBudgetExceeded,
        match=rf"over the target 0.5: the target allows {allowed} rounds at this noise",
    ):
        privacy.check_budget(settings, allowed + 1)


def test_privatize_clips_to_the_bound_and_adds_the_clients_share_of_noise():
    settings = privacy.PrivacySettings(clip_norm=2.0, noise_multiplier=1.5)
    update = np.full(400_000, 1.0)  # norm 632: clipped to 2
    sent, norm = privacy.privatize(update, settings, 4, np.random.default_rng(0))
    assert norm == pytest.approx(math.sqrt(400_000))
    noise = sent - update * (2.0 / norm)
    # Each of 4 clients adds a quarter of the variance: the sum's noise is 1.5 x 2.
    assert np.std(noise) == pytest.approx(1.5 * 2.0 / 2, rel=0.01)
    small = np.array([0.3, 0.4])  # within the bound: not scaled
    np.testing.assert_array_equal(privacy.clip(small, 2.0)[0], small)
    with pytest.raises(ValueError, match="noise_multiplier must be > 0"):
        privacy.PrivacySettings(clip_norm=1.0, noise_multiplier=0.0)
