r"""Edge lists to sparse matrices with bounded extra memory (issue 31: PPGNN at 50 million
edges).

Every helper here works on the edge list ``[2, E]`` with messages flowing
``edge_index[0] -> edge_index[1]`` and avoids what made the server's memory grow with ``E``:
``torch.unique(dim=1)`` (about 300 bytes per edge of temporaries), ``coalesce`` of a COO matrix
and the copies of ``edge_index`` made by ``flip``, ``stack`` and masking. The largest temporary
is one ``int64`` key per edge (``dst * n + src``) and the sort of it; checks and decoding run
over chunks of :data:`CHUNK` edges.

An edge list is *dst-coalesced* when its ``(dst, src)`` pairs are unique and sorted by ``dst``
then ``src``: then the transposed CSR adjacency (``adj_t[dst, src]``, what PyG's sparse
aggregation and FlexProp take) is ``crow`` from the counts of ``dst`` and ``col = edge_index[0]``
itself, a view, not a copy (:func:`dst_csr`).
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

#: edges per chunk of the checks and of the decoding (2**22: 32 MiB of int64 per row)
CHUNK = 2 ** 22


def _keys(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """``dst * num_nodes + src`` as int64 (the (dst, src) order as one integer)."""
    return dst.long() * num_nodes + src.long()


def is_sorted(values: Tensor, chunk: int = CHUNK) -> bool:
    """Whether the 1-D ``values`` are non-decreasing (checked over chunks, no ``[E]``
    temporary)."""
    for s in range(0, max(values.numel() - 1, 0), chunk):
        part = values[s:s + chunk + 1]
        if bool((part[1:] < part[:-1]).any()):
            return False
    return True


def is_dst_coalesced(edge_index: Tensor, num_nodes: int, chunk: int = CHUNK) -> bool:
    """Whether the ``(dst, src)`` pairs of ``edge_index`` are unique and sorted by ``dst`` then
    ``src`` (module docs), checked over chunks."""
    src, dst = edge_index
    for s in range(0, max(src.numel() - 1, 0), chunk):
        key = _keys(src[s:s + chunk + 1], dst[s:s + chunk + 1], num_nodes)
        if bool((key[1:] <= key[:-1]).any()):
            return False
    return True


def unique_edges(parts: list[Tensor], num_nodes: int, chunk: int = CHUNK) -> Tensor:
    """The union of the edge lists ``parts`` (each ``[2, e]``, any integer dtype) without
    duplicates, dst-coalesced (sorted by ``dst`` then ``src``), as int64 ``[2, E]``.

    The same set of edges as ``torch.unique(torch.cat(parts, 1), dim=1)`` (which sorts by
    ``src`` then ``dst``), in the ``(dst, src)`` order that :func:`dst_csr` reads without a
    copy. Extra memory: one int64 key per input edge, the sort of the keys, and the output.
    """
    total = sum(int(p.size(1)) for p in parts)
    keys = torch.empty(total, dtype=torch.long)
    at = 0
    for p in parts:
        for s in range(0, p.size(1), chunk):
            part = p[:, s:s + chunk]
            keys[at:at + part.size(1)] = _keys(part[0], part[1], num_nodes)
            at += part.size(1)
    keys = torch.unique(keys, sorted=True)
    out = torch.empty(2, keys.numel(), dtype=torch.long)
    for s in range(0, keys.numel(), chunk):
        k = keys[s:s + chunk]
        torch.remainder(k, num_nodes, out=out[0, s:s + chunk])
        torch.div(k, num_nodes, rounding_mode="floor", out=out[1, s:s + chunk])
    return out


def dst_csr(edge_index: Tensor, num_nodes: int, drop_self_loops: bool = False,
            dtype: torch.dtype = torch.float32) -> Tensor:
    """The transposed adjacency ``adj_t[dst, src] = 1`` as a sparse CSR tensor ``[n, n]`` with
    ``dtype`` values, one entry per edge (duplicates stay separate entries: a sparse matmul
    sums them as a coalesced matrix would).

    When ``edge_index[1]`` is sorted (:func:`is_sorted`; e.g. :func:`unique_edges`' output)
    the column indices are ``edge_index[0]`` itself (a view, no copy); otherwise the edges are
    sorted by ``dst`` (stable) once. ``drop_self_loops``: leave out ``i -> i`` (a copy only when
    there is one).
    """
    src, dst = edge_index[0], edge_index[1]
    if drop_self_loops and any(bool((src[s:s + CHUNK] == dst[s:s + CHUNK]).any())
                               for s in range(0, src.numel(), CHUNK)):
        keep = src != dst
        src, dst = src[keep], dst[keep]
        del keep
    if not is_sorted(dst):
        order = torch.sort(dst, stable=True).indices
        src, dst = src[order], dst[order]
        del order
    counts = torch.bincount(dst, minlength=num_nodes)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(src.dtype)
    values = torch.ones(src.numel(), dtype=dtype, device=src.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR "beta" warning
        return torch.sparse_csr_tensor(crow, src.contiguous(), values, (num_nodes, num_nodes),
                                       check_invariants=False)


__all__ = ["CHUNK", "dst_csr", "is_dst_coalesced", "is_sorted", "unique_edges"]
