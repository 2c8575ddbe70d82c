"""Models and propagation layers (PyG underneath)."""
from .models import BACKBONES, adjacency_for, make_backbone
from .propagation import flexprop_weights, weighted_propagation

__all__ = ["BACKBONES", "adjacency_for", "flexprop_weights", "make_backbone", "weighted_propagation"]
