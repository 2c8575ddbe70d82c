"""Rényi-DP curves of the events and their conversion to ``(epsilon, delta)``.

All curves are in nats, at the orders ``alpha`` given (``DEFAULT_ORDERS`` = dp-accounting's
``DEFAULT_RDP_ORDERS``: 1.1 ... 10.9 by 0.1, 11 ... 63, 128, 256, 512, 1024).

* Gaussian, ``count`` times, multiplier ``s``: ``count * alpha / (2 s^2)`` (Mironov 2017,
  Prop. 7; exact).
* Poisson-subsampled Gaussian: Opacus' ``compute_rdp`` (Mironov, Talwar & Zhang 2019,
  "Rényi DP of the Sampled Gaussian Mechanism"; exact at integer orders).
* Laplace, multiplier ``b`` (scale / L1 sensitivity): Mironov 2017, Prop. 6 (exact).
* Poisson-subsampled Laplace: the *exact* Rényi divergence of the dominating pair, computed
  numerically. With the shift normalised to 1, removal gives ``P = (1-q) Lap(0, b) + q Lap(1,
  b)`` vs ``Q = Lap(0, b)``; the likelihood ratio ``P/Q`` is ``(1-q) + q e^{-1/b}`` on
  ``x <= 0``, ``(1-q) + q e^{1/b}`` on ``x >= 1`` and ``(1-q) + q e^{(2x-1)/b}`` in between,
  so ``E_Q[(P/Q)^t]`` is two closed-form tail terms plus a 1-D integral over ``[0, 1]``
  (``scipy.integrate.quad``). ``t = alpha`` gives ``D_alpha(P||Q)`` (removal), ``t = 1 -
  alpha`` gives ``D_alpha(Q||P)`` (addition); the curve is the larger of the two. For integer
  orders the removal direction equals the binomial formula of Zhu & Wang 2019 (Thm. 5, their
  "lower bound", which autodp's ``compose_poisson_subsampled_mechanisms`` uses); their general
  upper bound (Thm. 6) carries an extra factor 3 on the terms of order >= 3 and is much looser.
* ``PureDP(epsilon)``: the Rényi divergence of randomized response with parameter epsilon,
  ``log(p^a q^(1-a) + q^a p^(1-a)) / (a - 1)`` with ``p = e^eps / (1 + e^eps)``, ``q = 1-p``.
  Valid for every epsilon-DP mechanism: each is a post-processing of randomized response
  (Kairouz, Oh & Viswanath 2015, Thm. 2.1), and Rényi divergence obeys data processing.
  (prv-accountant 0.2.0's ``PureDPMechanism.rdp`` returns ``(a-1) eps / a``, which is *below*
  this for small orders; see ``accountants._PureDPPRV``.)
* ``ApproxDP``: no finite RDP curve (``NotImplementedError``).

Conversion to ``(epsilon, delta)``: ``"balle2020"`` (default; Balle et al. 2020, "Hypothesis
testing interpretations and Rényi DP", Thm. 21; the same as dp-accounting's and Opacus')
or ``"mironov2017"`` (Mironov 2017, Prop. 3: ``min_a rdp(a) + log(1/delta)/(a-1)``; looser,
used by autodp and hence by papers that report autodp figures, e.g. PrivGNN).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from .events import ApproxDP, Event, Gaussian, Laplace, PureDP, SubsampledGaussian

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]
)
CONVERSIONS = ("balle2020", "mironov2017")


def laplace_rdp(noise_multiplier: float, order: float) -> float:
    """RDP (nats) of one Laplace mechanism with scale/sensitivity ``noise_multiplier``.

    Mironov 2017, Prop. 6: ``eps + log1p((a-1) expm1((1-2a) eps) / (2a-1)) / (a-1)`` with
    ``eps = 1 / noise_multiplier``, in a form stable for large ``eps * a``.
    """
    eps = 1.0 / noise_multiplier
    a = float(order)
    if a == 1.0:
        return eps + math.expm1(-eps)
    return eps + math.log1p((a - 1) * math.expm1((1 - 2 * a) * eps) / (2 * a - 1)) / (a - 1)


def pure_dp_rdp(epsilon: float, order: float) -> float:
    """RDP (nats) of randomized response with parameter ``epsilon`` (tight for epsilon-DP)."""
    a = float(order)
    lp = -math.log1p(math.exp(-epsilon))  # log(e^eps / (1 + e^eps))
    lq = lp - epsilon
    return float(np.logaddexp(a * lp + (1 - a) * lq, a * lq + (1 - a) * lp) / (a - 1))


def _log_moment_subsampled_laplace(b: float, q: float, t: float) -> float:
    """``log E_Q[(P/Q)^t]`` for P = (1-q) Lap(0,b) + q Lap(1,b), Q = Lap(0,b)."""
    from scipy import integrate

    lr_lo = math.log1p(q * math.expm1(-1.0 / b))  # log P/Q on x <= 0
    lr_hi = math.log1p(q * math.expm1(1.0 / b))  # log P/Q on x >= 1

    def g(x):  # log of the integrand on [0, 1]: log Q-density + t log(P/Q)
        return -x / b - math.log(2 * b) + t * math.log1p(q * math.expm1((2 * x - 1) / b))

    grid = np.linspace(0.0, 1.0, 257)
    m = max(g(x) for x in grid)
    val, _ = integrate.quad(
        lambda x: math.exp(g(x) - m), 0.0, 1.0, epsabs=0.0, epsrel=1e-10, limit=500, points=[0.5]
    )
    terms = [math.log(0.5) + t * lr_lo, math.log(0.5) - 1.0 / b + t * lr_hi]
    if val > 0:
        terms.append(m + math.log(val))
    return float(np.logaddexp.reduce(terms))


def subsampled_laplace_rdp(noise_multiplier: float, sample_rate: float, order: float) -> float:
    """RDP (nats) of one Poisson-subsampled Laplace mechanism, exact up to quadrature error.

    The larger of the removal and addition Rényi divergences (module docstring). For
    ``sample_rate == 1`` this is :func:`laplace_rdp`.
    """
    if sample_rate >= 1.0:
        return laplace_rdp(noise_multiplier, order)
    a = float(order)
    remove = _log_moment_subsampled_laplace(noise_multiplier, sample_rate, a) / (a - 1)
    add = _log_moment_subsampled_laplace(noise_multiplier, sample_rate, 1 - a) / (a - 1)
    return max(remove, add, 0.0)


@functools.lru_cache(maxsize=4096)
def _subsampled_gaussian_step(
    sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]
) -> np.ndarray:
    """One step's RDP curve of the Poisson-subsampled Gaussian (Mironov et al. 2019, via
    Opacus's ``compute_rdp``, whose ``steps`` steps are ``steps`` times this curve exactly),
    kept: the fractional orders cost milliseconds each, and a run composes the same step
    (one client's DP-SGD schedule, its report, its cross-check) many times. Read-only."""
    from .._lazy import import_without_root_logging

    compute_rdp = import_without_root_logging("opacus.accountants.analysis.rdp").compute_rdp
    curve = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)),
        dtype=float,
    )
    curve.flags.writeable = False
    return curve


