r"""GAP's privacy argument in one place: what one release can change (sensitivity), the events a
run spends, the noise calibrated for a target, and a federated client's plan.

Privacy (GAP paper Sec. 5; its theorems were lost in the text extraction, rebuilt from the text
and the reference code github.com/sisaman/GAP):

* Edge level: PMA (:mod:`.aggregation`) is ``K`` Gaussian mechanisms with L2 sensitivity
  :math:`\sqrt 2` per hop for the default unit, an undirected edge stored as two directed edges
  (rows ``u`` and ``v`` both change), or 1 for a directed edge ``u -> v`` (adding it adds the
  unit-norm row :math:`\check X^{(k-1)}_u` to row ``v``; the paper's unit, one half of an
  undirected friendship) (:func:`edge_sensitivity`). EM and CM do not use the edges, so
  edge-level DP costs PMA only.
* Node level: out-degrees bounded by ``D`` (:func:`fedgraph.utils.bound_out_degree`, the
  reference code's ``BoundOutDegree``), sensitivity :math:`\sqrt D` per hop centrally,
  :math:`\sqrt{D + n - 1}` across ``n`` clients (:func:`node_sensitivity`); EM and CM are
  trained with DP-SGD (Poisson sampling, per-example clipping, Opacus; :mod:`.training`). The
  reference code calibrates **one** noise multiplier shared by the encoder's DP-SGD, PMA (noise
  std = multiplier x :math:`\sqrt D`) and the classifier's DP-SGD, by root finding on the
  composed privacy curve; :func:`calibrate_gap` does the same.
* ``delta="auto"`` follows the reference code: :math:`10^{-\#digits}` of the number of edges
  (edge level) or training nodes (node level), i.e. :math:`\delta < 1/|E|` or :math:`1/N`
  (:func:`default_delta`).

Federated (:mod:`.client_pma` runs PMA hop by hop across clients): a client's privacy plan
(:func:`privacy_plan`) calibrates its own noise for its own ``(epsilon, delta)`` target and lists
the events it will spend (:func:`plan_events`), so that calibration, noise and ledger entry are
computed in one place. One directed edge changes one row of one released sum by a unit vector,
so each hop of each client is a Gaussian mechanism with L2 sensitivity sqrt(2) for an undirected
edge (the default unit; 1 for a directed one). Node level: a node changes the <= D rows its
out-edges enter and, through its in-edges from the other ``n - 1`` clients, the row each of them
releases for it: clipped to norm :data:`REMOTE_ROW_NORM`, sensitivity sqrt(D + n - 1) (the
argument, and the secure-aggregation case: :func:`node_sensitivity`). The remote rows carry at
least every client's own sigma where a client's own would not do (:func:`remote_noise`,
:func:`secure_remote_sigma`); a client checks what it is sent (:func:`check_remote_sigma`).

Privacy of the inductive mode (``GAPConfig.inference``, :func:`~.client_pma.graph_nodes`): the
training graph and the held-out graph share no edge and no node. Edge level: an edge enters at
most one of the two PMA runs, which therefore compose in parallel (each run is calibrated for the
client's whole epsilon). Node level: a train/val node's features and edges enter only the
training PMA and DP-SGD; a test node's only the held-out PMA (its features reach the training
graph's aggregates only through dropped edges); the held-out run's other input, the encoder, is a
released output (post-processing). So a client's epsilon is that of one PMA run (plus DP-SGD at
node level), as in the transductive mode; the ledger records the held-out run under its own
subject ``client-i (held-out graph)`` (:func:`heldout_events`; the ledger cannot express parallel
composition), and a client's epsilon is the larger of its two subjects', i.e. ``client-i``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ...config import GAPConfig
from .training import DPSGD, dpsgd_schedule

LEVELS = ("edge", "node")


def edge_sensitivity(unit: str = "undirected") -> float:
    r"""L2 sensitivity of one PMA hop for edge-level DP: :math:`\sqrt 2` for an undirected edge
    stored as ``u -> v`` and ``v -> u`` (rows ``u`` and ``v`` both change; the default: every
    graph fedgraph loads is undirected); 1 for a directed edge ``u -> v`` (row ``v`` changes by
    a unit vector; GAP's paper protects this unit, which on an undirected graph is half a
    friendship)."""
    if unit == "directed":
        return 1.0
    if unit == "undirected":
        return math.sqrt(2.0)
    raise ValueError(f"edge unit: unknown {unit!r}; allowed: directed, undirected")


def node_sensitivity(max_degree: int, other_clients: int = 0, summed: bool = False) -> float:
    r"""L2 sensitivity of one PMA hop for node-level DP: :math:`\sqrt{D + m}` with ``m`` other
    clients releasing rows (:math:`\sqrt{D + m^2}` when they are ``summed``), :math:`\sqrt D`
    centrally (``m = 0``).

    Neighbouring relation (GAP, paper 000, Sec. 5 "node-level privacy": a node influences at
    most ``D`` other nodes): node ``w`` is removed with all its edges, in and out, on every
    client (in the code: ``w`` becomes isolated; the ids that rows are released for are public
    and do not change), on the degree-bounded graph (the caveat of
    :mod:`fedgraph.utils.graph`: the sampling of out-edges is taken as given). Per hop ``k``,
    given the previous hop (adaptive composition), whose rows all have L2 norm <= 1
    (row-normalized), the rows that change are:

    1. **Rows that ``w``'s out-edges enter**, released by ``w``'s own client: its local sums
       (kept by the client, an output of the same Gaussian mechanism) and its remote partial
       sums (released to the server, routed to the target's owner). Out-degrees are bounded by
       ``D`` over local and boundary edges together, so at most ``D`` rows change, each by
       ``w``'s row (norm <= 1); a remote row is clipped to norm <= 1 before its noise (below),
       and clipping is a projection onto a ball, 1-Lipschitz, so it still changes by <= 1.
    2. **Rows that ``w``'s in-edges enter**: an in-edge ``u -> w`` from another client ``X`` is
       ``X``'s out-edge, summed in ``X``'s released row for ``w``. Nothing bounds ``w``'s
       in-degree from ``X`` (removing ``w`` changed that row by up to its in-degree, e.g. 168),
       so federated node-level PMA clips every remote row to L2 norm <= 1
       (:data:`REMOTE_ROW_NORM`, a public constant): removing ``w`` changes ``X``'s row for
       ``w`` by <= 1 (from ``clip(s)`` to ``clip(0) = 0``), and
       removing a node ``u`` at ``X`` still changes each of ``X``'s rows by <= 1 (1-Lipschitz),
       as in 1. So each of the ``m = num_clients - 1`` other clients releases one row that
       changes by <= 1. With secure aggregation the server sees only the sum over those ``m``
       clients of their rows for ``w``, which can change by ``m`` (all in one direction):
       ``summed=True`` counts it as one row of norm ``m``.
    3. **``w``'s own row at its own client** (the sum over its local in-edges plus the noisy rows
       received for it) is never released: the client keeps it as ``w``'s input to the
       classifier, whose training is DP-SGD at node level (``w``'s per-example gradient is
       clipped whatever its input), and it reaches other nodes only through ``w``'s out-edges,
       normalized (counted in 1 at the next hop). It is ``w``'s own data, like its features.
    4. Nothing else: other nodes' rows and out-edges are unchanged given the previous hop.

    So the change over all rows of all clients is at most
    :math:`\sqrt{D \cdot 1^2 + m \cdot 1^2}` (``summed``: :math:`\sqrt{D + m^2}`). Each client
    calibrates its noise multiplier ``z`` for its own target and uses std
    ``sigma = z x`` this sensitivity on its local rows; remote rows carry at least every
    client's own sigma (the largest, :func:`remote_noise`), so for the owner ``c`` of ``w``
    the ratio sensitivity / noise over all changed rows is at most
    :math:`\sqrt{D / \sigma_c^2 + m / \sigma_{max}^2} \le 1 / z_c`: ``K`` Gaussian mechanisms
    with multiplier ``z_c`` hold against the server, the other clients and the released model.

    Args:
        max_degree: ``D >= 1``, the out-degree bound.
        other_clients: ``m >= 0``, the clients other than ``w``'s that release a (clipped) row
            for ``w``: ``num_clients - 1`` with cross-client edges, else 0.
        summed: the server learns only the sum of those ``m`` rows (secure aggregation).

    Raises:
        ValueError: ``max_degree`` not an integer >= 1, or ``other_clients`` not an integer >= 0.
    """
    if isinstance(max_degree, bool) or int(max_degree) != max_degree or max_degree < 1:
        raise ValueError(f"max_degree must be an integer >= 1, got {max_degree}")
    if isinstance(other_clients, bool) or int(other_clients) != other_clients or other_clients < 0:
        raise ValueError(f"other_clients must be an integer >= 0, got {other_clients}")
    m = int(other_clients)
    return math.sqrt(max_degree + (m * m if summed else m))


def default_delta(count: int) -> float:
    r""":math:`10^{-d}` with ``d`` the number of digits of ``count`` (< 1/count): the reference
    code's ``delta="auto"`` (``count`` = edges at edge level, training nodes at node level)."""
    return 10.0 ** -len(str(int(count)))


