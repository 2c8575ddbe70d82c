"""Noise calibration: the smallest noise multiplier that meets an epsilon target."""
from __future__ import annotations

import math
from collections.abc import Callable

from .accountants import Accountant, compose_epsilon
from .events import Event


def calibrate(target_epsilon: float, delta: float, make_events: Callable[[float], list[Event]],
              accountant: str | Accountant = "prv", lower: float = 0.1, upper: float = 1e3,
              rtol: float = 1e-3) -> float:
    """The smallest noise multiplier ``sigma`` in ``[lower, upper]`` (up to ``rtol``) with
    ``compose_epsilon(make_events(sigma), delta, accountant) <= target_epsilon``.

    ``sigma`` is whatever ``make_events`` takes (a noise multiplier: noise scale /
    sensitivity). For the events here epsilon decreases monotonically in the noise
    multiplier (more noise is never less private), so the feasible set is an interval
    ``[sigma*, upper]``. It is bracketed by stepping up from ``lower`` a factor of 10 at a
    time (capped at ``upper``), then found by bisection on ``log sigma``. The returned value
    always satisfies the target (it is the feasible end of the final bracket), and the bracket
    is narrower than ``rtol`` relative: ``sigma* <= result <= sigma* (1 + rtol)``, up to the
    accountant's own error (prv: its upper bound is used, so the result is conservative).
    If ``make_events(lower)`` already meets the target, the bracket is expanded downward
    (factors of 10, down to ``lower * 1e-6``); if that still meets it, it is returned.

    Raises:
        ValueError: ``target_epsilon`` not finite and > 0; ``delta`` outside (0, 1);
            ``lower``/``upper``/``rtol`` invalid; "unreachable target" when even
            ``sigma = upper`` does not reach ``target_epsilon``.
    """
    if isinstance(target_epsilon, bool) or not (target_epsilon > 0
                                                and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if not (0 < lower < upper and math.isfinite(upper)):
        raise ValueError(f"need 0 < lower < upper < inf, got lower={lower!r}, upper={upper!r}")
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must lie in (0, 1), got {rtol!r}")

    def eps(sigma: float) -> float:
        return compose_epsilon(make_events(sigma), delta, accountant)

    seed = _rdp_bracket(target_epsilon, delta, make_events, accountant, lower, upper, eps)
    if seed is not None:
        return _bisect(*seed, lambda sigma: eps(sigma) <= target_epsilon, rtol)
    # Bracket from below, a decade at a time, so that extreme noise is rarely evaluated.
    lo, hi, e = lower, None, eps(lower)
    if e <= target_epsilon:  # lower already feasible: expand the bracket downward
        hi = lo
        while True:
            if hi <= lower * 1.000001e-6:
                return hi
            lo = hi / 10
            if eps(lo) > target_epsilon:
                break
            hi = lo
    else:
        while hi is None:
            x = min(lo * 10, upper)
            e = eps(x)
            if e <= target_epsilon:
                hi = x
            elif x >= upper:
                raise ValueError(
                    f"unreachable target: epsilon {e:.6g} > {target_epsilon:g} even at the "
                    f"largest noise multiplier {upper:g}; raise `upper`")
            else:
                lo = x
    return _bisect(lo, hi, lambda sigma: eps(sigma) <= target_epsilon, rtol)


def _bisect(lo: float, hi: float, feasible: Callable[[float], bool], rtol: float) -> float:
    """Bisection on ``log sigma`` keeping ``feasible(hi)`` and not ``feasible(lo)`` until
    ``hi / lo - 1 <= rtol``; returns ``hi`` (feasible)."""
    while hi / lo - 1 > rtol:
        mid = math.sqrt(lo * hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _rdp_bracket(target_epsilon, delta, make_events, accountant, lower, upper, eps):
    """``(lo, hi)`` with ``eps(lo) > target >= eps(hi)`` found near the answer, or ``None``.

    A tight accountant (prv, pld) is slow and memory-hungry far from the answer: at noise
    multipliers much smaller than the answer prv-accountant fails numerically and the PLD
    fallback of hundreds of DP-SGD steps took 60 s and 8.7 GB in one GAP client's node-level
    calibration. RDP is cheap everywhere and an upper bound on epsilon, so its calibrated
    ``sigma_rdp`` is (up to the tight accountant's own error) feasible and the answer lies a
    little below it: the tight accountant is then only evaluated within a factor of 2 steps of
    ``sigma_rdp``. ``None`` (use the plain search) for the rdp accountant itself, or when RDP
    cannot handle the events.
    """
    from .accountants import get_accountant

    if get_accountant(accountant).name == "rdp":
        return None
    try:
        hi = calibrate(target_epsilon, delta, make_events, "rdp", lower, upper, rtol=1e-2)
    except ValueError:
        return None  # e.g. unreachable under RDP: let the plain search decide (and explain)
    while eps(hi) > target_epsilon:  # the tight accountant's error made it infeasible
        if hi >= upper:
            return None
        hi = min(hi * 1.25, upper)
    lo = hi / 2
    while eps(lo) <= target_epsilon:
        if lo <= lower:
            return None
        hi, lo = lo, max(lo / 2, lower)
    return lo, hi
