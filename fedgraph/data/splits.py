r"""Node splits into training, validation and test sets.

Every function returns a shallow copy of the input :class:`Data` with boolean
``train_mask``, ``val_mask`` and ``test_mask`` of shape ``[N]``; the input is
not modified.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch_geometric.data import Data

_EPS = 1e-9


def _check_fraction(value: float, arg: str) -> float:
    value = float(value)
    if not math.isfinite(value) or not (0.0 < value <= 1.0):
        raise ValueError(f"'{arg}' must be a fraction in (0, 1] (got {value})")
    return value


def random_split(data: Data, train: float, val: float, test: float, seed: int) -> Data:
    r"""Random node split with the given fractions.

    Counts are ``round(train * N)`` and ``round(val * N)``; the test set takes
    all remaining nodes when the fractions sum to 1 (so the masks cover every
    node), else ``round(test * N)`` nodes. The masks are disjoint.

    Args:
        data (Data): graph with ``num_nodes = N``.
        train (float): training fraction in ``(0, 1]``.
        val (float): validation fraction in ``(0, 1]``.
        test (float): test fraction in ``(0, 1]``.
        seed (int): seed of the permutation (a local
            :class:`torch.Generator`; the global RNG is not touched).

    Returns:
        Data: a shallow copy with ``train_mask``, ``val_mask``, ``test_mask``
        (``bool``, ``[N]``).

    Raises:
        ValueError: if a fraction is outside ``(0, 1]`` (naming it) or the
            fractions sum to more than 1.
    """
    train = _check_fraction(train, "train")
    val = _check_fraction(val, "val")
    test = _check_fraction(test, "test")
    total = train + val + test
    if total > 1.0 + _EPS:
        raise ValueError(
            f"'train' + 'val' + 'test' must be <= 1 (got {train} + {val} + {test} = {total})"
        )
    n = int(data.num_nodes)
    n_train = min(n, int(round(train * n)))
    n_val = min(n - n_train, int(round(val * n)))
    if abs(total - 1.0) <= 1e-6:
        n_test = n - n_train - n_val
    else:
        n_test = min(n - n_train - n_val, int(round(test * n)))

    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=gen)
    out = copy.copy(data)
    masks = []
    start = 0
    for count in (n_train, n_val, n_test):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[perm[start : start + count]] = True
        masks.append(mask)
        start += count
    out.train_mask, out.val_mask, out.test_mask = masks
    return out


def ppgnn_split(data: Data, seed: int) -> Data:
    r"""Random 50/25/25 split (PPGNN paper). See :func:`random_split`."""
    return random_split(data, 0.5, 0.25, 0.25, seed)


def gap_split(data: Data, seed: int) -> Data:
    r"""Random 75/10/15 split (GAP paper). See :func:`random_split`."""
    return random_split(data, 0.75, 0.10, 0.15, seed)


def planetoid_split(data: Data, seed: int = 0) -> Data:
    r"""The standard public Planetoid split (20 labels per class, 500
    validation and 1000 test nodes), as kept by
    :func:`fedgraph.data.load_dataset` in ``public_{train,val,test}_mask``.

    Args:
        data (Data): a Cora, CiteSeer or PubMed graph (the Planetoid split) or an
            ogbn-products graph (OGB's sales-ranking split) from
            :func:`~fedgraph.data.load_dataset`.
        seed (int, optional): ignored; for a uniform signature.

    Raises:
        ValueError: if ``data`` carries no public Planetoid masks.
    """
    keys = ("public_train_mask", "public_val_mask", "public_test_mask")
    if not all(k in data for k in keys):
        raise ValueError(
            f"Dataset '{getattr(data, 'name', '?')}' has no public Planetoid "
            f"split (only cora, citeseer, pubmed and ogbn-products loaded with "
            f"fedgraph.data.load_dataset have one)"
        )
    out = copy.copy(data)
    out.train_mask = data.public_train_mask.clone()
    out.val_mask = data.public_val_mask.clone()
    out.test_mask = data.public_test_mask.clone()
    return out


SPLITS: dict[str, Callable[[Data, int], Data]] = {
    "random-50-25-25": ppgnn_split,
    "random-75-10-15": gap_split,
    "planetoid": planetoid_split,
}


def apply_split(data: Data, name: str, seed: int = 0) -> Data:
    r"""Applies a split by name.

    Args:
        data (Data): the graph.
        name (str): one of ``random-50-25-25`` (PPGNN), ``random-75-10-15``
            (GAP) or ``planetoid`` (public split).
        seed (int, optional): seed of the random splits. (default: :obj:`0`)

    Raises:
        ValueError: on an unknown name (listing :data:`SPLITS`).
    """
    key = str(name).strip().lower()
    if key not in SPLITS:
        raise ValueError(f"Unknown split '{name}'. Known splits: {', '.join(SPLITS)}")
    return SPLITS[key](data, seed)