def gap_events(
    noise_multiplier_pma: float,
    num_hops: int,
    *,
    node_level: bool = False,
    encoder_dpsgd: tuple[float, float, int] | None = None,
    classifier_dpsgd: tuple[float, float, int] | None = None,
) -> list:
    """Privacy events of one GAP run (for :func:`fedgraph.accounting.compose_epsilon`).

    Args:
        noise_multiplier_pma: PMA noise std / sensitivity (the sensitivity, 1, sqrt(2) or
            sqrt(D), is already divided out).
        num_hops: ``K``: PMA is ``K`` Gaussian mechanisms.
        node_level: node-level DP; then the encoder and classifier must come with their DP-SGD
            (a private module trained without it would leak), unless it was not trained
            (``steps = 0``).
        encoder_dpsgd, classifier_dpsgd: ``(sample_rate, noise_multiplier, steps)`` of each
            module's DP-SGD (see :func:`dpsgd_schedule`), or ``None``.

    Returns:
        list of events: ``Gaussian(noise_multiplier_pma, count=K)`` (if ``K > 0``) and one
        ``SubsampledGaussian`` per DP-SGD training with ``steps > 0``.
    """
    from ...accounting import Gaussian, SubsampledGaussian

    if node_level and (encoder_dpsgd is None or classifier_dpsgd is None):
        raise ValueError(
            "node-level GAP needs encoder_dpsgd and classifier_dpsgd "
            "(use (q, noise, 0) for a module that is not trained)"
        )
    events = []
    if num_hops > 0:
        events.append(Gaussian(noise_multiplier_pma, count=num_hops))
    for spec in (encoder_dpsgd, classifier_dpsgd):
        if spec is not None and spec[2] > 0:
            q, noise, steps = spec
            events.append(SubsampledGaussian(q, noise, steps))
    return events


