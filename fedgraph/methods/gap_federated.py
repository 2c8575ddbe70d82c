"""The client half of federated GAP (Sajadmanesh et al. 2023), built from :mod:`.gap`.

A client holds a :class:`~fedgraph.data.ClientGraph`. Its privacy plan (:func:`privacy_plan`)
calibrates its own noise for its own ``(epsilon, delta)`` target and lists the events it will
spend, so that calibration, noise and ledger entry are computed in one place. PMA (Alg. 1) runs
hop by hop across clients:

1. :func:`pma_partial_sums`: from its normalized hop ``k-1``, the client sums over its edges,
   for its own nodes (local edges) and for remote nodes (boundary edges ``u -> v`` with ``u``
   here), and adds ``N(0, sigma^2 I)`` to **every** row of both (node level: each remote row
   is first clipped to L2 norm <= :data:`REMOTE_ROW_NORM`). Only the noisy remote rows leave
   the client (through the server, to the owner of ``v``).
2. :func:`pma_finish`: the owner adds the noisy partial sums it received to its own noisy sums
   and row-normalizes: hop ``k``.

One directed edge changes one row of one released sum by a unit vector, so each hop of each
client is a Gaussian mechanism with L2 sensitivity sqrt(2) for an undirected edge (the default
unit; 1 for a directed one). Node level: a node changes the <= D rows its out-edges enter and,
through its in-edges from the other ``n - 1`` clients, the row each of them releases for it:
clipped to norm 1, sensitivity sqrt(D + n - 1) (the argument, and the secure-aggregation case:
:func:`~fedgraph.methods.gap.node_sensitivity`).

Inference (``GAPConfig.inference``). Transductive: one PMA on the whole graph serves training
and evaluation. Inductive: the masks split the graph into a *training graph* (edges with both
ends in train or val nodes) and a *held-out graph* (edges with both ends in test nodes); edges
between the two are dropped (:func:`graph_nodes`, :func:`client_edges`). PMA runs on the
training graph for the classifier's inputs, and once more, after the classifier rounds, on the
held-out graph (fresh noise, same sigma and K) for the test nodes' inputs. Who decides: the
client that owns an edge's source, from both endpoints' split membership, which every client
and the server know (the split is public: a seeded permutation of the public node count, or
the published Planetoid masks); the owner of the target therefore receives sums over exactly
the edges of the current graph, and the released rows are those of the current graph's remote
nodes (fixed by the public split, not by the edges).

Privacy of the inductive mode: the two graphs share no edge and no node. Edge level: an edge
enters at most one of the two PMA runs, which therefore compose in parallel (each run is
calibrated for the client's whole epsilon). Node level: a train/val node's features and edges
enter only the training PMA and DP-SGD; a test node's only the held-out PMA (its features reach
the training graph's aggregates only through dropped edges); the held-out run's other input,
the encoder, is a released output (post-processing). So a client's epsilon is that of one PMA
run (plus DP-SGD at node level), as in the transductive mode; the ledger records the held-out
run under its own subject ``client-i (held-out graph)`` (it cannot express parallel
composition), and a client's epsilon is the larger of its two subjects', i.e. ``client-i``'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from .. import randomness as rng
from ..config import GAPConfig
from ..nn.gap import GAPClassifier, GAPEncoder, normalize_rows
from ..utils.graph import MAX_MESSAGE_ELEMENTS, bound_out_degree, scatter_sum_chunked
from .gap import DPSGD, calibrate_gap, dpsgd_schedule, edge_sensitivity, node_sensitivity


#: Node level: L2 norm bound of every remote partial-sum row before its noise (public). A
#: node's in-edges from another client are summed in that client's row for it; clipping bounds
#: their effect to this norm (:func:`~fedgraph.methods.gap.node_sensitivity`).
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
        return {"epsilon_target": self.epsilon, "delta": self.delta,
                "noise_multiplier": self.noise_multiplier, "sensitivity": self.sensitivity,
                "sigma": self.sigma, "hops": self.hops, "remote_norm": self.remote_norm,
                "encoder_schedule": self.encoder_schedule,
                "classifier_schedule": self.classifier_schedule}


def plan_events(plan: dict) -> list[tuple[str, object]]:
    """``(release, event)`` pairs a client with this plan (:meth:`PrivacyPlan.to_dict`) spends:
    ``K`` Gaussian mechanisms for PMA and, at node level, the DP-SGD steps."""
    from ..accounting import Gaussian, SubsampledGaussian

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


def heldout_events(plan: dict) -> list[tuple[str, object]]:
    """``(release, event)`` pairs of the inductive mode's PMA on the held-out graph (the ``K``
    Gaussian mechanisms of :func:`plan_events`' ``pma``, same noise): a ledger subject of its
    own, since it composes in parallel with the training graph's releases (module docstring)."""
    return [(f"{release} (held-out graph)", event) for release, event in plan_events(plan)
            if release == "pma"]


