"""Privacy events: what one release does to one subject's data, in accountant-neutral terms.

Every event is a frozen dataclass validated on construction (``ValueError`` naming the field).
Noise is given as a *noise multiplier*: the noise scale divided by the sensitivity of the
released quantity, so that an event does not depend on the units of the data.

Neighbouring relation: add/remove one record (Poisson subsampling amplifies under it; it is
the relation of Opacus, prv-accountant and dp-accounting's default ``ADD_OR_REMOVE_ONE``).

Sources: Dwork & Roth, "The Algorithmic Foundations of Differential Privacy" (2014) for the
pure/approximate and Laplace mechanisms; Mironov, "Rényi Differential Privacy" (2017); Abadi
et al., "Deep Learning with Differential Privacy" (2016) for the subsampled Gaussian.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


def _positive_finite(name: str, value) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (value > 0 and math.isfinite(value))
    ):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def _count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _rate(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < value <= 1.0):
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")


@dataclass(frozen=True)
class PureDP:
    """A release that is ``epsilon``-DP (or epsilon-LDP), applied ``count`` times.

    Raises:
        ValueError: ``epsilon`` not finite and > 0; ``count`` not an integer >= 1.
    """

    epsilon: float
    count: int = 1

    def __post_init__(self):
        _positive_finite("epsilon", self.epsilon)
        _count("count", self.count)


@dataclass(frozen=True)
class ApproxDP:
    """A release that is ``(epsilon, delta)``-DP, applied ``count`` times.

    Raises:
        ValueError: ``epsilon`` not finite and > 0; ``delta`` outside ``[0, 1)``; ``count``
            not an integer >= 1.
    """

    epsilon: float
    delta: float
    count: int = 1

    def __post_init__(self):
        _positive_finite("epsilon", self.epsilon)
        if (
            isinstance(self.delta, bool)
            or not isinstance(self.delta, numbers.Real)
            or not (0.0 <= self.delta < 1.0)
        ):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")
        _count("count", self.count)


@dataclass(frozen=True)
class Gaussian:
    """The Gaussian mechanism applied ``count`` times (adaptively) to the full data.

    ``noise_multiplier`` = noise standard deviation / L2 sensitivity (dimensionless).
    ``count`` compositions with multiplier ``s`` are exactly one Gaussian mechanism with
    multiplier ``s / sqrt(count)`` (Dong, Roth & Su 2019, Gaussian DP, Cor. 3.3).

    Raises:
        ValueError: ``noise_multiplier`` not finite and > 0; ``count`` not an integer >= 1.
    """

    noise_multiplier: float
    count: int = 1

    def __post_init__(self):
        _positive_finite("noise_multiplier", self.noise_multiplier)
        _count("count", self.count)


@dataclass(frozen=True)
class SubsampledGaussian:
    """``steps`` rounds of the Gaussian mechanism on a Poisson subsample (DP-SGD).

    Each record joins each round's sample independently with probability ``sample_rate``;
    ``noise_multiplier`` = noise standard deviation / L2 sensitivity (clipping norm).
    Neighbouring relation: add/remove one record.

    Raises:
        ValueError: ``sample_rate`` outside ``(0, 1]``; ``noise_multiplier`` not finite and
            > 0; ``steps`` not an integer >= 1.
    """

    sample_rate: float
    noise_multiplier: float
    steps: int

    def __post_init__(self):
        _rate("sample_rate", self.sample_rate)
        _positive_finite("noise_multiplier", self.noise_multiplier)
        _count("steps", self.steps)


@dataclass(frozen=True)
class Laplace:
    """The Laplace mechanism applied ``count`` times, optionally on a Poisson subsample.

    ``noise_multiplier`` = Laplace scale ``b`` / L1 sensitivity (dimensionless), so one
    application without subsampling is ``1 / noise_multiplier``-DP. ``sample_rate < 1``:
    each application runs on a fresh Poisson subsample (each record kept independently with
    probability ``sample_rate``), e.g. PrivGNN's query-specific teachers.

    Raises:
        ValueError: ``noise_multiplier`` not finite and > 0; ``count`` not an integer >= 1;
            ``sample_rate`` outside ``(0, 1]``.
    """

    noise_multiplier: float
    count: int = 1
    sample_rate: float = 1.0

    def __post_init__(self):
        _positive_finite("noise_multiplier", self.noise_multiplier)
        _count("count", self.count)
        _rate("sample_rate", self.sample_rate)


Event = PureDP | ApproxDP | Gaussian | SubsampledGaussian | Laplace
EVENT_TYPES = (PureDP, ApproxDP, Gaussian, SubsampledGaussian, Laplace)


def check_event(event) -> None:
    """Raises ``TypeError`` unless ``event`` is one of :data:`EVENT_TYPES`."""
    if not isinstance(event, EVENT_TYPES):
        raise TypeError(
            f"unknown privacy event {event!r}: use one of "
            f"{', '.join(t.__name__ for t in EVENT_TYPES)}"
        )


def pure_epsilon(event: Event) -> float:
    """The pure-DP epsilon of ``event`` (all its applications), ``inf`` if it has none.

    PureDP / ApproxDP: ``epsilon * count`` (ApproxDP's delta is accounted separately, see
    :func:`event_delta`); Laplace: ``count * log(1 + q (e^{1/b} - 1))`` (amplification by
    Poisson subsampling of a pure mechanism, Li, Qardaji & Su 2012 / Balle et al. 2018;
    ``1/b`` per application for ``q = 1``); Gaussian mechanisms: ``inf``.
    """
    if isinstance(event, (PureDP, ApproxDP)):
        return event.epsilon * event.count
    if isinstance(event, Laplace):
        eps1 = 1.0 / event.noise_multiplier
        if event.sample_rate < 1.0:
            eps1 = math.log1p(event.sample_rate * math.expm1(eps1))
        return eps1 * event.count
    return math.inf


def event_delta(event: Event) -> float:
    """The delta an event carries by itself (ApproxDP: ``delta * count``; others 0)."""
    return event.delta * event.count if isinstance(event, ApproxDP) else 0.0


def is_pure(event: Event) -> bool:
    """True for ``PureDP`` and ``ApproxDP`` events (privacy *parameters*, no mechanism)."""
    return isinstance(event, (PureDP, ApproxDP))
