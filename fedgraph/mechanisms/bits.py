r"""Randomized-response bit mechanisms: 1-bit, the local randomizer and multi-bit / MLR.

All three share one primitive: a feature value ``x in [-1, 1]`` becomes a sign ``+-1`` with

.. math::
    \Pr[s = +1] = \frac{1}{2} + \frac{x}{2} \cdot \frac{e^\epsilon - 1}{e^\epsilon + 1},

which is the 1-bit mechanism (PPGNN paper Eq. 4; Ding et al. 2017) and the Bernoulli of the
local randomizer (PPGNN paper Alg. 1). The ratio of the two outputs' probabilities over any two
inputs is at most ``e^epsilon``. Multiplying the sign by
:math:`C(\epsilon) = (e^\epsilon + 1)/(e^\epsilon - 1)` gives an unbiased estimate of ``x``.

Each sign compares a 53-bit uniform integer with an integer threshold
(:func:`~fedgraph.mechanisms.thresholds.sign_thresholds`) whose ends are rounded so that the
ratio is at most ``e^epsilon`` exactly; an epsilon per entry above ``ln(2^53 - 1) = 36.74`` is
refused (Mironov, CCS 2012; issue 60, fault 7).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import randomness as rng
from ._checks import check_epsilon, check_unit_features, per_row
from .thresholds import BINARY_EPSILON_MAX, binary_thresholds, sign_thresholds


def unbias_factor(epsilon: Tensor | float) -> Tensor:
    r""":math:`C(\epsilon) = (e^\epsilon + 1) / (e^\epsilon - 1)`, so that ``E[C s] = x``."""
    eps = check_epsilon(epsilon)
    return 1.0 / torch.tanh(eps / 2.0)  # == (e^eps + 1) / (e^eps - 1), stable for small eps


def one_bit(x: Tensor, epsilon: float | Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""1-bit mechanism applied to every entry (PPGNN paper Eq. 4).

    Args:
        x: values ``[n, k]`` in ``[-1, 1]``.
        epsilon: budget *per entry*, scalar or ``[n]`` (one per row).

    Returns:
        Signs ``[n, k]`` in ``{-1., +1.}`` (same dtype as ``x``). Each entry is
        ``epsilon``-LDP exactly (:func:`~fedgraph.mechanisms.thresholds.binary_thresholds`);
        ``E[sign] = x / C(epsilon)`` up to ``2^-49`` relative.

    Raises:
        ValueError: ``epsilon`` not finite and > 0 or above ``ln(2^53 - 1)`` (36.74), or
            ``x`` not in ``[-1, 1]``.
    """
    x = check_unit_features(x)
    n = x.shape[0]
    t_lo, t_hi = binary_thresholds(per_row(check_epsilon(epsilon), n, x.device))
    t = sign_thresholds(x, t_lo, t_hi)
    return torch.where(rng.bernoulli_bits(t, generator), 1.0, -1.0).to(x.dtype)


def local_randomizer(
    x: Tensor, epsilon: float | Tensor, generator: torch.Generator | None = None
) -> Tensor:
    r"""Local randomizer (PPGNN paper Alg. 1; Duchi et al.): unbiased output ``+-C(epsilon)``.

    Returns:
        ``[n, k]`` with values in ``{-C(eps), +C(eps)}`` and ``E[x'] = x``.
    """
    n = x.shape[0]
    return one_bit(x, epsilon, generator) * per_row(unbias_factor(epsilon), n, x.device).to(x.dtype)


def mlr_num_dims(epsilon: Tensor | float, num_features: int, divisor: float = 2.2) -> Tensor:
    r"""Number of sampled dimensions ``m = max(1, min(d, floor(epsilon / 2.2)))``.

    PPGNN paper Theorem 1 (the minimiser of Eq. 5). LPGNN (Sajadmanesh & Gatica-Perez 2021)
    uses the same rule with ``divisor = 2.18``.

    Returns:
        Long tensor with the shape of ``epsilon``.
    """
    eps = check_epsilon(epsilon)
    return torch.clamp(torch.floor(eps / divisor), min=1, max=num_features).long()


class SampledBits(NamedTuple):
    """What a user releases under multi-bit / MLR: which dimensions were sampled and their signs.

    ``row[i], col[i], sign[i]``: user ``row[i]`` reports sign ``sign[i]`` in ``{-1, +1}`` for
    dimension ``col[i]``. The values that can appear do not depend on the user's budget.
    """

    row: Tensor  # long [nnz]
    col: Tensor  # long [nnz]
    sign: Tensor  # int8 [nnz]


def sample_dims(
    num_dims: Tensor,
    num_features: int,
    generator: torch.Generator | None = None,
    chunk_rows: int = 4096,
) -> tuple[Tensor, Tensor]:
    """Sample ``num_dims[i]`` distinct dimensions uniformly without replacement for each row.

    Args:
        num_dims: long ``[n]`` with values in ``[1, d]``.

    Returns:
        ``(row, col)`` long tensors of length ``num_dims.sum()``; rows chunked to bound memory
        at ``chunk_rows * d`` random keys.
    """
    rows, cols = [], []
    n = num_dims.numel()
    for start in range(0, n, chunk_rows):
        m = num_dims[start : start + chunk_rows].cpu()
        m_max = int(m.max())
        keys = rng.rand((m.numel(), num_features), generator)
        top = keys.topk(m_max, dim=1).indices  # m_max distinct dims per row, uniform
        keep = torch.arange(m_max).view(1, -1) < m.view(-1, 1)
        r = torch.arange(start, start + m.numel()).view(-1, 1).expand(-1, m_max)
        rows.append(r[keep])
        cols.append(top[keep])
    return torch.cat(rows), torch.cat(cols)


