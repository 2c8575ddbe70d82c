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

    The noise is drawn in float64 (:func:`fedgraph.randomness.laplace`: the inverse CDF on
    52-bit uniforms and a sign bit), ``x + b z`` is computed in float64 with ``b`` in float64,
    and rounded once to ``x``'s dtype (:func:`fedgraph.randomness.add_laplace`; Mironov,
    CCS 2012, Sec. 5). The float32 noise, float32 scale and float32 sum used before made the
    set of outputs depend on ``x``: at ``d = 1433``, ``epsilon = 1``, 11.7 % of the output
    coordinates under ``x = +1`` are impossible under ``x = -1`` (issue 60, fault 5). A float32
    ``x`` (the clients' features) is the defended case; a float64 ``x`` gets a float64 release
    with the sampler's own precision.

    Args:
        x: features ``[n, d]`` in ``[-1, 1]``.
        epsilon: budget per user (per row), scalar or ``[n]``.

    Returns:
        Unbiased noisy features ``[n, d]`` (real valued), ``x``'s dtype and device.

    Raises:
        ValueError: ``x`` not a float ``[n, d]`` in ``[-1, 1]``, or ``epsilon`` not finite and
            > 0 (or not a scalar or ``[n]``).
    """
    x = check_unit_features(x)
    n, d = x.shape
    scale = per_row(laplace_scale(epsilon, d), n, x.device)  # float64 [n, 1]
    return rng.add_laplace(x, scale, generator)


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
        Unbiased noisy features ``[n, d]``, ``x``'s dtype: ``x + sigma z`` computed in float64
        and rounded once (Mironov, CCS 2012).
    """
    x = check_unit_features(x)
    n, d = x.shape
    sigma = per_row(gaussian_sigma(epsilon, delta, d), n, x.device)  # float64 [n, 1]
    # float64 noise (a CSPRNG: Opacus's sum of four), added in float64 with sigma in float64
    # and rounded once to x's dtype (fedgraph.randomness.add_gaussian; issue 60, fault 5)
    return rng.add_gaussian(x, sigma, generator, torch.float64)
