"""GAP's client half, one function per message a GAP client answers, without Flower.

The ClientApp (``simulations/client_app.py``) decodes a message, calls one of these and encodes
the reply; everything a client computes and releases is here, next to where its noise is drawn
and the plan (:func:`~fedgraph.methods.gap.privacy.privacy_plan`) that accounts for it:

* :func:`setup` (``query.gap_setup``): the client's calibration for its own target and its node
  ids (the public directory); nothing about the graph beyond the public schema.
* :func:`train` (``train``): one FedAvg round (local Adam; node level DP-SGD, ledger
  ``encoder dp-sgd`` / ``classifier dp-sgd``) or one FedSGD gradient (:func:`train_round`).
* :func:`validate` (``evaluate``, :func:`validation`) and :func:`final_counts`
  (``evaluate.gap``, :func:`evaluate_counts`).
* :func:`pma_request` and :func:`pma_step` (``query.gap_pma``): one hop of the private
  multi-hop aggregation (GAP paper Sec. 4, Alg. 1 lines 3-6; ledger ``pma``: a Gaussian
  mechanism of the plan's ``sigma`` and ``sensitivity`` per hop; :func:`pma_hop`).

State between messages is explicit: what a client keeps (the PMA state between hops, under
:func:`pma_state_key`; the finished private hops, under :func:`hops_key`) goes in as arguments
and comes out in the return values; where it is kept is the ClientApp's business.

Every draw comes from ``generator(purpose)``, the client's own generator for that release
(:func:`fedgraph.randomness.client_generator`, keyed by the client's data as well), so the
functions run the same in a test with a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...device import resolve_device, to_cpu
from ..rounds import admit_round as rounds_admit
from .client_pma import (
    client_edges,
    graph_nodes,
    masked_release,
    pma_edge_sums,
    pma_finish,
    pma_partial_sums,
    release_buffer,
)
from .models import build_classifier, build_encoder
from .privacy import check_remote_sigma, own_contributors, privacy_plan
from .training import evaluate, local_gradient, local_train

__all__ = [
    "client_plan",
    "setup",
    "inputs",
    "phase_inputs",
    "train",
    "train_round",
    "validate",
    "validation",
    "validation_phase",
    "final_counts",
    "evaluate_counts",
    "PMARequest",
    "PMAState",
    "PMAStep",
    "pma_request",
    "pma_hop",
    "pma_step",
    "hops_key",
    "pma_state_key",
]


def client_plan(cfg, partition_id: int, view):
    """This client's :class:`~fedgraph.methods.gap.privacy.PrivacyPlan` for its own target
    (``cfg.client_epsilon(partition_id)``) and its public count of training nodes."""
    return privacy_plan(cfg, cfg.client_epsilon(partition_id), int(view.graph.train_mask.sum()))


def setup(cfg, partition_id: int, view) -> tuple[Tensor, dict]:
    """``query.gap_setup``: ``(node ids [n], plan)``. The plan (noise multiplier, sigma,
    sensitivity, schedules) is a function of the public config and the directory's counts
    (``num_nodes``, ``num_train``: counts of nodes are not protected by edge-level DP's unit,
    and node level's node universe is public); no edge count is sent."""
    g = view.graph
    plan = {
        **client_plan(cfg, partition_id, view).to_dict(),
        "partition_id": partition_id,
        "num_nodes": g.num_nodes,
        "num_train": int(g.train_mask.sum()),
    }
    return g.node_ids, plan


def hops_key(graph: str) -> str:
    """Client-state key of the private hops of a PMA run on ``graph`` (``all``/``train``: the
    classifier's training inputs; ``test``: the held-out graph's, inductive inference)."""
    return "gap.hops.test" if graph == "test" else "gap.hops"


def inputs(
    cfg,
    view,
    phase: str,
    weights: dict | None = None,
    hops: Tensor | None = None,
    heldout_hops: Tensor | None = None,
):
    """``(model, x)`` of a phase on this client's device (``device``: the GPU Ray assigned,
    else the CPU): the encoder on raw features ``[n, F]``; the classifier on the stacked
    private hops ``[n, K + 1, e]`` (``hops``; the MLP baseline: raw features ``[n, 1, F]``),
    the test nodes' rows from ``heldout_hops`` when given (inductive inference). ``weights``:
    a state dict to load (empty or ``None``: fresh weights)."""
    g, s = view.graph, view.schema
    if phase == "gap.encoder":
        model, x = build_encoder(cfg, s["num_features"], s["num_classes"]), g.x
    else:
        model = build_classifier(cfg, s["num_features"], s["num_classes"])
        if cfg.variant == "mlp":
            x = g.x.unsqueeze(1)
        else:
            if hops is None or hops.size(1) != cfg.hops + 1:
                held = "none" if hops is None else hops.size(1) - 1
                raise ValueError(
                    f"client state holds {held} hops, the run config says hops = {cfg.hops}"
                )
            x = hops
            if heldout_hops is not None:
                x = torch.where(g.test_mask.view(-1, 1, 1), heldout_hops.to(x.dtype), x)
    if weights:
        model.load_state_dict(weights)
    dev = resolve_device(cfg.device)
    return model.to(dev), x.to(dev)


def phase_inputs(
    cfg,
    view,
    phase: str,
    weights: dict | None,
    kept: Callable[[str], dict[str, Tensor]],
    heldout: bool = False,
):
    """``(model, x)`` of ``phase`` (:func:`inputs`), the private hops read from what this client
    kept: ``kept(key)`` returns the tensors kept under ``key`` (:func:`hops_key`; the ClientApp
    passes its client state's reader). ``heldout``: the test nodes' rows from the held-out
    graph's hops (inductive inference). The encoder and the MLP baseline read nothing."""

    def hops(graph):
        return kept(hops_key(graph))["hops"]

    if phase == "gap.encoder" or cfg.variant == "mlp":
        return inputs(cfg, view, phase, weights)
    held = hops("test") if heldout and cfg.inference == "inductive" else None
    return inputs(cfg, view, phase, weights, hops("all"), held)


def _on(x: Tensor, tensor: Tensor) -> Tensor:
    return tensor.to(x.device)


def validation(model, x: Tensor, view) -> dict:
    """Validation accuracy and loss on this client's validation nodes with their exact count as
    weight (0: none); the loss breaks ties (:func:`fedgraph.strategies.fedavg.selection_key`). Edge
    level only: labels are not the unit."""
    res = evaluate(model, x, _on(x, view.graph.y), _on(x, view.graph.val_mask))
    acc, loss = (res["accuracy"], res["loss"]) if res["total"] else (0.0, 0.0)
    return {"num-examples": res["total"], "val-accuracy": float(acc), "val-loss": float(loss)}


def validation_phase(cfg, phase: str | None) -> str:
    """The phase an ``evaluate`` round validates (``None``: the classifier), refused at node
    level (the validation labels are private: the strategy selects no round there).

    Raises:
        ValueError: node level, or an unknown phase."""
    if cfg.level == "node":
        raise ValueError(
            "level: node: the validation labels are private, validation accuracy "
            "is not released (the strategy does not select rounds at node level)"
        )
    phase = "gap.classifier" if phase is None else str(phase)
    if phase not in ("gap.encoder", "gap.classifier"):
        raise ValueError(f"unknown GAP phase {phase!r}")
    return phase


def train_round(
    cfg,
    partition_id: int,
    view,
    model,
    x: Tensor,
    *,
    validate: bool,
    generator,
    proximal_mu: float = 0.0,
) -> tuple[dict, dict]:
    """``train``: ``(arrays, metrics)`` of one round at ``model``'s received weights.

    FedSGD (edge level): the full-batch gradient of the mean training loss, the batch norms'
    running statistics after that pass, the training-node count and loss, and (``validate``)
    the received weights' validation (:func:`validation`, for the previous round). FedAvg: the
    weights after ``local-epochs`` of Adam; node level DP-SGD with the plan's schedule
    (rate, steps and Opacus's normaliser from the public count), uniform FedAvg weights and no
    loss (the private count and loss would leave unnoised). ``generator``: DP-SGD's sampling
    and noise (and dropout). ``proximal_mu``: FedProx's term in the local steps (the
    ``proximal-mu`` Flower's FedProx puts in the train config; :func:`local_train`).
    """
    g = view.graph
    if cfg.schedule == "fedsgd":
        val = {}
        if validate:
            if cfg.level != "edge":  # (the config allows FedSGD at edge level only)
                raise ValueError("level: node: the validation labels are private")
            val = validation(model, x, view)
            val["val-examples"] = val.pop("num-examples")
        n, loss, grads = local_gradient(model, x, _on(x, g.y), _on(x, g.train_mask))
        grads.update(model.named_buffers())
        return to_cpu(grads), {"num-examples": n, "train-loss": float(loss) if n else 0.0, **val}
    dp = client_plan(cfg, partition_id, view).dpsgd(cfg)  # node level: DP-SGD's schedule
    n, loss = local_train(
        model,
        x,
        _on(x, g.y),
        _on(x, g.train_mask),
        cfg.local_epochs,
        cfg.dpsgd_batch_size if dp else (cfg.batch_size or None),
        cfg.lr,
        dp,
        generator=generator,
        num_public=int(g.train_mask.sum()),
        proximal_mu=proximal_mu,
    )
    metrics = (
        {"num-examples": max(n, 1), "train-loss": float(loss)}
        if cfg.level == "edge"
        else {"num-examples": 1}
    )
    return to_cpu(model.state_dict()), metrics


def admit_round(cfg, phase: str, server_round: int, last: dict[str, int]) -> dict[str, int]:
    """The client's own check of a ``train`` message before it trains: ``server_round`` is
    within the ``encoder-rounds`` / ``classifier-rounds`` its privacy plan covers (node level:
    each round is DP-SGD steps of its epsilon) and after the last round it took part in (a
    round's draws are keyed by its number: a repeated round would repeat them). Whatever
    strategy drives the rounds (``round-strategy``, client sampling), a client releases at
    most what its plan accounted for (:func:`fedgraph.methods.rounds.admit_round`).

    Args:
        last: phase -> the last round this client trained (its state between messages).
    Returns:
        ``last`` with ``phase`` set to ``server_round``.
    Raises:
        ValueError: naming the phase, the round and the allowed range.
    """
    if phase not in ("gap.encoder", "gap.classifier"):
        raise ValueError(f"unknown GAP phase {phase!r}; allowed: gap.encoder, gap.classifier")
    rounds = cfg.encoder_rounds if phase == "gap.encoder" else cfg.classifier_rounds
    return rounds_admit(phase, server_round, rounds, last)


def train(
    cfg,
    partition_id: int,
    view,
    phase: str,
    weights: dict | None,
    kept: Callable[[str], dict[str, Tensor]],
    *,
    server_round: int,
    validate: bool,
    generator: Callable[[str], object],
    proximal_mu: float = 0.0,
) -> tuple[dict, dict]:
    """``train``: :func:`train_round` of ``phase`` (``gap.encoder``/``gap.classifier``) at the
    received ``weights`` (:func:`phase_inputs`), with this round's generator
    ``generator(f"gap:{phase}:{server_round}")`` (:func:`admit_round` first)."""
    model, x = phase_inputs(cfg, view, phase, weights, kept)
    return train_round(
        cfg,
        partition_id,
        view,
        model,
        x,
        validate=validate,
        generator=generator(f"gap:{phase}:{server_round}"),
        proximal_mu=proximal_mu,
    )


def validate(
    cfg, view, phase: str | None, weights: dict | None, kept: Callable[[str], dict[str, Tensor]]
) -> dict:
    """``evaluate``: :func:`validation` of ``phase`` (:func:`validation_phase`; ``None``: the
    classifier) at the received ``weights``.

    Raises:
        ValueError: node level, or an unknown phase (:func:`validation_phase`)."""
    phase = validation_phase(cfg, phase)
    model, x = phase_inputs(cfg, view, phase, weights, kept)
    return validation(model, x, view)


def final_counts(cfg, view, weights: dict | None, kept: Callable[[str], dict[str, Tensor]]) -> dict:
    """``evaluate.gap``: :func:`evaluate_counts` of the classifier at the received ``weights``,
    the test nodes on the held-out graph's hops under inductive inference."""
    model, x = phase_inputs(cfg, view, "gap.classifier", weights, kept, heldout=True)
    return evaluate_counts(model, x, view)


def evaluate_counts(model, x: Tensor, view) -> dict:
    """``evaluate.gap``: correct predictions and totals per split (evaluation outputs, outside
    the guarantee as in the paper)."""
    counts = {}
    for split in ("train", "val", "test"):
        r = evaluate(model, x, _on(x, view.graph.y), _on(x, getattr(view.graph, f"{split}_mask")))
        counts[f"{split}_correct"], counts[f"{split}_total"] = r["correct"], r["total"]
    return counts


@dataclass
class PMARequest:
    """What the server sends for one PMA hop (``query.gap_pma``).

    ``hop``: k in ``1..K+1`` (K+1: finish only); ``graph``: ``all``, or inductive inference's
    ``train``/``test``; ``encoder``: the encoder's weights (hop 1); ``incoming``: the partial
    sums routed to this client's nodes (``ids [m]``, ``sums [m, e]``; hops >= 2);
    ``remote_sigma``/``remote_contributors``: the common noise std of remote rows and how many
    clients' rows the server sums (:func:`~fedgraph.methods.gap.privacy.remote_noise`);
    ``secagg``: ``(private key, verified keys, owner [N], context label)`` for masking (the
    keys a :class:`~fedgraph.secure_aggregation.VerifiedKeys` that this client verified,
    :func:`~fedgraph.secure_aggregation.verify_key_list`);
    ``object_store``: the server reads Ray's object store (the reply may be a reference into
    it, :func:`fedgraph.messaging.bulk_record`)."""

    hop: int
    graph: str = "all"
    encoder: dict | None = None
    incoming: dict | None = None
    remote_sigma: float | None = None
    remote_contributors: int | None = None
    secagg: tuple | None = None
    object_store: bool = False


def pma_request(
    content, secagg: tuple | None, label: str, read: Callable | None = None
) -> PMARequest:
    """A ``query.gap_pma`` message's records (``pma``: hop, graph, remote sigma and
    contributors, object store; ``encoder``; ``incoming``; with secure aggregation ``secagg``
    and ``owner``) as a :class:`PMARequest`; ``secagg``: ``(private key, VerifiedKeys)``, this
    client's secure-aggregation key and the message's key list as this client verified it
    (the ClientApp's :func:`~simulations.routes.common.verified_keys`; ``None`` without
    secure aggregation); ``label``: the run's masking context (hop and graph added); ``read``:
    how ``incoming`` is decoded (the ClientApp passes :func:`fedgraph.messaging.bulk_tensors`;
    ``None``: a copy of the ArrayRecord).

    Raises:
        ValueError: the message carries a key list this client has not verified."""

    def tensors(record) -> dict:
        return dict(record.to_torch_state_dict())

    pma = content["pma"]
    hop, graph = int(pma["hop"]), str(pma.get("graph", "all"))
    keys = secagg
    secagg = None
    if "secagg" in content:
        if keys is None:
            raise ValueError(
                "secure aggregation: the server sent a key list this client has "
                "not verified; refusing to release"
            )
        secagg = (
            keys[0],
            keys[1],
            tensors(content["owner"])["owner"],
            f"{label} graph={graph} hop={hop}",
        )
    return PMARequest(
        hop,
        graph,
        content["encoder"].to_torch_state_dict() if "encoder" in content else None,
        (read or tensors)(content["incoming"]) if "incoming" in content else None,
        float(pma["remote-sigma"]) if "remote-sigma" in pma else None,
        int(pma["remote-contributors"]) if "remote-contributors" in pma else None,
        secagg,
        bool(pma.get("object-store", False)),
    )


@dataclass
class PMAState:
    """A client's PMA state between hops (kept by the client, never sent): the finished hops
    ``hop0..hop{k-1}`` (``[n, e]`` each) and the local sums of hop k awaiting the rows other
    clients send for this client's nodes."""

    tensors: dict

    def stacked(self, num_hops: int) -> Tensor:
        """The private hops ``0..K`` as ``[n, K + 1, e]`` (CPU): the classifier's inputs."""
        return torch.stack([self.tensors[f"hop{j}"].cpu() for j in range(num_hops + 1)], dim=1)


def pma_hop(
    cfg,
    partition_id: int,
    view,
    req: PMARequest,
    state: PMAState | None,
    generator: Callable[[str], object],
    memo: Callable[[Callable], object] | None = None,
) -> tuple[PMAState, dict[str, Tensor]]:
    """One PMA hop: finish hop k-1 with the rows received, then compute this client's noisy
    partial sums of hop k and release the rows for remote nodes (GAP Alg. 1 lines 3-6).

    Privacy (ledger ``pma``, one Gaussian mechanism per hop): every released row is the sum of
    normalized hop-(k-1) rows over the client's (degree-bounded at node level) edges into that
    node plus ``N(0, sigma^2 I)`` (``plan.sigma = noise multiplier x plan.sensitivity``; remote
    rows with the common ``remote_sigma``, never below this client's sigma, and at node level
    clipped to ``plan.remote_norm``); the ids are every remote node of the graph (the public
    directory, not the edges). With secure aggregation only masked rows leave.

    Args:
        generator: ``generator(purpose)``, this client's generator of one release
            (``gap:degree``: degree sampling, the same at every hop; ``gap:pma<k>``: hop k's
            noise; ``:test`` for the held-out graph's run).
        memo: ``memo(build)`` returns ``build()``, built once for the hops of this PMA run
            (the ClientApp's :func:`~simulations.client_state.derived`): the client's sums over
            its edges (:func:`~.client_pma.pma_edge_sums`), the same at every hop, and the
            block the remote rows are written into (:func:`~.client_pma.release_buffer`,
            shared with the other clients the process runs: so a CPU release is overwritten by
            this client's next hop or another client's: encode it before). ``None``: built at
            every hop, and every release a new tensor. Nothing in it is sent apart from the
            release.

    Returns:
        ``(state, release)``: the state for the next hop and the reply's ``partial_sums``
        (``ids [m]`` and ``sums [m, e]``, or the masked record; empty at k = K+1).

    Raises:
        ValueError: a remote sigma below this client's own over the contributors it counts
            itself (:func:`~.privacy.own_contributors`: its verified peers under secure
            aggregation, else 1), a ``remote_contributors`` that differs from that count,
            secure aggregation without keys.
    """
    g, k = view.graph, req.hop
    in_graph = graph_nodes(view.test_mask, req.graph)
    tag = ":test" if req.graph == "test" else ""  # fresh noise for the held-out run
    dev = resolve_device(cfg.device)
    if k == 1:
        model, x = inputs(cfg, view, "gap.encoder", req.encoder)
        hops = {"hop0": model.embed(x)}
    else:
        hops = dict(state.tensors)
        inc = req.incoming
        hops[f"hop{k - 1}"] = pma_finish(
            hops.pop("local_sums").to(dev), g.node_ids, inc["ids"], inc["sums"]
        )
    out = {"ids": torch.zeros(0, dtype=torch.long), "sums": torch.zeros(0, cfg.encoder_dim)}
    if k <= cfg.hops:
        plan = client_plan(cfg, partition_id, view)

        def edge_sums():
            local, boundary = client_edges(g, cfg, generator(f"gap:degree{tag}"), in_graph)
            # a row for every node of the graph held elsewhere: ids fixed by the directory
            others = torch.ones(view.schema["num_nodes"], dtype=torch.bool)
            others[g.node_ids] = False
            if in_graph is not None:
                others &= in_graph
            remote = (
                others.nonzero().flatten()
                if cfg.cross_client_edges
                else others.nonzero()[:0].flatten()
            )
            return (*pma_edge_sums(local, boundary, g.num_nodes, remote), {})

        if req.remote_sigma is not None:  # a share only over contributors it verified
            if cfg.secure_aggregation and req.secagg is None:
                raise ValueError(
                    "secure-aggregation = true but the server sent no public "
                    "keys: refusing to release unmasked rows"
                )
            check_remote_sigma(
                req.remote_sigma,
                plan.sigma,
                own_contributors(
                    cfg.secure_aggregation, req.secagg and req.secagg[1], req.remote_contributors
                ),
            )
        local, boundary, buffers = edge_sums() if memo is None else memo(edge_sums)
        h_prev = hops[f"hop{k - 1}"].to(dev)
        local_sums, ids, sums = pma_partial_sums(
            h_prev,
            local,
            boundary,
            plan.sigma,
            generator(f"gap:pma{k}{tag}"),
            remote_sigma=req.remote_sigma,
            remote_norm=plan.remote_norm,
            remote_out=None if memo is None else release_buffer(buffers, boundary.num_rows, h_prev),
        )
        hops["local_sums"] = local_sums
        out = {"ids": ids, "sums": sums}
        if cfg.secure_aggregation and ids.numel():  # only masked rows leave
            if req.secagg is None:
                raise ValueError(
                    "secure-aggregation = true but the server sent no public "
                    "keys: refusing to release unmasked rows"
                )
            private, keys, owner, label = req.secagg
            out = masked_release(
                ids, sums, private, list(keys.public_keys), keys.index, owner, label
            )
    return PMAState(to_cpu(hops)), to_cpu(out)


def pma_state_key(graph: str) -> str:
    """Client-state key of a PMA run's :class:`PMAState` between hops, on ``graph``."""
    return hops_key(graph) + ".pma"


@dataclass
class PMAStep:
    """What a client keeps and releases after one PMA hop (:func:`pma_step`).

    ``pending``: the :class:`PMAState` tensors to keep under :func:`pma_state_key` for the next
    hop, ``None`` after the last hop (the state is dropped); ``hops``: after the last hop, the
    private hops ``[n, K + 1, e]`` (CPU) to keep under :func:`hops_key`, the classifier's inputs
    in every classifier round; ``release``: the reply's ``partial_sums`` (with a memo, its rows
    are the process's release block, overwritten by the next hop of any client: encode or copy
    them first)."""

    pending: dict[str, Tensor] | None
    hops: Tensor | None
    release: dict[str, Tensor]


def pma_step(
    cfg,
    partition_id: int,
    view,
    req: PMARequest,
    kept: dict[str, Tensor] | None,
    generator: Callable[[str], object],
    memo: Callable[[Callable], object] | None = None,
) -> PMAStep:
    """``query.gap_pma`` with the client's state in and out: ``kept``, the tensors kept under
    :func:`pma_state_key` after the previous hop (read from hop 2 on; ``None``: nothing kept),
    and what to keep now (:class:`PMAStep`). The hop itself: :func:`pma_hop` (``memo``: as
    there).

    Raises:
        ValueError: a hop after the first without the previous hop's state; and as
            :func:`pma_hop`.
    """
    if req.hop > 1 and kept is None:
        raise ValueError(f"PMA hop {req.hop}: this client kept no state of hop {req.hop - 1}")
    state, release = pma_hop(
        cfg, partition_id, view, req, PMAState(kept) if req.hop > 1 else None, generator, memo
    )
    if req.hop <= cfg.hops:
        return PMAStep(state.tensors, None, release)
    return PMAStep(None, state.stacked(cfg.hops), release)
