r"""Extended Square Wave (ESW) mechanism for a discrete privacy level (PPGNN paper Sec. III-B 2).

Input domain ``{1, ..., f}`` (the level index), output domain ``{1, ..., f + 2b}``. With the
output shifted by ``b`` so that the window around ``g`` always fits in the output domain,

.. math::
    \Pr[\mathrm{ESW}(g) = g'] = p \text{ if } |g + b - g'| \le b, \text{ else } q,
    \quad p = \frac{e^\epsilon}{(2b+1)e^\epsilon + f - 1},\ q = \frac{1}{(2b+1)e^\epsilon + f - 1}

(Eq. 6). ``p / q = e^epsilon``, so ESW is ``epsilon``-LDP for *any* window ``b``.

Level hiding: the window ``b`` fixes the output domain. The paper computes ``b`` from the
user's own budget, which would make the set of possible outputs depend on the level. Here ``b``
is computed once from a *public* budget (the smallest ESW budget of the budget set) and shared
by every user; only ``p`` and ``q`` use the user's own budget.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import randomness as rng
from ._checks import check_epsilon
from .thresholds import esw_thresholds


def esw_window(epsilon: float, num_levels: int) -> int:
    r"""Window radius :math:`b = \lfloor \frac{\epsilon e^\epsilon - e^\epsilon + 1}
    {2 e^\epsilon (e^\epsilon - 1 - \epsilon)} \cdot f \rfloor` (PPGNN paper Sec. III-B 2).

    Args:
        epsilon: the (public) ESW budget, > 0.
        num_levels: ``f``, the number of privacy levels (>= 1).
    """
    eps = float(check_epsilon(epsilon, "esw epsilon"))
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    ratio = _window_ratio(eps)
    # The ratio is < 1/2 for every epsilon > 0 (so b < f / 2); the cap only matters when
    # f * ratio rounds up to f / 2 in floating point (epsilon below ~1e-15).
    return min(int(math.floor(ratio * num_levels)), (num_levels - 1) // 2)


def _window_ratio(eps: float) -> float:
    r""":math:`(\epsilon e^\epsilon - e^\epsilon + 1) / (2 e^\epsilon (e^\epsilon - 1 - \epsilon))`,
    evaluated without cancellation (the closed form loses every digit below epsilon ~ 1e-6 and
    overflows above ~709)."""
    if eps < 1.0:
        # numerator = sum_{k>=2} (k-1) eps^k / k!,  e^eps - 1 - eps = sum_{k>=2} eps^k / k!
        num, rem, term, k = 0.0, 0.0, eps, 1
        while True:
            k += 1
            term *= eps / k
            num += (k - 1) * term
            rem += term
            if (k - 1) * term <= 1e-18 * num:
                break
        if rem == 0.0:  # eps^2 underflows (eps < ~1e-154): the limit of the ratio is 1/2
            return 0.5
        return num / (2.0 * math.exp(eps) * rem)
    # divide numerator and denominator by e^(2 eps)
    em = math.exp(-eps)
    return ((eps - 1.0) * em + em * em) / (2.0 * (1.0 - (1.0 + eps) * em))


def esw_probabilities(
    epsilon: Tensor | float, num_levels: int, window: int
) -> tuple[Tensor, Tensor]:
    """``(p, q)`` of Eq. (6) as float64 tensors with the shape of ``epsilon``."""
    eps = check_epsilon(epsilon, "esw epsilon")
    e = torch.exp(eps)
    norm = (2 * window + 1) * e + num_levels - 1
    return e / norm, 1.0 / norm


def esw(
    levels: Tensor,
    epsilon: float | Tensor,
    num_levels: int,
    window: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Release privacy levels with ESW (PPGNN paper Eq. 6).

    One 53-bit uniform integer ``u`` per user (:func:`fedgraph.randomness.uniform_bits`) is
    cut into ``2b + 1`` ranges of ``p_units`` (the window's outputs) and ``f - 1`` of
    ``q_units`` (the others), :func:`~fedgraph.mechanisms.thresholds.esw_thresholds`, rounded so
    that ``p_units / q_units <= e^epsilon`` exactly; the remainder (fewer than ``2b + 1`` units
    of ``2^-53``) is redrawn (Mironov, CCS 2012; issue 60, fault 7).

    Args:
        levels: long ``[n]`` with values in ``{1, ..., num_levels}``.
        epsilon: ESW budget per user, scalar or ``[n]``.
        num_levels: ``f``.
        window: ``b`` (public, the same for every user; see :func:`esw_window`).

    Returns:
        long ``[n]`` with values in ``{1, ..., num_levels + 2 * window}``.

    Raises:
        ValueError: if a level lies outside ``{1, ..., num_levels}``, or ``epsilon`` is not
            finite and > 0 or outside the range the ``2^-53`` grid carries (names ``esw
            epsilon``).
    """
    if levels.dtype != torch.long or levels.dim() != 1:
        raise ValueError("levels must be a 1-D long tensor")
    if levels.numel() and (levels.min() < 1 or levels.max() > num_levels):
        raise ValueError(f"levels must lie in {{1, ..., {num_levels}}}")
    n = levels.numel()
    if num_levels == 1:  # the window is {g}: nothing to hide
        check_epsilon(epsilon, "esw epsilon")
        return levels.clone()
    p_units, q_units = esw_thresholds(epsilon, num_levels, window)
    p_units = (p_units.expand(n) if p_units.dim() == 0 else p_units).cpu()
    q_units = (q_units.expand(n) if q_units.dim() == 0 else q_units).cpu()
    w = 2 * window + 1
    inner = w * p_units
    used = inner + (num_levels - 1) * q_units  # 2^53 less the remainder, redrawn
    u = rng.uniform_bits(n, generator)
    redraw = u >= used
    while bool(redraw.any()):  # probability below (2b + 1) 2^-53 per user
        u[redraw] = rng.uniform_bits(int(redraw.sum()), generator)
        redraw = u >= used
    g = levels.cpu()
    inside = g + u.div(p_units, rounding_mode="floor").clamp_max(w - 1)  # g .. g + 2b
    # Outside: uniform over the f - 1 positions {1..g-1} U {g+2b+1..f+2b}.
    k = (u - inner).clamp_min(0).div(q_units, rounding_mode="floor")
    outside = torch.where(k < g - 1, k + 1, k + 2 * window + 2)
    return torch.where(u < inner, inside, outside).to(levels.device)


def esw_decode(released: Tensor, num_levels: int, window: int) -> Tensor:
    """Server-side point estimate of the level: ``clip(g' - b, 1, f)`` (long ``[n]``)."""
    return (released - window).clamp(1, num_levels)
