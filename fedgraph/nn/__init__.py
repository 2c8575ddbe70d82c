"""Models and propagation layers (PyG underneath).

The names are imported from their module on first use (PEP 562): GAP's client, which needs
only :mod:`fedgraph.nn.gap` (plain torch), does not import PyG (about 2 s per process)."""

from .._lazy import lazy_attributes

_WHERE = {
    "BACKBONES": "models",
    "adjacency_for": "models",
    "make_backbone": "models",
    "flexprop_weights": "propagation",
    "weighted_propagation": "propagation",
}


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())


__all__ = [
    "BACKBONES",
    "adjacency_for",
    "flexprop_weights",
    "make_backbone",
    "weighted_propagation",
]
