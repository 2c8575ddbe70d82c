"""What the server computes with GAP's data: the server's step of federated PMA (GAP paper
Alg. 1 across clients, :mod:`.client_pma`), routing every released row to the owner of its node
(:func:`route_partial_sums`) or, with secure aggregation, summing the masked rows per node and
routing the sums (:func:`unmask_partial_sums`). The rows are noisy, so this is
post-processing; the strategies (``strategies/gap.py``, ``strategies/progap.py``: ProGAP's
aggregations are PMA hops of another input) send and record them."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ...secure_aggregation import unmask_sum


def route_partial_sums(released: list[tuple[Tensor, Tensor]], owner: Tensor,
                       num_clients: int) -> list[tuple[Tensor, Tensor]]:
    """The server's step of federated PMA: every released row (a global node id and its noisy
    partial sum) goes to the client that holds the node, ``owner[id]``.

    Per reply one stable sort of its rows by owner and a split (no per-client loop over the
    rows); each client receives the rows the per-client loop ``for (ids, sums) in released:
    for i: ids[owner[ids] == i]`` gave, in the same order (replies in the order of
    ``released``, rows in their order), so :func:`pma_finish` adds them in the same order:
    the same floats. Memory: as the loop's (the routed rows, then one copy per client).

    Args:
        released: per reply ``(ids [m], sums [m, e])`` (CPU tensors from the messages).
        owner: ``[N]`` index of the client holding each node (rows of a node with a negative
            owner are dropped, as the loop dropped them).
        num_clients: number of clients.
    Returns:
        per client ``i``: ``(ids [m_i], sums [m_i, e])``, empty ``[0]``/``[0, e]`` if none.
    """
    chunks: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(num_clients)]
    dim = 0
    for ids, sums in released:
        dim = sums.shape[1] if sums.dim() == 2 else dim
        dst = owner[ids]
        if ids.numel() and int(dst.min()) < 0:
            keep = dst >= 0
            ids, sums, dst = ids[keep], sums[keep], dst[keep]
        order = torch.sort(dst, stable=True).indices
        counts = torch.bincount(dst, minlength=num_clients).tolist()
        for i, part in enumerate(zip(ids[order].split(counts), sums[order].split(counts))):
            if counts[i]:
                chunks[i].append(part)
    return [(torch.cat([c[0] for c in ch]), torch.cat([c[1] for c in ch])) if ch else
            (torch.zeros(0, dtype=torch.long), torch.zeros(0, dim)) for ch in chunks]


def unmask_partial_sums(released: list[dict[str, Tensor]], owner: Tensor,
                        dim: int) -> list[tuple[Tensor, Tensor]]:
    """Secure aggregation's server step of federated PMA: the clients' masked rows
    (:func:`fedgraph.secure_aggregation.mask_rows`, :func:`.client_pma.masked_release`) added
    per node, which cancels the masks (:func:`~fedgraph.secure_aggregation.unmask_sum`), one
    summed row per node routed to its owner.

    Args:
        released: per client index ``i``, its reply's rows ``{"ids": [m_i], "masked": [m_i, e]
            int64}`` (the ``uint64`` ring elements' bits; ``masked`` absent: no row).
        owner: ``[N]`` index of the client holding each node.
        dim: ``e``, the width of the empty rows returned when no row was released.
    Returns:
        per client ``i``: ``(ids [m], sums [m, e] float32)``: the sums of the nodes it holds.
    Raises:
        ValueError: a node lacks a row from a client other than its owner (the masks would
            not cancel; :func:`~fedgraph.secure_aggregation.unmask_sum`).
    """
    contributions = {}
    for i, out in enumerate(released):
        masked = out.get("masked", torch.zeros(0, 0, dtype=torch.long))
        contributions[i] = (out["ids"].numpy(), masked.numpy().view(np.uint64))
    ids, sums = unmask_sum(contributions, owner.numpy(), len(released))
    if not ids.size:
        return [(torch.zeros(0, dtype=torch.long), torch.zeros(0, dim))] * len(released)
    ids, sums = torch.from_numpy(ids), torch.from_numpy(sums).float()
    dst = owner[ids]
    return [(ids[dst == i], sums[dst == i]) for i in range(len(released))]
