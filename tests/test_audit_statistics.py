"""The auditor's statistics (issue 63, :mod:`fedgraph.auditing`) on exact Gaussian-mechanism
samples drawn with numpy (no fedgraph mechanism): the bound holds below the true epsilon, comes
within half of it given enough trials, and exceeds the claim of a mechanism whose noise is
halved."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from fedgraph.auditing import (
    clopper_pearson_upper,
    epsilon_from_rates,
    epsilon_lower_bound,
    gaussian_epsilon,
)

DELTA = 1e-3


def _gaussian(mu: float, n: int, seed: int):
    """``n`` scores a side of a Gaussian mechanism with sensitivity / std ``mu``, projected on
    the canary's direction: the likelihood-ratio test's statistic."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, n), rng.normal(mu, 1.0, n), rng


def test_clopper_pearson_is_scipys_exact_interval():
    for k, n in ((0, 50), (3, 50), (49, 50), (120, 10000)):
        one_sided = binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").high
        assert clopper_pearson_upper(np.array([k]), n, 0.05)[0] == pytest.approx(one_sided)
    assert clopper_pearson_upper(np.array([50]), 50, 0.05)[0] == 1.0


def test_the_formula():
    # FPR 0.01 and FNR 0.5 at delta 0: log(0.5 / 0.01)
    assert epsilon_from_rates(0.01, 0.5, 0.0) == pytest.approx(math.log(50))
    assert epsilon_from_rates(0.5, 0.01, 0.0) == pytest.approx(math.log(50))  # symmetric
    assert epsilon_from_rates(0.5, 0.5, 0.0) == 0.0  # a coin
    assert epsilon_from_rates(0.6, 0.6, 0.0) == 0.0  # worse than a coin: no bound


def test_gaussian_epsilon_is_the_accountants():
    from fedgraph.accounting.accountants import analytic_gaussian_epsilon

    for z in (0.7, 1.0, 3.0):
        assert gaussian_epsilon(1 / z, 1e-5) == pytest.approx(
            analytic_gaussian_epsilon(z, 1e-5), rel=1e-6
        )


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_the_bound_is_below_the_true_epsilon(mu):
    truth = gaussian_epsilon(mu, DELTA)
    for seed in range(10):
        absent, present, rng = _gaussian(mu, 20000, seed)
        for method, grid in (("holdout", None), ("bonferroni", np.linspace(-3, 6, 60))):
            res = epsilon_lower_bound(
                absent, present, DELTA, method=method, thresholds=grid, rng=rng
            )
            assert 0.0 <= res.epsilon_lower_bound <= truth, (seed, method, res)
            assert res.epsilon_lower_bound <= res.epsilon_point + 1e-12


def test_the_bound_reaches_half_the_true_epsilon_with_enough_trials():
    truth = gaussian_epsilon(1.0, DELTA)  # 3.14
    absent, present, rng = _gaussian(1.0, 50000, 0)
    res = epsilon_lower_bound(absent, present, DELTA, rng=rng)
    assert truth / 2 <= res.epsilon_lower_bound <= truth, res
    assert res.trials == (50000, 50000) and res.evaluated == (25000, 25000)


def test_a_mechanism_with_half_the_noise_is_caught():
    """Claimed: std 2 for sensitivity 1 (mu 0.5, epsilon 1.35 at 1e-3); shipped: std 1."""
    claimed = gaussian_epsilon(0.5, DELTA)
    for seed in range(3):
        absent, present, rng = _gaussian(1.0, 50000, seed)
        res = epsilon_lower_bound(absent, present, DELTA, rng=rng)
        assert res.epsilon_lower_bound > claimed, res


def test_the_test_direction_is_found():
    absent, present, rng = _gaussian(-1.0, 20000, 1)  # the canary lowers the score
    res = epsilon_lower_bound(absent, present, DELTA, rng=rng)
    assert res.direction == "below" and res.epsilon_lower_bound > 1.0


def test_no_signal_gives_a_bound_near_zero():
    absent, present, rng = _gaussian(0.0, 20000, 2)
    assert epsilon_lower_bound(absent, present, DELTA, rng=rng).epsilon_lower_bound < 0.2


def test_refusals():
    with pytest.raises(ValueError, match="bonferroni"):
        epsilon_lower_bound([0.0] * 10, [1.0] * 10, DELTA, method="bonferroni")
    with pytest.raises(ValueError, match="4 trials"):
        epsilon_lower_bound([0.0], [1.0], DELTA)
    with pytest.raises(ValueError, match="finite"):
        epsilon_lower_bound([0.0, math.nan] * 4, [1.0] * 8, DELTA)
