"""ProGAP's client half, one function per message a ProGAP client answers, without Flower.

The ClientApp (``simulations/client_app.py``) decodes a message, calls one of these and encodes
the reply; the client's cached inputs (its nodes' aggregations of every finished stage) stay in
its own state. What leaves a client:

* :func:`setup` (``query.progap_setup``): its node ids (the public directory) and its plan
  (:func:`~fedgraph.methods.progap.privacy.privacy_plan` for its own target).
* :func:`train_round` (``train.progap_stage``, a round of the stage's Flower strategy): edge
  level the full-batch gradient of its mean training loss over the stage's parameters, its
  batch norms' running statistics, its training-node count and loss, and (from round 2) the
  received weights' :func:`validation` (labels and features are not edge level's unit, the
  inputs are private aggregations); node level the weights after ``local_epochs`` of DP-SGD
  and the count 1 (ledger ``stage dp-sgd``).
* :func:`validation` (``evaluate.progap_stage``, edge level, after a stage's last round): the
  last weights' validation accuracy, loss and count.
* :func:`release` (``query.progap_aggregate``, step ``release``): the noisy sums of the stage's
  normalized embedding over its edges into every remote node (ledger ``aggregation``: one
  Gaussian mechanism), masked under secure aggregation; :func:`finish` (step ``finish``) adds
  the rows received to its own noisy local sums: the next stage's input, kept.
* :func:`counts` (``query.progap_eval``): correct predictions and totals per split (what GAP's
  clients send: no loss).

Every draw comes from ``generator(purpose)``, the client's generator of one release.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...device import resolve_device, to_cpu
from ...nn.gap import normalize_rows

# GAP's pieces this module reuses (one place, to repoint when GAP's modules move)
from ..gap.client_pma import client_edges, masked_release, pma_partial_sums
from ..gap.privacy import check_remote_sigma, own_contributors
from ..gap.training import evaluate, local_train
from ..rounds import admit_round as rounds_admit
from .model import ProgressiveModel, stage_input
from .privacy import gap_edges_config, privacy_plan

__all__ = [
    "client_plan",
    "setup",
    "build_model",
    "stage_model",
    "admit_round",
    "train_round",
    "validation",
    "counts",
    "release",
    "finish",
]


def client_plan(cfg, partition_id: int, view):
    """This client's plan for ``cfg.client_epsilon(partition_id)`` and its public count of
    training nodes."""
    return privacy_plan(cfg, cfg.client_epsilon(partition_id), int(view.graph.train_mask.sum()))


def setup(cfg, partition_id: int, view) -> tuple[Tensor, dict]:
    """``query.progap_setup``: ``(node ids [n], plan)``; the plan is a function of the public
    config and the directory's counts."""
    g = view.graph
    plan = {
        **client_plan(cfg, partition_id, view).to_dict(),
        "partition_id": partition_id,
        "num_nodes": g.num_nodes,
        "num_train": int(g.train_mask.sum()),
    }
    return g.node_ids, plan


def build_model(cfg, num_features: int, num_classes: int) -> ProgressiveModel:
    """All stages' submodels as the config says (dropout 0, as the official Facebook runs;
    ``batch-norm`` at node level: GroupNorm(1, C), per example, as the official DP-SGD runs)."""
    node = cfg.level == "node"
    return ProgressiveModel(
        num_features,
        num_classes,
        cfg.depth,
        cfg.hidden,
        cfg.base_layers,
        cfg.head_layers,
        cfg.jk,
        0.0,
        cfg.batch_norm and not node,
        group_norm=cfg.batch_norm and node,
    )


def stage_model(cfg, view, stage: int, weights: dict, cache: list[Tensor]):
    """``(model at stage, x [n, F + stage h])`` on this client's device; ``cache``: its
    aggregations of stages ``1..stage`` (``[n, h]`` each)."""
    s = view.schema
    model = build_model(cfg, s["num_features"], s["num_classes"])
    model.load_state_dict(weights)
    model.set_stage(stage)
    if len(cache) < stage:
        raise ValueError(
            f"stage {stage} needs {stage} cached aggregations, this client holds {len(cache)}"
        )
    dev = resolve_device(cfg.device)
    return model.to(dev), stage_input([view.graph.x] + list(cache[:stage])).to(dev)