@lru_cache(maxsize=64)
def _calibrate(epsilon, delta, hops, level, enc, cls, accountant) -> float:
    return calibrate_gap(epsilon, delta, num_hops=hops, level=level, encoder_schedule=enc,
                         classifier_schedule=cls, accountant=accountant)


def has_remote_rows(cfg: GAPConfig) -> bool:
    """Whether clients release partial-sum rows for each other's nodes (PMA across clients)."""
    return cfg.cross_client_edges and cfg.variant != "mlp" and cfg.num_clients > 1


def privacy_plan(cfg: GAPConfig, epsilon: float, num_train: int) -> PrivacyPlan:
    """Calibrate a client's noise multiplier for its target ``epsilon`` (per client, for the
    whole run) and ``cfg.delta``. Edge level: PMA only, sensitivity
    :func:`~fedgraph.methods.gap.edge_sensitivity` of ``cfg.edge_unit``; node level: PMA and
    the DP-SGD of the encoder and the classifier share one noise multiplier (the paper's
    reference code), PMA's sensitivity is :func:`~fedgraph.methods.gap.node_sensitivity` with
    the ``num_clients - 1`` other clients' rows (summed under secure aggregation) and
    ``remote_norm`` :data:`REMOTE_ROW_NORM` (no clipping without noise: ``gap-inf``, ``inf``)."""
    hops = 0 if cfg.variant == "mlp" else cfg.hops
    node = cfg.level == "node"
    others = cfg.num_clients - 1 if has_remote_rows(cfg) else 0
    sens = node_sensitivity(cfg.max_degree, others, cfg.secure_aggregation) if node \
        else edge_sensitivity(cfg.edge_unit)
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
    z = _calibrate(epsilon, cfg.delta, hops, cfg.level, enc, cls, cfg.accountant)
    return PrivacyPlan(epsilon, cfg.delta, z, sens if hops else 0.0, enc, cls, hops,
                       REMOTE_ROW_NORM if node and others else None)


def build_encoder(cfg: GAPConfig, num_features: int, num_classes: int) -> GAPEncoder:
    """GAP's encoder; ``cfg.batch_norm``: the reference code's batch norms (hidden layers and
    after the normalized output), see :func:`build_classifier` for their statistics."""
    return GAPEncoder(num_features, num_classes, cfg.encoder_dim, cfg.hidden, 2, 0.0,
                      batch_norm=cfg.batch_norm, output_batch_norm=cfg.batch_norm)


def build_classifier(cfg: GAPConfig, num_features: int, num_classes: int) -> GAPClassifier:
    """GAP's classifier; ``cfg.batch_norm`` (edge level only): the reference code's batch norms
    (hidden layers and after the normalized combined hops). Federated, a client's batch norm
    normalizes with its own training nodes' statistics while training (local statistics,
    as FedAvg with batch norm does); the running statistics are averaged by the server weighted
    by training nodes with the weights, and evaluation uses them. With one client this is the
    centralized model; with several, the training statistics are the clients', so FedSGD no
    longer follows the one-client trajectory exactly (``tests/test_gap_equivalence.py``).
    Privacy: the statistics are functions of features and labels and of PMA's noisy rows, the
    same inputs as the weights (edge level): no further epsilon."""
    hops = 0 if cfg.variant == "mlp" else cfg.hops
    in_dim = num_features if cfg.variant == "mlp" else cfg.encoder_dim
    return GAPClassifier(hops, in_dim, cfg.hidden, num_classes, cfg.combine,
                         base_layers=2 if cfg.variant == "mlp" else 1, head_layers=1,
                         dropout=0.0, batch_norm=cfg.batch_norm,
                         output_batch_norm=cfg.batch_norm)


