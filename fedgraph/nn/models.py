"""GNN backbones from PyG, configured as in the PPGNN paper (Sec. IV-A 3): 2 layers, hidden 16,
SELU activation followed by dropout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.models import GAT, GCN, GraphSAGE


class ProjectFirstSAGEConv(SAGEConv):
    r"""PyG's :class:`~torch_geometric.nn.SAGEConv` (mean aggregation) that projects before it
    aggregates when that is cheaper: :math:`W \operatorname{mean}_{j} x_j =
    \operatorname{mean}_j W x_j`, the same layer up to float rounding (the same parameters,
    initialization and state dict), with the sparse aggregation over ``out_channels`` columns
    instead of ``in_channels`` (16 instead of 4,714 on Facebook page-page: the aggregation was
    most of a training epoch there), and one matmul for the neighbour and root projections.
    Other aggregations, ``project = True`` and pair inputs use PyG's order.
    """

    def forward(self, x, edge_index, size=None) -> Tensor:
        if (
            not isinstance(x, Tensor)
            or self.project
            or self.aggr != "mean"
            or self.lin_l.in_channels <= self.lin_l.out_channels
        ):
            return super().forward(x, edge_index, size)
        # One matmul for both projections (the wide input is read once).
        weights = [self.lin_l.weight] + ([self.lin_r.weight] if self.root_weight else [])
        h = F.linear(x, torch.cat(weights)).split(self.lin_l.out_channels, dim=-1)
        out = self.propagate(edge_index, x=(h[0], h[0]), size=size)
        if self.lin_l.bias is not None:
            out = out + self.lin_l.bias
        if self.root_weight:
            out = out + h[1]
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out


class ProjectFirstGraphSAGE(GraphSAGE):
    """PyG's :class:`~torch_geometric.nn.models.GraphSAGE` with :class:`ProjectFirstSAGEConv`
    layers (same model, faster for wide inputs)."""

    def init_conv(self, in_channels, out_channels, **kwargs):
        return ProjectFirstSAGEConv(in_channels, out_channels, **kwargs)


BACKBONES = {"gcn": GCN, "sage": ProjectFirstGraphSAGE, "gat": GAT}


def make_backbone(
    name: str,
    in_channels: int,
    out_channels: int,
    hidden_channels: int = 16,
    num_layers: int = 2,
    dropout: float = 0.5,
) -> nn.Module:
    """Build a PyG backbone ``name`` in ``{gcn, sage, gat}``; forward ``(x [N, F], edge_index
    [2, E]) -> logits [N, C]``.

    Raises:
        ValueError: unknown backbone, listing the allowed names.
    """
    if name not in BACKBONES:
        raise ValueError(f"backbone: unknown {name!r}; allowed: {sorted(BACKBONES)}")
    return BACKBONES[name](
        in_channels=in_channels,
        hidden_channels=hidden_channels,
        num_layers=num_layers,
        out_channels=out_channels,
        dropout=dropout,
        act="selu",
    )


def adjacency_for(name: str, edge_index, num_nodes: int):
    """The graph argument that runs ``name`` fastest with identical results.

    SAGE and GCN take a transposed sparse CSR adjacency (``adj_t[dst, src]``), which lets PyG
    fuse gather and aggregation into one sparse matmul (about 10x faster on CPU for
    bag-of-words features); GAT needs per-edge attention and keeps ``edge_index``.

    When ``edge_index`` is already dst-coalesced (unique and sorted by ``dst`` then ``src``, as
    the PPGNN server's :func:`~fedgraph.utils.sparse.unique_edges` returns it;
    :func:`~fedgraph.utils.sparse.is_dst_coalesced`) the CSR is built directly, its columns a
    view of ``edge_index[0]``: the same matrix as PyG's ``to_torch_csr_tensor``, which copies
    and sorts the edges (about 56 bytes per edge of temporaries and 8 kept).
    """
    if name == "gat":
        return edge_index
    import warnings

    from torch_geometric.utils import to_torch_csr_tensor

    from ..utils.sparse import dst_csr, is_dst_coalesced

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR "beta" warning
        if edge_index.dtype == torch.long and is_dst_coalesced(edge_index, num_nodes):
            return dst_csr(edge_index, num_nodes)
        return to_torch_csr_tensor(edge_index.flip(0), size=(num_nodes, num_nodes))
