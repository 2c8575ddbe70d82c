"""Privacy accounting: every release is recorded as a mechanism event; epsilon is composed
from the events by a swappable accountant (prv-accountant, dp-accounting's PLD, Rényi DP)."""
from .accountants import (ACCOUNTANTS, Accountant, Composition, PldAccountant, PrvAccountant,
                          RdpAccountant, compose, compose_epsilon, get_accountant, to_dp_event)
from .calibrate import calibrate
from .events import (EVENT_TYPES, ApproxDP, Event, Gaussian, Laplace, PureDP,
                     SubsampledGaussian, pure_epsilon)
from .ledger import PrivacyLedger

__all__ = ["ACCOUNTANTS", "Accountant", "ApproxDP", "Composition", "EVENT_TYPES", "Event",
           "Gaussian", "Laplace", "PldAccountant", "PrivacyLedger", "PrvAccountant", "PureDP",
           "RdpAccountant", "SubsampledGaussian", "calibrate", "compose", "compose_epsilon",
           "get_accountant", "pure_epsilon", "to_dp_event"]
