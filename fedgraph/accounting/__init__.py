"""Privacy accounting: every release is recorded as a mechanism event; epsilon is composed
from the events by a swappable accountant (prv-accountant, dp-accounting's PLD, Rényi DP)."""
from . import _absl_log
from .accountants import (ACCOUNTANTS, DELTA_FLOOR, Accountant, Composition, PldAccountant,
                          PrvAccountant, RdpAccountant, check_delta, compose, compose_epsilon,
                          get_accountant, to_dp_event)
from .calibrate import CalibrationError, calibrate
from .events import (EVENT_TYPES, ApproxDP, Event, Gaussian, Laplace, PureDP,
                     SubsampledGaussian, pure_epsilon)
from .ledger import PrivacyLedger

__all__ = ["ACCOUNTANTS", "DELTA_FLOOR", "Accountant", "ApproxDP", "CalibrationError",
           "Composition", "EVENT_TYPES", "Event", "Gaussian", "Laplace", "PldAccountant",
           "PrivacyLedger", "PrvAccountant", "PureDP", "RdpAccountant", "SubsampledGaussian",
           "calibrate", "check_delta", "compose", "compose_epsilon", "get_accountant",
           "pure_epsilon", "to_dp_event"]

_absl_log.install()  # dp-accounting's repeated numerical warnings: once each
