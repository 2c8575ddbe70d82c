"""A privacy ledger per subject (a client, a privacy level, a user group).

Every release a method makes is recorded here as a mechanism event, next to the code that adds
the noise. ``epsilon(subject, delta)`` composes the subject's events; ``cross_check`` recomputes
the same figure with an independent accountant (prv-accountant, Gopi et al. 2021) so that a
wrong composition shows up as a mismatch in the report.

Shape follows Opacus' accountants: events in, epsilon out.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class PureDP:
    """A release that is ``epsilon``-DP (or epsilon-LDP), applied ``count`` times."""

    epsilon: float
    count: int = 1

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class ApproxDP:
    """A release that is ``(epsilon, delta)``-DP, applied ``count`` times."""

    epsilon: float
    delta: float
    count: int = 1

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not (0.0 <= self.delta < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta}")


Event = PureDP | ApproxDP


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
        ledger.epsilon("level-1")        # 1.0 (basic composition)
    """

    entries: dict[str, list[_Entry]] = field(default_factory=lambda: defaultdict(list))

    def record(self, subject: str, release: str, event: Event) -> None:
        """Record that ``subject``'s data went through ``event`` in the release ``release``."""
        if not isinstance(event, (PureDP, ApproxDP)):
            raise TypeError(f"unknown privacy event {event!r}: use PureDP or ApproxDP")
        self.entries[subject].append(_Entry(release, event))

    @property
    def subjects(self) -> list[str]:
        return sorted(self.entries)

    def epsilon(self, subject: str) -> tuple[float, float]:
        """``(epsilon, delta)`` of ``subject`` by basic (sequential) composition.

        For pure events this is the exact worst case of their composition; approximate
        events add their deltas (Dwork & Roth, Thm. 3.16).

        Raises:
            KeyError: if nothing was recorded for ``subject``.
        """
        if subject not in self.entries:
            raise KeyError(f"no release recorded for {subject!r}; known: {self.subjects}")
        eps = sum(e.event.epsilon * e.event.count for e in self.entries[subject])
        delta = sum(getattr(e.event, "delta", 0.0) * e.event.count for e in self.entries[subject])
        return eps, delta

    def cross_check(self, subject: str, delta: float = 1e-6) -> tuple[float, float, float]:
        """``(lower, estimate, upper)`` epsilon of ``subject`` at ``delta`` from prv-accountant.

        Pure events only (prv-accountant's ``PureDPMechanism``); an independent recomputation
        of :meth:`epsilon`, which it must not exceed (up to its stated error).
        """
        from prv_accountant import PRVAccountant, PureDPMechanism

        events = [e.event for e in self.entries[subject]]
        if any(not isinstance(e, PureDP) for e in events):
            raise NotImplementedError("cross_check supports PureDP events only")
        acc = PRVAccountant(
            prvs=[PureDPMechanism(e.epsilon) for e in events],
            max_self_compositions=[e.count for e in events],
            eps_error=1e-3, delta_error=1e-10,
        )
        return tuple(acc.compute_epsilon(delta=delta, num_self_compositions=[e.count for e in events]))

    def summary(self) -> dict[str, dict]:
        """Per subject: epsilon, delta, the releases composed, and the cross-check."""
        out = {}
        for s in self.subjects:
            eps, delta = self.epsilon(s)
            row = {
                "epsilon": eps, "delta": delta, "accountant": "basic composition",
                "releases": [{"release": e.release, "event": type(e.event).__name__,
                              **asdict(e.event)} for e in self.entries[s]],
            }
            try:
                lo, est, hi = self.cross_check(s)
                row["cross_check"] = {"accountant": "prv-accountant", "delta": 1e-6,
                                      "epsilon_lower": lo, "epsilon_estimate": est,
                                      "epsilon_upper": hi,
                                      "agrees": bool(lo <= eps + 2e-3 and hi >= eps - 0.05 * eps)}
            except Exception as err:  # the accountant's numerics fail for some (large) eps
                row["cross_check"] = {"accountant": "prv-accountant",
                                      "error": f"{type(err).__name__}: {err}"}
            out[s] = row
        return out
