"""Rényi DP of the (Confident-)GNMax aggregator of PATE (Papernot, Song, Mironov, Raghunathan,
Talwar & Erlingsson, "Scalable Private Learning with PATE", ICLR 2018; arXiv 1802.08908).

GNMax: the teachers' votes ``n [C]`` (counts per class) are released as
``argmax_j (n_j + N(0, sigma^2))``. One protected unit (here: one private node) changes at most
one teacher's vote, so a neighbouring histogram ``n'`` differs by ``-1`` in one class and ``+1``
in another (L2 distance ``sqrt 2``). Confident-GNMax first checks ``max_j n_j + N(0, sigma1^2)
>= T`` and answers (with GNMax of ``sigma2``) only if it passes.

Analyses (all RDP values in nats, at orders ``alpha > 1``):

* Data-independent (Prop. 8): GNMax is ``(alpha, alpha / sigma^2)``-RDP, the Gaussian mechanism
  on a histogram of L2 sensitivity ``sqrt 2``; it holds whatever the votes, and also for the
  release of the whole noisy histogram. The threshold check acts on ``max_j n_j`` (sensitivity
  1): ``alpha / (2 sigma1^2)``.
* Data-dependent (Thm. 6 with Prop. 7 and Prop. 10): with ``q >= Pr[GNMax(n) != argmax n]``
  (:func:`logq_gnmax`, a union bound over the other classes), a bound on
  ``D_alpha(M(n) || M(n'))`` for every neighbour ``n'`` that is far smaller than ``alpha /
  sigma^2`` when the teachers agree (:func:`rdp_gnmax_data_dependent`); the threshold's
  data-dependent cost is the same bound at ``sqrt 2 sigma1`` with ``q = min(Pr[answered],
  Pr[not answered])`` (:func:`rdp_threshold_data_dependent`).

The data-dependent figure depends on the votes, i.e. on the private data: it is a privacy
*loss* of this dataset, not a released guarantee (releasing it would need smooth sensitivity,
paper Sec. 4.3). Report it beside the data-independent guarantee, never instead of it.

The formulas follow the paper and its published analysis (tensorflow/privacy,
``research/pate_2018/core.py``: ``compute_logq_gaussian``, ``rdp_gaussian``,
``compute_logpr_answered``, ``compute_rdp_threshold``); this is an independent implementation,
tested against those formulas and a brute-force Rényi divergence (``tests/test_pate.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

from .rdp import rdp_to_epsilon

#: RDP orders of the PATE analysis (the paper's scripts use 2..100 and up to 500)
PATE_ORDERS: tuple[float, ...] = tuple(
    [1.25, 1.5, 1.75]
    + [float(a) for a in np.arange(2, 100.5, 0.5)]
    + [float(a) for a in np.logspace(np.log10(100), np.log10(1000), 40)[1:]]
)


def _orders(orders) -> np.ndarray:
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    if np.any(a <= 1):
        raise ValueError(f"orders must be > 1 (got {a[a <= 1].tolist()})")
    return a


def _check_sigma(sigma: float, name: str) -> float:
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"{name} must be finite and > 0 (got {sigma})")
    return sigma


def _log1mexp(x: float) -> float:
    """``log(1 - exp(x))`` for ``x <= 0`` (numerically stable)."""
    if x > 0:
        raise ValueError(f"log1mexp needs x <= 0 (got {x})")
    if x == 0:
        return -math.inf
    return math.log(-math.expm1(x)) if x > -math.log(2) else math.log1p(-math.exp(x))


def logq_gnmax(votes: Sequence[float], sigma: float) -> float:
    """``log q``, an upper bound on ``log Pr[GNMax(votes) != argmax votes]`` (paper Prop. 7):
    ``q <= sum_{j != i*} Pr[N(0, 2 sigma^2) >= n_i* - n_j]``, capped at ``1 - 1/C``.

    Args:
        votes: ``[C]`` vote counts (or any real scores); sigma: GNMax noise std.
    """
    sigma = _check_sigma(sigma, "sigma")
    n = np.asarray(votes, dtype=float)
    i = int(np.argmax(n))
    gaps = np.delete(n[i] - n, i)
    logq = float(logsumexp(norm.logsf(gaps, scale=math.sqrt(2) * sigma)))
    return min(logq, math.log(1 - 1 / n.size))


def rdp_gnmax_data_independent(sigma: float, orders=PATE_ORDERS) -> np.ndarray:
    """``alpha / sigma^2`` (paper Prop. 8): GNMax, or the whole noisy histogram."""
    return _orders(orders) / _check_sigma(sigma, "sigma") ** 2


def rdp_gnmax_data_dependent(logq: float, sigma: float, orders=PATE_ORDERS) -> np.ndarray:
    """Data-dependent RDP of GNMax at every order (paper Thm. 6, with the higher orders
    ``mu2 = sigma sqrt(-log q)``, ``mu1 = mu2 + 1`` of Prop. 10), never above
    :func:`rdp_gnmax_data_independent`.

    Thm. 6: if ``q < 1`` and ``q <= e^{(mu2-1) eps2} / (mu1/(mu1-1) * mu2/(mu2-1))^{mu2}``
    (and ``mu1 > alpha``, ``mu2 > 1``, ``-log q > eps2``), then
    ``D_alpha <= 1/(alpha-1) log((1-q) A^{alpha-1} + q B^{alpha-1})`` with
    ``A = (1-q) / (1 - (q e^{eps2})^{(mu2-1)/mu2})`` and ``B = e^{eps1} / q^{1/(mu1-1)}``,
    ``eps_i = mu_i / sigma^2`` (the data-independent RDP at ``mu_i``).
    """
    a = _orders(orders)
    sigma = _check_sigma(sigma, "sigma")
    if logq > 0:
        raise ValueError(f"logq must be <= 0 (got {logq})")
    if math.isinf(logq):  # the output is fixed: 0-RDP
        return np.zeros_like(a)
    var = sigma**2
    ret = a / var
    mu2 = math.sqrt(var * -logq)
    mu1 = mu2 + 1
    if mu2 <= 1:
        return ret
    eps1, eps2 = mu1 / var, mu2 / var
    cond = (mu2 - 1) * eps2 - mu2 * (math.log(1 + 1 / (mu1 - 1)) + math.log(1 + 1 / (mu2 - 1)))
    mask = mu1 > a
    if not (mask.any() and logq <= cond and -logq > eps2):
        return ret
    log1q = _log1mexp(logq)
    log_a = (a - 1) * (log1q - _log1mexp((logq + eps2) * (1 - 1 / mu2)))
    log_b = (a - 1) * (eps1 - logq / (mu1 - 1))
    dep = np.logaddexp(log1q + log_a, logq + log_b) / (a - 1)
    ret[mask] = np.minimum(ret, dep)[mask]
    return ret


def logpr_answered(threshold: float, sigma1: float, votes: Sequence[float]) -> float:
    """``log Pr[max votes + N(0, sigma1^2) >= threshold]`` (Confident-GNMax's check)."""
    return float(
        norm.logsf(float(threshold) - float(np.max(votes)), scale=_check_sigma(sigma1, "sigma1"))
    )


def rdp_threshold_data_independent(sigma1: float, orders=PATE_ORDERS) -> np.ndarray:
    """``alpha / (2 sigma1^2)``: Gaussian on ``max_j n_j`` (sensitivity 1)."""
    return rdp_gnmax_data_independent(math.sqrt(2) * _check_sigma(sigma1, "sigma1"), orders)


def rdp_threshold_data_dependent(logpr: float, sigma1: float, orders=PATE_ORDERS) -> np.ndarray:
    """Data-dependent RDP of the threshold check: Thm. 6 at ``sqrt 2 sigma1`` with ``q`` the
    probability of the less likely outcome, ``min(Pr[answered], Pr[not answered])``."""
    logq = min(float(logpr), _log1mexp(min(float(logpr), 0.0)))
    return rdp_gnmax_data_dependent(logq, math.sqrt(2) * _check_sigma(sigma1, "sigma1"), orders)


@dataclass
class ConfidentGNMaxCost:
    """RDP curves of a run of (Confident-)GNMax, at :attr:`orders`: ``independent`` (the
    guarantee: every query's threshold check, every answer) and ``dependent`` (the
    data-dependent loss of these votes); :meth:`epsilon` converts at ``delta``."""

    orders: np.ndarray
    independent: np.ndarray
    dependent: np.ndarray
    queries: int
    answered: int

    def epsilon(
        self, delta: float, which: str = "independent", conversion: str = "balle2020"
    ) -> float:
        """Epsilon (nats) at ``delta`` of the ``independent`` or ``dependent`` curve."""
        curve = {"independent": self.independent, "dependent": self.dependent}[which]
        return rdp_to_epsilon(self.orders, curve, delta, conversion)[0]


def confident_gnmax_cost(
    votes,
    answered,
    sigma2: float,
    threshold: float | None = None,
    sigma1: float | None = None,
    orders=PATE_ORDERS,
) -> ConfidentGNMaxCost:
    """RDP of Confident-GNMax over ``Q`` queries (paper Alg. 1 and Sec. 4).

    Args:
        votes: ``[Q, C]`` noise-free vote counts of the whole ensemble (the histogram the
            noise is added to).
        answered: bool ``[Q]``: which queries passed the (noisy) threshold check and were
            answered by GNMax. Without a threshold, all of them.
        sigma2: GNMax noise std; threshold, sigma1: the check (``None``: plain GNMax, every
            query answered).

    Every query pays the threshold check; answered ones pay GNMax too. Data-dependent:
    Thm. 6 per query (:func:`rdp_threshold_data_dependent`, :func:`rdp_gnmax_data_dependent`).
    """
    a = _orders(orders)
    v = np.asarray(votes, dtype=float)
    ans = np.asarray(answered, dtype=bool)
    if v.ndim != 2 or ans.shape != (v.shape[0],):
        raise ValueError(f"votes must be [Q, C] and answered [Q] (got {v.shape}, {ans.shape})")
    checked = threshold is not None
    if checked and sigma1 is None:
        raise ValueError("sigma1 is needed with a threshold")
    if not checked and not ans.all():
        raise ValueError("without a threshold every query is answered")
    ind = np.zeros_like(a)
    dep = np.zeros_like(a)
    for row, was_answered in zip(v, ans):
        if checked:
            ind += rdp_threshold_data_independent(sigma1, a)
            dep += rdp_threshold_data_dependent(logpr_answered(threshold, sigma1, row), sigma1, a)
        if was_answered:
            ind += rdp_gnmax_data_independent(sigma2, a)
            dep += rdp_gnmax_data_dependent(logq_gnmax(row, sigma2), sigma2, a)
    return ConfidentGNMaxCost(a, ind, dep, int(v.shape[0]), int(ans.sum()))


def gnmax_output_distribution(
    votes: Sequence[float], sigma: float, points: int = 4001
) -> np.ndarray:
    """``Pr[argmax_j (n_j + N(0, sigma^2)) = i]`` for every class ``i`` by numerical
    integration (``int phi_i(x) prod_{j != i} Phi_j(x) dx`` on a grid of ``points`` over
    ``+-12 sigma``). For tests of the bounds on small vote vectors."""
    n = np.asarray(votes, dtype=float)
    sigma = _check_sigma(sigma, "sigma")
    x = np.linspace(n.min() - 12 * sigma, n.max() + 12 * sigma, points)
    logcdf = norm.logcdf(x[:, None], loc=n[None, :], scale=sigma)  # [P, C]
    logpdf = norm.logpdf(x[:, None], loc=n[None, :], scale=sigma)
    total = logcdf.sum(1, keepdims=True)
    dens = np.exp(logpdf + total - logcdf)  # phi_i(x) prod_{j != i} Phi_j(x)
    p = np.trapezoid(dens, x, axis=0)
    return p / p.sum()


__all__ = [
    "PATE_ORDERS",
    "logq_gnmax",
    "rdp_gnmax_data_independent",
    "rdp_gnmax_data_dependent",
    "logpr_answered",
    "rdp_threshold_data_independent",
    "rdp_threshold_data_dependent",
    "ConfidentGNMaxCost",
    "confident_gnmax_cost",
    "gnmax_output_distribution",
]
