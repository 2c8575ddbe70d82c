"""Flower server strategies of fedgraph: the server half of each method, phase by phase."""

from .base import STRATEGIES, PrivateStrategy, register_strategy, resolve_strategy
from .gap import GAPStrategy
from .ppgnn import PPGNNStrategy
from .privgnn import PrivGNNStrategy
from .progap import ProGAPStrategy

__all__ = [
    "GAPStrategy",
    "PPGNNStrategy",
    "PrivGNNStrategy",
    "ProGAPStrategy",
    "PrivateStrategy",
    "STRATEGIES",
    "register_strategy",
    "resolve_strategy",
]