def counts(
    model, x: Tensor, view, splits=("train", "val", "test"), *, with_loss: bool = False
) -> dict:
    """``<split>_correct``, ``<split>_total`` (and, ``with_loss``, ``<split>_loss``: the summed
    cross-entropy, for the edge-level round selection's ties) of ``model`` per split."""
    g, out = view.graph, {}
    for split in splits:
        r = evaluate(model, x, g.y.to(x.device), getattr(g, f"{split}_mask").to(x.device))
        out[f"{split}_correct"], out[f"{split}_total"] = r["correct"], r["total"]
        if with_loss:
            out[f"{split}_loss"] = float(r["loss"] * r["total"]) if r["total"] else 0.0
    return out


def admit_round(cfg, stage: int, server_round: int, last: dict[str, int]) -> dict[str, int]:
    """The client's check of a ``train.progap_stage`` message before it trains: round
    ``server_round`` of stage ``stage`` is within the ``epochs`` rounds per stage its plan
    covers and after the last one of that stage it took
    (:func:`fedgraph.methods.rounds.admit_round`).

    Raises:
        ValueError: a stage outside ``0..depth``, or the round refused (naming the range)."""
    if not 0 <= stage <= cfg.depth:
        raise ValueError(f"stage {stage} refused: allowed stages 0..{cfg.depth}")
    return rounds_admit(f"progap.stage{stage}", server_round, cfg.epochs, last)


def validation(cfg, model, x: Tensor, view, count: str = "num-examples") -> dict:
    """``val-accuracy``, ``val-loss`` (the mean cross-entropy) and the count (``count``:
    ``num-examples`` in an evaluation reply, ``val-examples`` beside a training reply's own
    count) of ``model`` on this client's validation nodes (eval mode): what an edge-level
    round's model selection reads (:func:`fedgraph.strategies.fedavg.selection_key`).

    Raises:
        ValueError: at node level (the validation labels are private there)."""
    if cfg.level != "edge":
        raise ValueError(
            "validation: refused at node level (the validation labels are "
            "private; allowed: level = 'edge')"
        )
    r = counts(model, x, view, ("val",), with_loss=True)
    total = r["val_total"]
    return {
        "val-accuracy": r["val_correct"] / total if total else 0.0,
        "val-loss": r["val_loss"] / total if total else 0.0,
        count: total,
    }


def train_round(
    cfg,
    partition_id: int,
    view,
    model,
    x: Tensor,
    generator,
    *,
    validate: bool = False,
    proximal_mu: float = 0.0,
) -> tuple[dict, dict]:
    """``train.progap_stage``: ``(arrays, metrics)`` at the received weights.

    Edge level (FedSGD): with ``validate`` first :func:`validation` of the received weights
    (the previous round's; eval mode), then the gradient of the mean training cross-entropy
    (train mode, one full batch) over the stage's parameters and the buffers after that
    pass, ``num-examples`` and ``train-loss``. Node level (FedAvg): ``local_epochs`` of DP-SGD
    with the plan's multiplier and the schedule of the public count
    (:func:`fedgraph.methods.gap.local_train`; ``proximal_mu``: FedProx's term), the whole
    state and the count 1 (the private count and loss do not leave)."""
    g = view.graph
    y, train = g.y.to(x.device), g.train_mask.to(x.device)
    if cfg.level == "edge":
        val = validation(cfg, model, x, view, "val-examples") if validate else {}
        names = model.stage_parameter_names()
        params = dict(model.named_parameters())
        idx = train.nonzero().flatten()
        model.train()
        if idx.numel():
            loss = F.cross_entropy(model(x[idx]), y[idx])
            grads = torch.autograd.grad(loss, [params[k] for k in names])
            out = {k: gr.detach() for k, gr in zip(names, grads)}
        else:
            loss, out = torch.tensor(0.0), {k: torch.zeros_like(params[k]) for k in names}
        out.update(model.named_buffers())
        return to_cpu(out), {
            "num-examples": int(idx.numel()),
            "train-loss": float(loss.detach()),
            **val,
        }
    plan = client_plan(cfg, partition_id, view)
    dp = plan.dpsgd(cfg.max_grad_norm)
    bsz = cfg.dpsgd_batch_size if dp else (cfg.batch_size or None)
    local_train(
        model,
        x,
        y,
        train,
        cfg.local_epochs,
        bsz,
        cfg.lr,
        dp,
        weight_decay=cfg.weight_decay,
        generator=generator,
        num_public=int(g.train_mask.sum()),
        proximal_mu=proximal_mu,
    )
    return to_cpu(model.state_dict()), {"num-examples": 1}


