"""Additive-noise LDP mechanisms for features in ``[-1, 1]^d`` (PPGNN paper, Sec. II-D 1-2)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import randomness as rng
from ._checks import check_delta, check_epsilon, check_unit_features, per_row


def laplace_scale(epsilon: Tensor | float, num_features: int) -> Tensor:
    """Laplace scale ``b = 2 d / epsilon``: L1 sensitivity 2 per dimension, budget ``epsilon/d``."""
    return 2.0 * num_features / check_epsilon(epsilon)


def laplace(x: Tensor, epsilon: float | Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""Laplace mechanism, :math:`x' = x + \mathrm{Lap}(2d/\epsilon)` per dimension.

    Each of the ``d`` dimensions gets ``epsilon / d`` (sequential composition), so a row is
    ``epsilon``-LDP. Source: PPGNN paper (He et al.), Sec. II-D 1; Dwork et al. 2006.

    Args:
        x: features ``[n, d]`` in ``[-1, 1]``.
        epsilon: budget per user (per row), scalar or ``[n]``.

    Returns:
        Unbiased noisy features ``[n, d]`` (real valued).
    """
    x = check_unit_features(x)
    n, d = x.shape
    scale = per_row(laplace_scale(epsilon, d), n, x.device).to(x.dtype)
    u = rng.rand(x.shape, generator, torch.float64).to(x.device) - 0.5
    noise = -torch.sign(u) * torch.log1p(-2.0 * u.abs())  # standard Laplace by inversion
    return x + scale * noise.to(x.dtype)


def gaussian_sigma(epsilon: Tensor | float, delta: float, num_features: int) -> Tensor:
    r"""Classical Gaussian-mechanism noise std per dimension.

    :math:`\sigma = \Delta_2 \sqrt{2 \ln(1.25/\delta)} / \epsilon_d` with sensitivity
    :math:`\Delta_2 = 2` (range ``[-1, 1]``) and per-dimension budget
    :math:`\epsilon_d = \epsilon / d`. (The paper's Sec. II-D 2 prints
    :math:`\sigma^2 = 2\ln(1.25/\delta)/\epsilon^2`, i.e. sensitivity 1; we use the true range.)

    Raises:
        ValueError: if ``epsilon / d >= 1``: the classical bound (Dwork & Roth, Thm. A.1) holds
            only for per-dimension epsilon below 1.
    """
    eps_d = check_epsilon(epsilon) / num_features
    delta = check_delta(delta)
    if bool((eps_d >= 1).any()):
        raise ValueError("gaussian mechanism: epsilon / num_features must be < 1 (classical bound)")
    return 2.0 * math.sqrt(2.0 * math.log(1.25 / delta)) / eps_d


def gaussian(
    x: Tensor, epsilon: float | Tensor, delta: float, generator: torch.Generator | None = None
) -> Tensor:
    r"""Gaussian mechanism, :math:`x' = x + \mathcal N(0, \sigma^2)` per dimension.

    ``(epsilon, delta)``-LDP per row by composition over dimensions
    (PPGNN paper Sec. II-D 2). ``sigma`` from :func:`gaussian_sigma`.

    Args:
        x: features ``[n, d]`` in ``[-1, 1]``.
    Returns:
        Unbiased noisy features ``[n, d]``.
    """
    x = check_unit_features(x)
    n, d = x.shape
    sigma = per_row(gaussian_sigma(epsilon, delta, d), n, x.device).to(x.dtype)
    # float64 noise (a CSPRNG: Opacus's sum of four, added in float64; fedgraph.randomness)
    return rng.add_gaussian(x, sigma, generator, torch.float64)
