"""Models and propagation layers (PyG underneath).

The names are imported from their module on first use (PEP 562): GAP's client, which needs
only :mod:`fedgraph.nn.gap` (plain torch), does not import PyG (about 2 s per process)."""
from importlib import import_module as _import_module

_WHERE = {"BACKBONES": "models", "adjacency_for": "models", "make_backbone": "models",
          "flexprop_weights": "propagation", "weighted_propagation": "propagation"}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(_import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__all__ = ["BACKBONES", "adjacency_for", "flexprop_weights", "make_backbone", "weighted_propagation"]
