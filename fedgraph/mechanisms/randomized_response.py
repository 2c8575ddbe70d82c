"""k-ary randomized response for labels (Warner 1965; Kairouz et al. 2016)."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import randomness as rng
from ._checks import check_epsilon
from .thresholds import randomized_response_thresholds


def randomized_response(
    y: Tensor, num_classes: int, epsilon: float, generator: torch.Generator | None = None
) -> Tensor:
    r"""Keep each label with probability :math:`e^\epsilon / (e^\epsilon + k - 1)`, else report
    one of the other ``k - 1`` classes uniformly. ``epsilon``-LDP per label, exactly.

    One 53-bit uniform integer ``u`` per label (:func:`fedgraph.randomness.uniform_bits`):
    ``u < keep`` keeps the label, otherwise the label moves by ``1 + (u - keep) // other``
    (mod ``k``), with the integer lengths ``keep + (k - 1) other = 2^53`` of
    :func:`~fedgraph.mechanisms.thresholds.randomized_response_thresholds`, rounded so that
    ``keep / other <= e^epsilon``: every output has probability ``keep / 2^53`` or ``other /
    2^53`` (both > 0) under every input (Mironov, CCS 2012; issue 60, fault 7: a float32
    uniform against a float32 threshold gave effective epsilon 16.03 at 16 and changed 0 of
    2,000,000 labels at 19.5).

    Args:
        y: long ``[n]`` in ``{0..k-1}``.
        num_classes: ``k >= 1`` (one class: ``y`` is returned, there is nothing to hide).
        epsilon: per label, in :func:`~fedgraph.mechanisms.thresholds.randomized_response_range`
            (``(0, 36.04]`` for 7 classes).
    Returns:
        long ``[n]`` in ``{0..k-1}``, on ``y``'s device.
    Raises:
        ValueError: bad epsilon (not finite and > 0, or outside the range the ``2^-53`` grid
            carries; names ``label_epsilon``) or labels out of range.
    """
    check_epsilon(epsilon, "label_epsilon")
    if y.numel() and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in {{0..{num_classes - 1}}}")
    keep, other = randomized_response_thresholds(epsilon, num_classes, "label_epsilon")
    if other == 0:
        return y.clone()
    u = rng.uniform_bits(y.shape, generator)
    shift = torch.where(u < keep, 0, 1 + (u - keep).div(other, rounding_mode="floor"))
    return ((y.cpu() + shift) % num_classes).to(y.device)
