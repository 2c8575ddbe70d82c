"""PrivGNN's client half (paper Alg. 1 lines 3-7, within a budget): noisy answers to a round
of queries, and the client's state across rounds.

Client -> server (:func:`client_answer`): Laplace-noised teacher posteriors (or votes, or, in
the ensemble mode, noisy vote histograms, masked with secure aggregation) for the first ``m``
queries, ``m`` = what its epsilon budget still allows (0: a refusal,
:func:`~.privacy.client_limit`), and counts that depend only on public parameters (asked,
answered, limit, target). :func:`query_round` is what the ClientApp calls: it keeps the
counters across rounds (state in, state out) and names the round's generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import PrivGNNConfig
from ...device import resolve_device
from .graphs import client_graph
from .privacy import Mode, QueryBudget, client_limit, noisy_answers, noisy_votes
from .queries import FeatureProjection, QueryGraphs, decode_queries, first_queries
from .teachers import (
    TeacherConfig,
    TeacherTiming,
    ensemble_votes,
    teacher_config,
    teacher_posteriors,
)


def answer_queries(
    private,
    query_x: Tensor,
    *,
    rate: float,
    k: int,
    lam: float,
    num_classes: int,
    teacher: TeacherConfig | None = None,
    mode: Mode = "posterior",
    neighbourhoods: QueryGraphs | None = None,
    projection: FeatureProjection | None = None,
    budget: QueryBudget | None = None,
    generator: torch.Generator | None = None,
    timing: TeacherTiming | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Client side of PrivGNN: noisy answers to ``Q`` queries (paper Alg. 1 lines 3-7).

    Args:
        private: a :class:`~fedgraph.data.ClientGraph` or any object with ``x [n, F]``,
            ``y [n]``, ``edge_index [2, e]`` (local ids) and optionally ``train_mask``
            (labelled nodes; others are never retrieved).
        query_x: ``[Q, F]`` features of the public query nodes.
        rate: Poisson sampling rate gamma; k: neighbours retrieved per query;
        lam: Laplace parameter lambda (noise scale 2 / lambda);
        num_classes: ``C``; teacher: teacher configuration; mode: ``posterior`` or ``vote``;
        neighbourhoods: the queries' public neighbourhoods (:func:`query_neighbourhoods`);
            ``None`` attaches each query to its retrieved nodes instead.
        projection: a public feature map for the teachers' inputs (:func:`public_projection`;
            ``None``: raw features, the paper's setting).
        budget: refuses (raises before any computation) if ``Q`` exceeds what is left.
        generator: every random draw (CPU; see the module docstring).
        device: where the teachers run (``None``: the CPU).

    Returns:
        ``[Q, C]`` noisy answers, a CPU tensor (the release). Privacy: :func:`privgnn_events`
        with ``num_queries=Q``.

    Raises:
        BudgetExceededError: if ``budget`` has fewer than ``Q`` queries left.
    """
    if budget is not None:
        budget.charge(int(query_x.shape[0]))
    post = teacher_posteriors(
        private,
        query_x,
        rate=rate,
        k=k,
        num_classes=num_classes,
        teacher=teacher,
        neighbourhoods=neighbourhoods,
        projection=projection,
        generator=generator,
        timing=timing,
        device=device,
    )
    return noisy_answers(post, lam, mode, generator).cpu()


@dataclass
class SecAggKeys:
    """What a client needs to mask its ensemble histograms (:mod:`fedgraph.secure_aggregation`):
    its X25519 private key (never sent), every client's public key by index (relayed by the
    server, verified by this client: :func:`fedgraph.secure_aggregation.verify_key_list`), its
    own index, the masks' context (run and round: a fresh mask for every release) and
    ``contributors``, the clients whose histograms add up in the sum, as this client counted
    them from the verified keys (its noise share assumes them; 1: the whole noise)."""

    private_key: bytes
    public_keys: list[bytes]
    index: int
    context: str
    contributors: int = 1


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


