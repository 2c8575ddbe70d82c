"""Privacy accounting: every release is recorded as a mechanism event; epsilon is composed
from the events by a swappable accountant (prv-accountant, dp-accounting's PLD, Rényi DP)."""

from . import _absl_log
from .accountants import (
    ACCOUNTANTS,
    DELTA_FLOOR,
    Accountant,
    Composition,
    PldAccountant,
    PrvAccountant,
    RdpAccountant,
    check_delta,
    compose,
    compose_epsilon,
    get_accountant,
    to_dp_event,
)
from .calibrate import (
    MAX_NOISE_MULTIPLIER,
    CalibrationError,
    UnreachableTarget,
    calibrate,
    epsilon_floor,
)
from .events import (
    EVENT_TYPES,
    ApproxDP,
    Event,
    Gaussian,
    Laplace,
    PureDP,
    SubsampledGaussian,
    pure_epsilon,
)
from .ledger import PrivacyLedger

__all__ = [
    "ACCOUNTANTS",
    "DELTA_FLOOR",
    "EVENT_TYPES",
    "MAX_NOISE_MULTIPLIER",
    "Accountant",
    "ApproxDP",
    "calibrate",
    "CalibrationError",
    "check_delta",
    "compose",
    "compose_epsilon",
    "Composition",
    "epsilon_floor",
    "Event",
    "Gaussian",
    "get_accountant",
    "Laplace",
    "PldAccountant",
    "PrivacyLedger",
    "PrvAccountant",
    "pure_epsilon",
    "PureDP",
    "RdpAccountant",
    "SubsampledGaussian",
    "to_dp_event",
    "UnreachableTarget",
]

_absl_log.install()  # dp-accounting's repeated numerical warnings: once each
