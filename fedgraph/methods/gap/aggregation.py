r"""GAP's aggregation module (AM): the aggregation perturbation mechanism, Private Multi-hop
Aggregation (PMA; GAP paper Sec. 4, "Aggregation Module", Alg. 1, Eq. 7-9).

:math:`\check X^{(0)}` is the row-normalized encoder output (Eq. 6); for ``k = 1..K``:

* aggregation (Eq. 7), :func:`aggregate`: :math:`X^{(k)} = A^T \check X^{(k-1)}`, the sum over
  in-neighbours;
* perturbation (Eq. 8), :func:`perturb`: :math:`\tilde X^{(k)}_v = X^{(k)}_v + \mathcal N(0,
  \sigma^2 I)` for every row ``v``, the Gaussian mechanism;
* normalization (Eq. 9), :func:`~fedgraph.nn.gap.normalize_rows`: every row to L2 norm 1, which
  bounds each row's effect on the next hop (the sensitivity, :mod:`.privacy`).

:func:`pma` runs the loop on one graph (centralized GAP, :mod:`.reference`). The pieces are
exposed so that a federation can run PMA across clients (:mod:`.client_pma`, :mod:`.server`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...nn.gap import normalize_rows
from ...utils.sparse import EdgeSum, sum_over_edges

__all__ = ["aggregate", "perturb", "normalize_rows", "pma"]


def aggregate(h: Tensor, edge_index: Tensor, num_nodes: int, chunk_size: int = 2**22) -> Tensor:
    r"""Sum aggregation over in-neighbours, :math:`A^T H` (paper Eq. 7):
    ``out[v] = sum_{(u, v) in E} h[u]``.

    One sparse matmul when ``edge_index`` is sorted by target (every loaded graph is
    dst-coalesced), else ``index_add_`` over chunks of edges
    (:func:`fedgraph.utils.sparse.sum_over_edges`).

    Args:
        h: ``[N_src, e]`` rows of the source nodes (indexed by ``edge_index[0]``).
        edge_index: long ``[2, E]``, messages ``edge_index[0] -> edge_index[1]``.
        num_nodes: number of target rows ``N`` (targets are ``edge_index[1]`` in
            ``[0, N)``; sources and targets may be numbered differently, e.g. a client's partial
            sums for remote targets).
        chunk_size: edges per chunk of the unsorted path; its memory is ``chunk_size * e``
            floats beyond the output.

    Returns:
        ``[N, e]`` (zero rows for nodes without in-edges).

    Raises:
        ValueError: ``edge_index`` not of shape ``[2, E]``.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    return sum_over_edges(
        h, edge_index[0], edge_index[1], num_nodes, max_elements=chunk_size * max(h.size(1), 1)
    )


def perturb(sums: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
    r"""Gaussian mechanism on every row (paper Eq. 8):
    :math:`\tilde X_v = X_v + \mathcal N(0, \sigma^2 I)`.

    Args:
        sums: ``[N, e]`` aggregations.
        sigma: noise standard deviation (noise multiplier x L2 sensitivity); ``0`` adds nothing.
        generator: noise source (``None``: the global RNG).
    """
    from ...mechanisms._checks import check_noise_scale

    sigma = check_noise_scale(sigma, "sigma", allow_zero=True)
    if sigma == 0:
        return sums
    noise = torch.randn(sums.shape, generator=generator, dtype=sums.dtype, device="cpu")
    return sums + sigma * noise.to(sums.device)


def pma(
    x0: Tensor,
    edge_index: Tensor,
    num_hops: int,
    sigma: float,
    generator: torch.Generator | None = None,
    chunk_size: int = 2**22,
) -> list[Tensor]:
    r"""Private Multi-hop Aggregation (paper Alg. 1).

    :math:`\check X^{(0)} = x_0 / \lVert x_0 \rVert` (rows; Eq. 6, so the sensitivity holds
    whatever the caller passes), then for ``k = 1..K``: :math:`X^{(k)} = A^T \check X^{(k-1)}`
    (Eq. 7), :math:`\tilde X^{(k)} = X^{(k)} + \mathcal N(0, \sigma^2 I)` row-wise (Eq. 8),
    :math:`\check X^{(k)} = \tilde X^{(k)} / \lVert \tilde X^{(k)} \rVert` (Eq. 9).

    Args:
        x0: ``[N, e]`` encoder output.
        edge_index: ``[2, E]``, ``edge_index[0] -> edge_index[1]`` (degree-bounded for node-level
            DP, see :func:`fedgraph.utils.bound_out_degree`).
        num_hops: ``K >= 0``.
        sigma: noise std per hop (noise multiplier x sensitivity); ``0``: GAP without noise.
        generator: noise source.

    Returns:
        ``K + 1`` tensors ``[N, e]``: hop 0 (normalized ``x0``) to hop ``K``; every row has unit
        norm (with ``sigma = 0`` a node without in-neighbours keeps a zero row).
    """
    if num_hops < 0:
        raise ValueError(f"num_hops must be >= 0, got {num_hops}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    n = x0.size(0)
    hops = [normalize_rows(x0)]
    if not num_hops:
        return hops
    # the sum over the edges built once for the K hops, as each federated client builds its
    # own once per run (Eq. 7 at every hop: the same matrix, a new right-hand side)
    edge_sum = EdgeSum(
        edge_index[0], edge_index[1], n, num_rows=n, max_elements=chunk_size * max(x0.size(1), 1)
    )
    for _ in range(num_hops):
        hops.append(normalize_rows(perturb(edge_sum(hops[-1]), sigma, generator)))
    return hops
