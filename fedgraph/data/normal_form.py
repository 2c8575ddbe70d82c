r"""The one form of every loaded graph (:mod:`fedgraph.data.datasets`'s module docs):
:func:`finalize` brings a loader's graph to it, :func:`check_graph` checks a user loader's
graph before, :func:`dataset_statistics` summarises one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from ..registry import ContractError


def finalize(data: Data, name: str, feature_domain: tuple[float, float] | None) -> Data:
    r"""Casts to the project's dtypes, makes the graph undirected, dst-coalesced (unique
    edges sorted by target, then source: the rows of the transposed CSR adjacency as they
    stand, :mod:`fedgraph.utils.sparse`) and free of self loops, and sets ``name`` and
    ``feature_domain``."""
    num_nodes = data.num_nodes
    out = Data(x=data.x.to(torch.float32).contiguous(), y=data.y.to(torch.long).view(-1))
    edge_index = data.edge_index.to(torch.long)
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = to_undirected(edge_index, num_nodes=num_nodes)
    out.edge_index = coalesce(edge_index, num_nodes=num_nodes, sort_by_row=False)
    for key in ("train_mask", "val_mask", "test_mask"):
        if key in data and data[key] is not None:
            mask = data[key].to(torch.bool)
            if mask.dim() == 1:  # PyG's default public split
                out[key] = mask
                out["public_" + key] = mask.clone()
    out.num_nodes = num_nodes
    out.name = name
    out.feature_domain = feature_domain
    return out


def dataset_statistics(data: Data) -> dict[str, Any]:
    r"""Summary statistics of a node-classification graph.

    Args:
        data (Data): graph with ``x [N, F]``, ``y [N]`` and
            ``edge_index [2, E]``.

    Returns:
        dict: ``name``, ``num_nodes``, ``num_edges`` (directed count, i.e. each
        undirected edge counted twice), ``num_features``, ``num_classes``,
        ``avg_degree`` (``num_edges / num_nodes``) and ``class_counts``
        (list of length ``num_classes``).
    """
    n = int(data.num_nodes)
    e = int(data.edge_index.size(1))
    y = data.y.view(-1)
    valid = y[y >= 0]
    num_classes = int(valid.max()) + 1 if valid.numel() > 0 else 0
    counts = torch.bincount(valid, minlength=num_classes).tolist()
    return {
        "name": getattr(data, "name", None),
        "num_nodes": n,
        "num_edges": e,
        "num_features": int(data.x.size(1)) if data.x is not None else 0,
        "num_classes": num_classes,
        "avg_degree": e / n if n > 0 else 0.0,
        "class_counts": counts,
    }


def check_graph(data: Data, name: str = "dataset") -> None:
    r"""Checks that a loader's graph is what the pipeline needs.

    Required: ``x`` a finite float tensor ``[N, F]`` with ``N >= 2`` and
    ``F >= 1``; ``y`` an integer tensor ``[N]`` with labels in
    ``[0, num_classes)`` (``num_classes``: the attribute if set, else
    ``max(y) + 1``, and then every class must have a node), at least two
    classes; ``edge_index`` an integer tensor
    ``[2, E]`` with node ids in ``[0, N)`` (directed or undirected: it is made
    undirected afterwards). Optional: ``feature_domain`` ``None`` or
    ``(low, high)`` with ``low < high`` and every feature inside (a public
    range: LDP feature mechanisms need it); ``train_mask``/``val_mask``/
    ``test_mask`` boolean ``[N]`` (the ``planetoid`` split uses them). ``y`` may also be
    ``[N, 1]`` (as OGB stores labels): it is flattened.

    Raises:
        ContractError: naming ``name``, the field and what was wrong.
    """

    def bad(msg: str):
        raise ContractError(f"dataset {name!r}: {msg}")

    if not isinstance(data, Data):
        bad(f"the loader must return a torch_geometric.data.Data, got {type(data).__name__}")
    x, y, ei = data.get("x"), data.get("y"), data.get("edge_index")
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        bad(f"x must be a float tensor [num_nodes, num_features], got {_describe(x)}")
    n, f = x.shape
    if n < 2 or f < 1:
        bad(f"x has shape [{n}, {f}]; need at least 2 nodes and 1 feature")
    if not bool(torch.isfinite(x).all()):
        bad("x has NaN or infinite values")
    if (
        not isinstance(y, Tensor)
        or y.is_floating_point()
        or y.is_complex()
        or y.dtype == torch.bool
        or y.view(-1).numel() != n
        or y.dim() > 2
    ):
        bad(f"y must be an integer tensor [{n}] (one class id per node), got {_describe(y)}")
    y = y.view(-1)
    num_classes = data.get("num_classes")
    limit = int(num_classes) if num_classes is not None else int(y.max()) + 1
    if int(y.min()) < 0 or int(y.max()) >= limit:
        first = int(((y < 0) | (y >= limit)).nonzero()[0])
        bad(
            f"labels must lie in [0, {limit}) (num_classes = {limit}), got values in "
            f"[{int(y.min())}, {int(y.max())}]; the first outside is {int(y[first])} at node "
            f"{first} (0-based: the data line of labels.csv for the 'files' dataset)"
        )
    present = torch.unique(y)
    if int(present.numel()) < 2:
        bad("y has a single class; node classification needs at least 2")
    if num_classes is None and int(present.numel()) != limit:
        missing = sorted(set(range(limit)) - set(present.tolist()))
        shown = (
            f"{missing}"
            if len(missing) <= 10
            else f"[{', '.join(map(str, missing[:10]))}, ...] ({len(missing)} in all)"
        )
        values = present.tolist()
        seen = f"{values}" if len(values) <= 12 else f"[{', '.join(map(str, values[:12]))}, ...]"
        top = int(y.max())
        at = (y == top).nonzero().view(-1)[:5].tolist()
        why = (
            "1-based labels? "
            if int(y.min()) == 1
            else f"the largest label, {top}, is at node(s) {at} (0-based: the data line of "
            "labels.csv for the 'files' dataset); "
        )
        bad(
            f"class ids must be 0..C-1 with every class present; the labels take the values "
            f"{seen}, so classes {shown} have no node ({why}relabel with "
            "torch.unique(y, return_inverse=True)[1], or set data.num_classes if some classes "
            "are truly empty)"
        )
    if (
        not isinstance(ei, Tensor)
        or ei.dim() != 2
        or ei.shape[0] != 2
        or ei.is_floating_point()
        or ei.dtype == torch.bool
    ):
        bad(f"edge_index must be an integer tensor [2, num_edges], got {_describe(ei)}")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        bad(
            f"edge_index has node ids in [{int(ei.min())}, {int(ei.max())}], outside "
            f"[0, {n}) (num_nodes = x.shape[0])"
        )
    if data.get("num_nodes") is not None and data.num_nodes != n:
        bad(f"num_nodes = {data.num_nodes} but x has {n} rows")
    domain = data.get("feature_domain")
    if domain is not None:
        try:
            low, high = (float(v) for v in domain)
        except (TypeError, ValueError):
            bad(f"feature_domain must be None or (low, high), got {domain!r}")
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            bad(f"feature_domain must satisfy low < high (finite), got {domain!r}")
        if float(x.min()) < low or float(x.max()) > high:
            bad(
                f"features lie in [{float(x.min()):g}, {float(x.max()):g}], outside the "
                f"declared feature_domain ({low:g}, {high:g}); declare the public range "
                "of the data format (not the data's own min/max), or None"
            )
    for key in ("train_mask", "val_mask", "test_mask"):
        mask = data.get(key)
        if mask is not None and (
            not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n,)
        ):
            bad(f"{key} must be a bool tensor [{n}], got {_describe(mask)}")


def _describe(t) -> str:
    if isinstance(t, Tensor):
        return f"{t.dtype} tensor of shape {list(t.shape)}"
    return "None (missing)" if t is None else type(t).__name__
