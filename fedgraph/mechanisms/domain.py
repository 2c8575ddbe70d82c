"""Map features to the mechanisms' input domain ``[-1, 1]`` with a *public* range."""

from __future__ import annotations

import torch
from torch import Tensor


def to_unit_range(x: Tensor, low: float | Tensor, high: float | Tensor) -> Tensor:
    r"""Map ``x`` from the public feature domain ``[low, high]`` to ``[-1, 1]``.

    :math:`x \mapsto 2 (x - \text{low}) / (\text{high} - \text{low}) - 1`, per dimension.
    The range must be public (for bag-of-words features ``(0, 1)``): using the data's own
    minimum and maximum would leak information that no mechanism accounts for.

    Args:
        x: features ``[n, d]``.
        low, high: scalars or ``[d]`` tensors with ``high > low``.

    Raises:
        ValueError: if ``high <= low`` or a value of ``x`` lies outside ``[low, high]``.
    """
    span = high - low
    if (span <= 0).any() if isinstance(span, Tensor) else span <= 0:
        raise ValueError(f"feature_domain must satisfy high > low, got low={low}, high={high}")
    out = 2.0 * (x - low) / span - 1.0
    if out.numel() and (
        not bool(torch.isfinite(out).all()) or out.min() < -1.0 - 1e-6 or out.max() > 1.0 + 1e-6
    ):
        raise ValueError(f"features lie outside the declared public feature_domain [{low}, {high}]")
    return out.clamp_(-1.0, 1.0)
