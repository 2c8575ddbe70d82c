"""Flower server strategies of fedgraph: the server half of each method, phase by phase."""
from .base import STRATEGIES, PrivateStrategy, register_strategy, resolve_strategy
from .ppgnn import PPGNNStrategy

__all__ = ["PPGNNStrategy", "PrivateStrategy", "STRATEGIES", "register_strategy", "resolve_strategy"]
