"""Input validation shared by every mechanism (shapes, domains, budgets)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def check_epsilon(epsilon: float | Tensor, name: str = "epsilon") -> Tensor:
    """Return ``epsilon`` as a float64 tensor; raise if any value is not finite and > 0.

    Raises:
        ValueError: naming ``name`` and the allowed range ``(0, inf)``.
    """
    eps = torch.as_tensor(epsilon, dtype=torch.float64)
    if eps.numel() == 0 or not bool(torch.isfinite(eps).all()) or not bool((eps > 0).all()):
        raise ValueError(
            f"{name} must be finite and > 0 (allowed range: (0, inf)), got {epsilon!r}"
        )
    return eps


def check_noise_scale(value: float, name: str, *, allow_zero: bool = False) -> float:
    """``value`` as a float if it is a valid noise scale (a standard deviation, a Laplace
    scale, a noise multiplier): finite and > 0, or ``== 0`` when ``allow_zero`` (only where
    "no noise" is a documented case whose release the ledger records as unprotected, e.g.
    GAP-inf's ``sigma = 0``).

    Raises:
        ValueError: naming ``name`` and the allowed values, for NaN, +-inf, a negative value,
            ``0`` without ``allow_zero``, or a non-number.
    """
    allowed = "[0, inf)" if allow_zero else "(0, inf)"
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(
            f"{name} must be finite and {'>= 0' if allow_zero else '> 0'} "
            f"(allowed: {allowed}), got {value!r}"
        )
    return v


def check_delta(delta: float, name: str = "delta") -> float:
    if not (isinstance(delta, (int, float)) and 0.0 < float(delta) < 1.0) or math.isnan(delta):
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {delta!r}")
    return float(delta)


def check_unit_features(x: Tensor, name: str = "x") -> Tensor:
    """Check that ``x`` is a float matrix ``[n, d]`` with every entry in ``[-1, 1]``."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"{name} must be a float tensor of shape [num_users, num_features]")
    if x.numel() and (not bool(torch.isfinite(x).all()) or x.abs().max() > 1.0 + 1e-6):
        raise ValueError(
            f"{name} must lie in [-1, 1]; map features with "
            "fedgraph.mechanisms.to_unit_range(x, low, high) first"
        )
    return x


def per_row(epsilon: Tensor, n: int, device: torch.device) -> Tensor:
    """Broadcast a scalar or ``[n]`` budget to a float64 ``[n, 1]`` column."""
    if epsilon.dim() == 0:
        epsilon = epsilon.expand(n)
    if epsilon.shape != (n,):
        raise ValueError(
            f"epsilon must be a scalar or have shape [{n}], got {tuple(epsilon.shape)}"
        )
    return epsilon.to(device).view(n, 1)
