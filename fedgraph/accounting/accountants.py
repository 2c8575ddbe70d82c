"""Accountants: events in, epsilon out (the shape of Opacus' accountants), swappable by name.

* ``"prv"`` — prv-accountant (Gopi, Lee & Wutschitz 2021, "Numerical Composition of
  Differential Privacy"). Returns its **upper** bound (conservative): the true epsilon lies in
  ``[lower, upper]`` and ``upper - lower`` is about ``2 * eps_error``. Supports Gaussian,
  SubsampledGaussian, Laplace without subsampling, PureDP and ApproxDP. Poisson-subsampled
  Laplace is not in prv-accountant: such event lists go to ``"pld"`` (with a note). So do
  lists on which its numerics fail (``RuntimeError: Discrete mean differs from continuous mean
  significantly`` for tiny pure epsilons, ``ValueError`` for tiny deltas): it first retries with
  a 10x looser ``delta_error``, then falls back to PLD, recording both in the notes.
* ``"pld"`` — dp-accounting's privacy loss distributions (Koskela et al. 2020; Doroshenko et
  al. 2022, "Connect the Dots"), pessimistic estimate, value discretisation 1e-4: the same
  PLDs ``dp_accounting.pld.PLDAccountant`` builds for ``GaussianDpEvent``,
  ``PoissonSampledDpEvent(GaussianDpEvent | LaplaceDpEvent)``, ``LaplaceDpEvent`` and
  ``SelfComposedDpEvent`` (see :func:`to_dp_event`), composed directly so that ``PureDP`` /
  ``ApproxDP`` can join: dp-accounting has no epsilon-delta *event*, but has the closed-form
  worst-case PLD of an ``(epsilon, delta)`` guarantee (``from_privacy_parameters``; the PLD of
  randomized response plus mass delta at infinity), which we compose with the rest.
* ``"rdp"`` — Rényi DP (:mod:`fedgraph.accounting.rdp`), converted with Balle et al. 2020.
  Looser than the other two; every event type but ``ApproxDP``.

For pure-only lists (PureDP / ApproxDP / Laplace) the result is never above basic
composition (sum of epsilons), which holds at every delta.

Every result carries the accountant actually used and notes on fallbacks; ``delta`` of a
result is the requested delta plus the deltas the ApproxDP events carry themselves.
:func:`compose` returns the tightest of the valid upper bounds that succeed (the requested
accountant's, RDP's, and PLD's when the requested one fails or gives infinity), never infinity
when one of them is finite; deltas below :data:`DELTA_FLOOR` are refused by run configs,
ledger summaries and calibration.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .events import (
    ApproxDP,
    Event,
    Gaussian,
    Laplace,
    PureDP,
    SubsampledGaussian,
    check_event,
    event_delta,
    pure_epsilon,
)
from .rdp import CONVERSIONS, DEFAULT_ORDERS, event_rdp, rdp_to_epsilon

#: The smallest delta a run config, a ledger summary or a calibration accepts. Below it the
#: tight accountants are not reliable: prv-accountant's ``delta_error`` (1e-3 of delta) meets
#: float64 round-off and it fails (seen at 1e-14 for ``SubsampledGaussian(0.00033, 4, 10^4)``,
#: fine at 1e-12), and dp-accounting's PLD truncates tails of mass 1e-15 (infinity at 1e-18).
#: :func:`compose` itself still answers below it (with RDP's bound, see :func:`_tightest`).
DELTA_FLOOR = 1e-12


def check_delta(delta: float, name: str = "delta") -> float:
    """``delta`` as a float if it lies in ``[DELTA_FLOOR, 1)``.

    Raises:
        ValueError: naming ``name`` and the allowed range, for a delta that is not a real
            number, is NaN, or lies outside ``[1e-12, 1)``.
    """
    if (
        isinstance(delta, bool)
        or not isinstance(delta, (int, float))
        or not (DELTA_FLOOR <= float(delta) < 1.0)
    ):
        raise ValueError(
            f"{name} must lie in [{DELTA_FLOOR:g}, 1) (below {DELTA_FLOOR:g} the "
            f"prv and pld accountants are not reliable), got {delta!r}"
        )
    return float(delta)


@dataclass(frozen=True)
class Composition:
    """The result of composing events.

    ``epsilon`` (nats) holds at total ``delta`` (= requested delta + the ApproxDP events'
    own deltas). ``accountant``: the one that produced ``epsilon``; ``requested``: the one
    asked for; ``bounds``: ``(lower, estimate, upper)`` where the accountant gives them;
    ``notes``: fallbacks and loosened tolerances, in words.
    """

    epsilon: float
    delta: float
    accountant: str
    requested: str
    bounds: tuple[float, float, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


class Accountant(ABC):
    """Composes a list of events into an epsilon at a delta. Subclasses: a ``name`` and
    :meth:`_epsilon`; they raise ``NotImplementedError`` for event types they lack."""

    name: str = "?"

    @abstractmethod
    def _epsilon(self, events: list[Event], delta: float) -> tuple[float, tuple | None, list[str]]:
        """``(epsilon, bounds or None, notes)`` at the *total* delta ``delta``."""

    def supports(self, events: Sequence[Event]) -> bool:
        return True

    def compose(self, events: Sequence[Event], delta: float) -> Composition:
        """Compose ``events``; ``delta`` (in (0, 1)) excludes the ApproxDP events' deltas.

        Raises:
            ValueError: ``delta`` outside (0, 1) or total delta >= 1.
            NotImplementedError: an event type this accountant lacks.
        """
        events = list(events)
        for e in events:
            check_event(e)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        total = delta + sum(event_delta(e) for e in events)
        if total >= 1.0:
            raise ValueError(f"total delta {total} (delta plus ApproxDP deltas) must be < 1")
        if not events:
            return Composition(0.0, total, self.name, self.name)
        eps, bounds, notes = self._epsilon(events, total)
        return Composition(
            float(eps),
            total,
            self.name,
            self.name,
            None if bounds is None else tuple(float(b) for b in bounds),
            tuple(notes),
        )


def _gaussian_equivalent(events: list[Event]) -> tuple[float | None, list[Event]]:
    """Merge all full-batch Gaussian events into one noise multiplier (exact: mu^2 add up).

    Returns ``(noise multiplier or None, the other events)``.
    """
    inv_var, rest = 0.0, []
    for e in events:
        if isinstance(e, Gaussian):
            inv_var += e.count / e.noise_multiplier**2
        elif isinstance(e, SubsampledGaussian) and e.sample_rate >= 1.0:
            inv_var += e.steps / e.noise_multiplier**2
        else:
            rest.append(e)
    return (inv_var**-0.5 if inv_var > 0 else None), rest


def _grouped(events: list[Event]) -> Counter:
    """Events with their repetition folded out: ``{(kind, params...): compositions}``."""
    groups: Counter = Counter()
    for e in events:
        if isinstance(e, SubsampledGaussian):
            groups[("sgm", e.sample_rate, e.noise_multiplier)] += e.steps
        elif isinstance(e, Laplace):
            groups[("laplace", e.noise_multiplier, e.sample_rate)] += e.count
        elif isinstance(e, PureDP):
            groups[("approx", e.epsilon, 0.0)] += e.count
        elif isinstance(e, ApproxDP):
            groups[("approx", e.epsilon, e.delta)] += e.count
        else:
            raise TypeError(f"unexpected event {e!r}")
    return groups


# ---------------------------------------------------------------------------------------- PRV


def _prv_classes():
    """prv-accountant's pure/approximate-DP variables with a correct RDP curve.

    prv-accountant 0.2.0 sizes its discretisation domain from the PRVs' RDP curves
    (``compute_safe_domain_size``), and ``PureDPMechanism.rdp(a)`` returns ``(a-1) eps / a``,
    an underestimate (e.g. 0.5 instead of 0.735 at a = 2, eps = 1). The domain then comes out
    too small and epsilon far too low: 1000 x PureDP(1) at delta 1e-5 gave 45.8 or 68.9
    (depending on delta_error) where PLD and the CLT give about 578. We override ``rdp`` with
    randomized response's (:func:`fedgraph.accounting.rdp.pure_dp_rdp`).
    """
    import numpy as np
    from prv_accountant import ApproximateDPMechanism, PureDPMechanism

    from .rdp import pure_dp_rdp

    class PureDPPRV(PureDPMechanism):
        def rdp(self, alpha):
            return np.vectorize(lambda a: pure_dp_rdp(self.eps, a))(alpha)

    class ApproxDPPRV(ApproximateDPMechanism):
        def __init__(self, epsilon, delta):
            super().__init__(epsilon, delta)
            self.pure_dp = PureDPPRV(epsilon)

    return PureDPPRV, ApproxDPPRV


class PrvAccountant(Accountant):
    """prv-accountant, upper bound. ``eps_error`` (nats) is chosen per call as
    ``rel_eps_error`` times an RDP upper estimate of epsilon (at least ``min_eps_error``),
    loosened if the discretisation would exceed ``max_points`` mesh points (run time grows
    about linearly with them: ~1 s per 10^6 points and PRV); ``delta_error`` is
    ``delta_error_fraction`` times the free delta (then 10x that on failure). So the reported
    upper bound is within about ``2 * rel_eps_error`` (relative) of the true epsilon unless a
    note says the tolerance was loosened.
    """

    name = "prv"

    def __init__(
        self,
        rel_eps_error: float = 2e-3,
        min_eps_error: float = 1e-3,
        delta_error_fraction: float = 1e-3,
        max_points: int = 2**20,
    ):
        self.rel_eps_error = rel_eps_error
        self.min_eps_error = min_eps_error
        self.delta_error_fraction = delta_error_fraction
        self.max_points = max_points

    def supports(self, events: Sequence[Event]) -> bool:
        return not any(isinstance(e, Laplace) and e.sample_rate < 1.0 for e in events)

    def _prvs(self, events: list[Event]):
        from prv_accountant import (
            GaussianMechanism,
            LaplaceMechanism,
            PoissonSubsampledGaussianMechanism,
        )

        PureDPPRV, ApproxDPPRV = _prv_classes()
        sigma, rest = _gaussian_equivalent(events)
        prvs, counts = [], []
        if sigma is not None:
            prvs.append(GaussianMechanism(noise_multiplier=sigma))
            counts.append(1)
        for key, n in _grouped(rest).items():
            if key[0] == "sgm":
                prvs.append(
                    PoissonSubsampledGaussianMechanism(
                        sampling_probability=key[1], noise_multiplier=key[2]
                    )
                )
            elif key[0] == "laplace":
                if key[2] < 1.0:
                    raise NotImplementedError(
                        "prv-accountant has no Poisson-subsampled Laplace mechanism"
                    )
                prvs.append(LaplaceMechanism(mu=1.0 / key[1]))  # mu = sensitivity / scale
            elif key[2] > 0:
                prvs.append(ApproxDPPRV(key[1], key[2]))
            else:
                prvs.append(PureDPPRV(key[1]))
            counts.append(n)
        return prvs, counts

    def _epsilon(self, events, delta):
        import numpy as np
        from prv_accountant import PRVAccountant
        from prv_accountant.accountant import compute_safe_domain_size
        from prv_accountant.other_accountants import RDP

        if not self.supports(events):
            raise NotImplementedError("prv-accountant has no Poisson-subsampled Laplace")
        prvs, counts = self._prvs(events)
        free = delta - sum(event_delta(e) for e in events)
        notes = []
        n_total = sum(counts)
        _, _, guess = RDP(prvs=prvs).compute_epsilon(delta=free, num_self_compositions=counts)
        guess = min(guess, sum(pure_epsilon(e) for e in events))
        if not math.isfinite(guess):
            guess = 1.0
        eps_error = max(self.rel_eps_error * guess, self.min_eps_error)
        last = None
        for frac in (self.delta_error_fraction, 10 * self.delta_error_fraction):
            delta_error = frac * free
            # Guard the discretisation size (Gopi et al., Thm. 5.5 mesh; Remark 5.6 domain).
            L = compute_safe_domain_size(prvs, counts, eps_error=eps_error, delta_error=delta_error)
            mesh = eps_error / math.sqrt(n_total / 2 * math.log(12 / delta_error))
            points = 2 * L / mesh
            ee = eps_error
            if points > self.max_points:
                ee = eps_error * points / self.max_points
                notes.append(
                    f"prv eps_error loosened to {ee:.3g} to keep the mesh at "
                    f"{self.max_points} points"
                )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    acc = PRVAccountant(
                        prvs=prvs,
                        max_self_compositions=counts,
                        eps_error=ee,
                        delta_error=delta_error,
                    )
                    lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
                if not np.isfinite(hi):
                    raise ValueError(f"prv-accountant returned epsilon {hi}")
                return max(hi, 0.0), (lo, est, hi), notes
            except (RuntimeError, ValueError, FloatingPointError, AssertionError) as err:
                last = err
                notes.append(
                    f"prv failed with eps_error={ee:.3g}, delta_error={delta_error:.3g}"
                    f": {type(err).__name__}: {err}"
                )
        raise _PrvNumericalFailure(notes) from last


class _PrvNumericalFailure(RuntimeError):
    def __init__(self, notes):
        super().__init__("; ".join(notes))
        self.notes = notes


# ---------------------------------------------------------------------------------------- PLD


class PldAccountant(Accountant):
    """dp-accounting PLD, pessimistic estimate (an upper bound up to the tail truncation of
    1e-15); ``pessimistic=False`` gives the optimistic estimate (a lower bound; dp-accounting's
    "Privacy Buckets" rounding, as Connect-the-Dots is pessimistic only)."""

    name = "pld"

    def __init__(self, value_discretization_interval: float = 1e-4, pessimistic: bool = True):
        self.vdi = value_discretization_interval
        self.pessimistic = pessimistic

    def _pld(self, events: list[Event]):
        from dp_accounting.pld import common
        from dp_accounting.pld import privacy_loss_distribution as PLD

        pld = None
        sigma, rest = _gaussian_equivalent(events)
        parts = []
        if sigma is not None:
            parts.append(
                PLD.from_gaussian_mechanism(
                    standard_deviation=sigma,
                    value_discretization_interval=self.vdi,
                    pessimistic_estimate=self.pessimistic,
                    use_connect_dots=self.pessimistic,
                )
            )
        for key, n in _grouped(rest).items():
            if key[0] == "sgm":
                p = PLD.from_gaussian_mechanism(
                    standard_deviation=key[2],
                    sampling_prob=key[1],
                    value_discretization_interval=self.vdi,
                    pessimistic_estimate=self.pessimistic,
                    use_connect_dots=self.pessimistic,
                )
            elif key[0] == "laplace":
                p = PLD.from_laplace_mechanism(
                    parameter=key[1],
                    sampling_prob=key[2],
                    value_discretization_interval=self.vdi,
                    pessimistic_estimate=self.pessimistic,
                    use_connect_dots=self.pessimistic,
                )
            elif self.pessimistic:  # closed-form worst case of an (epsilon, delta) guarantee
                p = PLD.from_privacy_parameters(
                    common.DifferentialPrivacyParameters(key[1], key[2]),
                    value_discretization_interval=self.vdi,
                )
            else:  # the same, rounded down (from_privacy_parameters rounds up)
                eps, dlt = key[1], key[2]
                pmf = {math.floor(eps / self.vdi): (1 - dlt) / (1 + math.exp(-eps))}
                k = math.floor(-eps / self.vdi)
                pmf[k] = pmf.get(k, 0.0) + (1 - dlt) / (1 + math.exp(eps))
                p = PLD.PrivacyLossDistribution.create_from_rounded_probability(
                    pmf, dlt, self.vdi, pessimistic_estimate=False
                )
            parts.append(p.self_compose(n) if n > 1 else p)
        for p in parts:
            pld = p if pld is None else pld.compose(p)
        return pld

    def _epsilon(self, events, delta):
        if not events:
            return 0.0, None, []
        return self._pld(events).get_epsilon_for_delta(delta), None, []


# ---------------------------------------------------------------------------------------- RDP


class RdpAccountant(Accountant):
    """Rényi DP at ``orders``, converted with ``conversion`` (see :mod:`.rdp`)."""

    name = "rdp"

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS, conversion: str = "balle2020"):
        if conversion not in CONVERSIONS:
            raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
        self.orders = tuple(orders)
        self.conversion = conversion

    def supports(self, events: Sequence[Event]) -> bool:
        return not any(isinstance(e, ApproxDP) for e in events)

    def rdp_curve(self, events: Sequence[Event]):
        """Total RDP curve (nats) at ``self.orders``. Raises ``NotImplementedError`` for
        ApproxDP."""
        import numpy as np

        sigma, rest = _gaussian_equivalent(list(events))
        total = np.zeros(len(self.orders))
        if sigma is not None:
            total += event_rdp(Gaussian(sigma), self.orders)
        for e in rest:
            total += event_rdp(e, self.orders)
        return total

    def _epsilon(self, events, delta):
        eps, order = rdp_to_epsilon(self.orders, self.rdp_curve(events), delta, self.conversion)
        notes = [f"rdp: best order {order:g}, conversion {self.conversion}"]
        if order in (min(self.orders), max(self.orders)):
            notes.append("rdp: best order at the end of the grid; widen `orders`")
        return eps, None, notes


def analytic_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    r"""Exact epsilon of one Gaussian mechanism at ``delta`` (Balle & Wang 2018, Thm. 8):
    the root in epsilon of
    :math:`\delta = \Phi(-\epsilon/\mu + \mu/2) - e^\epsilon \Phi(-\epsilon/\mu - \mu/2)`,
    :math:`\mu = 1/z`. Compositions of Gaussians are one Gaussian with
    :math:`z^{-2} = \sum_i k_i z_i^{-2}` (:func:`_gaussian_equivalent`), so this is exact for
    any list of full-batch Gaussian events."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    mu = 1.0 / noise_multiplier

    def gap(eps: float) -> float:
        # e^eps Phi(-a) as exp(eps + log Phi(-a)): the exponent is <= 0 (a^2 >= 2 eps), so it
        # cannot overflow for the large epsilons of tiny noise multipliers (calibration probes them)
        tail = math.exp(eps + norm.logcdf(-eps / mu - mu / 2))
        return norm.cdf(-eps / mu + mu / 2) - tail - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2.0
    return float(brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-12))


