"""PPGNN's server half: decode every client's report (:meth:`FeatureMechanism.estimate`),
denoise with FlexProp (Alg. 4) or KProp, train a GNN backbone with model selection on the
validation users, and predict. Everything here is post-processing of the clients' DP reports.

FlexProp's source weights are, by default (``weights = "posterior"``), the expected inverse
variance of a user's estimate given its ESW-decoded level
(:func:`fedgraph.mechanisms.ppm.posterior_inverse_variance`); ``weights = "level"`` is the
paper's Eq. 12. The default departs from the paper because it measured better: on
``synthetic-sbm:3000:4`` (20 seeds, paired) +1.25 +- 0.47 points over LPGNN at the smallest
level where Eq. 12 is -1.74 +- 0.56, and level with Eq. 12 or above it on Cora and CiteSeer
(docs/results/accuracy.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import PPGNNConfig
from ...mechanisms import FeatureMechanism
from ...nn import adjacency_for, flexprop_weights, make_backbone, weighted_propagation
from ..training import TrainResult, train_node_classifier
from .privacy import build_mechanism


@dataclass
class ServerFit:
    """What the server computed: the trained model, its inputs and predictions for all nodes."""

    train: TrainResult
    features: Tensor  # [N, d] denoised features
    edge_index: Tensor  # [2, E]
    predictions: Tensor  # long [N]
    level_hat: Tensor | None  # long [N] decoded levels (PPM) or None


def assemble(
    reports: list[dict[str, Tensor]], mech: FeatureMechanism, num_nodes: int, num_features: int
):
    """Decode and scatter the clients' reports into global arrays.

    Raises:
        ValueError: the mechanism's estimate is not finite; two clients report the same user;
            users are missing.

    Returns ``(x_hat [N, d], level_hat [N] | None, y [N], train_mask, val_mask, edge_index)``;
    ``edge_index``: int64 ``[2, E]``, the union of the reported edges without duplicates,
    sorted by target then source (:func:`fedgraph.utils.sparse.unique_edges`: one int64 key
    per reported edge, not the ~300 bytes per edge of ``torch.unique(dim=1)``), so that the
    adjacency of FlexProp and of the backbone shares its columns with it.
    """
    from ...utils.sparse import unique_edges

    x_hat = torch.zeros(num_nodes, num_features)
    level_hat = None
    y = torch.full((num_nodes,), -1, dtype=torch.long)
    train_mask = torch.zeros(num_nodes, dtype=torch.bool)
    val_mask = torch.zeros(num_nodes, dtype=torch.bool)
    seen = torch.zeros(num_nodes, dtype=torch.bool)
    edges = []
    for rep in reports:
        ids = rep["node_ids"]
        if bool(seen[ids].any()):
            raise ValueError("two clients reported the same user")
        seen[ids] = True
        mrep = {k[5:]: v for k, v in rep.items() if k.startswith("mech.")}
        xc, lc = mech.estimate(mrep, num_features)
        if not bool(torch.isfinite(xc).all()):
            raise ValueError(
                f"mechanism: {type(mech).__name__}.estimate returned a non-finite "
                f"x_hat (NaN or inf) for {int((~torch.isfinite(xc)).any(1).sum())} "
                f"of {len(ids)} users of one client; allowed: finite estimates"
            )
        x_hat[ids] = xc
        if lc is not None:
            level_hat = torch.ones(num_nodes, dtype=torch.long) if level_hat is None else level_hat
            level_hat[ids] = lc
        y[rep["labelled_ids"]] = rep["labels"]
        train_mask[rep["labelled_ids"][rep["is_train"]]] = True
        val_mask[rep["labelled_ids"][~rep["is_train"]]] = True
        edges.append(rep["edge_index"])
    if not bool(seen.all()):
        raise ValueError(f"{int((~seen).sum())} users are missing from the clients' reports")
    edge_index = unique_edges(edges, num_nodes)
    return x_hat, level_hat, y, train_mask, val_mask, edge_index


def fit_each_steps(
    reports: list[dict[str, Tensor]],
    cfg: PPGNNConfig,
    num_nodes: int,
    num_features: int,
    num_classes: int,
) -> Iterator[ServerFit]:
    """Server half of PPGNN once per candidate ``K`` in ``cfg.steps`` (ascending): decode,
    denoise (FlexProp / KProp / none) with ``K`` steps, train, predict.

    Propagation is incremental (``K = 16`` after ``K = 8`` costs 8 more steps), and every
    ``K``'s model starts from the same seeded initialization, so the ``K`` of one candidate
    list gives the same result as a run with that single ``K``. With ``denoiser = "none"`` the
    only candidate is ``K = 0``. Everything here is post-processing of the clients' DP
    reports. Used by :func:`server_fit` (model selection on validation) and by the K sweep of
    ``bench/ppgnn_table.py`` (every ``K`` on the same reports).

    Runs on ``cfg.device`` (:func:`fedgraph.device.resolve_device`: ``auto`` is the server
    process's GPU if it has one); the yielded tensors and models are on the CPU.

    Yields:
        :class:`ServerFit` per ``K``, with ``train.steps = K``.
    """
    from ...device import resolve_device

    dev = resolve_device(cfg.device)
    mech = build_mechanism(cfg)
    x_hat, level_hat, y, train_mask, val_mask, edge_index = assemble(
        reports, mech, num_nodes, num_features
    )
    w = None
    if cfg.denoiser == "flexprop" and level_hat is not None and cfg.weights == "posterior":
        from ...mechanisms.ppm import PPMParams, posterior_inverse_variance

        params = PPMParams(
            tuple(cfg.feature_budgets), cfg.gamma, tuple(cfg.shares) if cfg.shares else None
        )
        w = posterior_inverse_variance(level_hat, params, num_features).to(dev)
    elif cfg.denoiser == "flexprop" and level_hat is not None and cfg.weights != "uniform":
        w = flexprop_weights(
            level_hat, cfg.feature_budgets, cfg.weights, num_features, 1 - cfg.gamma
        )
        w = w.to(dev)
    x_hat, y, train_mask, val_mask, edge_index = (
        t.to(dev) for t in (x_hat, y, train_mask, val_mask, edge_index)
    )
    graph = adjacency_for(cfg.backbone, edge_index, num_nodes)
    candidates = [0] if cfg.denoiser == "none" else sorted(set(cfg.steps))
    h, done = x_hat, 0
    for k in candidates:
        h = weighted_propagation(h, edge_index, k - done, w, cfg.self_loops)
        done = k
        feats = (h - h.mean(0)) / h.std(0).clamp_min(1e-6) if cfg.standardize else h
        torch.manual_seed(cfg.seed)
        model = make_backbone(
            cfg.backbone, num_features, num_classes, cfg.hidden, 2, cfg.dropout
        ).to(dev)
        result = train_node_classifier(
            model,
            feats,
            graph,
            y.clamp_min(0),
            train_mask,
            val_mask,
            epochs=cfg.epochs,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            patience=cfg.patience or None,
        )
        result.steps = k
        with torch.no_grad():
            pred = result.model(feats, graph).argmax(-1)
        result.model = result.model.cpu()
        yield ServerFit(result, feats.cpu(), edge_index.cpu(), pred.cpu(), level_hat)


def server_fit(
    reports: list[dict[str, Tensor]],
    cfg: PPGNNConfig,
    num_nodes: int,
    num_features: int,
    num_classes: int,
) -> ServerFit:
    """Server half of PPGNN: decode, denoise (FlexProp / KProp / none), train, predict.

    With several candidate ``cfg.steps`` (K), one model is trained per K
    (:func:`fit_each_steps`) and the one with the best validation accuracy is kept (ties: the
    smaller K): model selection on the validation users, whose labels the server holds.

    Returns:
        the selected :class:`ServerFit` (tensors and model on the CPU).
    """
    best = None
    for fit in fit_each_steps(reports, cfg, num_nodes, num_features, num_classes):
        if best is None or fit.train.val_accuracy > best.train.val_accuracy:
            best = fit
    return best


__all__ = ["ServerFit", "assemble", "fit_each_steps", "server_fit"]
