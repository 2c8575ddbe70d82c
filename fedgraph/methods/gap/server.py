"""What the server computes with GAP's data: the server's step of federated PMA (GAP paper
Alg. 1 across clients, :mod:`.client_pma`), summing the released rows per node and sending
each owner the sums of its nodes (:func:`sum_partial_sums`) or, with secure aggregation, the
same from masked rows (:func:`unmask_partial_sums`). The rows are noisy, so this is
post-processing; the strategies (``strategies/gap.py``, ``strategies/progap.py``: ProGAP's
aggregations are PMA hops of another input) send and record them."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ...secure_aggregation import unmask_sum


def sum_partial_sums(
    released: list[tuple[Tensor, Tensor]], owner: Tensor, num_clients: int
) -> list[tuple[Tensor, Tensor]]:
    """The server's step of federated PMA: every released row (a global node id and its noisy
    partial sum) is added into its node's sum, and each client receives one row per node it
    holds, ``owner[id]``: the sum of the rows the other clients released for it (GAP Alg. 1
    line 5 needs only that sum: :func:`~.client_pma.pma_finish` adds it to the owner's own
    noisy sums). Post-processing of noisy rows; secure aggregation's server step gives the
    same sums from masked rows (:func:`unmask_partial_sums`).

    Why sums and not the rows themselves: every client releases a row for every node it does
    not hold, so with ``C`` clients a node has ``C - 1`` rows; sending their sum sends
    ``1 / (C - 1)`` of the bytes (at 1e6 nodes and 4 clients, 16 MB per client and hop
    instead of 48 MB) and the owner learns less (the sum, not each client's row).

    Args:
        released: per reply ``(ids [m], sums [m, e])`` (CPU tensors from the messages; ids
            distinct within a reply).
        owner: ``[N]`` index of the client holding each node (rows of a node with a negative
            owner are dropped).
        num_clients: number of clients.
    Returns:
        per client ``i``: ``(ids [m_i], sums [m_i, e])``, ``ids`` the sorted global ids of its
        nodes that received a row, ``sums`` their summed rows (float32, the rows' dtype);
        empty ``[0]``/``[0, e]`` if none. The sums are added in the order of ``released``.
    """
    total = PartialSums(owner, num_clients)
    for ids, sums in released:
        total.add(ids, sums)
    return total.routed()


class PartialSums:
    """:func:`sum_partial_sums` one reply at a time, so that the server can add each reply's
    rows as it arrives, while other clients still compute (:class:`~strategies.gap.GAPStrategy`
    adds them in the clients' order, so the float sums do not depend on arrival times).

    Args:
        owner: ``[N]`` index of the client holding each node (negative: rows dropped).
        num_clients: number of clients.
    """

    def __init__(self, owner: Tensor, num_clients: int) -> None:
        self.owner, self.num_clients = owner, num_clients
        self._total: Tensor | None = None
        self._received = torch.zeros(owner.numel(), dtype=torch.bool)

    def add(self, ids: Tensor, sums: Tensor) -> None:
        """Add one reply's rows: ``ids [m]`` distinct global ids, ``sums [m, e]`` (read only:
        views of a message's bytes will do)."""
        if self._total is None and sums.dim() == 2:  # the first rows fix width and dtype
            self._total = torch.zeros(self.owner.numel(), sums.shape[1], dtype=sums.dtype)
        if not ids.numel():
            return
        self._total.index_add_(0, ids, sums.to(self._total.dtype))
        self._received[ids] = True

    def routed(self, clients=None) -> list[tuple[Tensor, Tensor]]:
        """Per client ``i`` (of ``clients``, indices; ``None``: every client, in order):
        ``(ids [m_i], sums [m_i, e])`` as :func:`sum_partial_sums` (of the rows added so
        far)."""
        clients = range(self.num_clients) if clients is None else clients
        if self._total is None:
            return [(torch.zeros(0, dtype=torch.long), torch.zeros(0, 0)) for _ in clients]
        out = []
        for i in clients:
            ids = (self._received & (self.owner == i)).nonzero().flatten()
            out.append((ids, self._total[ids]))
        return out


def unmask_partial_sums(
    released: list[dict[str, Tensor]], owner: Tensor, dim: int
) -> list[tuple[Tensor, Tensor]]:
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
