"""Privacy ledger: every release is recorded as a mechanism event; epsilon is composed from it."""
from .ledger import ApproxDP, PrivacyLedger, PureDP

__all__ = ["ApproxDP", "PrivacyLedger", "PureDP"]
