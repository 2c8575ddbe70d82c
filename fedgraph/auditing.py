r"""Privacy auditing: an empirical lower bound on epsilon from a distinguisher's errors.

A mechanism ``M`` is :math:`(\varepsilon, \delta)`-DP only if, for every test that tells
``M(D)`` (canary absent) from ``M(D')`` (canary present), its false-positive rate ``FPR`` and
false-negative rate ``FNR`` satisfy (Kairouz, Oh and Viswanath 2015, Thm. 2.1)

.. math::
    \mathrm{FPR} + e^{\varepsilon}\,\mathrm{FNR} \ge 1 - \delta, \qquad
    \mathrm{FNR} + e^{\varepsilon}\,\mathrm{FPR} \ge 1 - \delta .

So any test's error rates give the lower bound
:math:`\varepsilon \ge \max\{\log\frac{1 - \delta - \mathrm{FNR}}{\mathrm{FPR}},
\log\frac{1 - \delta - \mathrm{FPR}}{\mathrm{FNR}}\}`. From ``n`` trials per side the rates
are only estimated: the bound uses one-sided Clopper-Pearson upper limits
``FPR_hi``, ``FNR_hi`` (each at ``alpha / 2``, so both hold together with probability at least
``1 - alpha``), which makes the bound hold with that confidence (Jagielski, Ullman and Oprea
2020, "Auditing Differentially Private Machine Learning", Sec. 3; Nasr et al. 2021,
"Adversary Instantiation", Sec. 4):

.. math::
    \hat\varepsilon_{\mathrm{lb}} = \max\Big(\log\frac{1 - \delta - \mathrm{FNR}_{hi}}
    {\mathrm{FPR}_{hi}},\ \log\frac{1 - \delta - \mathrm{FPR}_{hi}}{\mathrm{FNR}_{hi}},\ 0\Big).

The test is a threshold on a score (higher: canary present; the best threshold test on the
likelihood ratio is the most powerful, Neyman-Pearson). Choosing the threshold on the same
trials that estimate its errors would void the confidence, so :func:`epsilon_lower_bound`
does one of two things (``method``):

``"holdout"`` (default)
    the threshold and direction are chosen on a random half of the trials (the one maximizing
    the bound computed there), and the bound is computed on the other half at that single
    threshold: valid at ``confidence`` exactly as stated, at the price of half the trials.
``"bonferroni"``
    a grid of thresholds given in advance (independent of the scores, e.g. from the
    mechanism's public parameters) over all trials, the confidence split evenly over the
    grid and both directions (Bonferroni): valid for any grid fixed before the trials.

The rates' intervals come from :func:`scipy.stats.beta` (Clopper and Pearson 1934); nothing
here reimplements a quantile. This module is statistics only (numpy, scipy): the trials come
from the real client code (:mod:`fedgraph.simulations.auditor`) or from a user's script.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "AuditResult",
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "gaussian_epsilon",
    "METHODS",
]

METHODS = ("holdout", "bonferroni")


@dataclass(frozen=True)
class AuditResult:
    """The outcome of one audit (:func:`epsilon_lower_bound`).

    ``epsilon_lower_bound``: the bound at ``confidence`` (nats, >= 0); ``epsilon_point``: the
    same formula on the observed rates of the evaluated trials (no interval: an estimate, not a
    bound); ``threshold`` and ``direction`` (``"above"``: a score above the threshold says
    "canary present"); ``fpr``, ``fnr``: the observed rates and ``fpr_hi``, ``fnr_hi`` their
    upper limits; ``trials``: trials per side ``(absent, present)`` in all, ``evaluated``: those
    the bound was computed on; ``method``: ``holdout`` or ``bonferroni``; ``delta``.
    """

    epsilon_lower_bound: float
    epsilon_point: float
    confidence: float
    delta: float
    threshold: float
    direction: str
    fpr: float
    fnr: float
    fpr_hi: float
    fnr_hi: float
    trials: tuple[int, int]
    evaluated: tuple[int, int]
    method: str

    def to_dict(self) -> dict:
        out = asdict(self)
        out["trials"], out["evaluated"] = list(self.trials), list(self.evaluated)
        return out


def clopper_pearson_upper(errors, n, alpha: float):
    """One-sided Clopper-Pearson upper limit at level ``1 - alpha`` of a binomial rate with
    ``errors`` of ``n`` (arrays broadcast): ``Beta(1 - alpha; k + 1, n - k)``, 1 where
    ``k = n`` (:func:`scipy.stats.beta.ppf`)."""
    from scipy.stats import beta

    k = np.asarray(errors, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), k.shape)
    out = np.ones_like(k)
    some = k < n
    out[some] = beta.ppf(1.0 - alpha, k[some] + 1.0, n[some] - k[some])
    return out


def epsilon_from_rates(fpr, fnr, delta: float):
    """``max(log((1 - delta - fnr) / fpr), log((1 - delta - fpr) / fnr), 0)`` elementwise
    (arrays broadcast; a non-positive numerator gives 0, a zero rate with a positive
    numerator ``inf``)."""
    fpr, fnr = np.asarray(fpr, dtype=float), np.asarray(fnr, dtype=float)

    def side(num, den):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(num > 0, np.log(np.maximum(num, 1e-300)) - np.log(den), 0.0)
        return np.where((num > 0) & (den <= 0), np.inf, r)

    return np.maximum(np.maximum(side(1.0 - delta - fnr, fpr), side(1.0 - delta - fpr, fnr)), 0.0)


def _errors(absent: np.ndarray, present: np.ndarray, thresholds: np.ndarray):
    """``(false positives, false negatives)`` per threshold and direction, shapes
    ``[2, t]``: row 0 "above" (score > t says present), row 1 "below" (score <= t says
    present). ``absent`` and ``present`` sorted."""
    pos_absent = absent.size - np.searchsorted(absent, thresholds, side="right")  # > t
    pos_present = present.size - np.searchsorted(present, thresholds, side="right")
    fp = np.stack([pos_absent, absent.size - pos_absent])
    fn = np.stack([present.size - pos_present, pos_present])
    return fp, fn


def _bounds(absent, present, thresholds, delta, alpha):
    fp, fn = _errors(absent, present, thresholds)
    fpr_hi = clopper_pearson_upper(fp, absent.size, alpha / 2)
    fnr_hi = clopper_pearson_upper(fn, present.size, alpha / 2)
    return fp, fn, fpr_hi, fnr_hi, epsilon_from_rates(fpr_hi, fnr_hi, delta)


def _candidates(scores: np.ndarray, count: int) -> np.ndarray:
    """Up to ``count`` thresholds: quantiles of ``scores``, denser in the tails (where the
    largest ratios are), unique."""
    u = np.linspace(-4.0, 4.0, count)
    q = 1.0 / (1.0 + np.exp(-2.0 * u))  # logistic spacing: tails within ~1/count**2
    return np.unique(np.quantile(scores, q, method="lower"))


def epsilon_lower_bound(
    absent,
    present,
    delta: float,
    *,
    confidence: float = 0.95,
    method: str = "holdout",
    thresholds=None,
    candidates: int = 400,
    rng: np.random.Generator | None = None,
) -> AuditResult:
    """The audited lower bound on epsilon at ``delta`` from a distinguisher's scores (module
    docstring: the formula, the intervals, the two ways of choosing the threshold).

    Args:
        absent: ``[n0]`` scores of trials on ``D`` (canary absent); present: ``[n1]`` on
            ``D'`` (canary present). Higher should mean "present"; the other direction is
            tried as well.
        delta: the delta the bound is stated at (the run's).
        confidence: ``1 - alpha``, the probability that the bound holds (over the trials).
        method: ``"holdout"`` or ``"bonferroni"`` (then ``thresholds`` is required).
        thresholds: ``"bonferroni"``: the grid fixed before the trials.
        candidates: ``"holdout"``: how many thresholds are tried on the selection half.
        rng: the split of ``"holdout"`` (default: fresh OS entropy).

    Raises:
        ValueError: fewer than 2 trials a side (4 for holdout), a bad method, confidence or
            delta, non-finite scores.
    """
    absent = np.asarray(absent, dtype=float).ravel()
    present = np.asarray(present, dtype=float).ravel()
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must lie in [0, 1), got {delta}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (np.isfinite(absent).all() and np.isfinite(present).all()):
        raise ValueError("scores must be finite")
    alpha = 1.0 - confidence
    trials = (int(absent.size), int(present.size))
    if method == "bonferroni":
        if thresholds is None:
            raise ValueError("method 'bonferroni' needs the thresholds fixed before the trials")
        grid = np.unique(np.asarray(thresholds, dtype=float).ravel())
        if min(trials) < 2 or grid.size == 0:
            raise ValueError("bonferroni: at least 2 trials a side and one threshold")
        # 2 directions x grid thresholds, 2 rates each: alpha / (4 |grid|) per rate
        return _best(
            np.sort(absent),
            np.sort(present),
            grid,
            delta,
            alpha / (2 * grid.size),
            confidence,
            trials,
            method,
        )
    if min(trials) < 4:
        raise ValueError(f"holdout needs at least 4 trials a side, got {trials}")
    rng = rng if rng is not None else np.random.default_rng()
    a, p = rng.permutation(absent), rng.permutation(present)
    sel_a, ev_a = np.sort(a[: a.size // 2]), np.sort(a[a.size // 2 :])
    sel_p, ev_p = np.sort(p[: p.size // 2]), np.sort(p[p.size // 2 :])
    grid = _candidates(np.concatenate([sel_a, sel_p]), candidates)
    *_, eps = _bounds(sel_a, sel_p, grid, delta, alpha)
    side, at = np.unravel_index(int(np.argmax(eps)), eps.shape)
    return _evaluate(
        ev_a, ev_p, float(grid[at]), int(side), delta, alpha, confidence, trials, method
    )


def _best(absent, present, grid, delta, alpha, confidence, trials, method):
    """The best of ``grid`` (both directions), each rate's limit at ``alpha / 2``."""
    *_, eps = _bounds(absent, present, grid, delta, alpha)
    side, at = np.unravel_index(int(np.argmax(eps)), eps.shape)
    return _evaluate(
        absent, present, float(grid[at]), int(side), delta, alpha, confidence, trials, method
    )


def _evaluate(absent, present, threshold, side, delta, alpha, confidence, trials, method):
    fp, fn, fpr_hi, fnr_hi, eps = _bounds(absent, present, np.array([threshold]), delta, alpha)
    fpr, fnr = fp[side, 0] / absent.size, fn[side, 0] / present.size
    point = float(epsilon_from_rates(fpr, fnr, delta))
    return AuditResult(
        float(eps[side, 0]),
        point,
        confidence,
        float(delta),
        threshold,
        ("above", "below")[side],
        float(fpr),
        float(fnr),
        float(fpr_hi[side, 0]),
        float(fnr_hi[side, 0]),
        trials,
        (int(absent.size), int(present.size)),
        method,
    )


def gaussian_epsilon(mu: float, delta: float) -> float:
    r"""Exact epsilon at ``delta`` of a Gaussian mechanism whose shift / noise std is ``mu``
    (Balle and Wang 2018, Thm. 8: the root of
    :math:`\delta = \Phi(-\varepsilon/\mu + \mu/2) - e^\varepsilon\Phi(-\varepsilon/\mu - \mu/2)`):
    what the best test of a Gaussian release can reach, the ceiling of an audit's bound."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if mu <= 0:
        return 0.0

    def gap(eps):
        return (
            norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta
        )

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    return float(brentq(gap, 0.0, hi, xtol=1e-10))