def event_rdp(event: Event, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP curve (nats) of ``event`` (all its applications) at ``orders``.

    Raises:
        NotImplementedError: for ``ApproxDP`` (a delta > 0 has no finite RDP curve).
    """
    orders = [float(a) for a in orders]
    if isinstance(event, Gaussian):
        return np.array([event.count * a / (2 * event.noise_multiplier**2) for a in orders])
    if isinstance(event, SubsampledGaussian):
        if event.sample_rate >= 1.0:
            return np.array([event.steps * a / (2 * event.noise_multiplier**2) for a in orders])
        return event.steps * _subsampled_gaussian_step(
            event.sample_rate, event.noise_multiplier, tuple(orders)
        )
    if isinstance(event, Laplace):
        return np.array(
            [
                event.count * subsampled_laplace_rdp(event.noise_multiplier, event.sample_rate, a)
                for a in orders
            ]
        )
    if isinstance(event, PureDP):
        return np.array([event.count * pure_dp_rdp(event.epsilon, a) for a in orders])
    if isinstance(event, ApproxDP):
        raise NotImplementedError("ApproxDP (delta > 0) has no finite RDP curve")
    raise TypeError(f"unknown privacy event {event!r}")


def rdp_to_epsilon(
    orders: Sequence[float], rdp: Sequence[float], delta: float, conversion: str = "balle2020"
) -> tuple[float, float]:
    """``(epsilon, best order)`` from an RDP curve at ``delta`` in (0, 1).

    Raises:
        ValueError: ``delta`` outside (0, 1), unequal lengths, unknown ``conversion``.
    """
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if len(orders) != len(rdp):
        raise ValueError("orders and rdp must have the same length")
    if conversion == "balle2020":
        from dp_accounting.rdp import compute_epsilon

        from .._lazy import no_root_logging_config

        with no_root_logging_config():  # absl's warnings (once each): no basicConfig
            eps, order = compute_epsilon(list(orders), list(rdp), delta)
        return float(eps), float(order)
    if conversion == "mironov2017":
        a = np.asarray(orders, dtype=float)
        eps = np.asarray(rdp, dtype=float) + math.log(1 / delta) / (a - 1)
        i = int(np.nanargmin(eps))
        return float(max(eps[i], 0.0)), float(a[i])
    raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
