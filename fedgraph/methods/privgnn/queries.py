"""PrivGNN's queries (paper Alg. 1 lines 1-2, Sec. 3.1.2), all public data: the server picks
query nodes from the public pool, cuts their ``l``-hop public neighbourhoods, fits an optional
public PCA map, and sends them to the clients in one ``query.privgnn`` message.

Message (server -> client, :func:`encode_queries`): the queries' public ``hops``-hop
neighbourhoods and, with ``projection-dim > 0``, a PCA map fitted on the public features.
No private data, so none of this costs privacy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.utils import k_hop_subgraph, subgraph

from ... import randomness as rng
from ...config import PrivGNNConfig
from ...nn import adjacency_for


@dataclass
class QueryGraphs:
    """The public neighbourhoods of ``Q`` query nodes, as sent by the server: the disjoint
    union of the ``l``-hop subgraphs (``x [M, F]``, ``edge_index [2, E]`` in union ids),
    ``ptr [Q+1]`` (graph ``q`` is nodes ``ptr[q]:ptr[q+1]``) and ``center [Q]`` (union id of
    query ``q``)."""

    x: Tensor
    edge_index: Tensor
    ptr: Tensor
    center: Tensor

    @property
    def query_x(self) -> Tensor:
        return self.x[self.center]

    def graph(self, q: int) -> tuple[Tensor, Tensor, int]:
        """``(x [m, F], edge_index [2, e] local ids, center local id)`` of query ``q``."""
        lo, hi = int(self.ptr[q]), int(self.ptr[q + 1])
        e = self.edge_index
        keep = (e[0] >= lo) & (e[0] < hi)
        return self.x[lo:hi], e[:, keep] - lo, int(self.center[q]) - lo


def query_neighbourhoods(
    public: Data,
    query_idx: Tensor,
    hops: int = 2,
    max_nodes: int | None = 2000,
    generator: torch.Generator | None = None,
) -> QueryGraphs:
    """Server side: the ``hops``-hop public neighbourhood of every query (paper Sec. 3.1.2: a
    teacher predicts a query from its ``l``-hop neighbourhood; ``l`` = number of layers).

    ``max_nodes`` caps a neighbourhood (a uniform random subset of the non-centre nodes, the
    public graph is public so this choice costs no privacy); ``None`` keeps all.
    """
    xs, edges, ptr, centers, offset = [], [], [0], [], 0
    for v in query_idx.tolist():
        nodes, ei, mapping, _ = k_hop_subgraph(
            int(v), hops, public.edge_index, relabel_nodes=True, num_nodes=int(public.num_nodes)
        )
        c = int(mapping[0])
        if max_nodes is not None and nodes.numel() > max_nodes:
            others = torch.tensor([i for i in range(nodes.numel()) if i != c])
            keep = others[rng.randperm(others.numel(), generator)[: max_nodes - 1]]
            keep = torch.cat([torch.tensor([c]), keep]).sort().values
            ei, _ = subgraph(keep, ei, relabel_nodes=True, num_nodes=nodes.numel())
            c = int((keep == c).nonzero())
            nodes = nodes[keep]
        xs.append(public.x[nodes])
        edges.append(ei + offset)
        centers.append(c + offset)
        offset += nodes.numel()
        ptr.append(offset)
    return QueryGraphs(torch.cat(xs), torch.cat(edges, 1), torch.tensor(ptr), torch.tensor(centers))


@dataclass
class FeatureProjection:
    """A linear map of features fitted on *public* data only (so it costs no privacy), applied
    to every teacher's input: ``(x - mean) @ components``. Retrieval still uses raw features."""

    mean: Tensor  # [F]
    components: Tensor  # [F, d]

    def __call__(self, x: Tensor) -> Tensor:
        return (x.float() - self.mean) @ self.components


def public_projection(public_x: Tensor, dim: int = 64, seed: int = 0) -> FeatureProjection:
    """Server side: PCA of the public features (``torch.pca_lowrank``) to ``dim`` components,
    sent to clients so that their teachers are small (:func:`answer_queries`'s
    ``projection``). Public data only: no privacy cost."""
    torch.manual_seed(int(seed))
    mean = public_x.float().mean(0)
    dim = min(int(dim), *public_x.shape)
    _, _, v = torch.pca_lowrank(public_x.float() - mean, q=dim, center=False, niter=4)
    return FeatureProjection(mean, v[:, :dim])


