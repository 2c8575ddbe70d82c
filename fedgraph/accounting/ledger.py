"""A privacy ledger per subject (a client, a privacy level, a user group).

Every release a method makes is recorded here as a mechanism event (:mod:`.events`), next to
the code that adds the noise. :meth:`PrivacyLedger.epsilon` composes the subject's events;
:meth:`PrivacyLedger.cross_check` recomputes the figure with an independent accountant so that
a wrong composition shows up as a mismatch in the report.

Shape follows Opacus' accountants: events in, epsilon out, the accountant swappable by name
(:mod:`.accountants`: ``"prv"``, ``"pld"``, ``"rdp"``).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from .accountants import PldAccountant, PrvAccountant, check_delta, compose
from .events import (
    ApproxDP,
    Event,
    Gaussian,
    Laplace,
    PureDP,
    SubsampledGaussian,
    check_event,
    event_delta,
    is_pure,
)

__all__ = [
    "ApproxDP",
    "Event",
    "Gaussian",
    "Laplace",
    "PrivacyLedger",
    "PureDP",
    "SubsampledGaussian",
]

AGREE_RTOL = 0.01  # cross-check: relative tolerance
AGREE_ATOL = 2e-3  # cross-check: absolute tolerance (nats), for epsilons near 0
#: budget check: a subject is over budget when its epsilon exceeds the budget by more than this
#: relative margin (the accountants' own numerical error; calibration targets the budget)
BUDGET_RTOL = 1e-3


@dataclass
class _Entry:
    release: str
    event: Event


@dataclass
class PrivacyLedger:
    """Records releases per subject and composes their privacy loss.

    Example::

        ledger = PrivacyLedger()
        ledger.record("level-1", "esw", PureDP(0.1))
        ledger.record("level-1", "mlr", PureDP(0.9))
        ledger.epsilon("level-1")                 # (1.0, 0.0): basic composition
        ledger.record("client-3", "dp-sgd", SubsampledGaussian(0.01, 1.0, 1000))
        ledger.epsilon("client-3", delta=1e-5)    # (~1.84, 1e-5): prv-accountant, upper
    """

    entries: dict[str, list[_Entry]] = field(default_factory=lambda: defaultdict(list))
    #: releases outside the accountants, per subject: ``(release, reason, epsilon)`` with
    #: epsilon ``inf`` (released without noise, or with noise of no finite sensitivity) or
    #: ``0`` (the protected unit was not used)
    unprotected: dict[str, list[tuple[str, str, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    #: epsilon budget per subject (nats; e.g. a PPGNN level's eps_tau, a client's target):
    #: :meth:`summary` flags a subject whose epsilon exceeds it
    budgets: dict[str, float] = field(default_factory=dict)
    #: figures claimed for releases that are *not* DP (:meth:`record_unprotected` with
    #: ``claimed``), per subject: ``(release, claimed_by, event)``; shown beside the epsilon
    #: ``inf`` in :meth:`summary`, never composed into it
    claims: dict[str, list[tuple[str, str, Event]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def record(self, subject: str, release: str, event: Event) -> None:
        """Record that ``subject``'s data went through ``event`` in the release ``release``.
        Call it when the release leaves the client (e.g. when the server receives the reply),
        so that a run that fails later still reports what was spent. An event that repeats the
        previous entry of the same release with the same parameters is merged into it (its
        ``count``/``steps`` added): one entry per release, however many rounds recorded it.

        Raises:
            TypeError: ``event`` is not one of the event types of :mod:`.events`.
        """
        check_event(event)
        rows = self.entries[subject]
        if rows and rows[-1].release == release:
            merged = _merge(rows[-1].event, event)
            if merged is not None:
                rows[-1] = _Entry(release, merged)
                return
        rows.append(_Entry(release, event))

    def set_budget(self, subject: str, epsilon: float) -> None:
        """Declare ``subject``'s epsilon budget (nats, > 0, ``inf`` allowed). It does not
        create the subject: a subject that released nothing stays out of :meth:`summary`.

        Raises:
            ValueError: ``epsilon`` is not a number > 0.
        """
        if not isinstance(epsilon, (int, float)) or math.isnan(epsilon) or epsilon <= 0:
            raise ValueError(f"budget of {subject!r}: epsilon must be > 0, got {epsilon!r}")
        self.budgets[subject] = float(epsilon)

    def over_budget(self, subject: str, epsilon: float) -> bool | None:
        """True if ``epsilon`` (the subject's spent epsilon) exceeds its budget by more than
        :data:`BUDGET_RTOL`; ``None`` if the subject has no budget."""
        budget = self.budgets.get(subject)
        if budget is None:
            return None
        return bool(epsilon > budget * (1 + BUDGET_RTOL)) if not math.isnan(epsilon) else True

    def record_unprotected(
        self, subject: str, release: str, reason: str = "no noise", claimed=(), claimed_by: str = ""
    ) -> None:
        """Record that ``subject``'s data left in ``release`` **without** a DP guarantee (e.g. a
        client whose epsilon target is inf adds no noise). The subject is listed with epsilon
        ``inf`` (:meth:`epsilon`, :meth:`summary`) instead of vanishing from the report.

        ``claimed``: events that someone (``claimed_by``, e.g. a paper) accounts this release
        as, although they do not hold for it (e.g. Laplace noise calibrated to a sensitivity the
        released quantity does not have). :meth:`summary` composes them into a separate
        ``claimed`` figure, labelled as not holding; the subject's epsilon stays ``inf``.

        Raises:
            TypeError: a claimed event is not an event of :mod:`.events`.
        """
        self.unprotected[subject].append((release, reason, math.inf))
        for event in claimed:
            check_event(event)
            rows = self.claims[subject]
            merged = (
                _merge(rows[-1][2], event)
                if rows and rows[-1][:2] == (release, claimed_by)
                else None
            )
            if merged is not None:
                rows[-1] = (release, claimed_by, merged)
            else:
                rows.append((release, claimed_by, event))

    def _claimed_row(self, subject: str, delta: float, accountant) -> dict:
        """The composed claimed figure of ``subject`` (see :meth:`record_unprotected`)."""
        claims = self.claims[subject]
        events = [e for _, _, e in claims]
        row = {
            "by": sorted({by for _, by, _ in claims}),
            "releases": sorted({r for r, _, _ in claims}),
            "holds": False,
            "note": "the figure its authors' accounting gives; it is NOT a differential "
            "privacy guarantee for this release (see the release's reason)",
        }
        try:
            if all(is_pure(e) for e in events):
                row.update(
                    epsilon=sum(e.epsilon * e.count for e in events),
                    delta=sum(event_delta(e) for e in events),
                    accountant="basic composition",
                )
            else:
                c = compose(events, delta, accountant)
                row.update(epsilon=c.epsilon, delta=c.delta, accountant=c.accountant)
        except Exception as err:  # noqa: BLE001 - keep the report writable
            row["error"] = f"{type(err).__name__}: {err}"
        return row

    def record_unused(self, subject: str, release: str, reason: str) -> None:
        """Record that ``release`` did not use ``subject``'s protected unit at all (e.g. an MLP
        baseline under edge-level DP reads no edge): epsilon 0 unless other releases add some."""
        self.unprotected[subject].append((release, reason, 0.0))

    def _fixed_epsilon(self, subject: str) -> float | None:
        """inf if a release of ``subject`` had no noise; 0 if it only has unused releases;
        None if its accountable events decide."""
        fixed = self.unprotected.get(subject, [])
        if any(math.isinf(e) for _, _, e in fixed):
            return math.inf
        if fixed and not self.entries.get(subject):
            return 0.0
        return None

    @property
    def subjects(self) -> list[str]:
        return sorted(set(self.entries) | set(self.unprotected))

    def events(self, subject: str) -> list[Event]:
        """``subject``'s events in recording order. Raises ``KeyError`` if none."""
        if subject not in self.entries and subject not in self.unprotected:
            raise KeyError(f"no release recorded for {subject!r}; known: {self.subjects}")
        return [e.event for e in self.entries.get(subject, [])]

    def is_pure(self, subject: str) -> bool:
        """True if all of ``subject``'s events are PureDP / ApproxDP."""
        return all(is_pure(e) for e in self.events(subject))

    def epsilon(self, subject: str, delta: float = 0.0, accountant="prv") -> tuple[float, float]:
        """``(epsilon, delta)`` of ``subject`` (epsilon in nats).

        Only PureDP / ApproxDP events: basic (sequential) composition, whatever ``delta``:
        epsilons add up, the ApproxDP deltas add up (Dwork & Roth, Thm. 3.16); exact in the
        worst case at delta 0. (For a tighter epsilon at some delta > 0, use
        :func:`fedgraph.accounting.compose` or :meth:`cross_check`.)

        Otherwise ``accountant`` (``"prv"``, ``"pld"``, ``"rdp"`` or an instance; see
        :func:`fedgraph.accounting.compose`) at ``delta``; the returned delta is ``delta``
        plus the ApproxDP events' deltas. ``delta == 0`` works for Laplace events (basic
        composition of their pure epsilons).

        Raises:
            KeyError: nothing was recorded for ``subject``.
            ValueError: ``delta`` outside [0, 1), or 0 with a Gaussian event.
        """
        events = self.events(subject)
        fixed = self._fixed_epsilon(subject)
        if fixed is not None:
            return fixed, 0.0
        if all(is_pure(e) for e in events):
            return (sum(e.epsilon * e.count for e in events), sum(event_delta(e) for e in events))
        c = compose(events, delta, accountant)
        return c.epsilon, c.delta

    def composition(self, subject: str, delta: float = 0.0, accountant="prv"):
        """Like :meth:`epsilon`, but the full :class:`~.accountants.Composition` (accountant
        used, bounds, notes)."""
        from .accountants import Composition

        events = self.events(subject)
        fixed = self._fixed_epsilon(subject)
        if fixed is not None:
            note = (
                "no differential privacy: released without noise, or with noise of no "
                "finite sensitivity"
                if math.isinf(fixed)
                else "the protected unit was not used"
            )
            return Composition(fixed, 0.0, "none", "none", None, (note,))
        if all(is_pure(e) for e in events):
            eps, d = self.epsilon(subject)
            return Composition(eps, d, "basic composition", "basic composition")
        return compose(events, delta, accountant)

    def epsilon_rdp(self, subject: str, delta: float, conversion: str = "balle2020") -> float:
        """Epsilon (nats) of ``subject`` at ``delta`` from Rényi DP (looser than prv/pld).

        Raises:
            KeyError: nothing was recorded for ``subject``.
            ValueError: ``delta`` outside (0, 1).
            NotImplementedError: the subject has an ApproxDP event (no finite RDP curve).
        """
        from .accountants import RdpAccountant

        events = self.events(subject)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        return RdpAccountant(conversion=conversion).compose(events, delta).epsilon

    def cross_check(
        self, subject: str, delta: float = 1e-6, main_accountant: str | None = None
    ) -> tuple[float, float, float]:
        """``(lower, estimate, upper)`` epsilon of ``subject`` at ``delta`` from an accountant
        independent of the main figure's, ``main_accountant`` (the name of the accountant
        that produced it; ``None``: the default composition's, :meth:`composition`).

        Pure subjects: prv-accountant (Gopi et al. 2021), whose figure must not exceed basic
        composition beyond its error. A main figure of PLD: prv-accountant, or where it is
        not applicable (subsampled Laplace) RDP, an upper bound (returned as
        ``(0, rdp, rdp)``). Others: dp-accounting's PLD, optimistic (lower) and pessimistic
        (estimate = upper) estimates.

        Raises:
            KeyError: nothing was recorded for ``subject``.
        """
        events = self.events(subject)
        if all(is_pure(e) for e in events):
            c = PrvAccountant(min_eps_error=1e-3).compose(events, delta)
            return c.bounds
        if main_accountant is None:
            main_accountant = self.composition(subject, delta).accountant
        if main_accountant == "pld":
            if PrvAccountant().supports(events):
                c = PrvAccountant().compose(events, delta)
                return c.bounds
            rdp = self.epsilon_rdp(subject, delta)
            return 0.0, rdp, rdp
        hi = PldAccountant().compose(events, delta).epsilon
        lo = PldAccountant(pessimistic=False).compose(events, delta).epsilon
        return lo, hi, hi

    def _cross_check_row(self, subject: str, eps: float, main_acc: str, delta: float) -> dict:
        row = self._cross_check_figures(subject, eps, main_acc, delta)
        row["delta"] = delta + sum(event_delta(e) for e in self.events(subject))
        return row

    def _cross_check_figures(self, subject, eps, main_acc, delta) -> dict:
        events = self.events(subject)
        if all(is_pure(e) for e in events):
            name, why = "prv-accountant", {}
            try:
                lo, est, hi = self.cross_check(subject, delta)
            except Exception as err:  # noqa: BLE001 - prv's discretisation fails at some
                # (eps, delta): "Discrete mean differs from continuous mean significantly"
                # (microsoft/prv_accountant issues 36 and 42); dp-accounting's PLD instead
                name = "pld (prv-accountant failed)"
                why = {"fallback": f"prv-accountant raised {type(err).__name__}: {err}"[:400]}
                hi = est = PldAccountant().compose(events, delta).epsilon
                lo = PldAccountant(pessimistic=False).compose(events, delta).epsilon
            return {
                "accountant": name,
                "delta": delta,
                "epsilon_lower": lo,
                "epsilon_estimate": est,
                "epsilon_upper": hi,
                "test": "lower bound <= basic composition (+1%); the basic figure is "
                "exact at delta 0, the cross-check's at `delta` may be smaller",
                "agrees": bool(lo <= eps * (1 + AGREE_RTOL) + AGREE_ATOL),
                **why,
            }
        if main_acc == "pld" and not PrvAccountant().supports(events):
            _, rdp, _ = self.cross_check(subject, delta, main_acc)
            return {
                "accountant": "rdp",
                "delta": delta,
                "epsilon_upper": rdp,
                "test": "pld epsilon <= rdp bound (+1%)",
                "agrees": bool(eps <= rdp * (1 + AGREE_RTOL) + AGREE_ATOL),
            }
        # the check's accountant is chosen against the one that gave the main figure (with
        # accountant = "pld" the default composition's would have been PLD checked by itself)
        lo, est, hi = self.cross_check(subject, delta, main_acc)
        if main_acc == "rdp":  # the tightest bound that held (compose's RDP cap or fallback)
            return {
                "accountant": "pld",
                "delta": delta,
                "epsilon_lower": lo,
                "epsilon_estimate": est,
                "epsilon_upper": hi,
                "test": "pld optimistic (lower) <= rdp bound (+1%)",
                "agrees": bool(lo <= eps * (1 + AGREE_RTOL) + AGREE_ATOL),
            }
        name = "prv-accountant" if main_acc == "pld" else "pld"
        return {
            "accountant": name,
            "delta": delta,
            "epsilon_lower": lo,
            "epsilon_estimate": est,
            "epsilon_upper": hi,
            "test": f"|{main_acc} - {name}| <= 1% (+{AGREE_ATOL})",
            "agrees": bool(abs(eps - est) <= AGREE_RTOL * max(eps, est) + AGREE_ATOL),
        }

    def summary(self, delta: float = 1e-6, accountant="prv") -> dict[str, dict]:
        """Per subject: ``epsilon``, ``delta``, ``accountant`` (the one used), ``releases``,
        ``cross_check`` (an independent accountant at ``delta``, with ``agrees`` and the
        ``test`` applied) and ``rdp`` (the RDP figure at ``delta``) where available.

        Subjects with only PureDP / ApproxDP events: basic composition (at their own delta),
        cross-checked by prv at ``delta``. Others: ``accountant`` at ``delta``. Never raises
        for a subject: failures land in the row as ``error`` strings (epsilon ``nan``).

        Raises:
            ValueError: ``delta`` outside ``[1e-12, 1)`` (:func:`~.accountants.check_delta`).
        """
        check_delta(delta)
        out = {}
        # Subjects with the same events (clients of one privacy plan) have the same figures:
        # composed once per distinct event list (a composition with its cross-checks takes
        # about 0.5 s; ten clients of one epsilon target spent 5 s here).
        figures: dict[str, dict] = {}
        for s in self.subjects:
            row: dict = {
                "releases": [
                    {"release": e.release, "event": type(e.event).__name__, **asdict(e.event)}
                    for e in self.entries.get(s, [])
                ]
            }
            row["releases"] += [
                {"release": r, "event": "none", "reason": why, "epsilon": e}
                for r, why, e in self.unprotected.get(s, [])
            ]
            fixed = self._fixed_epsilon(s)
            if fixed is not None:
                c = self.composition(s)
                row.update(epsilon=fixed, delta=0.0, accountant="none", notes=list(c.notes))
                if self.claims.get(s):
                    row["claimed"] = self._claimed_row(s, delta, accountant)
                out[s] = row
                continue
            key = repr([(type(e).__name__, asdict(e)) for e in self.events(s)])
            if key not in figures:
                figures[key] = self._summary_figures(s, delta, accountant)
            row.update(copy.deepcopy(figures[key]))
            out[s] = row
        for s, row in out.items():
            flag = self.over_budget(s, row["epsilon"])
            if flag is not None:
                row["budget"], row["over_budget"] = self.budgets[s], flag
        return out

    def _summary_figures(self, s: str, delta: float, accountant) -> dict:
        """The composed part of ``s``'s :meth:`summary` row (a function of its events,
        ``delta`` and ``accountant`` only): epsilon, delta, accountant, notes, bounds,
        cross-check, RDP; failures as ``error`` strings."""
        row: dict = {}
        try:
            c = self.composition(s, delta, accountant)
            row.update(epsilon=c.epsilon, delta=c.delta, accountant=c.accountant)
            if c.notes:
                row["notes"] = list(c.notes)
            if c.bounds is not None:
                row["bounds"] = list(c.bounds)
        except Exception as err:  # keep the report writable
            row.update(
                epsilon=math.nan,
                delta=math.nan,
                accountant=getattr(accountant, "name", str(accountant)),
                error=f"{type(err).__name__}: {err}",
            )
            return row
        try:
            row["cross_check"] = self._cross_check_row(s, c.epsilon, c.accountant, delta)
        except Exception as err:  # the accountants' numerics fail for some parameters
            row["cross_check"] = {"accountant": "?", "error": f"{type(err).__name__}: {err}"}
        try:
            row["rdp"] = {
                "epsilon": self.epsilon_rdp(s, delta),
                "delta": delta,
                "conversion": "balle2020",
            }
        except NotImplementedError:
            pass
        except Exception as err:
            row["rdp"] = {"error": f"{type(err).__name__}: {err}"}
        return row


def _merge(old: Event, new: Event) -> Event | None:
    """``old`` and ``new`` as one event if they differ only in their repetition count
    (``count``, or ``steps`` of a subsampled Gaussian); else ``None``."""
    from dataclasses import replace

    if type(old) is not type(new):
        return None
    key = "steps" if isinstance(old, SubsampledGaussian) else "count"
    a, b = asdict(old), asdict(new)
    if {k: v for k, v in a.items() if k != key} != {k: v for k, v in b.items() if k != key}:
        return None
    return replace(old, **{key: a[key] + b[key]})
