"""Feature mechanisms as pluggable objects: client ``perturb`` -> report -> server ``estimate``.

A :class:`FeatureMechanism` is what PPGNN's clients run on their users' features. Its report
is a dict of tensors (what leaves the client, nothing else), its ``estimate`` is the server's
unbiased decoding, and ``privacy_spent(level)`` states the epsilon each user at that level
spends per release (the strategy records it in the privacy ledger before any client runs).

Register a new one with :func:`register_mechanism` or select it by import path
(``mechanism = "mypkg.mech:MyMechanism"``); :func:`make_mechanism` checks what a mechanism
declares (:func:`check_privacy_declaration`) and :func:`check_mechanism` dry-runs it
(shapes, report types, raw features not released). See ``docs/extending.md``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

from ..registry import ContractError, Registry
from ._checks import check_unit_features
from .additive import gaussian, laplace
from .bits import SampledBits, mlr_num_dims, multi_bit, multi_bit_estimate, one_bit, unbias_factor
from .ppm import PPMParams, PPMReport, ppm, ppm_estimate
from .ppm import level_epsilon as ppm_level_epsilon

Report = dict[str, Tensor]


class FeatureMechanism(ABC):
    """Base class of an LDP mechanism for node features in ``[-1, 1]^d``.

    Subclasses set ``name`` and implement :meth:`perturb` (client), :meth:`estimate` (server)
    and :meth:`privacy_spent` (the ledger's declaration); ``delta`` defaults to 0 (pure LDP).
    The contract, checked by :func:`check_privacy_declaration` and :func:`check_mechanism`:
    the report holds only perturbed values, ``privacy_spent(level)`` names every release with
    its epsilon for each level, ``estimate`` returns ``[n, d]``.
    """

    name: str = "abstract"
    #: True if the report limits what it reveals about the user's privacy level; then
    #: :meth:`level_epsilon` states how much (the whole report, not one part of it).
    hides_level: bool = False

    @abstractmethod
    def perturb(
        self, x: Tensor, levels: Tensor, generator: torch.Generator | None = None
    ) -> Report:
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

    def level_epsilon(
        self, level: int, num_features: int | None = None, relation: str = "level"
    ) -> float:
        """Epsilon (nats) of what one user's *whole* report reveals about its level, for a user
        at ``level``: the largest log ratio of the report's probability against any other
        level (``relation = "level"``: features fixed). Required, finite and >= 0, when
        ``hides_level`` (:func:`check_privacy_declaration`); the default ``inf`` states that
        the mechanism has not analysed it. ``num_features``: ``d``, ``None`` for every ``d``."""
        return math.inf


class PPMMechanism(FeatureMechanism):
    """PPM (PPGNN Alg. 3) with personalized levels; see :mod:`fedgraph.mechanisms.ppm`."""

    name = "ppm"
    hides_level = True

    def __init__(self, budgets, gamma: float = 0.1, shares=None, rescale: str = "posterior"):
        self.params = PPMParams(
            tuple(float(b) for b in budgets),
            float(gamma),
            tuple(float(s) for s in shares) if shares else None,
        )
        self.rescale = rescale

    def perturb(self, x, levels, generator=None):
        r = ppm(x, levels, self.params, generator)
        return {
            "released_level": r.released_level,
            "row": r.bits.row,
            "col": r.bits.col,
            "sign": r.bits.sign,
        }

    def estimate(self, report, num_features):
        r = PPMReport(
            report["released_level"], SampledBits(report["row"], report["col"], report["sign"])
        )
        return ppm_estimate(r, num_features, self.params, self.rescale)

    def privacy_spent(self, level):
        return self.params.epsilon_split(level)

    def level_epsilon(self, level, num_features=None, relation="level"):
        """Exact, from :func:`fedgraph.mechanisms.ppm.level_epsilon` (ESW output, the number of
        sampled dimensions and the signs, whose probabilities depend on ``eps_tau``)."""
        if not 1 <= level <= self.params.num_levels:
            raise ValueError(f"level must lie in {{1, ..., {self.params.num_levels}}}, got {level}")
        return float(ppm_level_epsilon(self.params, num_features, relation)[level - 1])


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
        return {
            "row": bits.row,
            "col": bits.col,
            "sign": bits.sign,
            "num_rows": torch.tensor([x.shape[0]]),
        }

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


def _check_factory(factory, name: str) -> None:
    """Registry check: a callable; a class must be a concrete :class:`FeatureMechanism`."""
    if isinstance(factory, type):
        if not issubclass(factory, FeatureMechanism):
            raise ContractError(
                f"mechanism {name!r}: {factory.__qualname__} is not a subclass "
                "of fedgraph.mechanisms.FeatureMechanism"
            )
        missing = sorted(getattr(factory, "__abstractmethods__", ()))
        if missing:
            raise ContractError(
                f"mechanism {name!r}: {factory.__qualname__} does not implement "
                f"{', '.join(missing)}"
            )
    elif not callable(factory):
        raise ContractError(
            f"mechanism {name!r}: expected a FeatureMechanism subclass or a "
            f"factory function, got {type(factory).__name__}"
        )


#: name -> factory(budgets=..., gamma=..., shares=..., rescale=..., epsilon=..., delta=...)
#: returning a FeatureMechanism (a FeatureMechanism subclass is such a factory).
FEATURE_MECHANISMS: Registry = Registry(
    "mechanism", check=_check_factory, hint="See docs/extending.md, 'A feature mechanism'."
)


def register_mechanism(
    name: str, factory: Callable[..., FeatureMechanism] | None = None, *, replace: bool = False
):
    """Register a feature mechanism factory under ``name`` (usable as a decorator).

    ``factory(budgets=[eps_1, ..], gamma=.., shares=.., rescale=.., epsilon=.., delta=..)``
    returns a :class:`FeatureMechanism`; a subclass whose ``__init__`` takes these keywords
    (and ``**_`` for the rest) is such a factory.

    Raises:
        ContractError: ``factory`` is not callable, or a class that is not a concrete
            :class:`FeatureMechanism`.
        ValueError: ``name`` is taken by another factory (pass ``replace=True``).
    """
    return FEATURE_MECHANISMS.register(name, factory, replace=replace)


register_mechanism(
    "ppm",
    lambda budgets, gamma=0.1, shares=None, rescale="posterior", **_: PPMMechanism(
        budgets, gamma, shares, rescale
    ),
)
for _cls in (MultiBitMechanism, OneBitMechanism, LaplaceMechanism, GaussianMechanism):
    register_mechanism(
        _cls.name,
        lambda budgets, epsilon=None, _c=_cls, **kw: _c(
            epsilon if epsilon is not None else min(budgets), **kw
        ),
    )


def check_privacy_declaration(mech: FeatureMechanism, num_levels: int, name: str = "") -> None:
    """Check what ``mech`` declares to the privacy ledger, for every level ``1..num_levels``.

    ``privacy_spent(level)`` must be a non-empty dict ``{release name: epsilon}`` with every
    epsilon finite and > 0, ``level_epsilon(level)`` finite and >= 0 when ``hides_level``, and
    ``delta()`` must lie in ``[0, 1)``. A mechanism that declares
    nothing would have its reports leave the clients with no ledger event.

    Raises:
        ContractError: naming the mechanism, the level and what was wrong.
    """
    label = f"mechanism {name or getattr(mech, 'name', type(mech).__name__)!r}"
    if not isinstance(mech, FeatureMechanism):
        raise ContractError(
            f"{label}: the factory returned {type(mech).__name__}, not a "
            "fedgraph.mechanisms.FeatureMechanism"
        )
    for level in range(1, num_levels + 1):
        spent = mech.privacy_spent(level)
        if not isinstance(spent, dict) or not spent:
            raise ContractError(
                f"{label}: privacy_spent(level={level}) returned {spent!r}; it must name every "
                "release with its epsilon, e.g. {'features': 1.0}: without it the reports "
                "would leave the clients with no event in the privacy ledger"
            )
        for release, eps in spent.items():
            if (
                not isinstance(release, str)
                or isinstance(eps, bool)
                or not isinstance(eps, (int, float))
                or not math.isfinite(eps)
                or eps <= 0
            ):
                raise ContractError(
                    f"{label}: privacy_spent(level={level}) has {release!r}: "
                    f"{eps!r}; every epsilon must be a finite number > 0"
                )
        if mech.hides_level:
            eps = mech.level_epsilon(level)
            if (
                isinstance(eps, bool)
                or not isinstance(eps, (int, float))
                or not (0 <= eps < math.inf)
            ):
                raise ContractError(
                    f"{label}: hides_level is True but level_epsilon(level={level}) returned "
                    f"{eps!r}; it must state what the whole report reveals about the level "
                    "(a finite epsilon >= 0)"
                )
    delta = mech.delta()
    if not isinstance(delta, (int, float)) or not 0.0 <= float(delta) < 1.0:
        raise ContractError(f"{label}: delta() must lie in [0, 1), got {delta!r}")


def make_mechanism(name: str, **kwargs) -> FeatureMechanism:
    """Build the mechanism ``name`` (a registered name or ``"package.module:factory"``) and
    check its privacy declaration for every level of ``kwargs["budgets"]``.

    Raises:
        ValueError: for an unknown name (listing the registered ones) or an import path that
            does not resolve.
        ContractError: the factory is not a mechanism, or the mechanism declares no (or an
            invalid) privacy loss (:func:`check_privacy_declaration`).
    """
    mech = FEATURE_MECHANISMS.resolve(name)(**kwargs)
    check_privacy_declaration(mech, len(kwargs.get("budgets") or [None]), name)
    return mech


def check_mechanism(
    mech: FeatureMechanism,
    num_features: int = 8,
    num_levels: int = 1,
    num_users: int = 32,
    seed: int = 0,
) -> Report:
    """Dry-run ``mech`` on random features and check the contract a strategy relies on.

    Checks :func:`check_privacy_declaration`; ``perturb`` returns a non-empty dict of tensors,
    none of which is the raw feature matrix; ``estimate`` returns a finite ``x_hat [n, d]`` and
    ``level_hat`` ``None`` or ``[n]`` (required when ``hides_level``). The dry run is done twice,
    once with each kind of generator a client may pass (:func:`fedgraph.randomness.client_generator`):
    a seeded :class:`torch.Generator` (``noise-source = "mt19937"``) and a
    :class:`~fedgraph.randomness.SecureRandom` under a key derived from ``seed`` (``secure``,
    the default, and ``secret``), so a mechanism that draws with ``torch.rand(...,
    generator=generator)`` is refused here rather than on every client. No global randomness
    is consumed. Call it from your mechanism's unit test.

    Args:
        num_features: ``d`` of the random features (uniform in ``[-1, 1]``).
        num_levels: levels ``1..num_levels`` assigned to the users in turn.
        num_users: ``n``.

    Returns:
        the report of the dry run with the :class:`torch.Generator`.
    Raises:
        ContractError: naming the mechanism and the broken rule; where ``perturb`` or
            ``estimate`` raised, the generator kind, with the mechanism's error as its cause.
    """
    import hashlib

    from ..randomness import SecureRandom

    label = f"mechanism {getattr(mech, 'name', type(mech).__name__)!r}"
    check_privacy_declaration(mech, num_levels)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(num_users, num_features, generator=gen) * 2 - 1
    levels = torch.arange(num_users) % num_levels + 1
    key = hashlib.sha256(f"fedgraph check_mechanism {seed}".encode()).digest()
    reports = [
        _dry_run(mech, label, x, levels, generator, kind)
        for generator, kind in (
            (gen, 'a torch.Generator (noise-source "mt19937")'),
            (
                SecureRandom(key),
                'a fedgraph.randomness.SecureRandom (noise-source "secure", the '
                'default, and "secret")',
            ),
        )
    ]
    return reports[0]


def _first_line(err: BaseException) -> str:
    """``err``'s message up to its first line break (torch's TypeErrors list every overload;
    the whole message follows in the traceback)."""
    return (str(err).splitlines() or [""])[0]


def _dry_run(
    mech: FeatureMechanism, label: str, x: Tensor, levels: Tensor, generator, kind: str
) -> Report:
    """One dry run of :func:`check_mechanism` on ``x [n, d]`` with ``generator`` (described by
    ``kind``)."""
    num_users, num_features = x.shape
    try:
        report = mech.perturb(x.clone(), levels, generator)
    except Exception as err:  # noqa: BLE001 - the mechanism's own failure, named
        hint = (
            " (draw with fedgraph.randomness's rand/randn/randint/randperm/add_gaussian"
            "(..., generator), which take either kind)"
            if isinstance(err, TypeError)
            else ""
        )
        raise ContractError(
            f"{label}: perturb raised {type(err).__name__} with {kind}{hint}: {_first_line(err)}"
        ) from err
    if (
        not isinstance(report, dict)
        or not report
        or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in report.items())
    ):
        raise ContractError(
            f"{label}: perturb must return a non-empty dict of named tensors "
            f"(what leaves the client), got {type(report).__name__}"
        )
    for key, value in report.items():
        if value.shape == x.shape and torch.equal(value.to(x.dtype), x):
            raise ContractError(
                f"{label}: report[{key!r}] is the raw feature matrix: only "
                "perturbed values may leave a client"
            )
    try:
        out = mech.estimate(report, num_features)
    except Exception as err:  # noqa: BLE001 - as perturb's
        raise ContractError(
            f"{label}: estimate raised {type(err).__name__} on the report of "
            f"a dry run with {kind}: {_first_line(err)}"
        ) from err
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ContractError(f"{label}: estimate must return (x_hat, level_hat or None)")
    x_hat, level_hat = out
    if not isinstance(x_hat, Tensor) or tuple(x_hat.shape) != (num_users, num_features):
        raise ContractError(
            f"{label}: estimate returned x_hat of shape "
            f"{tuple(getattr(x_hat, 'shape', ()))}, expected "
            f"[{num_users}, {num_features}]"
        )
    if not bool(torch.isfinite(x_hat).all()):
        raise ContractError(
            f"{label}: estimate returned a non-finite x_hat (NaN or inf); "
            "an estimate must be finite"
        )
    if level_hat is None and mech.hides_level:
        raise ContractError(f"{label}: hides_level is True but estimate returned no level_hat")
    if level_hat is not None and (
        not isinstance(level_hat, Tensor) or tuple(level_hat.shape) != (num_users,)
    ):
        raise ContractError(f"{label}: level_hat must be None or a tensor [{num_users}]")
    return report
