"""Noise calibration: the smallest noise multiplier that meets an epsilon target."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .accountants import Accountant, check_delta, compose_epsilon
from .events import Event

#: the largest noise multiplier :func:`calibrate` searches by default (its ``upper``)
MAX_NOISE_MULTIPLIER = 1e3


class CalibrationError(ValueError):
    """Calibration ran out of its evaluation or time budget (the message names the target)."""


class UnreachableTarget(ValueError):
    """Even the largest noise multiplier searched does not meet the target: ``epsilon`` is
    what the events spend there, the smallest target a calibration can reach."""

    def __init__(self, message: str, epsilon: float):
        super().__init__(message)
        self.epsilon = epsilon


class _Budget:
    """Counts accountant evaluations and wall time of one calibration (the RDP pre-search
    shares it); :meth:`spend` raises :class:`CalibrationError` once either is used up."""

    def __init__(self, max_evaluations: int, time_budget_s: float | None, what: str):
        self.done = 0
        self.max_evaluations = max_evaluations
        self.time_budget_s = time_budget_s
        self.start = time.monotonic()
        self.what = what

    def spend(self) -> None:
        """Count one evaluation about to run; raise if the budget is already used up."""
        used = time.monotonic() - self.start
        if self.done >= self.max_evaluations or (
            self.time_budget_s is not None and used > self.time_budget_s
        ):
            raise CalibrationError(
                f"calibration for {self.what} did not finish: stopped after "
                f"{self.done} accountant evaluations and {used:.1f} s "
                f"(budget: {self.max_evaluations} evaluations, "
                f"{self.time_budget_s if self.time_budget_s is not None else 'no'} s limit); "
                "raise delta or epsilon, use accountant='rdp', or raise the budget"
            )
        self.done += 1


def epsilon_floor(
    make_events: Callable[[float], list[Event]] | None,
    delta: float,
    accountant: str | Accountant = "prv",
    upper: float = MAX_NOISE_MULTIPLIER,
) -> float:
    """The smallest target :func:`calibrate` can reach for these events: their epsilon at the
    largest noise multiplier it searches, ``upper`` (``make_events`` ``None``: nothing is
    noised, ``0.0``). One accountant evaluation, so a preflight can check a target before
    the calibration itself runs."""
    if make_events is None:
        return 0.0
    return float(compose_epsilon(make_events(upper), check_delta(delta), accountant))


def calibrate(
    target_epsilon: float,
    delta: float,
    make_events: Callable[[float], list[Event]],
    accountant: str | Accountant = "prv",
    lower: float = 0.1,
    upper: float = MAX_NOISE_MULTIPLIER,
    rtol: float = 1e-3,
    max_evaluations: int = 200,
    time_budget_s: float | None = 600.0,
    _budget: _Budget | None = None,
) -> float:
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

    The search is bounded: at most ``max_evaluations`` accountant evaluations (a search
    needs about 20-40) and ``time_budget_s`` seconds of wall time (checked after each
    evaluation, so one slow evaluation may overrun it; ``None``: no time limit).

    Raises:
        ValueError: ``target_epsilon`` not finite and > 0; ``delta`` outside
            ``[DELTA_FLOOR, 1)`` (:func:`~fedgraph.accounting.check_delta`);
            ``lower``/``upper``/``rtol``/``max_evaluations``/``time_budget_s`` invalid;
            :class:`UnreachableTarget` (a ValueError) when even ``sigma = upper`` does not reach
            ``target_epsilon``.
        CalibrationError: (a ValueError) the evaluation or time budget ran out; the message
            names ``target_epsilon`` and ``delta``.
    """
    if isinstance(target_epsilon, bool) or not (
        target_epsilon > 0 and math.isfinite(target_epsilon)
    ):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    delta = check_delta(delta)
    if isinstance(max_evaluations, bool) or not (
        isinstance(max_evaluations, int) and max_evaluations >= 1
    ):
        raise ValueError(f"max_evaluations must be an int >= 1, got {max_evaluations!r}")
    if time_budget_s is not None and not (time_budget_s > 0):
        raise ValueError(f"time_budget_s must be > 0 or None, got {time_budget_s!r}")
    if not (0 < lower < upper and math.isfinite(upper)):
        raise ValueError(f"need 0 < lower < upper < inf, got lower={lower!r}, upper={upper!r}")
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must lie in (0, 1), got {rtol!r}")

    budget = _budget or _Budget(
        max_evaluations, time_budget_s, f"target_epsilon={target_epsilon:g}, delta={delta:g}"
    )

    def eps(sigma: float) -> float:
        budget.spend()
        return compose_epsilon(make_events(sigma), delta, accountant)

    seed = _rdp_bracket(target_epsilon, delta, make_events, accountant, lower, upper, eps, budget)
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
                raise UnreachableTarget(
                    f"unreachable target: epsilon {e:.6g} > {target_epsilon:g} even at the "
                    f"largest noise multiplier {upper:g}; raise `upper`",
                    e,
                )
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


def _rdp_bracket(target_epsilon, delta, make_events, accountant, lower, upper, eps, budget):
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
        hi = calibrate(
            target_epsilon, delta, make_events, "rdp", lower, upper, rtol=1e-2, _budget=budget
        )
    except CalibrationError:
        raise
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
