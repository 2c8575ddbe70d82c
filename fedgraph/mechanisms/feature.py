"""Feature mechanisms as pluggable objects: client ``perturb`` -> report -> server ``estimate``.

A :class:`FeatureMechanism` is what PPGNN's clients run on their users' features. Its report
is a dict of tensors (what leaves the client, nothing else), its ``estimate`` is the server's
unbiased decoding, and ``privacy_spent(level)`` states the epsilon each user at that level
spends per release (the ledger records it). Register a new one with
:func:`register_mechanism`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch
from torch import Tensor

from ._checks import check_unit_features
from .additive import gaussian, laplace
from .bits import SampledBits, multi_bit, multi_bit_estimate, mlr_num_dims, one_bit, unbias_factor
from .ppm import PPMParams, PPMReport, ppm, ppm_estimate

Report = dict[str, Tensor]


class FeatureMechanism(ABC):
    """Base class of an LDP mechanism for node features in ``[-1, 1]^d``.

    Subclasses set ``name`` and implement :meth:`perturb`, :meth:`estimate` and
    :meth:`privacy_spent`.
    """

    name: str = "abstract"
    #: True if the report hides the user's privacy level (only a DP release of it leaves).
    hides_level: bool = False

    @abstractmethod
    def perturb(self, x: Tensor, levels: Tensor, generator: torch.Generator | None = None) -> Report:
        """Client side. ``x``: ``[n, d]`` in ``[-1, 1]``; ``levels``: long ``[n]`` (1-based)."""

    @abstractmethod
    def estimate(self, report: Report, num_features: int) -> tuple[Tensor, Tensor | None]:
        """Server side: ``(x_hat [n, d], level_hat [n] or None)``."""

    @abstractmethod
    def privacy_spent(self, level: int) -> dict[str, float]:
        """Pure epsilon-LDP per release for a user at ``level``, e.g. ``{"esw": .., "mlr": ..}``."""

    def delta(self) -> float:
        """delta of the LDP guarantee (0 for pure mechanisms)."""
        return 0.0


class PPMMechanism(FeatureMechanism):
    """PPM (PPGNN Alg. 3) with personalized levels; see :mod:`fedgraph.mechanisms.ppm`."""

    name = "ppm"
    hides_level = True

    def __init__(self, budgets, gamma: float = 0.1, shares=None, rescale: str = "posterior"):
        self.params = PPMParams(tuple(float(b) for b in budgets), float(gamma),
                                tuple(float(s) for s in shares) if shares else None)
        self.rescale = rescale

    def perturb(self, x, levels, generator=None):
        r = ppm(x, levels, self.params, generator)
        return {"released_level": r.released_level, "row": r.bits.row, "col": r.bits.col,
                "sign": r.bits.sign}

    def estimate(self, report, num_features):
        r = PPMReport(report["released_level"],
                      SampledBits(report["row"], report["col"], report["sign"]))
        return ppm_estimate(r, num_features, self.params, self.rescale)

    def privacy_spent(self, level):
        return self.params.epsilon_split(level)


class _UniformMechanism(FeatureMechanism):
    """A mechanism run with one epsilon for every user (the baselines' uniform setting)."""

    def __init__(self, epsilon: float, **_):
        if not (epsilon > 0 and epsilon < float("inf")):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
        self.epsilon = float(epsilon)

    def privacy_spent(self, level):
        return {self.name: self.epsilon}


class MultiBitMechanism(_UniformMechanism):
    """Multi-bit mechanism of LPGNN (m rule with divisor 2.18), one epsilon for everyone."""

    name = "multi-bit"

    def perturb(self, x, levels, generator=None):
        bits = multi_bit(x, self.epsilon, generator=generator, divisor=2.18)
        return {"row": bits.row, "col": bits.col, "sign": bits.sign,
                "num_rows": torch.tensor([x.shape[0]])}

    def estimate(self, report, num_features):
        n = int(report["num_rows"][0])
        m = mlr_num_dims(self.epsilon, num_features, 2.18)
        bits = SampledBits(report["row"], report["col"], report["sign"])
        return multi_bit_estimate(bits, n, num_features, self.epsilon, m), None


class OneBitMechanism(_UniformMechanism):
    """1-bit mechanism on every dimension with ``epsilon / d`` each (PPGNN Eq. 4)."""

    name = "one-bit"

    def perturb(self, x, levels, generator=None):
        x = check_unit_features(x)
        return {"sign": one_bit(x, self.epsilon / x.shape[1], generator).to(torch.int8)}

    def estimate(self, report, num_features):
        c = float(unbias_factor(self.epsilon / num_features))
        return report["sign"].float() * c, None


class LaplaceMechanism(_UniformMechanism):
    """Laplace mechanism (PPGNN Sec. II-D 1)."""

    name = "laplace"

    def perturb(self, x, levels, generator=None):
        return {"x": laplace(x, self.epsilon, generator)}

    def estimate(self, report, num_features):
        return report["x"].float(), None


class GaussianMechanism(_UniformMechanism):
    """Gaussian mechanism (PPGNN Sec. II-D 2), ``(epsilon, delta)``-LDP."""

    name = "gaussian"

    def __init__(self, epsilon: float, delta: float = 1e-5, **_):
        super().__init__(epsilon)
        self._delta = float(delta)

    def perturb(self, x, levels, generator=None):
        return {"x": gaussian(x, self.epsilon, self._delta, generator)}

    def estimate(self, report, num_features):
        return report["x"].float(), None

    def delta(self):
        return self._delta


#: name -> factory(budgets=..., gamma=..., epsilon=..., delta=...) -> FeatureMechanism
FEATURE_MECHANISMS: dict[str, Callable[..., FeatureMechanism]] = {}


def register_mechanism(name: str, factory: Callable[..., FeatureMechanism] | None = None):
    """Register a feature mechanism factory under ``name`` (usable as a decorator)."""
    def deco(f):
        FEATURE_MECHANISMS[name] = f
        return f
    return deco(factory) if factory is not None else deco


register_mechanism("ppm", lambda budgets, gamma=0.1, shares=None, rescale="posterior", **_:
                   PPMMechanism(budgets, gamma, shares, rescale))
for _cls in (MultiBitMechanism, OneBitMechanism, LaplaceMechanism, GaussianMechanism):
    register_mechanism(_cls.name, lambda budgets, epsilon=None, _c=_cls, **kw: _c(
        epsilon if epsilon is not None else min(budgets), **kw))


def make_mechanism(name: str, **kwargs) -> FeatureMechanism:
    """Build the registered mechanism ``name``.

    Raises:
        ValueError: for an unknown name, listing the registered ones.
    """
    if name not in FEATURE_MECHANISMS:
        raise ValueError(f"mechanism: unknown {name!r}; known: {sorted(FEATURE_MECHANISMS)}")
    return FEATURE_MECHANISMS[name](**kwargs)
