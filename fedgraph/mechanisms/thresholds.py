r"""Exact thresholds for the comparison samplers: randomized response, the 1-bit sign and ESW.

Each of these mechanisms draws one 53-bit uniform integer ``k`` per output
(:func:`fedgraph.randomness.uniform_bits`) and cuts ``[0, 2^53)`` into integer ranges, one per
output value: the value's probability is its range's length over ``2^53``, exactly. The lengths
are rounded in the private direction, so the ratio of any output's probabilities under two
inputs, the *effective* epsilon (``*_effective_epsilon``), is at most the nominal one; an epsilon
the grid cannot carry (the smallest probability would fall below ``2^-53``) is refused with a
``ValueError`` naming the parameter and the allowed range.

Why (Mironov, "On Significance of the Least Significant Bits for Differential Privacy", CCS 2012;
issue 60, fault 7): a float32 uniform (24 bits) against a float32 keep-probability rounds that
probability to the grid ``2^-24``; randomized response with ``k`` classes then had an effective
epsilon of 16.03 at a nominal 16, and from about 19.1 its keep-probability rounds to 1: at 19.5,
0 of 2,000,000 labels change (infinite epsilon). A float64 threshold against a float64 uniform
moves the cliff to ~36.7 but still rounds in either direction.

The float64 arithmetic that finds a threshold (``exp``, one addition, one division, below 3 ulps
together) is covered by a relative margin of :data:`MARGIN` (``2^-49``, 16 ulps) on the smaller
probability, which is then rounded up (the larger one gets what is left), so the integer
thresholds satisfy the privacy inequality exactly, whatever the last bits of ``exp``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..randomness import UNIFORM_SPAN
from ._checks import check_epsilon

#: relative margin on the smaller probability, above float64's error in computing it
MARGIN = 2.0**-49
#: the largest epsilon of a binary choice on the ``2^-53`` grid: ``ln(2^53 - 1)`` (36.74), the
#: ratio ``(2^53 - 1) / 1`` of the most lopsided split
BINARY_EPSILON_MAX = math.log(UNIFORM_SPAN - 1)
_HALF = UNIFORM_SPAN // 2


def _small_units(norm: Tensor) -> Tensor:
    """``ceil(2^53 / norm)`` with :data:`MARGIN`: at least ``2^53 / norm`` exactly (float64)."""
    return torch.ceil(float(UNIFORM_SPAN) / norm * (1.0 + MARGIN))


def binary_thresholds(epsilon: float | Tensor, name: str = "epsilon") -> tuple[Tensor, Tensor]:
    r"""Integer thresholds ``(t_lo, t_hi)`` of the 1-bit sign (PPGNN Eq. 4) at ``epsilon``:
    ``P[s = +1 | x = -1] = t_lo / 2^53`` and ``P[s = +1 | x = +1] = t_hi / 2^53``, with
    ``t_lo + t_hi = 2^53`` and ``t_lo >= 2^53 / (1 + e^epsilon)`` (rounded up), so
    ``t_hi / t_lo <= e^epsilon`` exactly (:func:`binary_effective_epsilon`).

    Args:
        epsilon: per entry, scalar or any shape, in ``(0, BINARY_EPSILON_MAX]``.
        name: the parameter named by the error.

    Returns:
        int64 tensors with ``epsilon``'s shape; ``1 <= t_lo <= 2^52 <= t_hi``.

    Raises:
        ValueError: ``epsilon`` not finite and > 0, or above :data:`BINARY_EPSILON_MAX`
            (names ``name`` and the allowed range).
    """
    eps = check_epsilon(epsilon, name)
    if bool((eps > BINARY_EPSILON_MAX).any()):
        raise ValueError(
            f"{name} must lie in (0, {BINARY_EPSILON_MAX:.6f}] (allowed range: a "
            "sign drawn on the 2^-53 grid cannot carry a probability below 2^-53; "
            f"Mironov 2012), got {float(eps.max())!r}"
        )
    lo = _small_units(1.0 + torch.exp(eps)).clamp(1, _HALF).long()
    return lo, UNIFORM_SPAN - lo


def binary_effective_epsilon(epsilon: float | Tensor) -> Tensor:
    """The epsilon the 1-bit sign really has at ``epsilon``: ``ln(t_hi / t_lo)`` of
    :func:`binary_thresholds` (float64, ``epsilon``'s shape; at most ``epsilon``)."""
    lo, hi = binary_thresholds(epsilon)
    return torch.log1p((hi - lo).double() / lo.double())


def sign_thresholds(x: Tensor, t_lo: Tensor, t_hi: Tensor) -> Tensor:
    r"""The threshold of each entry's sign: ``floor(2^52 + x (t_hi - 2^52))`` for ``x``
    clamped to ``[-1, 1]``, int64 in ``[t_lo, t_hi]`` (float64 rounding is monotone and the
    ends are exact integers), so ``P[s = +1] = 1/2 + x c / 2`` with ``c = (t_hi - t_lo) / 2^53
    <= tanh(epsilon / 2)`` up to ``2^-53``, and any two entries' probabilities of either sign
    differ by at most the factor ``t_hi / t_lo``.

    Args:
        x: ``[...]`` in ``[-1, 1]``; ``t_lo, t_hi``: int64 broadcastable to ``x``.
    """
    a = (t_hi - _HALF).double()
    t = torch.floor(float(_HALF) + x.double().clamp(-1.0, 1.0) * a).long()
    return torch.minimum(torch.maximum(t, t_lo), t_hi)


def randomized_response_range(num_classes: int) -> tuple[float, float]:
    r"""``(low, high)``: the epsilons :func:`randomized_response_thresholds` accepts for ``k``
    classes. ``high = ln(2^53 - (k - 1))``: each other class keeps one unit of ``2^-53``;
    ``low``: the effective epsilon of the most even split ``floor(2^53 / k)`` per other class
    (0 when ``k`` divides ``2^53``, about ``1e-15`` otherwise)."""
    k = int(num_classes)
    if k < 2:
        return 0.0, math.inf
    f = UNIFORM_SPAN // k
    return math.log1p((UNIFORM_SPAN - k * f) / f), math.log(UNIFORM_SPAN - (k - 1))


def randomized_response_thresholds(
    epsilon: float, num_classes: int, name: str = "label_epsilon"
) -> tuple[int, int]:
    r"""``(keep, other)``: integer lengths on the ``2^53`` grid of k-ary randomized response
    (Warner 1965; Kairouz et al. 2016): the true label keeps ``keep / 2^53``, each of the other
    ``k - 1`` classes gets ``other / 2^53``, ``keep + (k - 1) other = 2^53``, ``other >= 2^53 /
    (e^epsilon + k - 1)`` (rounded up), so ``keep / other <= e^epsilon`` exactly
    (:func:`randomized_response_effective_epsilon`). One class: ``(2^53, 0)`` (nothing to hide).

    Raises:
        ValueError: ``epsilon`` not finite and > 0, or outside
            :func:`randomized_response_range` (names ``name`` and the range); ``num_classes``
            below 1.
    """
    eps = float(check_epsilon(epsilon, name))
    k = int(num_classes)
    if k < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
    if k == 1:
        return UNIFORM_SPAN, 0
    low, high = randomized_response_range(k)
    if eps > high:
        raise ValueError(
            f"{name} must lie in [{low:.3g}, {high:.6f}] for {k} classes (allowed "
            "range: a label kept with probability above 1 - 2^-53 cannot be drawn "
            f"exactly on the 2^-53 grid; Mironov 2012), got {epsilon!r}"
        )
    norm = math.exp(eps) + (k - 1)
    other = min(math.ceil(UNIFORM_SPAN / norm * (1.0 + MARGIN)), UNIFORM_SPAN // k)
    keep = UNIFORM_SPAN - (k - 1) * other
    if math.log1p((keep - other) / other) > eps:
        raise ValueError(
            f"{name} must lie in [{low:.3g}, {high:.6f}] for {k} classes (allowed "
            "range: below it the 2^-53 grid cannot split the probability evenly "
            f"enough), got {epsilon!r}"
        )
    return keep, other


def randomized_response_effective_epsilon(epsilon: float, num_classes: int) -> float:
    """The epsilon randomized response really has at ``epsilon`` with ``k`` classes:
    ``ln(keep / other)`` of :func:`randomized_response_thresholds` (at most ``epsilon``; 0 for
    one class)."""
    keep, other = randomized_response_thresholds(epsilon, num_classes, "epsilon")
    return 0.0 if other == 0 else math.log1p((keep - other) / other)


def esw_thresholds(
    epsilon: float | Tensor, num_levels: int, window: int, name: str = "esw epsilon"
) -> tuple[Tensor, Tensor]:
    r"""``(p_units, q_units)``: integer lengths on the ``2^53`` grid of ESW (PPGNN Eq. 6):
    each of the ``2b + 1`` outputs in the window gets ``p_units / 2^53``, each of the ``f - 1``
    others ``q_units / 2^53``, ``q_units >= 2^53 / ((2b + 1) e^epsilon + f - 1)`` (rounded up),
    ``p_units`` the floor of what is left over ``2b + 1``. The remainder ``2^53 - (2b + 1)
    p_units - (f - 1) q_units < 2b + 1`` units is rejected (redrawn), which scales every
    probability by the same factor: ``p / q = p_units / q_units <= e^epsilon`` exactly
    (:func:`esw_effective_epsilon`).

    Returns:
        int64 tensors with ``epsilon``'s shape.

    Raises:
        ValueError: ``epsilon`` not finite and > 0, or one the grid cannot carry (above
            ``ln((2^53 - f + 1) / (2b + 1))`` or, for ``f + 2b`` not a power of two, below
            about ``1e-15``), naming ``name`` and the allowed range.
    """
    eps = check_epsilon(epsilon, name)
    f, b = int(num_levels), int(window)
    w = 2 * b + 1
    high = math.log((UNIFORM_SPAN - (f - 1)) / w)
    cap = UNIFORM_SPAN // (f - 1 + w)
    low = math.log1p(((UNIFORM_SPAN - (f - 1) * cap) // w - cap) / cap)
    if bool((eps > high).any()):
        raise ValueError(
            f"{name} must lie in [{low:.3g}, {high:.6f}] for {f} levels and window "
            f"{b} (allowed range: the 2^-53 grid; Mironov 2012), got "
            f"{float(eps.max())!r}"
        )
    q = _small_units(w * torch.exp(eps) + (f - 1)).clamp(1, cap).long()
    p = (UNIFORM_SPAN - (f - 1) * q) // w
    if bool((torch.log1p((p - q).double() / q.double()) > eps).any()):
        raise ValueError(
            f"{name} must lie in [{low:.3g}, {high:.6f}] for {f} levels and window "
            f"{b} (allowed range: the 2^-53 grid), got {float(eps.min())!r}"
        )
    return p, q


def esw_effective_epsilon(epsilon: float | Tensor, num_levels: int, window: int) -> Tensor:
    """The epsilon ESW really has: ``ln(p_units / q_units)`` of :func:`esw_thresholds`
    (float64, ``epsilon``'s shape; at most ``epsilon``)."""
    p, q = esw_thresholds(epsilon, num_levels, window)
    return torch.log1p((p - q).double() / q.double())


__all__ = [
    "BINARY_EPSILON_MAX",
    "MARGIN",
    "binary_effective_epsilon",
    "binary_thresholds",
    "esw_effective_epsilon",
    "esw_thresholds",
    "randomized_response_effective_epsilon",
    "randomized_response_range",
    "randomized_response_thresholds",
    "sign_thresholds",
]