class AnalyticGaussianAccountant(Accountant):
    """Exact composition for full-batch Gaussian events (closed form, microseconds); any other
    event makes it defer to :class:`PrvAccountant` (noted; the composition's ``accountant`` is
    then ``"prv"``, ``requested`` ``"analytic"``)."""

    name = "analytic"

    def compose(self, events: Sequence[Event], delta: float) -> Composition:
        events = list(events)
        for e in events:
            check_event(e)
        z, rest = _gaussian_equivalent(events) if events else (None, [])
        if events and (rest or z is None):
            # PRV's compose adds the ApproxDP events' deltas to ``delta`` once (this one
            # passed the total on, and the epsilon held only at a delta larger than reported)
            res = PrvAccountant().compose(events, delta)
            return replace(
                res,
                requested=self.name,
                notes=("analytic: non-Gaussian events, used prv", *res.notes),
            )
        return super().compose(events, delta)

    def _epsilon(self, events, delta):
        z, _ = _gaussian_equivalent(events)
        return analytic_gaussian_epsilon(z, delta), None, ["exact Gaussian composition"]


ACCOUNTANTS: dict[str, type[Accountant]] = {
    "prv": PrvAccountant,
    "pld": PldAccountant,
    "rdp": RdpAccountant,
    "analytic": AnalyticGaussianAccountant,
}


