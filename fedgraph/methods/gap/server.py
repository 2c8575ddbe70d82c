"""What the server computes with GAP's data: the server's step of federated PMA (GAP paper
Alg. 1 across clients, :mod:`.client_pma`), routing every released row to the owner of its node.
The rows are noisy (or, with secure aggregation, masked and summed by the strategy first), so
this is post-processing; the strategy (``strategies/gap.py``) sends and records them."""
from __future__ import annotations

import torch
from torch import Tensor


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