def calibrate_gap(
    target_epsilon: float,
    delta: float,
    *,
    num_hops: int,
    level: str = "edge",
    encoder_schedule: tuple[float, int] | None = None,
    classifier_schedule: tuple[float, int] | None = None,
    accountant: str = "prv",
) -> float:
    r"""Smallest noise multiplier for which GAP meets ``(target_epsilon, delta)``.

    Edge level: PMA only (``K`` Gaussian mechanisms; schedules must be ``None``). Node level:
    one multiplier shared by the encoder's DP-SGD, PMA and the classifier's DP-SGD (the
    reference code's choice, ``ComposedNoisyMechanism`` with one ``noise_scale``), found by
    root finding on the composed curve.

    Args:
        target_epsilon: ``> 0`` (``inf``: returns 0, no noise).
        delta: target delta.
        num_hops: ``K``.
        level: ``"edge"`` or ``"node"``.
        encoder_schedule, classifier_schedule: ``(sample_rate, steps)`` from
            :func:`dpsgd_schedule` (node level; ``None`` or ``steps = 0`` if not trained).
        accountant: passed to :func:`fedgraph.accounting.calibrate` / ``compose_epsilon``.

    Returns:
        the noise multiplier (PMA's noise std is it times the sensitivity; DP-SGD's noise std
        is it times the clipping norm).
    Raises:
        ValueError: unknown ``level``; ``delta`` outside ``[1e-12, 1)``
            (:func:`fedgraph.accounting.check_delta`).
        fedgraph.accounting.CalibrationError: the search ran out of its evaluation or time
            budget (:func:`fedgraph.accounting.calibrate`).
    """
    from ...accounting import calibrate, check_delta

    check_delta(delta)
    make_events = gap_noise_events(num_hops, level, encoder_schedule, classifier_schedule)
    if math.isinf(target_epsilon) or make_events is None:
        return 0.0
    return float(calibrate(target_epsilon, delta, make_events, accountant=accountant))


