"""Multi-hop feature propagation for denoising LDP features: FlexProp and KProp.

Both compute ``K`` steps of :math:`h^k_i = \\sum_{j \\in N(i)} \\Pi_{ij} h^{k-1}_j` with
:math:`\\Pi_{ij} = w_j / \\sum_{l \\in N(i)} w_l`: FlexProp weighs neighbour ``j`` by its
(released) privacy level (PPGNN paper Alg. 4, Eq. 12, where ``Pi_ij`` is nonzero only where
``A_ij = 1``); KProp (LPGNN, Sajadmanesh & Gatica-Perez 2021) is the uniform-weight special
case (a mean over the neighbours). ``N(i)`` excludes ``i`` by default, as Eq. 12 and the
LPGNN reference code (sisaman/LPGNN, ``add_self_loops=False``) do; ``self_loops=True`` adds
it (the run-config key ``self-loops``; bench/ppgnn_table.py measures both). A node without neighbours keeps its own features either way.
Sparse throughout: cost ``O(K * E * d)``, memory ``O(E + N * d)``, never an ``N x N`` matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..mechanisms.bits import mlr_num_dims, unbias_factor
from ..utils.sparse import dst_csr


def weighted_propagation(
    x: Tensor,
    edge_index: Tensor,
    steps: int,
    node_weight: Tensor | None = None,
    self_loops: bool = False,
) -> Tensor:
    """``steps`` rounds of weighted neighbourhood averaging.

    ``Pi h`` is computed as ``(A (w * h)) / (A w)`` with the 0/1 adjacency ``A[dst, src]``
    built once as a sparse CSR matrix (:func:`fedgraph.utils.sparse.dst_csr`: ``E`` entries,
    its columns shared with ``edge_index`` when that is sorted by ``dst``) and applied
    ``steps`` times with a sparse-dense matmul: no ``N x N`` dense matrix, no ``E x d``
    message tensor and no per-edge coefficient. The same result as applying the normalized
    ``Pi`` up to float rounding. Extra memory: ``A``'s values (``E`` of ``x``'s dtype), plus a
    sorted copy of the edges only when ``edge_index[1]`` is not sorted.

    Args:
        x: features ``[N, d]``.
        edge_index: ``[2, E]``, messages flow ``edge_index[0] -> edge_index[1]``.
        steps: ``K >= 0`` (0 returns ``x``).
        node_weight: ``[N]`` positive weight ``w_j`` of each source node; ``None`` = uniform
            (KProp).
        self_loops: include ``i`` in ``N(i)``; without (the default), a node with no
            incoming edge keeps its own row (``Pi_ii = 1``): the mean over an empty
            neighbourhood is undefined, and zeroing the node would discard its report.

    Returns:
        ``[N, d]``; each row of ``Pi`` sums to 1.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if steps == 0:
        return x
    n = x.size(0)
    # adj[dst, src] = 1 without self loops: the structure of Pi, one entry per edge; when
    # edge_index is sorted by dst (the server's unique_edges) its columns are edge_index[0]
    # itself, not a copy.
    adj = dst_csr(edge_index, n, drop_self_loops=True, dtype=x.dtype)
    crow = adj.crow_indices()
    w = (
        torch.ones(n, 1, dtype=x.dtype, device=x.device)
        if node_weight is None
        else node_weight.to(x.device, x.dtype).view(n, 1)
    )
    # Pi h = (A (w * h)) / (A w): the row sums of Pi are 1 by construction; no [E] coefficient
    # and no [E, d] message block.
    norm = adj @ w
    if self_loops:
        norm = norm + w
    else:
        lonely = (crow[1:] == crow[:-1]).nonzero().view(-1)  # Pi_ii = 1 for these rows
    norm = norm.clamp_min(torch.finfo(x.dtype).tiny)
    h = x
    for _ in range(steps):
        wh = w * h
        out = adj @ wh
        if self_loops:
            out += wh
        out /= norm
        if not self_loops:
            out[lonely] = h[lonely]
        h = out
    return h


def flexprop_weights(
    level_hat: Tensor,
    budgets: list[float] | tuple[float, ...],
    mode: str = "level",
    num_features: int | None = None,
    feature_share: float = 1.0,
) -> Tensor | None:
    r"""Source-node weights ``w_j`` for :func:`weighted_propagation`.

    Args:
        level_hat: long ``[N]`` decoded released levels in ``{1..h}``.
        mode: ``"level"``: :math:`w_j = \tau'_j` (PPGNN Eq. 12); ``"inverse-variance"``:
            :math:`w_j = 1/\sigma_j^2` with the multi-bit variance
            :math:`(d/m) C(\epsilon/m)^2` at the released level's feature budget (the optimum
            of Appendix E, Eq. 11); ``"uniform"``: ``None`` (KProp).
        num_features, feature_share: needed for ``"inverse-variance"`` (``d`` and
            ``1 - gamma``).

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode == "uniform":
        return None
    if mode == "level":
        return level_hat.double()
    if mode == "inverse-variance":
        if num_features is None:
            raise ValueError("inverse-variance weights need num_features")
        eps = feature_share * torch.tensor(budgets, dtype=torch.float64)[level_hat.cpu() - 1]
        m = mlr_num_dims(eps, num_features)
        var = (num_features / m) * unbias_factor(eps / m) ** 2
        return (1.0 / var).to(level_hat.device)
    raise ValueError(
        f"flexprop weights: unknown mode {mode!r}; allowed: level, inverse-variance, uniform"
    )
