r"""Personalised privacy levels of users (nodes).

A user at level ``tau`` (1-based, ``1..h``) uses the privacy budget
``budgets[tau - 1]``; budgets are strictly increasing, so level 1 is the most
private.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def check_budgets(budgets: Sequence[float]) -> list[float]:
    r"""Validates privacy budgets.

    Raises:
        ValueError: (naming ``budgets``) if empty, not finite, not > 0 or not
            strictly increasing.
    """
    values = [float(b) for b in budgets]
    if not values:
        raise ValueError("'budgets' must contain at least one epsilon")
    for b in values:
        if not math.isfinite(b) or b <= 0:
            raise ValueError(f"'budgets': epsilon must be > 0 and finite (got {b})")
    if any(b >= a for b, a in zip(values, values[1:])):
        raise ValueError(f"'budgets' must be strictly increasing (got {values})")
    return values


def _largest_remainder(num: int, probs: np.ndarray) -> np.ndarray:
    exact = probs * num
    counts = np.floor(exact).astype(np.int64)
    rest = num - int(counts.sum())
    # Largest remainders first, lower level first on ties.
    order = np.lexsort((np.arange(probs.size), -(exact - counts)))
    counts[order[:rest]] += 1
    return counts


def assign_privacy_levels(
    num_users: int,
    budgets: Sequence[float],
    probabilities: Sequence[float] | None = None,
    seed: int = 0,
) -> Tensor:
    r"""Assigns every user a privacy level in ``1..h`` with ``h =
    len(budgets)``.

    The number of users per level is the exact share ``p_tau * num_users``
    rounded by the largest-remainder method (so the counts sum to
    ``num_users``), and the levels are then shuffled by a seeded
    :class:`torch.Generator` permutation.

    Args:
        num_users (int): number of users ``>= 0``.
        budgets (Sequence[float]): strictly increasing epsilons ``> 0``.
        probabilities (Sequence[float], optional): share of every level,
            non-negative, summing to 1 (tolerance ``1e-6``); uniform if
            :obj:`None`.
        seed (int, optional): seed. (default: :obj:`0`)

    Returns:
        LongTensor: levels ``[num_users]``, values in ``1..h``.

    Raises:
        ValueError: naming ``num_users``, ``budgets`` or ``probabilities``.
    """
    if isinstance(num_users, bool) or not isinstance(num_users, (int, np.integer)) or num_users < 0:
        raise ValueError(f"'num_users' must be an integer >= 0 (got {num_users})")
    h = len(check_budgets(budgets))
    if probabilities is None:
        probs = np.full(h, 1.0 / h)
    else:
        probs = np.asarray([float(p) for p in probabilities], dtype=np.float64)
        if probs.size != h:
            raise ValueError(
                f"'probabilities' must have one entry per budget ({h}) (got {probs.size})"
            )
        if not np.all(np.isfinite(probs)) or np.any(probs < 0):
            raise ValueError(f"'probabilities' must be non-negative (got {probs.tolist()})")
        if abs(probs.sum() - 1.0) > 1e-6:
            raise ValueError(f"'probabilities' must sum to 1 (got {probs.sum()})")
    counts = _largest_remainder(int(num_users), probs)
    levels = torch.repeat_interleave(torch.arange(1, h + 1), torch.from_numpy(counts))
    return levels[
        torch.randperm(int(num_users), generator=torch.Generator().manual_seed(int(seed)))
    ]


def draw_privacy_levels(
    num_users: int,
    budgets: Sequence[float],
    probabilities: Sequence[float] | None = None,
    generator=None,
) -> Tensor:
    r"""The privacy levels of one client's users, drawn on the client: the exact shares of
    :func:`assign_privacy_levels` (largest remainder over ``num_users``) in an order drawn
    from the client's own ``generator`` (:func:`fedgraph.randomness.client_generator`), which
    the server never sees.

    Who holds which level is therefore not a function of the public run config: the server
    learns a user's level only through what PPM's ESW releases (issue 28, fault 2; PPGNN
    paper Sec. 4, the level as private as the features). The number of users per level on a
    client is a function of the public ``num_users`` and ``probabilities`` only.

    Args:
        num_users (int): the client's users ``>= 0``.
        budgets, probabilities: as :func:`assign_privacy_levels`.
        generator: a :class:`torch.Generator` or :class:`fedgraph.randomness.SecureRandom`.

    Returns:
        LongTensor: levels ``[num_users]`` in ``1..len(budgets)``.

    Raises:
        ValueError: as :func:`assign_privacy_levels`.
    """
    from ..randomness import randperm

    ordered = assign_privacy_levels(num_users, budgets, probabilities, seed=0).sort().values
    return ordered[randperm(int(num_users), generator)]


def geometric_budgets(base_epsilon: float, num_levels: int) -> list[float]:
    r"""Budgets ``[eps, 2 eps, 4 eps, ..., 2^(num_levels-1) eps]`` (the
    PPGNN paper's set ``E``).

    Raises:
        ValueError: if ``base_epsilon`` is not finite and > 0 or
            ``num_levels < 1``.
    """
    eps = float(base_epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"'base_epsilon': epsilon must be > 0 and finite (got {base_epsilon})")
    if (
        isinstance(num_levels, bool)
        or not isinstance(num_levels, (int, np.integer))
        or num_levels < 1
    ):
        raise ValueError(f"'num_levels' must be an integer >= 1 (got {num_levels})")
    return [eps * 2.0**i for i in range(int(num_levels))]


def level_budgets(levels: Tensor, budgets: Sequence[float]) -> Tensor:
    r"""Maps levels ``[n]`` (1-based) to their epsilons, ``float [n]``.

    Raises:
        ValueError: if a level is outside ``1..len(budgets)``.
    """
    values = torch.tensor(check_budgets(budgets), dtype=torch.float64)
    levels = torch.as_tensor(levels, dtype=torch.long)
    if levels.numel() and (int(levels.min()) < 1 or int(levels.max()) > values.numel()):
        raise ValueError(f"'levels' must lie in 1..{values.numel()}")
    return values[levels - 1]