def gap_noise_events(
    num_hops: int,
    level: str = "edge",
    encoder_schedule: tuple[float, int] | None = None,
    classifier_schedule: tuple[float, int] | None = None,
):
    """``make_events(noise_multiplier) -> list[Event]`` of what :func:`calibrate_gap`
    calibrates (arguments as there), or ``None`` when nothing is noised (no hop at edge level;
    no hop and no DP-SGD step at node level).

    Raises:
        ValueError: unknown ``level``; schedules at edge level.
    """
    if level not in LEVELS:
        raise ValueError(f"level: unknown {level!r}; allowed: {', '.join(LEVELS)}")
    enc = encoder_schedule if encoder_schedule is not None else (1.0, 0)
    cls = classifier_schedule if classifier_schedule is not None else (1.0, 0)
    if level == "edge":
        if encoder_schedule is not None or classifier_schedule is not None:
            raise ValueError("edge-level GAP trains EM and CM without DP-SGD: no schedules")
        if num_hops == 0:
            return None
    elif num_hops == 0 and enc[1] == 0 and cls[1] == 0:
        return None

    def make_events(z: float) -> list:
        return gap_events(
            z,
            num_hops,
            node_level=level == "node",
            encoder_dpsgd=(enc[0], z, enc[1]) if level == "node" else None,
            classifier_dpsgd=(cls[0], z, cls[1]) if level == "node" else None,
        )

    return make_events


def _compose(events: list, delta: float, accountant: str) -> float:
    from ...accounting import compose_epsilon

    return float(compose_epsilon(events, delta, accountant=accountant))


#: Node level: L2 norm bound of every remote partial-sum row before its noise (public). A
#: node's in-edges from another client are summed in that client's row for it; clipping bounds
#: their effect to this norm (:func:`node_sensitivity`).
REMOTE_ROW_NORM = 1.0


@dataclass(frozen=True)
class PrivacyPlan:
    """One client's noise and the events it spends (``noise_multiplier = 0``: no noise)."""

    epsilon: float
    delta: float
    noise_multiplier: float
    sensitivity: float
    encoder_schedule: tuple[float, int] | None  # (sample rate, steps) of DP-SGD, node level
    classifier_schedule: tuple[float, int] | None
    hops: int
    remote_norm: float | None = None  # node level: remote rows clipped to this L2 norm

    @property
    def sigma(self) -> float:
        """PMA noise std: noise multiplier x sensitivity."""
        return self.noise_multiplier * self.sensitivity

    def dpsgd(self, cfg: GAPConfig) -> DPSGD | None:
        if self.encoder_schedule is None or self.noise_multiplier == 0:
            return None
        return DPSGD(self.noise_multiplier, cfg.max_grad_norm)

    def to_dict(self) -> dict:
        return {
            "epsilon_target": self.epsilon,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "hops": self.hops,
            "remote_norm": self.remote_norm,
            "encoder_schedule": self.encoder_schedule,
            "classifier_schedule": self.classifier_schedule,
        }


def plan_events(plan: dict) -> list[tuple[str, object]]:
    """``(release, event)`` pairs a client with this plan (:meth:`PrivacyPlan.to_dict`) spends:
    ``K`` Gaussian mechanisms for PMA and, at node level, the DP-SGD steps."""
    from ...accounting import Gaussian, SubsampledGaussian

    z = plan["noise_multiplier"]
    if z == 0:
        return []
    out = []
    if plan["hops"] > 0 and plan["sensitivity"] > 0:
        out.append(("pma", Gaussian(z, count=plan["hops"])))
    for name in ("encoder", "classifier"):
        sched = plan[f"{name}_schedule"]
        if sched is not None and sched[1] > 0:
            out.append((f"{name} dp-sgd", SubsampledGaussian(sched[0], z, sched[1])))
    return out


