r"""Memory shared by the computations one process runs one after another (issue 31: GAP's PMA
at 1e6 nodes).

A simulation's Ray worker runs many clients' handlers in turn, each on blocks of tens of MiB
(a GAP client's released rows: ``[N - n_i, e]``; the values of its sparse matrices: one per
edge). Above 32 MiB glibc serves each allocation with fresh pages, so every client paid their
first touch again, at every one of its first messages: on the development VM about 14 us per
MiB for zeroing and faulting, and more after the host has taken freed pages back
(``bench/refault.py``). Here one block per kind is shared by every holder in the process and
faulted in once:

* :func:`shared_ones`: a read-only vector of ones, e.g. the values of a 0/1 CSR matrix (one
  per :class:`~fedgraph.utils.sparse.EdgeSum`);
* :func:`shared_block`: a writable ``[rows, cols]`` block per name and thread whose contents
  are overwritten by the next holder (e.g. a client's release, encoded into its reply before
  the handler returns).

Each returns a view of the process's block (its first rows); the registry keeps only a weak
reference to the block, so a block lives as long as a view of it (or a tensor built on one,
such as a sparse matrix's values) does, and a larger request makes a new block (the old one
lives on with its views). Sharing only saves memory and time: a block freed early is made
again at the next request. Nothing here crosses processes, and on a deployed
client, which runs only itself, these are its own blocks.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch import Tensor

__all__ = ["shared_ones", "shared_block"]

_BLOCKS: weakref.WeakValueDictionary[tuple, Tensor] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def _block(key: tuple, size: int, make) -> Tensor:
    """The live block under ``key`` if its first dimension is at least ``size``, else
    ``make()``, registered under ``key``."""
    with _LOCK:
        base = _BLOCKS.get(key)
        if base is None or base.size(0) < size:
            base = make()
            _BLOCKS[key] = base
        return base


def shared_ones(
    n: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Tensor:
    """``[n]`` ones of ``dtype`` on ``device``: a view of the process's block of ones, which
    its other callers share, so never write to it.

    Raises:
        ValueError: ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    device = torch.device(device)
    base = _block(
        ("ones", dtype, str(device)), n, lambda: torch.ones(n, dtype=dtype, device=device)
    )
    return base[:n]


def shared_block(
    name: str,
    rows: int,
    cols: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """A contiguous ``[rows, cols]`` tensor of ``dtype`` on ``device`` with arbitrary contents:
    the first rows of this thread's block of that ``name``, ``cols``, ``dtype`` and ``device``,
    which its other callers share. What one caller wrote is overwritten by the next, so a
    caller must be done with it (e.g. have encoded it into a message) before the thread runs
    another caller's step.

    Raises:
        ValueError: ``rows`` or ``cols`` < 0.
    """
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be >= 0, got {rows} and {cols}")
    device = torch.device(device)
    key = ("block", name, threading.get_ident(), cols, dtype, str(device))
    base = _block(key, rows, lambda: torch.empty(rows, cols, dtype=dtype, device=device))
    return base[:rows]