def release(
    cfg,
    partition_id: int,
    view,
    model,
    x: Tensor,
    *,
    remote_sigma: float | None,
    contributors: int | None,
    secagg: tuple | None,
    generator,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Step ``release`` of an aggregation (paper Eq. 4 split across clients, as one GAP PMA
    hop, :func:`fedgraph.methods.gap.client_pma.pma_partial_sums`): the stage's embedding
    ``H`` of this client's nodes, row-normalized, summed over its (node level:
    degree-bounded) local edges and over its boundary edges into every remote node, every row
    plus ``N(0, sigma^2 I)`` (remote rows ``remote_sigma`` when the server says, at node
    level clipped to the plan's ``remote_norm`` first).

    Args:
        remote_sigma: the request's common noise std of remote rows (``None``: the client's
            own sigma); used only if it is at least the client's sigma over the contributors
            the client counts itself (:func:`~fedgraph.methods.gap.privacy.own_contributors`:
            its verified peers under secure aggregation, else 1).
        contributors: the request's ``remote-contributors``, only cross-checked against that
            count.
        secagg: ``(private key, VerifiedKeys, owner [N], context)`` (the key list as this
            client verified it, :func:`fedgraph.secure_aggregation.verify_key_list`) or
            ``None``.
        generator: ``generator(purpose)``: ``progap:degree`` (the same bounding at every
            stage), ``progap:aggregation<stage>`` (the noise).

    Returns:
        ``(local_sums [n, h], release)``: kept, and the reply's rows (``ids``, ``sums`` or
        the masked record).
    Raises:
        ValueError: a remote sigma below this client's own over its own count of
            contributors, a ``contributors`` that differs from that count; secure aggregation
            without keys.
    """
    g, plan = view.graph, client_plan(cfg, partition_id, view)
    h = normalize_rows(model.embed(x))
    local, boundary = client_edges(g, gap_edges_config(cfg), generator("progap:degree"))
    others = torch.ones(view.schema["num_nodes"], dtype=torch.bool)
    others[g.node_ids] = False
    remote = (
        others.nonzero().flatten() if cfg.cross_client_edges else others.nonzero()[:0].flatten()
    )
    if remote_sigma is not None:  # a share only over contributors it verified
        if cfg.secure_aggregation and secagg is None:
            raise ValueError(
                "secure-aggregation = true but the server sent no public keys: "
                "refusing to release unmasked rows"
            )
        check_remote_sigma(
            remote_sigma,
            plan.sigma,
            own_contributors(cfg.secure_aggregation, secagg and secagg[1], contributors),
        )
    local_sums, ids, sums = pma_partial_sums(
        h,
        local,
        boundary,
        plan.sigma,
        generator(f"progap:aggregation{model.stage + 1}"),
        remote_ids=remote,
        remote_sigma=remote_sigma,
        remote_norm=plan.remote_norm,
    )
    out = {"ids": ids, "sums": sums}
    if cfg.secure_aggregation and ids.numel():  # only masked rows leave
        if secagg is None:
            raise ValueError(
                "secure-aggregation = true but the server sent no public keys: "
                "refusing to release unmasked rows"
            )
        private, keys, owner, context = secagg
        out = masked_release(ids, sums, private, list(keys.public_keys), keys.index, owner, context)
    return local_sums.detach().cpu(), to_cpu(out)


def finish(
    local_sums: Tensor, node_ids: Tensor, incoming_ids: Tensor, incoming_sums: Tensor
) -> Tensor:
    """Step ``finish``: this client's noisy local sums plus the noisy rows routed to its nodes
    (global ids ``incoming_ids``, each one of ``node_ids``): the next stage's input
    ``[n, h]``, not normalized (the official ``NAP``).

    Raises:
        ValueError: rows for nodes this client does not hold."""
    out = local_sums.clone()
    if incoming_ids.numel():
        table = torch.full(
            (int(max(node_ids.max(), incoming_ids.max())) + 1,), -1, dtype=torch.long
        )
        table[node_ids] = torch.arange(node_ids.numel())
        pos = table[incoming_ids]
        if bool((pos < 0).any()):
            raise ValueError("received rows for nodes this client does not hold")
        out.index_add_(0, pos, incoming_sums.to(out.dtype))
    return out