def reply_events(plan: dict, phase: str, rounds: int = 1) -> list[tuple[str, object]]:
    """``(release, event)`` pairs one reply of a client with this ``plan``
    (:meth:`PrivacyPlan.to_dict`) spends: the one definition both ledgers use, the server's
    (:class:`fedgraph.strategies.gap.GAPStrategy`, when the reply arrives) and the client's own
    (:class:`fedgraph.client_authority.ClientAuthority`, before the reply leaves).

    ``phase``: ``pma`` or ``pma (held-out graph)`` (one PMA hop: one Gaussian mechanism of the
    plan's multiplier; GAP Sec. 4.2, Thm. 1), ``encoder`` / ``classifier`` (one FedAvg round:
    at node level its share of the DP-SGD steps, ``steps // rounds``; at edge level nothing:
    the encoder reads no edge, the classifier only PMA's noisy output). A run's replies give
    exactly :func:`plan_events` (and :func:`heldout_events`). No noise (epsilon target inf):
    ``[]``.
    """
    from ...accounting import Gaussian, SubsampledGaussian

    if not plan_events(plan):
        return []
    z = plan["noise_multiplier"]
    if phase.startswith("pma"):
        if plan["hops"] > 0 and plan["sensitivity"] > 0:
            return [(phase, Gaussian(z))]
        return []
    sched = plan.get(f"{phase}_schedule")
    if sched is not None and sched[1] > 0:
        return [(f"{phase} dp-sgd", SubsampledGaussian(sched[0], z, sched[1] // max(rounds, 1)))]
    return []


def heldout_events(plan: dict) -> list[tuple[str, object]]:
    """``(release, event)`` pairs of the inductive mode's PMA on the held-out graph (the ``K``
    Gaussian mechanisms of :func:`plan_events`' ``pma``, same noise): a ledger subject of its
    own, since it composes in parallel with the training graph's releases (module docstring)."""
    return [
        (f"{release} (held-out graph)", event)
        for release, event in plan_events(plan)
        if release == "pma"
    ]


@lru_cache(maxsize=64)
def _calibrate(epsilon, delta, hops, level, enc, cls, accountant) -> float:
    return calibrate_gap(
        epsilon,
        delta,
        num_hops=hops,
        level=level,
        encoder_schedule=enc,
        classifier_schedule=cls,
        accountant=accountant,
    )


def has_remote_rows(cfg: GAPConfig) -> bool:
    """Whether clients release partial-sum rows for each other's nodes (PMA across clients)."""
    return cfg.cross_client_edges and cfg.variant != "mlp" and cfg.num_clients > 1


def epsilon_floor(cfg: GAPConfig, num_train: int) -> float:
    """The smallest per-client target epsilon a client with ``num_train`` training nodes can be
    calibrated for under ``cfg`` (hops, level, rounds, delta, accountant): what its releases
    spend at :data:`~fedgraph.accounting.MAX_NOISE_MULTIPLIER`, the largest noise multiplier
    :func:`privacy_plan` searches (``0``: it adds no noise;
    :func:`fedgraph.accounting.epsilon_floor`). A target below it raises
    :class:`~fedgraph.accounting.UnreachableTarget` in :func:`privacy_plan`; the preflight
    checks it first (:func:`fedgraph.federation.check_epsilons_reachable`)."""
    from ...accounting import MAX_NOISE_MULTIPLIER
    from ...accounting import epsilon_floor as floor_of

    floor = [0.0]

    def at_largest(epsilon, delta, hops, level, enc, cls, accountant) -> float:
        floor[0] = floor_of(gap_noise_events(hops, level, enc, cls), delta, accountant)
        return MAX_NOISE_MULTIPLIER

    privacy_plan(cfg, 1.0, num_train, calibrator=at_largest)
    return floor[0]


def privacy_plan(cfg: GAPConfig, epsilon: float, num_train: int, calibrator=None) -> PrivacyPlan:
    """Calibrate a client's noise multiplier for its target ``epsilon`` (per client, for the
    whole run) and ``cfg.delta``. Edge level: PMA only, sensitivity
    :func:`edge_sensitivity` of ``cfg.edge_unit``; node level: PMA and
    the DP-SGD of the encoder and the classifier share one noise multiplier (the paper's
    reference code), PMA's sensitivity is :func:`node_sensitivity` with
    the ``num_clients - 1`` other clients' rows (summed under secure aggregation) and
    ``remote_norm`` :data:`REMOTE_ROW_NORM` (no clipping without noise: ``gap-inf``, ``inf``).
    ``calibrator``: as the cached ``_calibrate`` (used by :func:`epsilon_floor`).

    Raises:
        fedgraph.accounting.UnreachableTarget: ``epsilon`` below :func:`epsilon_floor`."""
    hops = 0 if cfg.variant == "mlp" else cfg.hops
    node = cfg.level == "node"
    others = cfg.num_clients - 1 if has_remote_rows(cfg) else 0
    sens = (
        node_sensitivity(cfg.max_degree, others, cfg.secure_aggregation)
        if node
        else edge_sensitivity(cfg.edge_unit)
    )
    if cfg.variant == "gap-inf" or math.isinf(epsilon):
        return PrivacyPlan(math.inf, 0.0, 0.0, sens, None, None, hops)
    enc = cls = None
    if node:
        b = cfg.dpsgd_batch_size
        enc_epochs = 0 if cfg.variant == "mlp" else cfg.encoder_rounds * cfg.local_epochs
        enc = dpsgd_schedule(max(num_train, 1), b, enc_epochs)
        cls = dpsgd_schedule(max(num_train, 1), b, cfg.classifier_rounds * cfg.local_epochs)
    elif hops == 0:  # MLP at edge level touches no edge
        return PrivacyPlan(epsilon, cfg.delta, 0.0, 0.0, None, None, 0)
    z = (calibrator or _calibrate)(epsilon, cfg.delta, hops, cfg.level, enc, cls, cfg.accountant)
    return PrivacyPlan(
        epsilon,
        cfg.delta,
        z,
        sens if hops else 0.0,
        enc,
        cls,
        hops,
        REMOTE_ROW_NORM if node and others else None,
    )


def undirected_edge_epsilon(cfg, plans: list[dict]) -> dict[str, float]:
    """``edge_unit = "directed"``: what one undirected edge (both halves, two rows) costs each
    client, per client at its delta (the report's ``privacy.undirected_edge_epsilon``; GAP,
    and ProGAP with ``hops = depth``): its ``K`` PMA hops as Gaussian mechanisms of
    sensitivity 1 per half, one half at the client's sigma, the other at the smallest sigma
    that can carry it (a cross-client edge's other half is another client's row, each
    client's own sigma without secure aggregation; else the client's own).

    Args:
        cfg: a GAP or ProGAP config (``cross_client_edges``, ``num_clients``,
            ``secure_aggregation``, ``accountant``).
        plans: one dict per client with ``partition_id``, ``sigma``, ``hops``, ``delta``.
    Returns:
        ``{"client-<i>": epsilon}``.
    """
    from ...accounting import Gaussian, compose_epsilon

    remote = cfg.cross_client_edges and cfg.num_clients > 1 and not cfg.secure_aggregation
    low = min(p["sigma"] for p in plans)
    out = {}
    for p in plans:
        other = min(low, p["sigma"]) if remote else p["sigma"]
        if not p["hops"] or other == 0:
            out[f"client-{p['partition_id']}"] = 0.0 if not p["hops"] else math.inf
            continue
        z = 1 / math.sqrt(1 / p["sigma"] ** 2 + 1 / other**2)  # std / sensitivity sqrt 2
        out[f"client-{p['partition_id']}"] = float(
            compose_epsilon([Gaussian(z, count=p["hops"])], p["delta"], accountant=cfg.accountant)
        )
    return out


def secure_remote_sigma(sigmas: list[float], num_clients: int) -> float:
    """Noise std of every client's remote rows under secure aggregation.

    A node's row of hop ``k`` is the sum of the partial sums of the ``num_clients - 1`` clients
    that do not hold it (every client releases a row for every node held elsewhere). When the
    server (and the owner, who receives the sum) learns only that sum, its noise is the sum of
    the ``n - 1`` shares: with std ``sigma_max / sqrt(n - 1)`` each, std ``sigma_max``, at least
    every client's own ``sigma`` (``sigmas``: the clients' calibrated PMA noise stds). So an edge
    ``u -> v`` of any client, which changes one summed row by at most the sensitivity, is
    protected by a Gaussian mechanism at least as noisy as its own client's plan, and every
    client's epsilon is at most its target. Trust assumption (stated in the report): the
    protocol reveals only the sums, the server does not collude with clients, and every client
    adds its share (a client that does not reply fails the run).

    Returns ``sigma_max`` for one client (no remote rows), ``0.0`` when nobody adds noise.
    """
    if not sigmas:
        raise ValueError("secure aggregation needs the clients' sigmas")
    sigma_max = max(sigmas)
    return sigma_max / math.sqrt(num_clients - 1) if num_clients > 1 else sigma_max


def remote_noise(cfg: GAPConfig, sigmas: list[float]) -> tuple[float, int] | None:
    """Noise of the remote rows when a client's own ``sigma`` is not enough, else ``None``.

    Returns ``(std, contributors)``: every client adds ``std`` to each remote row, and
    ``contributors`` clients' noise adds up in the row an observer sees.

    * ``secure_aggregation``: :func:`secure_remote_sigma`, ``n - 1`` contributors.
    * Edge level with ``edge_unit = "undirected"`` and clients of different ``sigma``: an
      undirected cross-client edge ``{u, v}`` (``u`` at client c, ``v`` at client i) is released
      twice, in c's row for ``v`` and in i's row for ``u``. Client c calibrated for both halves
      at its own ``sigma_c``; if ``sigma_i < sigma_c``, the pair leaks more than c's target. So
      every remote row gets ``sigma_max`` (1 contributor): both halves have at least the noise
      either client planned for. Local rows (both halves at the same client) keep its sigma.
    * Node level and clients of different ``sigma``: removing node ``w`` of client c changes
      the (clipped) row every other client releases for ``w``; c calibrated for them at its
      own ``sigma_c`` (:func:`node_sensitivity`), so every remote row gets
      ``sigma_max`` (1 contributor), as above.
    """
    if not has_remote_rows(cfg) or not sigmas:
        return None  # no remote rows
    if cfg.secure_aggregation:
        return secure_remote_sigma(sigmas, cfg.num_clients), max(cfg.num_clients - 1, 1)
    two_sided = cfg.level == "node" or cfg.edge_unit == "undirected"
    if two_sided and max(sigmas) > min(sigmas):
        return max(sigmas), 1
    return None


def check_remote_sigma(remote_sigma: float, own_sigma: float, contributors: int) -> None:
    """A client's check before it adds ``remote_sigma`` instead of its own ``sigma`` to its
    remote rows: the noise of ``contributors`` clients adding up in a row must be at least its
    own plan's. ``contributors`` is the client's own count (:func:`own_contributors`), never
    the server's word. It cannot see the shares the other clients were sent: an honest server
    sends every client the same value (:func:`remote_noise`).

    Raises:
        ValueError: ``remote_sigma * sqrt(contributors) < own_sigma`` (the client refuses to
            release).
    """
    if not remote_sigma >= 0 or remote_sigma * math.sqrt(max(contributors, 1)) < own_sigma * (
        1 - 1e-9
    ):
        raise ValueError(
            f"remote noise std {remote_sigma:.4g} over {contributors} client(s) is "
            f"below this client's sigma {own_sigma:.4g}; refusing to release"
        )


def own_contributors(
    secure_aggregation: bool, keys, claimed: int | None = None, *, owned: bool = True
) -> int:
    """How many clients' noise a client may assume adds up in each of its remote rows, counted
    by the client itself: with secure aggregation and a key list it verified (``keys``, a
    :class:`fedgraph.secure_aggregation.VerifiedKeys`), the verified contributors of a row by
    the masking rule (:meth:`~fedgraph.secure_aggregation.VerifiedKeys.contributors`: every
    verified client but the row's owner, ``owned``; or all of them); otherwise 1, whatever the
    server says (without masking, the server reads each client's row alone).

    ``claimed``: the request's ``remote-contributors`` (the server's figure), only
    cross-checked.

    Raises:
        ValueError: ``claimed`` differs from the client's own count (the client refuses to
            release).
    """
    own = keys.contributors(owned) if secure_aggregation and keys is not None else 1
    if claimed is not None and int(claimed) != own:
        raise ValueError(
            f"the server says {int(claimed)} clients' rows are summed per remote "
            f"node; this client counts {own} (its verified peers under secure "
            f"aggregation, else 1); refusing to release"
        )
    return own