def get_accountant(spec: str | Accountant) -> Accountant:
    """An accountant instance from a name in :data:`ACCOUNTANTS` or an instance.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(spec, Accountant):
        return spec
    if spec not in ACCOUNTANTS:
        raise ValueError(
            f"accountant must be one of {sorted(ACCOUNTANTS)} or an Accountant, got {spec!r}"
        )
    return ACCOUNTANTS[spec]()


def compose(
    events: Sequence[Event], delta: float, accountant: str | Accountant = "prv"
) -> Composition:
    """Compose ``events`` into an epsilon (nats) at ``delta``.

    ``delta`` is the delta you are willing to add on top of the ApproxDP events' own deltas;
    the result holds at ``Composition.delta`` = their sum. ``delta == 0`` is allowed only when
    every event has a pure epsilon (PureDP, ApproxDP, Laplace): then the result is basic
    composition (Dwork & Roth, Thm. 3.16), exact in the worst case at delta 0. For pure-only
    lists at ``delta > 0`` the accountant's figure is capped by basic composition.

    ``"prv"`` falls back to ``"pld"`` for Poisson-subsampled Laplace and on numerical failure
    (the reason goes to ``notes``). The figure is then the tightest of the valid upper bounds
    that succeed (:func:`_tightest`): the requested accountant's, RDP's (always, where it
    applies) and, when the former is missing or infinite, pessimistic PLD's; ``accountant``
    names the one that gave it. So a finite bound is never reported as infinity (e.g. at
    ``delta = 1.1e-18`` prv fails, PLD gives infinity and RDP 0.146 for
    ``SubsampledGaussian(0.00033, 4.0, 10000)``). Run configs, ledger summaries and
    calibration reject deltas below :data:`DELTA_FLOOR` (see :func:`check_delta`).

    Raises:
        TypeError: an unknown event.
        ValueError: ``delta`` outside [0, 1); ``delta == 0`` with a Gaussian event; an
            unknown accountant name.
        NotImplementedError: the accountant (``"rdp"``) lacks an event type (ApproxDP).
    """
    events = list(events)
    for e in events:
        check_event(e)
    acc = get_accountant(accountant)
    if isinstance(delta, bool) or not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    basic = sum(pure_epsilon(e) for e in events)
    own_delta = sum(event_delta(e) for e in events)
    if not events:
        return Composition(0.0, own_delta + delta, "basic composition", acc.name)
    if delta == 0.0:
        if math.isinf(basic):
            raise ValueError(
                "delta must be > 0 for events without a pure epsilon (Gaussian, SubsampledGaussian)"
            )
        return Composition(basic, own_delta, "basic composition", acc.name)
    notes: list[str] = []
    if isinstance(acc, PrvAccountant) and not acc.supports(events):
        notes.append("prv-accountant has no Poisson-subsampled Laplace: used pld")
        result = _try(PldAccountant(), events, delta, notes)
    elif isinstance(acc, PrvAccountant) and delta < DELTA_FLOOR:
        # Its numerics fail there, after seconds to minutes of discretisation.
        notes.append(f"prv skipped: delta {delta:g} below {DELTA_FLOOR:g}; used pld")
        result = _try(PldAccountant(), events, delta, notes)
    else:
        try:
            result = acc.compose(events, delta)
        except _PrvNumericalFailure as err:
            notes.extend(err.notes)
            notes.append("prv numerics failed: used pld")
            result = _try(PldAccountant(), events, delta, notes)
    if result is not None:
        notes.extend(result.notes)
    result = _tightest(result, events, delta, notes)
    eps, used = result.epsilon, result.accountant
    if basic < eps:
        notes.append(f"{used} gave {eps:.6g} > basic composition {basic:.6g}: used basic")
        eps, used = basic, "basic composition"
    return Composition(eps, result.delta, used, acc.name, result.bounds, tuple(notes))


def _try(
    acc: Accountant, events: list[Event], delta: float, notes: list[str]
) -> Composition | None:
    """``acc.compose(events, delta)``, or ``None`` (the reason noted) if its numerics fail."""
    try:
        return acc.compose(events, delta)
    except (RuntimeError, ValueError, FloatingPointError, OverflowError, ArithmeticError) as err:
        notes.append(f"{acc.name} failed: {type(err).__name__}: {err}")
        return None


def _tightest(
    result: Composition | None, events: list[Event], delta: float, notes: list[str]
) -> Composition:
    """The smallest finite epsilon among ``result`` and the valid upper bounds that back it up.

    Every candidate is an upper bound on the true epsilon at the same total delta (prv's
    ``upper``, PLD's pessimistic estimate, RDP converted with Balle et al. 2020), so their
    minimum is one too. RDP (milliseconds) is always a candidate where it applies (no
    ApproxDP); when ``result`` is missing or infinite, pessimistic PLD is tried as well. So
    the figure is never infinite when one of them gives a finite bound: at tiny deltas
    (below ~1e-14) prv-accountant fails and PLD's tail truncation (1e-15) makes it return
    infinity while RDP is still finite. The chosen accountant is named in ``accountant`` and
    the others' figures go to the notes.

    Raises:
        RuntimeError: no accountant produced a result at all.
    """
    candidates = [result] if result is not None else []
    names = {c.accountant for c in candidates}
    if not candidates or not math.isfinite(candidates[0].epsilon):
        if "pld" not in names:
            c = _try(PldAccountant(), events, delta, notes)
            if c is not None:
                candidates.append(c)
    rdp = RdpAccountant()
    if "rdp" not in names and rdp.supports(events):
        c = _try(rdp, events, delta, notes)
        if c is not None:
            candidates.append(c)
    if not candidates:
        raise RuntimeError("every accountant failed: " + "; ".join(notes))
    best = min(candidates, key=lambda c: c.epsilon)
    if result is None or best.epsilon < result.epsilon:
        figures = ", ".join(f"{c.accountant} {c.epsilon:.6g}" for c in candidates)
        notes.append(f"tightest valid upper bound: {best.accountant} ({figures})")
        notes.extend(n for n in best.notes if n not in notes)
    return best


def compose_epsilon(
    events: Sequence[Event], delta: float, accountant: str | Accountant = "prv"
) -> float:
    """Epsilon (nats) of ``events`` at ``delta`` (plus ApproxDP deltas); see :func:`compose`.

    ``"prv"`` returns prv-accountant's upper bound (conservative).
    """
    return compose(events, delta, accountant).epsilon


def to_dp_event(event: Event):
    """The dp-accounting ``DpEvent`` of ``event`` (for use with dp-accounting directly).

    Raises:
        NotImplementedError: PureDP / ApproxDP (dp-accounting has no epsilon-delta event).
    """
    from dp_accounting import dp_event as E

    if isinstance(event, Gaussian):
        return E.SelfComposedDpEvent(E.GaussianDpEvent(event.noise_multiplier), event.count)
    if isinstance(event, SubsampledGaussian):
        return E.SelfComposedDpEvent(
            E.PoissonSampledDpEvent(event.sample_rate, E.GaussianDpEvent(event.noise_multiplier)),
            event.steps,
        )
    if isinstance(event, Laplace):
        inner = E.LaplaceDpEvent(event.noise_multiplier)
        if event.sample_rate < 1.0:
            inner = E.PoissonSampledDpEvent(event.sample_rate, inner)
        return E.SelfComposedDpEvent(inner, event.count)
    raise NotImplementedError(f"dp-accounting has no event for {type(event).__name__}")