def client_answer(
    cfg: PrivGNNConfig,
    partition_id: int,
    arrays: dict[str, Tensor],
    answered_before: int,
    generator: torch.Generator | None = None,
    secagg: SecAggKeys | None = None,
    data: tuple | None = None,
) -> ClientReply:
    """Client side of a query round (paper Alg. 1 lines 3-7, within a budget).

    Args:
        cfg: the run config; ``client_epsilon(partition_id)`` is this client's target.
        partition_id: this client's index.
        arrays: the message tensors (:func:`encode_queries`).
        answered_before: answers this client released in earlier rounds of the run.
        generator: randomness of sampling, teachers and noise (deployed clients: fresh); a
            CPU generator whatever the device, so a seed gives the same draws everywhere.
        data: ``(ClientGraph, stats)``, this client's private graph and the dataset
            statistics (the ClientApp reads them from the partition cache,
            :func:`fedgraph.federation.privgnn_client_graph`); ``None``:
            :func:`~.graphs.client_graph` (the dataset loaded and split in this process).

    The teachers run on ``resolve_device(cfg.device)`` (the GPU Ray assigned this client,
    else the CPU; :mod:`fedgraph.device`).

    Returns:
        :class:`ClientReply`; ``answers`` ``[m, C]`` (a CPU tensor, ready for the Flower
        message) with ``m = min(Q, limit - answered_before)``.
        Privacy: ``privgnn_events(answered_before + m, gamma, lam)`` for the whole run.
        Ensemble mode: ``answers`` are noisy vote histograms (:func:`~.privacy.noisy_votes`,
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
        raise ValueError(
            "secure-aggregation = true but the server sent no public keys: "
            "refusing to release unmasked histograms"
        )
    device = resolve_device(cfg.device)  # before any work: a bad device fails every round
    graph, stats = client_graph(cfg, partition_id) if data is None else data
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
        votes = ensemble_votes(
            graph,
            sub.query_x,
            num_teachers=cfg.num_teachers,
            num_classes=C,
            teacher=teacher_config(cfg),
            neighbourhoods=sub,
            projection=proj,
            generator=generator,
            device=device,
        )
        # a noise share only over the contributors this client verified
        shares = max(int(secagg.contributors), 1) if cfg.secure_aggregation else 1
        answers = noisy_votes(
            votes, cfg.sigma_votes, cfg.sigma_threshold or None, generator, shares=shares
        )
        if secagg is not None:
            answers = masked_histograms(answers, secagg)
    else:
        sub = first_queries(hoods, m)
        answers = answer_queries(
            graph,
            sub.query_x,
            rate=cfg.gamma,
            k=cfg.num_neighbours,
            lam=cfg.lam,
            num_classes=C,
            teacher=teacher_config(cfg),
            mode=cfg.answer_mode,
            neighbourhoods=sub,
            projection=proj,
            budget=budget,
            generator=generator,
            device=device,
        )
    meta = {
        "partition_id": int(partition_id),
        "asked": asked,
        "answered": int(m),
        "refused": asked - int(m),
        "limit": int(limit),
        "answered_total": int(budget.answered),
        "epsilon_target": float(target),
    }
    return ClientReply(answers, meta)


def query_round(
    cfg: PrivGNNConfig,
    partition_id: int,
    arrays: dict[str, Tensor],
    state: dict | None,
    generator: Callable[[str, object], object],
    private_key: bytes | None = None,
    secagg=None,
    run_id: int = 0,
    data: tuple | None = None,
) -> tuple[ClientReply, dict]:
    """One ``query.privgnn`` round on a client, with its state explicit: the ClientApp's
    handler decodes the message, calls this, stores the new state and encodes the reply.

    Args:
        cfg: the run config; partition_id: this client's index;
        arrays: the message tensors (:func:`~.queries.encode_queries`).
        state: this client's PrivGNN state from earlier rounds, ``{"answered": answers
            released so far, "rounds": rounds answered so far}`` (``None``: the first round).
        generator: ``(purpose, data) -> generator``, the client's own generator for a release
            (:func:`fedgraph.randomness.client_generator` bound to this client); this round's
            purpose is ``privgnn:<round>`` and its data the client's private part
            (:func:`~.graphs.client_graph`).
        private_key: this client's X25519 private key (kept in its state since
            ``privgnn_keys``; never sent); secagg: the message's key list as this client
            verified it (a :class:`fedgraph.secure_aggregation.VerifiedKeys`, from
            :func:`~fedgraph.secure_aggregation.verify_key_list`). Both given: the ensemble
            histograms leave masked (:class:`SecAggKeys`, context ``fedgraph privgnn ensemble
            run=<run_id> round=<round>``: a fresh mask every round), with a noise share over
            the verified clients (all of them contribute every row).
        run_id: the run's id (the masks' context).
        data: ``(ClientGraph, stats)`` as :func:`client_answer` takes it (``None``:
            :func:`~.graphs.client_graph`).

    Returns:
        ``(reply, new state)``: :func:`client_answer`'s :class:`ClientReply`, and
        ``{"answered": reply.meta["answered_total"], "rounds": round + 1}``.

    Raises:
        as :func:`client_answer`.
    """
    state = state or {"answered": 0, "rounds": 0}
    before, rnd = int(state["answered"]), int(state["rounds"])
    data = client_graph(cfg, partition_id) if data is None else data
    gen = generator(f"privgnn:{rnd}", data[0])
    keys = None
    if secagg is not None:
        from ...secure_aggregation import VerifiedKeys

        if private_key is None or not isinstance(secagg, VerifiedKeys):
            raise ValueError(
                "secure aggregation: a key list this client has not verified, or "
                "no key exchange of its own; refusing to release"
            )
        keys = SecAggKeys(
            bytes(private_key),
            list(secagg.public_keys),
            int(secagg.index),
            f"fedgraph privgnn ensemble run={run_id} round={rnd}",
            secagg.contributors(owned=False),
        )
    reply = client_answer(cfg, partition_id, arrays, before, gen, keys, data)
    return reply, {"answered": reply.meta["answered_total"], "rounds": rnd + 1}


def masked_histograms(histograms: Tensor, keys: SecAggKeys) -> Tensor:
    """A client's noisy histograms ``[m, W]`` (its noise share already added), masked for
    secure aggregation: one row per query (public id ``0..m-1``), no owner, so the masks cancel
    in the sum over all clients (:func:`fedgraph.secure_aggregation.mask_rows`). Returns
    ``[m, W]`` ``int64`` (the ``uint64`` ring elements' bits)."""
    import numpy as np

    from ...secure_aggregation import mask_rows

    m = int(histograms.shape[0])
    masked = mask_rows(
        histograms.detach().double().cpu().numpy(),
        np.arange(m),
        np.full(m, -1),
        int(keys.index),
        keys.private_key,
        list(keys.public_keys),
        keys.context,
    )
    return torch.from_numpy(masked.view(np.int64))


__all__ = [
    "answer_queries",
    "SecAggKeys",
    "ClientReply",
    "client_answer",
    "query_round",
    "masked_histograms",
]
