"""Models and propagation layers (PyG underneath)."""
from .models import BACKBONES, make_backbone
from .propagation import flexprop_weights, weighted_propagation

__all__ = ["BACKBONES", "flexprop_weights", "make_backbone", "weighted_propagation"]