def select_queries(
    public: Data,
    num_queries: int,
    policy: str = "random",
    student: nn.Module | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Server side: ``num_queries`` query nodes from the public pool (``public.train_mask``).

    ``random`` (paper): uniform without replacement. ``entropy``: the nodes on which
    ``student`` (a model trained earlier, e.g. on a first round of pseudo-labels) is least
    certain (highest predictive entropy); public data only, so no privacy cost.

    Returns:
        long ``[min(num_queries, pool)]`` public node ids.
    """
    pool = public.train_mask.nonzero().view(-1)
    num_queries = min(int(num_queries), pool.numel())
    if policy == "random":
        return pool[torch.randperm(pool.numel(), generator=generator)[:num_queries]]
    if policy == "entropy":
        if student is None:
            raise ValueError("select_queries: policy 'entropy' needs a student model")
        student.eval()
        with torch.no_grad():
            p = student(public.x, adjacency_for("sage", public.edge_index, int(public.num_nodes)))[
                pool
            ].softmax(-1)
        ent = -(p * p.clamp_min(1e-12).log()).sum(-1)
        return pool[torch.argsort(ent, descending=True)[:num_queries]]
    raise ValueError(f"policy: unknown {policy!r}; allowed: ['random', 'entropy']")


#: features sparser than this travel as COO (index, value) pairs: exact, and Cora's or
#: Facebook100's one-hot rows shrink ~50x.
SPARSE_DENSITY = 0.25


def encode_queries(
    hoods: QueryGraphs, projection: FeatureProjection | None = None
) -> dict[str, Tensor]:
    """Server side: the tensors of a ``query.privgnn`` message.

    Keys: ``edge_index [2, E]``, ``ptr [Q+1]``, ``center [Q]`` (:class:`QueryGraphs`),
    the neighbourhood features ``x [M, F]`` either dense (``x``) or, below
    :data:`SPARSE_DENSITY`, as ``x_index [2, nnz]``, ``x_value [nnz]``, ``x_shape [2]``; and
    with a projection ``proj_mean [F]``, ``proj_components [F, d]``.
    """
    x = hoods.x.float()
    out = {"edge_index": hoods.edge_index, "ptr": hoods.ptr, "center": hoods.center}
    if x.numel() and float((x != 0).float().mean()) < SPARSE_DENSITY:
        idx = x.nonzero().T
        out.update(x_index=idx, x_value=x[idx[0], idx[1]], x_shape=torch.tensor(list(x.shape)))
    else:
        out["x"] = x
    if projection is not None:
        out.update(proj_mean=projection.mean, proj_components=projection.components)
    return out


def decode_queries(arrays: dict[str, Tensor]) -> tuple[QueryGraphs, FeatureProjection | None]:
    """Client side: the inverse of :func:`encode_queries`."""
    if "x" in arrays:
        x = arrays["x"]
    else:
        shape = tuple(int(s) for s in arrays["x_shape"])
        x = torch.zeros(shape)
        x[arrays["x_index"][0], arrays["x_index"][1]] = arrays["x_value"]
    proj = (
        FeatureProjection(arrays["proj_mean"], arrays["proj_components"])
        if "proj_mean" in arrays
        else None
    )
    return QueryGraphs(x, arrays["edge_index"], arrays["ptr"], arrays["center"]), proj


def first_queries(hoods: QueryGraphs, m: int) -> QueryGraphs:
    """The neighbourhoods of queries ``0..m-1`` only (a prefix of the union)."""
    end = int(hoods.ptr[m])
    keep = hoods.edge_index[0] < end
    return QueryGraphs(
        hoods.x[:end], hoods.edge_index[:, keep], hoods.ptr[: m + 1], hoods.center[:m]
    )


def make_queries(
    public,
    query_idx: Tensor,
    cfg: PrivGNNConfig,
    generator: torch.Generator | None = None,
    projection: FeatureProjection | None = None,
) -> dict[str, Tensor]:
    """Server side: the message tensors for ``query_idx`` (long ``[Q]`` public node ids):
    their ``cfg.hops``-hop public neighbourhoods capped at ``cfg.neighbourhood_size`` nodes
    (a random subset: public data, no privacy cost)."""
    hoods = query_neighbourhoods(public, query_idx, cfg.hops, cfg.neighbourhood_size, generator)
    return encode_queries(hoods, projection)


__all__ = [
    "QueryGraphs",
    "query_neighbourhoods",
    "FeatureProjection",
    "public_projection",
    "select_queries",
    "SPARSE_DENSITY",
    "encode_queries",
    "decode_queries",
    "first_queries",
    "make_queries",
]