def multi_bit(
    x: Tensor,
    epsilon: float | Tensor,
    num_dims: Tensor | int | None = None,
    generator: torch.Generator | None = None,
    divisor: float = 2.2,
) -> SampledBits:
    r"""Multi-bit mechanism / MLR (PPGNN paper Alg. 2; LPGNN Alg. 1), client side.

    Each user samples ``m`` of its ``d`` dimensions without replacement and reports the 1-bit
    sign of each with budget ``epsilon / m``; by sequential composition the row is
    ``epsilon``-LDP. Dimensions not sampled are not reported (the estimate is 0 there).

    Args:
        x: features ``[n, d]`` in ``[-1, 1]``.
        epsilon: budget per user, scalar or ``[n]``.
        num_dims: ``m`` per user (scalar or ``[n]``); default :func:`mlr_num_dims` of epsilon.

    Returns:
        :class:`SampledBits`; use :func:`multi_bit_estimate` on the server.

    Raises:
        ValueError: ``epsilon`` not finite and > 0, ``num_dims`` outside ``[1, d]`` or ``x``
            not in ``[-1, 1]``. (``epsilon / m`` above ``ln(2^53 - 1)``, 36.74, is spent as
            that limit: :func:`~fedgraph.mechanisms.thresholds.binary_thresholds`.)
    """
    x = check_unit_features(x)
    n, d = x.shape
    eps = (
        check_epsilon(epsilon).expand(n)
        if check_epsilon(epsilon).dim() == 0
        else check_epsilon(epsilon)
    )
    if num_dims is None:
        m = mlr_num_dims(eps, d, divisor)
    else:
        m = torch.as_tensor(num_dims, dtype=torch.long).expand(n).clone()
        if bool((m < 1).any() or (m > d).any()):
            raise ValueError(f"num_dims must lie in [1, {d}] (the number of features)")
    row, col = sample_dims(m, d, generator)
    row, col = row.to(x.device), col.to(x.device)
    # a per-dimension budget above what the 2^-53 grid carries is spent as that limit: more
    # noise than asked (a flip probability of 2^-53), the row's epsilon still an upper bound;
    # the "clean features" references (epsilon 1e5) rely on it. The 1-bit sign and randomized
    # response refuse such an epsilon instead (their own single draw is the release).
    eps_entry = (eps.to(x.device) / m.to(x.device))[row].clamp(max=BINARY_EPSILON_MAX)
    t_lo, t_hi = binary_thresholds(eps_entry, "epsilon / num_dims (per sampled dimension)")
    sign = torch.where(
        rng.bernoulli_bits(sign_thresholds(x[row, col], t_lo, t_hi), generator), 1, -1
    ).to(torch.int8)
    return SampledBits(row, col, sign)


def multi_bit_estimate(
    bits: SampledBits,
    num_rows: int,
    num_features: int,
    epsilon: float | Tensor,
    num_dims: Tensor | int,
) -> Tensor:
    r"""Server side of multi-bit / MLR: the unbiased estimate ``x'_j = (d/m) C(eps/m) s_j``.

    PPGNN paper Alg. 2 line 6; LPGNN Eq. (3). Unbiased when ``epsilon`` and ``num_dims`` are the
    ones the user used.

    Args:
        bits: the users' reports.
        epsilon: budget per user used for rescaling, scalar or ``[num_rows]``.
        num_dims: ``m`` per user, scalar or ``[num_rows]``.

    Returns:
        Dense float32 estimate ``[num_rows, num_features]`` (zero where nothing was sampled).
    """
    eps = (
        check_epsilon(epsilon).expand(num_rows)
        if check_epsilon(epsilon).dim() == 0
        else check_epsilon(epsilon)
    )
    m = torch.as_tensor(num_dims, dtype=torch.float64).expand(num_rows).to(bits.row.device)
    scale = (num_features / m) * unbias_factor(eps.to(bits.row.device) / m)
    return scatter_bits(bits, num_rows, num_features, scale)


def scatter_bits(bits: SampledBits, num_rows: int, num_features: int, scale: Tensor) -> Tensor:
    """Dense ``[num_rows, num_features]`` float32 matrix with ``scale[row] * sign`` at the
    reported ``(row, col)`` entries and 0 elsewhere. ``scale``: float ``[num_rows]``."""
    out = torch.zeros(num_rows, num_features, dtype=torch.float32, device=bits.row.device)
    out[bits.row, bits.col] = (scale[bits.row] * bits.sign.double()).float()
    return out


def multi_bit_variance(x: Tensor, epsilon: float, num_dims: int) -> Tensor:
    r"""Per-entry variance of the multi-bit estimate (PPGNN paper Eq. 5):
    :math:`\frac{d}{m} C(\epsilon/m)^2 - x^2`."""
    d = x.shape[-1]
    c = float(unbias_factor(epsilon / num_dims))
    return (d / num_dims) * c * c - x.double() ** 2


__all__ = [
    "SampledBits",
    "local_randomizer",
    "mlr_num_dims",
    "multi_bit",
    "multi_bit_estimate",
    "multi_bit_variance",
    "one_bit",
    "sample_dims",
    "scatter_bits",
    "unbias_factor",
]
