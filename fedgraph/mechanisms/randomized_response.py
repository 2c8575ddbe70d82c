"""k-ary randomized response for labels (Warner 1965; Kairouz et al. 2016)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import randomness as rng
from ._checks import check_epsilon


def randomized_response(y: Tensor, num_classes: int, epsilon: float,
                        generator: torch.Generator | None = None) -> Tensor:
    r"""Keep each label with probability :math:`e^\epsilon / (e^\epsilon + k - 1)`, else report
    one of the other ``k - 1`` classes uniformly. ``epsilon``-LDP per label.

    Args:
        y: long ``[n]`` in ``{0..k-1}``.
    Returns:
        long ``[n]`` in ``{0..k-1}``.
    Raises:
        ValueError: bad epsilon or labels out of range.
    """
    eps = float(check_epsilon(epsilon, "label_epsilon"))
    if y.numel() and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in {{0..{num_classes - 1}}}")
    keep_p = math.exp(eps) / (math.exp(eps) + num_classes - 1)
    keep = rng.rand(y.shape, generator) < keep_p
    other = (y.cpu() + rng.randint(1, max(num_classes, 2), y.shape, generator)) % num_classes
    return torch.where(keep, y.cpu(), other).to(y.device)
