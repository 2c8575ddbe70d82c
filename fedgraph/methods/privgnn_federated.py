"""Federated PrivGNN (Olatunji, Funke & Khosla, TMLR 2023, arXiv 2109.08907), built from
:mod:`.privgnn`: who holds which graph, the query message, a client's answers within its
budget, and the server's aggregation of partial answers.

Data (paper Sec. 3, App. F): every party loads the dataset and applies the same seeded
:func:`~.privgnn.privgnn_split`; the server keeps the *public* graph (query pool and labelled
test nodes), the *private* graph is spread over the clients by the run's partitioner and each
client keeps only its own part (:class:`~fedgraph.data.ClientGraph`, all nodes labelled).

Protocol, one message type ``query.privgnn`` per query round:

1. Server -> client: the queries' public ``hops``-hop neighbourhoods (:func:`encode_queries`;
   public data only) and, with ``projection-dim > 0``, a PCA map fitted on the public features.
2. Client -> server (:func:`client_answer`): Laplace-noised teacher posteriors (or votes) for
   the first ``m`` queries, ``m`` = what its epsilon budget still allows (0: a refusal), and
   counts that depend only on public parameters (asked, answered, limit, target).
3. Server (:func:`aggregate_partial`): sums the noisy answers per query over the clients that
   answered it; queries nobody answered are dropped; argmax -> pseudo-labels.

Privacy per client (node-level DP for the nodes it holds, paper Thm. 7): ``m`` answers are ``m``
compositions of a Poisson-subsampled (rate ``gamma``) Laplace mechanism of noise multiplier
``1 / lam`` (:func:`~.privgnn.privgnn_events`); a client's limit is the largest total ``m`` whose
epsilon at ``delta`` (PLD, dp-accounting) stays within its target. A node of one client never
influences another client's answers, so epsilons are per client, not summed over clients.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from ..config import DataConfig, PrivGNNConfig
from ..device import resolve_device
from .privgnn import (FeatureProjection, QueryBudget, QueryGraphs, TeacherConfig,
                      answer_queries, check_neighbours, ensemble_votes, noisy_votes, max_queries, privgnn_epsilon, privgnn_split,
                      query_neighbourhoods)

#: features sparser than this travel as COO (index, value) pairs: exact, and Cora's or
#: Facebook100's one-hot rows shrink ~50x.
SPARSE_DENSITY = 0.25


# --------------------------------------------------------------------------------------------
# Data: the server's public graph, the clients' private parts
# --------------------------------------------------------------------------------------------
def _data_key(cfg: PrivGNNConfig) -> str:
    keys = list(DataConfig.model_fields) + ["public_fraction", "public_test_fraction"]
    return json.dumps({k: getattr(cfg, k) for k in keys}, sort_keys=True)


@lru_cache(maxsize=2)
def _federation(key: str):
    from ..data import dataset_statistics, partition
    from ..data import load_graph_locked as load_graph

    d = json.loads(key)
    cfg = DataConfig(**{k: v for k, v in d.items() if k in DataConfig.model_fields})
    data = load_graph(cfg)
    private, public = privgnn_split(data, public_fraction=d["public_fraction"],
                                    public_test_fraction=d["public_test_fraction"],
                                    seed=cfg.seed)
    clients = partition(private, cfg.num_clients, cfg.partitioner, cfg.seed, alpha=cfg.alpha)
    # What the server may state: the public graph's own statistics and the schema. The
    # private graphs' sizes, edges and labels are the simulation's ground truth (the report's
    # ground_truth, from the harness), never the server's knowledge (issue 28, fault 1).
    whole = dataset_statistics(data)
    stats = {"name": whole["name"], "num_features": whole["num_features"],
             "num_classes": whole["num_classes"], "public_nodes": int(public.num_nodes),
             "public_edges": int(public.edge_index.size(1)),
             "public_query_pool": int(public.train_mask.sum()),
             "public_test_nodes": int(public.test_mask.sum())}
    return public, tuple(clients), stats


def public_graph(cfg: PrivGNNConfig):
    """Server side: ``(public Data, dataset statistics)``; ``public.train_mask`` is the query
    pool (labels unused except for diagnostics), ``public.test_mask`` the test nodes."""
    public, _, stats = _federation(_data_key(cfg))
    return public, stats


def client_graph(cfg: PrivGNNConfig, partition_id: int):
    """Client side: ``(ClientGraph of partition_id's private nodes, dataset statistics)``.

    Raises:
        ValueError: ``partition_id`` outside ``[0, num_clients)``, or more clients than
            private nodes.
    """
    if not 0 <= partition_id < cfg.num_clients:
        raise ValueError(f"partition-id {partition_id} outside [0, {cfg.num_clients}): the "
                         "federation's num-supernodes must equal the run config's num-clients")
    _, clients, stats = _federation(_data_key(cfg))
    return clients[partition_id], stats


def check_config_neighbours(cfg: PrivGNNConfig) -> None:
    """Before any client starts: ``num-neighbours`` fits every client's expected Poisson sample
    (:func:`~.privgnn.check_neighbours`: ``K <= floor(gamma * n_c)`` for the ``n_c`` private
    nodes of client ``c``; the partition is computed from the public run config); in the
    ensemble mode, ``num-teachers <= n_c`` instead (:func:`~.privgnn.teacher_groups`); and
    ``num-queries`` at most the public query pool (it was silently capped).

    Raises:
        fedgraph.config.ConfigError: naming ``num-neighbours`` (or ``num-teachers``), the
            smallest client and the largest valid value; or ``num-queries`` and the pool.
    """
    from ..config import ConfigError

    _, clients, stats = _federation(_data_key(cfg))
    pool = int(stats["public_query_pool"])
    if cfg.num_queries > pool:
        raise ConfigError(f"num-queries = {cfg.num_queries} exceeds the public query pool "
                          f"({pool} unlabelled public nodes at public-fraction "
                          f"{cfg.public_fraction:g}, public-test-fraction "
                          f"{cfg.public_test_fraction:g}); allowed: 1 <= num-queries <= {pool}")
    sizes = [int(c.train_mask.sum()) if getattr(c, "train_mask", None) is not None
             else int(c.num_nodes) for c in clients]
    small = min(range(len(sizes)), key=sizes.__getitem__)
    if cfg.answer_mode == "ensemble":  # disjoint groups of labelled nodes, not K neighbours
        if cfg.num_teachers > sizes[small]:
            raise ConfigError(
                f"num-teachers = {cfg.num_teachers} exceeds the labelled private nodes of "
                f"client {small} ({sizes[small]}): each teacher needs its own disjoint group; "
                f"allowed: 1 <= num-teachers <= {sizes[small]}")
        return
    try:
        check_neighbours(cfg.num_neighbours, sizes[small], cfg.gamma,
                         f" for client {small} ({sizes[small]} private nodes)")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def teacher_config(cfg: PrivGNNConfig) -> TeacherConfig:
    """The clients' per-query teachers (paper App. G.1 apart from the sizes in ``cfg``)."""
    return TeacherConfig(hidden=cfg.teacher_hidden, epochs=cfg.teacher_epochs,
                         batch_size=cfg.teacher_batch_size, dropout=cfg.dropout, lr=cfg.lr)


# --------------------------------------------------------------------------------------------
# The query message (public data only)
# --------------------------------------------------------------------------------------------
def encode_queries(hoods: QueryGraphs, projection: FeatureProjection | None = None
                   ) -> dict[str, Tensor]:
    """Server side: the tensors of a ``query.privgnn`` message.

    Keys: ``edge_index [2, E]``, ``ptr [Q+1]``, ``center [Q]`` (:class:`~.privgnn.QueryGraphs`),
    the neighbourhood features ``x [M, F]`` either dense (``x``) or, below
    :data:`SPARSE_DENSITY`, as ``x_index [2, nnz]``, ``x_value [nnz]``, ``x_shape [2]``; and
    with a projection ``proj_mean [F]``, ``proj_components [F, d]``.
    """
    x = hoods.x.float()
    out = {"edge_index": hoods.edge_index, "ptr": hoods.ptr, "center": hoods.center}
    if x.numel() and float((x != 0).float().mean()) < SPARSE_DENSITY:
        idx = x.nonzero().T
        out.update(x_index=idx, x_value=x[idx[0], idx[1]],
                   x_shape=torch.tensor(list(x.shape)))
    else:
        out["x"] = x
    if projection is not None:
        out.update(proj_mean=projection.mean, proj_components=projection.components)
    return out


def decode_queries(arrays: dict[str, Tensor]) -> tuple[QueryGraphs, FeatureProjection | None]:
    """Client side: the inverse of :func:`encode_queries`."""
    if "x" in arrays:
        x = arrays["x"]
    else:
        shape = tuple(int(s) for s in arrays["x_shape"])
        x = torch.zeros(shape)
        x[arrays["x_index"][0], arrays["x_index"][1]] = arrays["x_value"]
    proj = (FeatureProjection(arrays["proj_mean"], arrays["proj_components"])
            if "proj_mean" in arrays else None)
    return QueryGraphs(x, arrays["edge_index"], arrays["ptr"], arrays["center"]), proj


def first_queries(hoods: QueryGraphs, m: int) -> QueryGraphs:
    """The neighbourhoods of queries ``0..m-1`` only (a prefix of the union)."""
    end = int(hoods.ptr[m])
    keep = hoods.edge_index[0] < end
    return QueryGraphs(hoods.x[:end], hoods.edge_index[:, keep], hoods.ptr[:m + 1],
                       hoods.center[:m])


def make_queries(public, query_idx: Tensor, cfg: PrivGNNConfig,
                 generator: torch.Generator | None = None,
                 projection: FeatureProjection | None = None) -> dict[str, Tensor]:
    """Server side: the message tensors for ``query_idx`` (long ``[Q]`` public node ids):
    their ``cfg.hops``-hop public neighbourhoods capped at ``cfg.neighbourhood_size`` nodes
    (a random subset: public data, no privacy cost)."""
    hoods = query_neighbourhoods(public, query_idx, cfg.hops, cfg.neighbourhood_size, generator)
    return encode_queries(hoods, projection)


# --------------------------------------------------------------------------------------------
# Client side: answers within the budget
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def answer_limit(epsilon: float, delta: float, rate: float, lam: float, wanted: int) -> int:
    """The most answers (in total, at most ``wanted``) whose composed epsilon at ``delta``
    (PLD) stays within ``epsilon``; ``inf`` allows ``wanted``. Depends on public parameters
    only, so the limit itself reveals nothing about the private data (cached: PLD takes up to
    a second per count)."""
    if wanted < 1 or math.isinf(epsilon):
        return max(int(wanted), 0)
    if privgnn_epsilon(wanted, rate, lam, delta, "pld") <= epsilon:
        return int(wanted)
    return max_queries(epsilon, delta, rate, lam, accountant="pld", cap=int(wanted))


@lru_cache(maxsize=64)
def ensemble_answer_limit(epsilon: float, delta: float, sigma_votes: float,
                          sigma_threshold: float, wanted: int) -> int:
    """Ensemble mode: the most released histograms (at most ``wanted``) whose composed epsilon
    at ``delta`` (:func:`~.privgnn.ensemble_epsilon`, exact) stays within ``epsilon``; public
    parameters only. Epsilon grows with the count, so a bisection finds it."""
    from .privgnn import _bisect, ensemble_epsilon

    if wanted < 1 or math.isinf(epsilon):
        return max(int(wanted), 0)

    def fits(q: int) -> bool:
        return ensemble_epsilon(q, sigma_votes, sigma_threshold or None, delta) <= epsilon

    if fits(int(wanted)):
        return int(wanted)
    if not fits(1):
        return 0
    return _bisect(fits, 1, int(wanted))


def client_limit(cfg: PrivGNNConfig, partition_id: int, wanted: int) -> int:
    """Answers client ``partition_id`` may give in total (at most ``wanted``) within its
    target: :func:`ensemble_answer_limit` in ensemble mode (with ``secure-aggregation``: the
    smallest over all clients' targets, since every client must answer the same queries for
    the masks to cancel; public parameters only), else :func:`answer_limit` (for
    ``log-softmax-paper`` the paper's own accounting, which does not hold: the report marks it
    not DP)."""
    target = cfg.client_epsilon(partition_id)
    if cfg.answer_mode == "ensemble":
        if cfg.secure_aggregation:  # the masks cancel only over every client: same queries
            return min(ensemble_answer_limit(cfg.client_epsilon(p), cfg.delta, cfg.sigma_votes,
                                             cfg.sigma_threshold, int(wanted))
                       for p in range(min(cfg.num_clients, len(cfg.client_epsilons))))
        return ensemble_answer_limit(target, cfg.delta, cfg.sigma_votes, cfg.sigma_threshold,
                                     int(wanted))
    return answer_limit(target, cfg.delta, cfg.gamma, cfg.lam, int(wanted))


@dataclass
class SecAggKeys:
    """What a client needs to mask its ensemble histograms (:mod:`fedgraph.secure_aggregation`):
    its X25519 private key (never sent), every client's public key by index (from the server),
    its own index and the masks' context (run and round: a fresh mask for every release)."""

    private_key: bytes
    public_keys: list[bytes]
    index: int
    context: str


@dataclass
class ClientReply:
    """What leaves a client for one query round.

    ``answers`` ``[m, C]``: noisy answers to the first ``m`` queries asked (``m = 0``: the
    client refused them all). ``meta``: counts fixed by public parameters (``asked``,
    ``answered`` = m, ``refused``, ``limit`` = total answers its budget allows,
    ``answered_total``, ``epsilon_target``, ``partition_id``).
    """

    answers: Tensor
    meta: dict


def client_answer(cfg: PrivGNNConfig, partition_id: int, arrays: dict[str, Tensor],
                  answered_before: int, generator: torch.Generator | None = None,
                  secagg: SecAggKeys | None = None) -> ClientReply:
    """Client side of a query round (paper Alg. 1 lines 3-7, within a budget).

    Args:
        cfg: the run config; ``client_epsilon(partition_id)`` is this client's target.
        partition_id: this client's index.
        arrays: the message tensors (:func:`encode_queries`).
        answered_before: answers this client released in earlier rounds of the run.
        generator: randomness of sampling, teachers and noise (deployed clients: fresh); a
            CPU generator whatever the device, so a seed gives the same draws everywhere.

    The teachers run on ``resolve_device(cfg.device)`` (the GPU Ray assigned this client,
    else the CPU; :mod:`fedgraph.device`).

    Returns:
        :class:`ClientReply`; ``answers`` ``[m, C]`` (a CPU tensor, ready for the Flower
        message) with ``m = min(Q, limit - answered_before)``.
        Privacy: ``privgnn_events(answered_before + m, gamma, lam)`` for the whole run.
        Ensemble mode: ``answers`` are noisy vote histograms (:func:`~.privgnn.noisy_votes`,
        ``[m, 2C]`` with the threshold copy first when ``sigma-threshold > 0``), privacy
        ``ensemble_events(answered_before + m, sigma_votes, sigma_threshold)``. With
        ``secure-aggregation`` the histograms carry a ``1 / num_clients`` share of that noise
        and leave masked (:func:`masked_histograms`: ``int64`` ring elements, uniform for the
        server); the events are those of the sum.

    Raises:
        ConfigError: ``device = "cuda"`` but this process sees no GPU (names the key).
        ValueError: ``secure-aggregation = true`` without ``secagg`` keys (refuses to release
            unmasked histograms).
    """
    if cfg.secure_aggregation and secagg is None:
        raise ValueError("secure-aggregation = true but the server sent no public keys: "
                         "refusing to release unmasked histograms")
    device = resolve_device(cfg.device)  # before any work: a bad device fails every round
    graph, stats = client_graph(cfg, partition_id)
    hoods, proj = decode_queries(arrays)
    asked = int(hoods.center.numel())
    target = cfg.client_epsilon(partition_id)
    limit = client_limit(cfg, partition_id, answered_before + asked)
    budget = QueryBudget(limit, int(answered_before), target, cfg.delta)
    m = min(asked, budget.remaining)
    C = int(stats["num_classes"])
    width = 2 * C if cfg.answer_mode == "ensemble" and cfg.sigma_threshold else C
    if m == 0:
        answers = torch.zeros(0, width, dtype=torch.long if secagg is not None else None)
    elif cfg.answer_mode == "ensemble":
        budget.charge(m)
        sub = first_queries(hoods, m)
        votes = ensemble_votes(graph, sub.query_x, num_teachers=cfg.num_teachers,
                               num_classes=C, teacher=teacher_config(cfg), neighbourhoods=sub,
                               projection=proj, generator=generator, device=device)
        shares = cfg.num_clients if cfg.secure_aggregation else 1
        answers = noisy_votes(votes, cfg.sigma_votes, cfg.sigma_threshold or None, generator,
                              shares=shares)
        if secagg is not None:
            answers = masked_histograms(answers, secagg)
    else:
        sub = first_queries(hoods, m)
        answers = answer_queries(graph, sub.query_x, rate=cfg.gamma, k=cfg.num_neighbours,
                                 lam=cfg.lam, num_classes=C, teacher=teacher_config(cfg),
                                 mode=cfg.answer_mode, neighbourhoods=sub, projection=proj,
                                 budget=budget, generator=generator, device=device)
    meta = {"partition_id": int(partition_id), "asked": asked, "answered": int(m),
            "refused": asked - int(m), "limit": int(limit),
            "answered_total": int(budget.answered), "epsilon_target": float(target)}
    return ClientReply(answers, meta)


def masked_histograms(histograms: Tensor, keys: SecAggKeys) -> Tensor:
    """A client's noisy histograms ``[m, W]`` (its noise share already added), masked for
    secure aggregation: one row per query (public id ``0..m-1``), no owner, so the masks cancel
    in the sum over all clients (:func:`fedgraph.secure_aggregation.mask_rows`). Returns
    ``[m, W]`` ``int64`` (the ``uint64`` ring elements' bits)."""
    import numpy as np

    from ..secure_aggregation import mask_rows

    m = int(histograms.shape[0])
    masked = mask_rows(histograms.detach().double().cpu().numpy(), np.arange(m),
                       np.full(m, -1), int(keys.index), keys.private_key, list(keys.public_keys),
                       keys.context)
    return torch.from_numpy(masked.view(np.int64))


def unmask_histograms(masked: dict[int, Tensor], num_clients: int) -> Tensor:
    """Server side of secure aggregation: the clients' masked histograms (client index ->
    ``[m, W]`` ``int64`` from :func:`masked_histograms`; every one of the ``num_clients``
    clients must send the same ``m``) added in the ring, which cancels the masks: the sum of the noisy histograms
    ``[m, W]`` (float32, up to :func:`~fedgraph.secure_aggregation.quantization_error_bound`).

    Raises:
        ValueError: a client's reply is missing or covers other queries (the masks do not
            cancel; no dropout recovery), or the widths differ.
    """
    import numpy as np

    from ..secure_aggregation import unmask_sum

    sizes = {int(t.shape[0]) for t in masked.values()}
    if len(sizes) != 1:
        raise ValueError(f"secure aggregation: the clients answered different numbers of "
                         f"queries {sorted(sizes)}; the masks cancel only over the same rows")
    m = sizes.pop()
    width = max(int(t.shape[1]) for t in masked.values())
    if m == 0:
        return torch.zeros(0, width)
    contributions = {i: (np.arange(m), t.numpy().view(np.uint64)) for i, t in masked.items()}
    ids, sums = unmask_sum(contributions, np.full(m, -1), int(num_clients))
    if ids.size != m:
        raise ValueError("secure aggregation: not every query was summed")
    return torch.from_numpy(sums).float()


# --------------------------------------------------------------------------------------------
# Server side: aggregation of partial answers
# --------------------------------------------------------------------------------------------
@dataclass
class Aggregate:
    """Pseudo-labels of the answered queries: ``kept`` bool ``[Q]`` (answered by at least one
    client), ``labels`` long ``[kept.sum()]``, ``votes`` long ``[Q]`` (answers per query)."""

    kept: Tensor
    labels: Tensor
    votes: Tensor


def aggregate_partial(answers: list[Tensor], num_queries: int, num_classes: int) -> Aggregate:
    """Server side (post-processing): sum each query's noisy answers over the clients that
    answered it (each client answers a prefix ``[m_c, C]`` of the ``num_queries`` queries),
    drop queries with no answer, argmax (paper Alg. 1 line 8, :func:`~.privgnn.aggregate_answers`
    on the answering clients)."""
    total = torch.zeros(int(num_queries), int(num_classes))
    votes = torch.zeros(int(num_queries), dtype=torch.long)
    for a in answers:
        m = int(a.shape[0])
        if m > num_queries:
            raise ValueError(f"a client answered {m} of {num_queries} queries")
        total[:m] += a.float()
        votes[:m] += 1
    kept = votes > 0
    return Aggregate(kept, total[kept].argmax(-1), votes)


def aggregate_ensemble(answers: list[Tensor], num_queries: int, num_classes: int,
                       threshold: float = 0.0, keep_fraction: float = 1.0) -> Aggregate:
    """Server side of the ensemble mode (post-processing): each client answered a prefix
    ``[m_c, C]`` or ``[m_c, 2C]`` of the queries with noisy vote histograms; per query, sum
    over the clients that answered it, keep it if someone answered and (with ``threshold``)
    the summed threshold copy's maximum reaches it (Confident-GNMax), label = argmax of the
    summed GNMax copies (:func:`~.privgnn.confident_aggregate`). ``keep_fraction < 1`` then
    keeps only that share of the kept queries with the widest noisy top-2 margin
    (:func:`~.privgnn.margin_filter`)."""
    from .privgnn import confident_aggregate, margin_filter

    counts = torch.zeros(int(num_queries), dtype=torch.long)
    width = max([int(a.shape[1]) for a in answers if a.numel()], default=int(num_classes))
    padded = []
    for a in answers:
        m = int(a.shape[0])
        if m > num_queries:
            raise ValueError(f"a client answered {m} of {num_queries} queries")
        full = torch.zeros(int(num_queries), width)
        full[:m] = a.float()
        counts[:m] += 1
        padded.append(full)
    answered, labels = confident_aggregate(padded or [torch.zeros(int(num_queries), width)],
                                           num_classes, threshold or None)
    kept = answered & (counts > 0)
    if keep_fraction < 1.0 and int(kept.sum()):
        gnmax = torch.stack(padded).sum(0)[:, -int(num_classes):]
        ids = kept.nonzero().view(-1)
        kept = torch.zeros_like(kept)
        kept[ids[margin_filter(gnmax[ids], keep_fraction)]] = True
    return Aggregate(kept, labels[kept], counts)


__all__ = ["SPARSE_DENSITY", "aggregate_ensemble", "public_graph", "client_graph", "check_config_neighbours",
           "teacher_config", "encode_queries",
           "decode_queries", "first_queries", "make_queries", "answer_limit",
           "ensemble_answer_limit", "client_limit", "ClientReply",
           "client_answer", "Aggregate", "aggregate_partial", "SecAggKeys",
           "masked_histograms", "unmask_histograms"]