GRAPHS = ("all", "train", "test")  # PMA's edge sets: whole graph, training graph, held-out graph


def graph_nodes(test_mask: Tensor | None, graph: str) -> Tensor | None:
    """Global boolean mask ``[N]`` of the nodes of ``graph`` (``"train"``: train and val
    nodes, i.e. not test; ``"test"``: test nodes); ``None`` for ``"all"`` (every node).
    ``test_mask``: the global test mask (public, see the module docstring).

    Raises:
        ValueError: unknown ``graph``, or no test mask for a split graph.
    """
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")
    if graph == "all":
        return None
    if test_mask is None:
        raise ValueError("inductive inference needs the split's test mask")
    return test_mask.clone() if graph == "test" else ~test_mask


def client_edges(client, cfg: GAPConfig, generator: torch.Generator,
                 in_graph: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The client's directed edges ``(local [2, e], boundary [2, b])`` that PMA uses: boundary
    edges only with ``cross_client_edges``; ``in_graph`` (global boolean mask ``[N]``, from
    :func:`graph_nodes`; ``None``: all nodes): only edges with both ends in it, local and
    boundary alike; node level: then out-degree bounded by ``D`` over both (the client owns its
    nodes' out-edges)."""
    local = client.edge_index
    boundary = client.boundary_edge_index if cfg.cross_client_edges else \
        client.boundary_edge_index[:, :0]
    if in_graph is not None:
        mine = in_graph[client.node_ids]
        local = local[:, mine[local[0]] & mine[local[1]]]
        boundary = boundary[:, mine[boundary[0]] & in_graph[boundary[1]]]
    if cfg.level != "node" or cfg.variant == "gap-inf":
        return local, boundary
    n = client.num_nodes
    # Encode remote targets as ids >= n so one bounding covers both kinds of out-edges.
    remote_ids, remote_dst = torch.unique(boundary[1], return_inverse=True)
    both = torch.cat([local, torch.stack([boundary[0], remote_dst + n])], dim=1)
    kept = bound_out_degree(both, n + remote_ids.numel(), cfg.max_degree, generator)
    is_local = kept[1] < n
    rem = kept[:, ~is_local]
    return kept[:, is_local], torch.stack([rem[0], remote_ids[rem[1] - n]])


def _positions(ids: Tensor, query: Tensor) -> Tensor:
    """Position of each ``query`` id in ``ids`` (distinct non-negative ids, e.g. sorted
    global node ids), ``-1`` where it is not there: the ``searchsorted`` result for sorted
    ``ids`` by one gather from an inverse table ``[max id + 1]`` (a binary search per query
    id was half of a client's PMA hop at 1e5 nodes). On ``query``'s device."""
    if not query.numel():
        return torch.zeros(0, dtype=torch.long, device=query.device)
    if bool((query < 0).any()):
        raise ValueError("node ids must be >= 0")
    size = int(query.max()) + 1
    ids = ids.to(query.device)
    if ids.numel():
        size = max(size, int(ids.max()) + 1)
    table = torch.full((size,), -1, dtype=torch.long, device=query.device)
    table[ids] = torch.arange(ids.numel(), device=query.device)
    return table[query]


def pma_partial_sums(h_prev: Tensor, local: Tensor, boundary: Tensor, sigma: float,
                     generator: torch.Generator, remote_ids: Tensor | None = None,
                     max_elements: int = MAX_MESSAGE_ELEMENTS,
                     remote_sigma: float | None = None, remote_norm: float | None = None,
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """One hop of PMA on a client (Alg. 1 lines 3-4, split across clients).

    Args:
        h_prev: normalized hop ``k-1`` of this client's nodes ``[n, e]``.
        local: ``[2, e_l]`` local edges (local ids); boundary: ``[2, e_b]`` (local src, global dst).
        sigma: noise std (noise multiplier x sensitivity); 0 only for GAP without noise.
        remote_ids: sorted global ids of the remote rows to release. Pass every node the client
            does not hold: the released ids must not depend on the edges, or their presence
            would reveal which remote nodes are neighbours (an edge leak no noise covers).
            ``None``: the remote targets of ``boundary`` (only for tests and non-private use).
        max_elements: memory cap of the per-hop aggregation: edges are summed in chunks whose
            ``[chunk, e]`` message block has at most this many elements
            (:func:`~fedgraph.utils.graph.scatter_sum_chunked`); no ``[E, e]`` block.
        remote_sigma: noise std of the remote rows (``None``: ``sigma``). Secure aggregation
            (:func:`secure_remote_sigma`): the server learns only the sum over the clients of a
            node's remote rows, so each adds a share of the noise. ``> 0`` when ``sigma > 0``.
        remote_norm: node level (:attr:`PrivacyPlan.remote_norm`): every remote row is
            projected onto the L2 ball of this radius before its noise, so that a node's
            in-edges from this client change its row by at most this much; ``None``: no
            clipping (edge level, where one edge changes one row by <= 1 anyway).

    Raises:
        ValueError: ``sigma`` not finite and >= 0; ``remote_sigma`` not finite and > 0 (>= 0
            when ``sigma == 0``); ``remote_norm`` not > 0; ``remote_ids`` missing a boundary
            target.

    Returns:
        ``(local_sums [n, e], remote_ids [m], remote_sums [m, e])``, every row noised, on
        ``h_prev``'s device (edges and ids may be on the CPU; the noise is drawn from the CPU
        ``generator``, so a run is the same on CPU and GPU up to float rounding).
    """
    from ..mechanisms._checks import check_noise_scale

    sigma = check_noise_scale(sigma, "sigma", allow_zero=True)
    remote_sigma = sigma if remote_sigma is None else check_noise_scale(
        remote_sigma, "remote_sigma", allow_zero=sigma == 0)
    n, e = h_prev.shape
    dev = h_prev.device
    local = local.to(dev)
    local_sums = scatter_sum_chunked(h_prev, local[0], local[1], n, max_elements)
    if remote_ids is None:
        remote_ids = torch.unique(boundary[1])
    pos = _positions(remote_ids, boundary[1])
    if bool((pos < 0).any()):
        raise ValueError("remote_ids must contain every boundary target")
    remote_sums = scatter_sum_chunked(h_prev, boundary[0].to(dev), pos.to(dev),
                                      remote_ids.numel(), max_elements)
    if remote_norm is not None:
        if not remote_norm > 0:
            raise ValueError(f"remote_norm must be > 0 (or None), got {remote_norm}")
        norms = remote_sums.norm(dim=1, keepdim=True)
        remote_sums = remote_sums * (remote_norm / norms.clamp_min(remote_norm))
    # the Gaussian mechanism, in place: under a CSPRNG the noise is added in float64 and
    # rounded once (fedgraph.randomness.add_gaussian_); a torch.Generator: += sigma * randn
    if sigma > 0:
        rng.add_gaussian_(local_sums, sigma, generator)
    if remote_sigma > 0:
        rng.add_gaussian_(remote_sums, remote_sigma, generator)
    return local_sums, remote_ids, remote_sums


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
      own ``sigma_c`` (:func:`~fedgraph.methods.gap.node_sensitivity`), so every remote row gets
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
    own plan's. It cannot see the shares the other clients were sent: an honest server sends
    every client the same value (:func:`remote_noise`).

    Raises:
        ValueError: ``remote_sigma * sqrt(contributors) < own_sigma`` (the client refuses to
            release).
    """
    if not remote_sigma >= 0 or remote_sigma * math.sqrt(max(contributors, 1)) < own_sigma * (1 - 1e-9):
        raise ValueError(f"remote noise std {remote_sigma:.4g} over {contributors} client(s) is "
                         f"below this client's sigma {own_sigma:.4g}; refusing to release")


def masked_release(ids: Tensor, sums: Tensor, private_key: bytes, public_keys: list[bytes],
                   me: int, owner: Tensor, context: str) -> dict[str, Tensor]:
    """Secure aggregation of a client's remote rows: what leaves the client instead of
    ``{"ids", "sums"}`` (:func:`fedgraph.secure_aggregation.mask_rows`).

    Args:
        ids: ``[m]`` global ids of the remote rows (every node of the graph held elsewhere).
        sums: ``[m, e]`` the noisy remote rows (:func:`pma_partial_sums`).
        private_key: this client's X25519 private key (never sent); public_keys: every
            client's, by client index; me: this client's index.
        owner: ``[N]`` client index owning each node (from the server, public).
        context: the masks' context (run, graph, hop), distinct for every release.

    Returns:
        ``{"ids": [m], "masked": [m, e] int64}`` (the ``uint64`` ring elements' bits): uniform
        on the ring for the server; the masks cancel in the sum over the ``n - 1``
        contributors of each node.
    """
    import numpy as np

    from ..secure_aggregation import mask_rows

    masked = mask_rows(sums.detach().double().cpu().numpy(), ids.cpu().numpy(),
                       owner.cpu().numpy(), me, private_key, public_keys, context)
    return {"ids": ids.cpu(), "masked": torch.from_numpy(masked.view(np.int64))}


def route_partial_sums(released: list[tuple[Tensor, Tensor]], owner: Tensor,
                       num_clients: int) -> list[tuple[Tensor, Tensor]]:
    """The server's step of federated PMA: every released row (a global node id and its noisy
    partial sum) goes to the client that holds the node, ``owner[id]``.

    Per reply one stable sort of its rows by owner and a split (no per-client loop over the
    rows); each client receives the rows the per-client loop ``for (ids, sums) in released:
    for i: ids[owner[ids] == i]`` gave, in the same order (replies in the order of
    ``released``, rows in their order), so :func:`pma_finish` adds them in the same order:
    the same floats. Memory: as the loop's (the routed rows, then one copy per client).

    Args:
        released: per reply ``(ids [m], sums [m, e])`` (CPU tensors from the messages).
        owner: ``[N]`` index of the client holding each node (rows of a node with a negative
            owner are dropped, as the loop dropped them).
        num_clients: number of clients.
    Returns:
        per client ``i``: ``(ids [m_i], sums [m_i, e])``, empty ``[0]``/``[0, e]`` if none.
    """
    chunks: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(num_clients)]
    dim = 0
    for ids, sums in released:
        dim = sums.shape[1] if sums.dim() == 2 else dim
        dst = owner[ids]
        if ids.numel() and int(dst.min()) < 0:
            keep = dst >= 0
            ids, sums, dst = ids[keep], sums[keep], dst[keep]
        order = torch.sort(dst, stable=True).indices
        counts = torch.bincount(dst, minlength=num_clients).tolist()
        for i, part in enumerate(zip(ids[order].split(counts), sums[order].split(counts))):
            if counts[i]:
                chunks[i].append(part)
    return [(torch.cat([c[0] for c in ch]), torch.cat([c[1] for c in ch])) if ch else
            (torch.zeros(0, dtype=torch.long), torch.zeros(0, dim)) for ch in chunks]


def pma_finish(local_sums: Tensor, node_ids: Tensor, incoming_ids: Tensor,
               incoming_sums: Tensor) -> Tensor:
    """Add the noisy partial sums received for this client's nodes and row-normalize (Alg. 1
    line 5). ``incoming_ids``: global ids (each must be one of ``node_ids``). Returns ``[n, e]``
    on ``local_sums``' device (the received sums, CPU tensors from a message, are moved there)."""
    out = local_sums.clone()
    if incoming_ids.numel():
        pos = _positions(node_ids, incoming_ids)
        if bool((pos < 0).any()):
            raise ValueError("received partial sums for nodes this client does not hold")
        out.index_add_(0, pos.to(out.device), incoming_sums.to(out.device, out.dtype))
    return normalize_rows(out)
