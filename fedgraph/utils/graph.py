r"""Degree bounding of directed graphs by uniform edge sampling.

Messages flow ``edge_index[0] -> edge_index[1]`` (source to target), as in PyG. An undirected
graph is stored with both directions, so for it in-degree and out-degree coincide before
bounding (but not after: bounding one direction breaks the symmetry).

Why bound degrees (GAP, Sajadmanesh et al. 2023, Sec. 5 "node-level privacy"): GAP's sum
aggregation computes row ``v`` of :math:`A^T X` as :math:`\sum_{u \to v} x_u` with unit-norm
rows :math:`x_u`. Removing node ``u`` changes every row ``v`` that ``u`` sends to, i.e. its
*out*-neighbours, each by a unit vector, so the L2 sensitivity of one aggregation step is
:math:`\sqrt{D}` when every node has **out**-degree at most ``D``. The GAP reference code bounds
exactly that (``BoundOutDegree``: it transposes the adjacency, samples at most ``D`` neighbours
per node, and transposes back). :func:`bound_in_degree` bounds the other direction: it keeps
every row a sum of at most ``D`` unit vectors (norm <= ``D``) but does *not* bound a node's
influence; it gives the :math:`\sqrt{D}` node-level sensitivity only when applied to the
reversed graph, which is what :func:`bound_out_degree` does.

Caveat (shared with the paper and its code): the sensitivity :math:`\sqrt{D}` is that of the
aggregation *on the degree-bounded graph*. The sampling itself depends on the neighbourhood
(removing ``w`` frees a slot of each in-neighbour of ``w`` for another edge), which the bound does
not account for.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import randomness as rng


def _check(edge_index: Tensor, num_nodes: int, max_degree: int) -> None:
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if isinstance(max_degree, bool) or int(max_degree) != max_degree or max_degree < 0:
        raise ValueError(f"max_degree must be an integer >= 0, got {max_degree}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index has node ids outside [0, {num_nodes})")


def in_degree(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Number of edges ending at each node, long ``[N]``."""
    return torch.bincount(edge_index[1], minlength=num_nodes)


def out_degree(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Number of edges leaving each node, long ``[N]``."""
    return torch.bincount(edge_index[0], minlength=num_nodes)


def bound_degree(
    edge_index: Tensor,
    num_nodes: int,
    max_degree: int,
    generator: torch.Generator | None = None,
    *,
    direction: str = "in",
    return_mask: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Keeps, for every node, at most ``max_degree`` of its incoming (``direction="in"``) or
    outgoing (``direction="out"``) edges, chosen uniformly at random without replacement.

    Vectorized: every edge draws a uniform key; edges are sorted by (group node, key) where the
    group node is the target (``in``) or the source (``out``); an edge is kept when its rank
    within its group is below ``max_degree``. A node with degree ``>= max_degree`` keeps
    exactly ``max_degree`` edges (a uniformly random subset), the others keep all of theirs.
    Cost ``O(E log E)``, memory ``O(E)``.

    Args:
        edge_index: long ``[2, E]``, ``edge_index[0] -> edge_index[1]``.
        num_nodes: ``N``.
        max_degree: ``D >= 0``.
        generator: source of the random keys (``None``: the global RNG).
        direction: ``"in"`` (bound in-degrees) or ``"out"`` (bound out-degrees).
        return_mask: also return the bool ``[E]`` mask of kept edges.

    Returns:
        ``[2, E']`` the kept edges, a subset of ``edge_index`` in its original order (and the
        mask if ``return_mask``).
    """
    _check(edge_index, num_nodes, max_degree)
    if direction not in ("in", "out"):
        raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
    group = edge_index[1] if direction == "in" else edge_index[0]
    e = group.numel()
    keys = rng.rand(e, generator).to(group.device)
    order = torch.argsort(keys)
    order = order[torch.argsort(group[order], stable=True)]  # by (group, key)
    counts = torch.bincount(group, minlength=num_nodes)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(e, device=group.device) - starts[group[order]]
    mask = torch.zeros(e, dtype=torch.bool, device=group.device)
    mask[order[rank < max_degree]] = True
    kept = edge_index[:, mask]
    return (kept, mask) if return_mask else kept


def bound_in_degree(
    edge_index: Tensor, num_nodes: int, max_degree: int, generator: torch.Generator | None = None
) -> Tensor:
    r"""Keeps at most ``max_degree`` incoming edges per target node, uniformly at random without
    replacement (see :func:`bound_degree`).

    After it, every row of the sum aggregation :math:`A^T X` (unit-norm rows) sums at most
    ``D`` unit vectors. The node-level sensitivity :math:`\sqrt{D}` per hop of GAP's PMA needs
    bounded *out*-degrees instead (a node's row enters the sums of its out-neighbours): use
    :func:`bound_out_degree`, which is this function on the reversed graph. For an undirected
    graph bounded in both directions the two coincide.
    """
    return bound_degree(edge_index, num_nodes, max_degree, generator, direction="in")


def bound_out_degree(
    edge_index: Tensor, num_nodes: int, max_degree: int, generator: torch.Generator | None = None
) -> Tensor:
    r"""Keeps at most ``max_degree`` outgoing edges per source node, uniformly at random without
    replacement (see :func:`bound_degree`); GAP's ``BoundOutDegree``.

    Removing a node ``u`` then changes at most ``D`` rows of :math:`A^T X`, each by one
    unit-norm row, so one aggregation step has node-level L2 sensitivity :math:`\sqrt{D}` (per
    hop of PMA). Federated use: a client owns the out-edges of its nodes (local and boundary
    edges, see :class:`fedgraph.data.ClientGraph`), so it can bound them on its own.
    """
    return bound_degree(edge_index, num_nodes, max_degree, generator, direction="out")


#: Default cap on the elements of the ``[chunk, d]`` message block of :func:`scatter_sum_chunked`
#: (2**24 float32 elements: 64 MiB).
MAX_MESSAGE_ELEMENTS = 2**24


def scatter_sum_chunked(
    h: Tensor, src: Tensor, dst: Tensor, num_rows: int, max_elements: int = MAX_MESSAGE_ELEMENTS
) -> Tensor:
    r"""``out[i] = sum over edges e with dst[e] = i of h[src[e]]``, with bounded extra memory.

    The plain ``index_add_(0, dst, h[src])`` materializes the ``[E, d]`` message block (3.2 GB
    for 50 million edges and ``d = 16`` in float32). Here the edges are taken
    ``max(1, max_elements // d)`` at a time, so the extra memory is at most ``max_elements``
    elements of ``h``'s dtype whatever ``E`` is; the result is the same up to float summation
    order.

    Args:
        h: ``[n, d]`` source rows (any device; ``src``/``dst`` on the same device).
        src: long ``[E]`` row of ``h`` per edge; dst: long ``[E]`` output row per edge, in
            ``[0, num_rows)``.
        num_rows: rows of the output.
        max_elements: cap on the elements of one message block (``>= 1``).

    Returns:
        ``[num_rows, d]`` of ``h``'s dtype and device (rows without edges are zero).

    Raises:
        ValueError: ``src`` and ``dst`` differ in length or ``max_elements < 1``.
    """
    if src.numel() != dst.numel():
        raise ValueError(
            f"src and dst must have the same length, got {src.numel()} and {dst.numel()}"
        )
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    d = h.size(1)
    out = torch.zeros(num_rows, d, dtype=h.dtype, device=h.device)
    step = max(1, max_elements // max(d, 1))
    for s in range(0, src.numel(), step):
        out.index_add_(0, dst[s : s + step], h[src[s : s + step]])
    return out
