r"""Seeded synthetic graphs for scale tests: a sparse stochastic block model.

``synthetic-sbm:<nodes>:<avg_degree>[:<seed>]`` (a dataset name understood by
:func:`fedgraph.data.load_dataset`) is a planted-partition stochastic block model with
:data:`SBM_CLASSES` equal-size classes, class homophily :data:`SBM_HOMOPHILY` (the share of
edges whose endpoints share a class) and binary class-dependent features.

Sampling is sparse: the ``M = round(N * avg_degree / 2)`` undirected edges are drawn one by one
(``O(M)`` time and memory), never through the ``N x N`` probability matrix of PyG's
``stochastic_blockmodel_graph``. Edge ``{u, v}``: ``u`` uniform over all nodes; with probability
``q`` ``v`` is uniform over ``u``'s class, else uniform over all nodes, where
``q = (h - 1/C) / (1 - 1/C)`` makes the expected homophily exactly ``h``. Self loops and
duplicates are dropped and the deficit is drawn again, so the graph has exactly ``M``
undirected edges (``2M`` directed entries in ``edge_index``: ``avg_degree`` as
:func:`~fedgraph.data.dataset_statistics` counts it), unless the graph cannot hold them.

STATS (``synthetic-sbm:2000:10``): 2,000 nodes, 20,000 directed edges, 32 binary features,
5 classes, homophily about 0.8.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and PyG load with sbm_graph: parsing a name needs neither
    from torch import Tensor
    from torch_geometric.data import Data

# The name's parsing lives in fedgraph.catalog: a run config is checked without torch.
from ..catalog import SBM_CLASSES, parse_sbm_name, sbm_spec  # noqa: F401
from ..catalog import SBM_PREFIX as PREFIX

#: Expected share of edges whose endpoints share a class.
SBM_HOMOPHILY = 0.8
#: Number of binary features.
SBM_FEATURES = 32
#: ``P(x_f = 1)`` for a feature in the node's class block, and outside it.
SBM_FEATURE_P = (0.5, 0.1)


def sbm_graph(
    num_nodes: int,
    avg_degree: float,
    seed: int = 0,
    *,
    num_classes: int = SBM_CLASSES,
    homophily: float = SBM_HOMOPHILY,
    num_features: int = SBM_FEATURES,
    feature_p: tuple[float, float] = SBM_FEATURE_P,
) -> Data:
    r"""A sparse planted-partition SBM with class-dependent binary features (module docs).

    Args:
        num_nodes: ``N >= 2 * num_classes``.
        avg_degree: directed edges per node (``2M / N``), in ``(0, N - 1]``.
        seed: with ``N`` and ``avg_degree``, seeds a CPU :class:`torch.Generator` (through a
            hash, so the graph is independent of splits seeded with the same integer): the
            same arguments give the same graph.
        num_classes: ``C >= 2``; class of node ``i`` is a seeded permutation of ``i mod C``.
        homophily: ``h`` in ``[1/C, 1]``, expected share of intra-class edges.
        num_features: ``F >= C``; feature ``f`` belongs to class block ``f * C // F``.
        feature_p: ``(p_in, p_out)``: ``P(x_f = 1)`` inside and outside the node's block.

    Returns:
        Data: ``x [N, F]`` float32 in ``{0, 1}``, ``y [N]`` long, ``edge_index [2, 2M]`` long
        (both directions, sorted by target then source, no self loops or duplicates),
        ``feature_domain = (0, 1)``,
        ``num_nodes``, ``name``. Memory ``O(M + N F)``: about 56 bytes per undirected edge at
        peak (the sort of int64 keys and the final edge index).

    Raises:
        ValueError: an argument out of range.
    """
    n, c = int(num_nodes), int(num_classes)
    if c < 2 or n < 2 * c:
        raise ValueError(
            f"need num_classes >= 2 and num_nodes >= 2 * num_classes, got {n} nodes, {c} classes"
        )
    if not (0 < avg_degree <= n - 1):
        raise ValueError(f"avg_degree must lie in (0, num_nodes - 1], got {avg_degree}")
    if not (1.0 / c <= homophily <= 1.0):
        raise ValueError(f"homophily must lie in [1/num_classes, 1], got {homophily}")
    if num_features < c:
        raise ValueError(f"num_features must be >= num_classes, got {num_features}")
    import torch
    from torch_geometric.data import Data

    # Not ``seed`` itself: a split seeded with the same integer draws the same randperm, and
    # the test nodes would all be of one class.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{PREFIX}{n}:{avg_degree}:{seed}".encode()))
    # Classes: contiguous blocks of a random order of the nodes.
    order = torch.randperm(n, generator=gen)
    sizes = torch.full((c,), n // c, dtype=torch.long)
    sizes[: n % c] += 1
    starts = torch.cumsum(sizes, 0) - sizes
    y = torch.empty(n, dtype=torch.long)
    y[order] = torch.repeat_interleave(torch.arange(c), sizes)
    pos = torch.empty(n, dtype=torch.long)  # position of node in ``order``
    pos[order] = torch.arange(n)

    target = int(round(n * avg_degree / 2))
    q = (homophily - 1.0 / c) / (1.0 - 1.0 / c)
    keys = torch.zeros(0, dtype=torch.long)
    for _ in range(50):
        need = target - keys.numel()
        if need <= 0:
            break
        draw = int(need * 1.05) + 16
        u = torch.randint(n, (draw,), generator=gen)
        same = torch.rand(draw, generator=gen) < q
        cu = y[u]
        off = (torch.rand(draw, generator=gen) * sizes[cu]).long().clamp_max(sizes[cu] - 1)
        v = torch.where(same, order[starts[cu] + off], torch.randint(n, (draw,), generator=gen))
        del same, cu, off
        ok = u != v
        lo, hi = torch.minimum(u[ok], v[ok]), torch.maximum(u[ok], v[ok])
        del u, v, ok
        keys = torch.unique(torch.cat([keys, lo * n + hi]))  # sorted keys u * N + v, u < v
        del lo, hi
    if keys.numel() > target:  # keep a seeded random subset of exactly ``target`` pairs
        keep = torch.randperm(keys.numel(), generator=gen)[:target]
        keys = keys[keep.sort().values]
        del keep
    src, dst = keys // n, keys % n
    del keys
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    del src, dst
    perm = (edge_index[1] * n + edge_index[0]).argsort()  # dst-coalesced, as finalize
    edge_index = edge_index[:, perm]
    del perm
    block = torch.arange(num_features) * c // num_features
    p_in, p_out = feature_p
    prob = torch.where(block[None, :] == y[:, None], p_in, p_out)
    x = (torch.rand(n, num_features, generator=gen) < prob).to(torch.float32)
    return Data(
        x=x,
        y=y,
        edge_index=edge_index,
        num_nodes=n,
        feature_domain=(0.0, 1.0),
        name=f"{PREFIX}{n}:{avg_degree:g}:{seed}",
    )


def load_sbm(name: str) -> Data:
    """The graph named ``synthetic-sbm:<nodes>:<avg_degree>[:<seed>]`` (:func:`sbm_graph`).

    Raises:
        ValueError: a malformed name (:func:`parse_sbm_name`).
    """
    nodes, degree, seed = parse_sbm_name(name)
    return sbm_graph(nodes, degree, seed)


def homophily_of(edge_index: Tensor, y: Tensor) -> float:
    """Share of edges ``[2, E]`` whose endpoints have the same label ``y [N]``."""
    if edge_index.numel() == 0:
        return float("nan")
    return float((y[edge_index[0]] == y[edge_index[1]]).double().mean())
