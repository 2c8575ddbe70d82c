"""The (Confident-)GNMax analysis (fedgraph.accounting.pate, PATE 2018) against the paper's
formulas, written out here independently, and against brute-force Rényi divergences between
the output distributions of neighbouring vote histograms (one teacher's vote moved)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedgraph.accounting import pate


def _sf(z: float) -> float:  # Pr[N(0, 1) >= z]
    return 0.5 * math.erfc(z / math.sqrt(2))


def _renyi(p: np.ndarray, r: np.ndarray, alpha: float) -> float:
    """D_alpha(p || r) of two distributions on a finite set (nats)."""
    return float(np.log(np.sum(p**alpha * r ** (1 - alpha))) / (alpha - 1))


def _neighbours(votes):
    """Every histogram with one vote moved from class i to class j."""
    for i, j in itertools.permutations(range(len(votes)), 2):
        if votes[i] > 0:
            n = list(votes)
            n[i] -= 1
            n[j] += 1
            yield n


def test_logq_is_the_union_bound_of_prop_7():
    votes, sigma = [10, 4, 1], 2.0
    q = _sf(6 / (math.sqrt(2) * sigma)) + _sf(9 / (math.sqrt(2) * sigma))
    assert pate.logq_gnmax(votes, sigma) == pytest.approx(math.log(q), rel=1e-9)
    # capped at 1 - 1/C when the union bound is useless
    assert pate.logq_gnmax([1, 1, 1], 5.0) == pytest.approx(math.log(2 / 3))


@pytest.mark.parametrize("votes,sigma", [([10, 4, 1], 2.0), ([20, 3, 2, 0], 4.0), ([5, 5, 1], 1.0)])
def test_logq_bounds_the_true_probability_of_a_wrong_answer(votes, sigma):
    p = pate.gnmax_output_distribution(votes, sigma, points=20001)
    wrong = 1 - p[int(np.argmax(votes))]
    assert wrong <= math.exp(pate.logq_gnmax(votes, sigma)) * (1 + 1e-6)


def test_data_independent_curves():
    a = np.array([2.0, 10.0, 50.0])
    assert pate.rdp_gnmax_data_independent(4.0, a) == pytest.approx(a / 16)
    assert pate.rdp_threshold_data_independent(4.0, a) == pytest.approx(a / 32)


def _thm6(q: float, sigma: float, alpha: float) -> float:
    """Thm. 6 of the paper in plain (non-log) arithmetic, with Prop. 10's orders."""
    mu2 = sigma * math.sqrt(-math.log(q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / sigma**2, mu2 / sigma**2
    big_a = (1 - q) / (1 - (q * math.exp(e2)) ** ((mu2 - 1) / mu2))
    big_b = math.exp(e1) / q ** (1 / (mu1 - 1))
    return math.log((1 - q) * big_a ** (alpha - 1) + q * big_b ** (alpha - 1)) / (alpha - 1)


@pytest.mark.parametrize("votes,sigma", [([40, 5, 2], 6.0), ([100, 20, 10, 0], 15.0)])
def test_data_dependent_bound_matches_theorem_6_and_beats_the_independent_one(votes, sigma):
    logq = pate.logq_gnmax(votes, sigma)
    orders = np.array([2.0, 5.0, 10.0])
    dep = pate.rdp_gnmax_data_dependent(logq, sigma, orders)
    for a, d in zip(orders, dep):
        assert d == pytest.approx(min(_thm6(math.exp(logq), sigma, a), a / sigma**2), rel=1e-6)
    assert np.all(dep < pate.rdp_gnmax_data_independent(sigma, orders) * 0.5)


def test_data_dependent_bound_falls_back_when_the_teachers_disagree():
    orders = np.array([2.0, 8.0])
    logq = pate.logq_gnmax([10, 9, 8], 5.0)
    assert pate.rdp_gnmax_data_dependent(logq, 5.0, orders) == pytest.approx(orders / 25)
    assert pate.rdp_gnmax_data_dependent(-math.inf, 5.0, orders) == pytest.approx([0, 0])


@pytest.mark.parametrize("votes,sigma", [([12, 2, 1], 3.0), ([30, 4, 0], 5.0), ([6, 5, 0], 2.0)])
def test_brute_force_renyi_divergence_is_within_both_bounds(votes, sigma):
    """D_alpha(GNMax(n) || GNMax(n')) over every neighbour n', by numerical integration:
    <= the data-dependent bound at n (Thm. 6 bounds this direction) and, both directions,
    <= alpha / sigma^2."""
    orders = np.array([1.5, 2.0, 4.0, 8.0])
    p = pate.gnmax_output_distribution(votes, sigma, points=20001)
    dep = pate.rdp_gnmax_data_dependent(pate.logq_gnmax(votes, sigma), sigma, orders)
    ind = pate.rdp_gnmax_data_independent(sigma, orders)
    worst = np.zeros_like(orders)
    for n in _neighbours(votes):
        r = pate.gnmax_output_distribution(n, sigma, points=20001)
        for k, a in enumerate(orders):
            fwd, back = _renyi(p, r, a), _renyi(r, p, a)
            worst[k] = max(worst[k], fwd)
            assert fwd <= dep[k] * (1 + 1e-4) + 1e-9
            assert back <= ind[k] * (1 + 1e-4) + 1e-9
    assert np.all(worst > 0)  # the check is not vacuous: neighbours do differ


@pytest.mark.parametrize("votes,t,sigma1", [([30, 4, 0], 20.0, 4.0), ([8, 2, 1], 20.0, 3.0)])
def test_threshold_check_brute_force(votes, t, sigma1):
    """The check's outcome is Bernoulli(Pr[max + N(0, sigma1^2) >= T]); a neighbour moves the
    max by at most 1."""
    orders = np.array([2.0, 4.0, 8.0])
    logpr = pate.logpr_answered(t, sigma1, votes)
    assert logpr == pytest.approx(math.log(_sf((t - max(votes)) / sigma1)), rel=1e-9)
    p1 = math.exp(logpr)
    p = np.array([p1, 1 - p1])
    dep = pate.rdp_threshold_data_dependent(logpr, sigma1, orders)
    ind = pate.rdp_threshold_data_independent(sigma1, orders)
    assert np.all(dep <= ind + 1e-12)
    for n in _neighbours(votes):
        r1 = _sf((t - max(n)) / sigma1)
        r = np.array([r1, 1 - r1])
        for k, a in enumerate(orders):
            assert _renyi(p, r, a) <= dep[k] * (1 + 1e-6) + 1e-12
            assert _renyi(r, p, a) <= ind[k] * (1 + 1e-6) + 1e-12


def test_confident_gnmax_cost_adds_the_per_query_curves():
    votes = np.array([[40, 5, 2], [10, 9, 8], [3, 2, 30]])
    answered = np.array([True, False, True])
    orders = np.array([2.0, 10.0])
    c = pate.confident_gnmax_cost(
        votes, answered, sigma2=6.0, threshold=25.0, sigma1=8.0, orders=orders
    )
    assert (c.queries, c.answered) == (3, 2)
    assert c.independent == pytest.approx(3 * orders / 128 + 2 * orders / 36)
    dep = sum(
        pate.rdp_threshold_data_dependent(pate.logpr_answered(25.0, 8.0, v), 8.0, orders)
        for v in votes
    )
    dep = dep + sum(
        pate.rdp_gnmax_data_dependent(pate.logq_gnmax(v, 6.0), 6.0, orders) for v in votes[answered]
    )
    assert c.dependent == pytest.approx(dep)
    assert np.all(c.dependent <= c.independent)
    full = pate.confident_gnmax_cost(votes, answered, 6.0, 25.0, 8.0)  # the default orders
    assert 0 < full.epsilon(1e-4, "dependent") <= full.epsilon(1e-4)
    with pytest.raises(ValueError, match="without a threshold every query is answered"):
        pate.confident_gnmax_cost(votes, answered, 6.0)
