"""Small, pure helpers over edge indices (degree bounding, ...), in the style of
``torch_geometric.utils``."""

from .graph import bound_degree, bound_in_degree, bound_out_degree, in_degree, out_degree

__all__ = ["bound_degree", "bound_in_degree", "bound_out_degree", "in_degree", "out_degree"]
