r"""ProGAP's privacy: sensitivity, calibration per client, the events a client spends.

Source: Sajadmanesh and Gatica-Perez, ProGAP, WSDM 2024, Sec. 5 (edge- and node-level
guarantees), and the official code (github.com/sisaman/ProGAP): ``core/nn/nap.py`` (the noisy
aggregation), ``core/methods/progap/edge.py`` and ``node.py`` (``calibrate``: one
``ComposedNoisyMechanism``).

* **Aggregation** (NAP, paper Eq. 4): stage ``i``'s embedding is row-normalized, summed over
  in-neighbours and perturbed with :math:`\mathcal N(0, \sigma^2 I)` per row. Given the previous
  stage (adaptive composition), it is a Gaussian mechanism of the same L2 sensitivity as one
  GAP hop: edge level 1 for a directed edge (the official ``NAP(sensitivity=1)``), sqrt 2 for an
  undirected one (:func:`fedgraph.methods.gap.edge_sensitivity`); node level sqrt D on the
  degree-bounded graph, :math:`\sqrt{D + m}` with ``m`` other clients' clipped remote rows
  (:func:`fedgraph.methods.gap.node_sensitivity`, where the argument is written out: the same
  rows change as in one PMA hop, since a ProGAP aggregation is one PMA hop of another input).
  ``depth`` = ``K`` aggregations in a run.
* **Training**: edge level, the submodels read features, labels and the private aggregations
  only: no further epsilon. Node level, each of the ``K + 1`` submodels is trained with DP-SGD
  (Poisson rate ``q``, ``T`` steps per stage, :func:`fedgraph.methods.gap.dpsgd_schedule`).
* **Calibration** (the official ``calibrate``): one noise multiplier ``z`` shared by every
  aggregation (noise std ``z x`` sensitivity) and every stage's DP-SGD (noise std ``z x`` the
  clipping norm), the smallest meeting ``(epsilon, delta)`` for the composition of
  ``Gaussian(z) x K`` and, at node level, ``SubsampledGaussian(q, z, T) x (K + 1)``
  (:func:`calibrate_progap`; edge level it is GAP's calibration of ``K`` hops).

Federated, each client calibrates its own ``z`` for its own target (:func:`privacy_plan`), and
its ledger subject records exactly :func:`plan_events`. Remote rows carry the noise
:func:`remote_noise` gives (GAP's rule, :func:`fedgraph.methods.gap.privacy.remote_noise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

# GAP's pieces this module reuses (one place, to repoint when GAP's modules move)
from ..gap.privacy import (  # noqa: F401
    REMOTE_ROW_NORM,
    calibrate_gap,
    edge_sensitivity,
    gap_noise_events,
    node_sensitivity,
    secure_remote_sigma,
)
from ..gap.training import DPSGD, dpsgd_schedule

__all__ = [
    "aggregation_sensitivity",
    "progap_events",
    "calibrate_progap",
    "PrivacyPlan",
    "privacy_plan",
    "plan_events",
    "remote_noise",
    "gap_edges_config",
    "DPSGD",
    "dpsgd_schedule",
]

LEVELS = ("edge", "node")


def aggregation_sensitivity(
    level: str,
    *,
    edge_unit: str = "directed",
    max_degree: int = 100,
    other_clients: int = 0,
    summed: bool = False,
) -> float:
    r"""L2 sensitivity of one ProGAP aggregation: edge level 1 (``directed``, the paper's and
    official code's unit) or :math:`\sqrt 2` (``undirected``); node level
    :math:`\sqrt{D + m}` (:math:`\sqrt{D + m^2}` ``summed``), ``m = other_clients``.

    Raises:
        ValueError: unknown ``level`` or ``edge_unit``; ``max_degree`` < 1."""
    if level == "edge":
        return edge_sensitivity(edge_unit)
    if level == "node":
        return node_sensitivity(max_degree, other_clients, summed)
    raise ValueError(f"level: unknown {level!r}; allowed: {', '.join(LEVELS)}")


def progap_events(
    noise_multiplier: float, depth: int, stage_dpsgd: tuple[float, int] | None = None
) -> list:
    """The events of one ProGAP run: ``Gaussian(z, count=K)`` for the aggregations (if
    ``K > 0``) and, with ``stage_dpsgd = (q, T)``, ``K + 1`` stages of
    ``SubsampledGaussian(q, z, T)`` (one event of ``(K + 1) T`` steps: the same composition).
    ``noise_multiplier``: noise std / sensitivity (dimensionless)."""
    from ...accounting import Gaussian, SubsampledGaussian

    events = []
    if depth > 0:
        events.append(Gaussian(noise_multiplier, count=depth))
    if stage_dpsgd is not None and stage_dpsgd[1] > 0:
        q, steps = stage_dpsgd
        events.append(SubsampledGaussian(q, noise_multiplier, steps * (depth + 1)))
    return events


def calibrate_progap(
    target_epsilon: float,
    delta: float,
    *,
    depth: int,
    level: str = "edge",
    stage_schedule: tuple[float, int] | None = None,
    accountant: str = "analytic",
) -> float:
    """Smallest noise multiplier meeting ``(target_epsilon, delta)`` (epsilon for the whole
    run). Edge level: ``K`` Gaussian mechanisms (GAP's :func:`~fedgraph.methods.gap.
    calibrate_gap` of ``K`` hops, the official ``ComposedNoisyMechanism([nap], [K])``); node
    level: with ``K + 1`` stages of DP-SGD ``stage_schedule = (q, T)`` at the same multiplier
    (the official ``ComposedNoisyMechanism([nap, noisy_sgd], [K, K + 1])``).

    Returns ``0.0`` for ``target_epsilon = inf``.
    Raises:
        ValueError: unknown level, node level without ``stage_schedule``, bad delta.
        fedgraph.accounting.CalibrationError: the search did not finish."""
    from ...accounting import calibrate, check_delta

    check_delta(delta)
    make_events = progap_noise_events(depth, level, stage_schedule)
    if math.isinf(target_epsilon) or make_events is None:
        return 0.0
    return float(calibrate(target_epsilon, delta, make_events, accountant=accountant))


def progap_noise_events(
    depth: int, level: str = "edge", stage_schedule: tuple[float, int] | None = None
):
    """``make_events(noise_multiplier) -> list[Event]`` of what :func:`calibrate_progap`
    calibrates (arguments as there; edge level: GAP's
    :func:`~fedgraph.methods.gap.privacy.gap_noise_events` of ``K`` hops), or ``None`` when
    nothing is noised.

    Raises:
        ValueError: unknown level, node level without ``stage_schedule``."""
    if level not in LEVELS:
        raise ValueError(f"level: unknown {level!r}; allowed: {', '.join(LEVELS)}")
    if level == "edge":
        return gap_noise_events(depth, "edge")
    if stage_schedule is None:
        raise ValueError("node-level ProGAP needs the stages' DP-SGD schedule (q, steps)")
    return lambda z: progap_events(z, depth, stage_schedule)


def epsilon_floor(cfg, num_train: int) -> float:
    """As GAP's :func:`~fedgraph.methods.gap.privacy.epsilon_floor`, for ProGAP's
    :func:`privacy_plan`: the smallest per-client target epsilon reachable."""
    from ...accounting import MAX_NOISE_MULTIPLIER
    from ...accounting import epsilon_floor as floor_of

    floor = [0.0]

    def at_largest(epsilon, delta, depth, level, sched, accountant) -> float:
        floor[0] = floor_of(progap_noise_events(depth, level, sched), delta, accountant)
        return MAX_NOISE_MULTIPLIER

    privacy_plan(cfg, 1.0, num_train, calibrator=at_largest)
    return floor[0]


@dataclass(frozen=True)
class PrivacyPlan:
    """One client's noise and what it spends (``noise_multiplier = 0``: no noise)."""

    epsilon: float
    delta: float
    noise_multiplier: float
    sensitivity: float
    depth: int
    stage_schedule: tuple[float, int] | None = None  # node level: (q, steps) per stage
    remote_norm: float | None = None  # node level with remote rows: their L2 clip

    @property
    def sigma(self) -> float:
        """Aggregation noise std: noise multiplier x sensitivity."""
        return self.noise_multiplier * self.sensitivity

    def dpsgd(self, max_grad_norm: float) -> DPSGD | None:
        """The stages' DP-SGD (node level with noise), else ``None``."""
        if self.stage_schedule is None or self.noise_multiplier == 0:
            return None
        return DPSGD(self.noise_multiplier, max_grad_norm)

    def to_dict(self) -> dict:
        return {
            "epsilon_target": self.epsilon,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "depth": self.depth,
            "remote_norm": self.remote_norm,
            "stage_schedule": self.stage_schedule,
        }


def plan_events(plan: dict) -> list[tuple[str, object]]:
    """``(release, event)`` pairs of a plan (:meth:`PrivacyPlan.to_dict`): ``aggregation``
    (``K`` Gaussian mechanisms) and, node level, ``stage dp-sgd`` (all stages' steps)."""
    z = plan["noise_multiplier"]
    if z == 0:
        return []
    sched = tuple(plan["stage_schedule"]) if plan["stage_schedule"] else None
    events = progap_events(z, plan["depth"], sched)
    names = (["aggregation"] if plan["depth"] > 0 else []) + (
        ["stage dp-sgd"] if sched and sched[1] else []
    )
    return list(zip(names, events))


def reply_events(plan: dict, phase: str, epochs: int = 1) -> list[tuple[str, object]]:
    """``(release, event)`` pairs one reply of a client with this ``plan`` spends, the one
    definition both ledgers use (the server's, :class:`fedgraph.strategies.progap.
    ProGAPStrategy`, and the client's own, :class:`fedgraph.client_authority.ClientAuthority`):
    ``aggregation`` (one stage's aggregation: one Gaussian mechanism of the plan's multiplier;
    ProGAP paper Sec. 4, Eq. 4) or ``train`` (node level: one round's DP-SGD steps, ``steps //
    epochs``; edge level: nothing, the rounds read only the noisy aggregations). A run's
    replies give exactly :func:`plan_events`. No noise (epsilon target inf): ``[]``."""
    from ...accounting import Gaussian, SubsampledGaussian

    if not plan_events(plan):
        return []
    z = plan["noise_multiplier"]
    if phase == "aggregation":
        return [("aggregation", Gaussian(z))] if plan["depth"] > 0 else []
    if plan.get("stage_schedule"):
        q, steps = plan["stage_schedule"]
        if steps // max(epochs, 1) > 0:
            return [("stage dp-sgd", SubsampledGaussian(q, z, steps // max(epochs, 1)))]
    return []


def has_remote_rows(cfg) -> bool:
    """Whether clients release aggregation rows for each other's nodes."""
    return cfg.cross_client_edges and cfg.num_clients > 1 and cfg.depth > 0


@lru_cache(maxsize=64)
def _calibrate(epsilon, delta, depth, level, sched, accountant) -> float:
    return calibrate_progap(
        epsilon, delta, depth=depth, level=level, stage_schedule=sched, accountant=accountant
    )


def privacy_plan(cfg, epsilon: float, num_train: int, calibrator=None) -> PrivacyPlan:
    """A client's plan for its own ``epsilon`` and ``cfg.delta`` (``cfg``: a
    :class:`~fedgraph.config.ProGAPConfig`); ``num_train``: its public count of training nodes
    (node level: DP-SGD's rate and steps, ``cfg.epochs`` local epochs per stage round count).
    ``calibrator``: as the cached ``_calibrate`` (used by :func:`epsilon_floor`).

    Raises:
        fedgraph.accounting.UnreachableTarget: ``epsilon`` below :func:`epsilon_floor`."""
    node = cfg.level == "node"
    others = cfg.num_clients - 1 if has_remote_rows(cfg) else 0
    sens = aggregation_sensitivity(
        cfg.level,
        edge_unit=cfg.edge_unit,
        max_degree=cfg.max_degree,
        other_clients=others,
        summed=cfg.secure_aggregation,
    )
    if math.isinf(epsilon):
        return PrivacyPlan(math.inf, 0.0, 0.0, sens, cfg.depth)
    sched = (
        dpsgd_schedule(max(num_train, 1), cfg.dpsgd_batch_size, cfg.stage_epochs) if node else None
    )
    z = (calibrator or _calibrate)(epsilon, cfg.delta, cfg.depth, cfg.level, sched, cfg.accountant)
    return PrivacyPlan(
        epsilon, cfg.delta, z, sens, cfg.depth, sched, REMOTE_ROW_NORM if node and others else None
    )


def remote_noise(cfg, sigmas: list[float]) -> tuple[float, int] | None:
    """Noise ``(std, contributors)`` of every remote row when a client's own sigma is not
    enough, else ``None``: GAP's rule (:func:`fedgraph.methods.gap.privacy.remote_noise`,
    where it is argued) for ProGAP's config: secure aggregation, ``sigma_max / sqrt(n - 1)``
    over ``n - 1`` contributors; two-sided units (node level, undirected edges) with different
    sigmas, ``sigma_max``."""
    if not has_remote_rows(cfg) or not sigmas:
        return None
    if cfg.secure_aggregation:
        return secure_remote_sigma(sigmas, cfg.num_clients), max(cfg.num_clients - 1, 1)
    two_sided = cfg.level == "node" or cfg.edge_unit == "undirected"
    if two_sided and max(sigmas) > min(sigmas):
        return max(sigmas), 1
    return None


def gap_edges_config(cfg) -> SimpleNamespace:
    """The fields of a GAP config that :func:`fedgraph.methods.gap.client_pma.client_edges`
    reads, for ProGAP's config (the same edges: boundary edges with cross-client edges, node
    level out-degrees bounded by ``max_degree`` over local and boundary edges together)."""
    return SimpleNamespace(
        cross_client_edges=cfg.cross_client_edges,
        level=cfg.level,
        variant="gap",
        max_degree=cfg.max_degree,
    )
