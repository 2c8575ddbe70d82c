"""PPGNN (He et al., "Towards Personalized Differentially Private Learning for Decentralized
Local Graphs"), client and server halves as plain functions.

Client (one Flower supernode holding many users): map features to ``[-1, 1]`` with the public
feature domain, run the feature mechanism (PPM, Alg. 3, by default) for each user at its own
level, and release the report, the labels of its training/validation users (the paper's
setting; optionally through randomized response) and the graph structure it knows (the server
knows the structure in the paper's threat model).

Server: decode every client's report (:meth:`FeatureMechanism.estimate`), denoise with
FlexProp (Alg. 4) or KProp, train a GNN backbone with model selection on the validation users,
and predict. FlexProp's source weights are, by default (``weights = "posterior"``), the
expected inverse variance of a user's estimate given its ESW-decoded level
(:func:`fedgraph.mechanisms.ppm.posterior_inverse_variance`); ``weights = "level"`` is the
paper's Eq. 12. The default departs from the paper because it measured better: on
``synthetic-sbm:3000:4`` (20 seeds, paired) +1.25 +- 0.47 points over LPGNN at the smallest
level where Eq. 12 is -1.74 +- 0.56, and level with Eq. 12 or above it on Cora and CiteSeer
(README, Results). Test labels never leave the clients: accuracy is counted there
(:func:`count_correct`).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..accounting import PrivacyLedger, PureDP, ApproxDP
from ..config import ConfigError, PPGNNConfig
from ..data import ClientGraph
from ..mechanisms import FeatureMechanism, make_mechanism, randomized_response, to_unit_range
from ..nn import adjacency_for, flexprop_weights, make_backbone, weighted_propagation
from .training import TrainResult, train_node_classifier


def build_mechanism(cfg: PPGNNConfig) -> FeatureMechanism:
    """The configured feature mechanism (``cfg.mechanism``) with the configured budgets."""
    return make_mechanism(cfg.mechanism, budgets=cfg.budgets, gamma=cfg.gamma,
                          shares=cfg.shares, rescale=cfg.rescale, epsilon=cfg.epsilon,
                          delta=cfg.delta)


def level_subject(level: int) -> str:
    """Ledger subject of what the reports reveal about the level of a user at ``level``."""
    return f"level-{level} (level)"


#: release name of the level-inference entries (:func:`record_privacy`)
LEVEL_RELEASE = "whole report: level inference, features fixed"


def record_privacy(ledger: PrivacyLedger, cfg: PPGNNConfig, mech: FeatureMechanism,
                   num_features: int | None = None) -> None:
    """Record in ``ledger`` what each user at each level releases (subject ``level-<tau>``;
    ``every-user`` when the mechanism declares the same for every level).

    Every user releases once: the mechanism's parts (e.g. ESW and MLR) and, with
    ``label_epsilon > 0``, its label through randomized response. Without randomized response
    the labels of training/validation users are given to the server in the clear (the paper's
    setting) and the report says so.

    The unit of ``level-<tau>`` is the user's features (with its level fixed). A mechanism that
    hides the level (``hides_level``, PPM) also gets, with several levels, a subject
    :func:`level_subject` per level whose unit is the user's level: the epsilon of the whole
    report against every other level, features fixed
    (:meth:`~fedgraph.mechanisms.FeatureMechanism.level_epsilon`; for PPM 2.68 at level 1 of
    ``E = {1, 2, 4}``, ``gamma = 0.1``, not the ``gamma * eps_tau`` of ESW alone), for
    ``num_features`` features (``None``: the bound for every ``d``).
    """
    levels = range(1, len(cfg.budgets) + 1)
    spent = {level: mech.privacy_spent(level) for level in levels}
    uniform = len(levels) > 1 and all(spent[level] == spent[1] for level in levels)
    for level in ([1] if uniform else levels):
        # A mechanism that ignores the levels (LPGNN, the uniform baselines) gives every user
        # the same guarantee: one subject, not one row per level with the same epsilon.
        subject = "every-user" if uniform else f"level-{level}"
        for release, eps in spent[level].items():
            event = ApproxDP(eps, mech.delta()) if mech.delta() > 0 else PureDP(eps)
            ledger.record(subject, release, event)
        if cfg.label_epsilon > 0:
            ledger.record(subject, "labels (randomized response)", PureDP(cfg.label_epsilon))
    if mech.hides_level and len(levels) > 1:
        for level in levels:
            ledger.record(level_subject(level), LEVEL_RELEASE,
                          PureDP(mech.level_epsilon(level, num_features)))


def with_client_levels(client: ClientGraph, cfg: PPGNNConfig, generator) -> ClientGraph:
    """``client`` with its users' privacy levels drawn on the client
    (:func:`fedgraph.data.draw_privacy_levels` from ``cfg.budgets`` and ``cfg.shares``, in an
    order from the client's own ``generator``): the server learns a level only through ESW's
    release (issue 28, fault 2). A copy; the cached partition is not modified."""
    from dataclasses import replace

    from ..data import draw_privacy_levels

    return replace(client, levels=draw_privacy_levels(client.num_nodes, cfg.budgets,
                                                      cfg.shares, generator))


def client_report(client: ClientGraph, cfg: PPGNNConfig, feature_domain, num_classes: int,
                  generator: torch.Generator) -> dict[str, Tensor]:
    """Everything one client releases for PPGNN, as named tensors (ids are global).

    Keys: ``node_ids [n]``, ``mech.<name>`` (the mechanism's report), ``labelled_ids``,
    ``labels``, ``is_train`` (training and validation users), ``edge_index [2, e]`` (local
    and boundary edges, global ids). Raw features, levels and test labels never appear.

    Runs on the CPU whatever ``cfg.device``: the mechanism is an elementwise perturbation of
    this client's own users' features drawn from the CPU ``generator`` (the client's own,
    :func:`fedgraph.randomness.client_generator`; a seeded one is reproducible,
    the same draws on every machine) and its output goes straight into the Flower message,
    while the heavy computation (FlexProp and the GNN) is server side and already on
    ``cfg.device`` (:func:`server_fit`).

    Raises:
        ConfigError: if the dataset has no public feature domain, or the client is empty.
    """
    if feature_domain is None:
        raise ConfigError(
            f"dataset: {cfg.dataset!r} has no public feature domain; LDP feature mechanisms "
            "need one (features with a known range, e.g. binary bag-of-words)")
    if client.num_nodes == 0:
        raise ConfigError(f"client {client.client_id} holds no users")
    x = to_unit_range(client.x, *feature_domain)
    report = build_mechanism(cfg).perturb(x, client.levels, generator)
    labelled = client.train_mask | client.val_mask
    labels = client.y[labelled]
    if cfg.label_epsilon > 0:
        labels = randomized_response(labels, num_classes, cfg.label_epsilon, generator)
    edges = torch.cat([client.node_ids[client.edge_index],
                       torch.stack([client.node_ids[client.boundary_edge_index[0]],
                                    client.boundary_edge_index[1]])], dim=1)
    return {"node_ids": client.node_ids, **{f"mech.{k}": v for k, v in report.items()},
            "labelled_ids": client.node_ids[labelled], "labels": labels,
            "is_train": client.train_mask[labelled], "edge_index": edges}


@dataclass
class ServerFit:
    """What the server computed: the trained model, its inputs and predictions for all nodes."""

    train: TrainResult
    features: Tensor  # [N, d] denoised features
    edge_index: Tensor  # [2, E]
    predictions: Tensor  # long [N]
    level_hat: Tensor | None  # long [N] decoded levels (PPM) or None


def assemble(reports: list[dict[str, Tensor]], mech: FeatureMechanism, num_nodes: int,
             num_features: int):
    """Decode and scatter the clients' reports into global arrays.

    Returns ``(x_hat [N, d], level_hat [N] | None, y [N], train_mask, val_mask, edge_index)``.
    """
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
    edge_index = torch.unique(torch.cat(edges, dim=1), dim=1)
    return x_hat, level_hat, y, train_mask, val_mask, edge_index


def fit_each_steps(reports: list[dict[str, Tensor]], cfg: PPGNNConfig, num_nodes: int,
                   num_features: int, num_classes: int) -> Iterator[ServerFit]:
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
    from ..device import resolve_device

    dev = resolve_device(cfg.device)
    mech = build_mechanism(cfg)
    x_hat, level_hat, y, train_mask, val_mask, edge_index = assemble(
        reports, mech, num_nodes, num_features)
    w = None
    if cfg.denoiser == "flexprop" and level_hat is not None and cfg.weights == "posterior":
        from ..mechanisms.ppm import PPMParams, posterior_inverse_variance

        params = PPMParams(tuple(cfg.budgets), cfg.gamma, tuple(cfg.shares) if cfg.shares else None)
        w = posterior_inverse_variance(level_hat, params, num_features).to(dev)
    elif cfg.denoiser == "flexprop" and level_hat is not None and cfg.weights != "uniform":
        w = flexprop_weights(level_hat, cfg.budgets, cfg.weights, num_features, 1 - cfg.gamma)
        w = w.to(dev)
    x_hat, y, train_mask, val_mask, edge_index = (
        t.to(dev) for t in (x_hat, y, train_mask, val_mask, edge_index))
    graph = adjacency_for(cfg.backbone, edge_index, num_nodes)
    candidates = [0] if cfg.denoiser == "none" else sorted(set(cfg.steps))
    h, done = x_hat, 0
    for k in candidates:
        h = weighted_propagation(h, edge_index, k - done, w, cfg.self_loops)
        done = k
        feats = (h - h.mean(0)) / h.std(0).clamp_min(1e-6) if cfg.standardize else h
        torch.manual_seed(cfg.seed)
        model = make_backbone(cfg.backbone, num_features, num_classes, cfg.hidden, 2,
                              cfg.dropout).to(dev)
        result = train_node_classifier(model, feats, graph, y.clamp_min(0), train_mask, val_mask,
                                       epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                       patience=cfg.patience or None)
        result.steps = k
        with torch.no_grad():
            pred = result.model(feats, graph).argmax(-1)
        result.model = result.model.cpu()
        yield ServerFit(result, feats.cpu(), edge_index.cpu(), pred.cpu(), level_hat)


def server_fit(reports: list[dict[str, Tensor]], cfg: PPGNNConfig, num_nodes: int,
               num_features: int, num_classes: int) -> ServerFit:
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


def count_correct(client: ClientGraph, node_ids: Tensor, predictions: Tensor) -> dict[str, int]:
    """Client side of evaluation: compare the server's predictions with the true labels.

    Returns ``{"<split>_correct": .., "<split>_total": ..}`` for train, val and test.

    Raises:
        ValueError: if ``node_ids`` are not exactly this client's users.
    """
    if node_ids.shape != client.node_ids.shape or not bool((node_ids == client.node_ids).all()):
        raise ValueError("predictions do not match this client's users")
    out = {}
    for split in ("train", "val", "test"):
        mask = getattr(client, f"{split}_mask")
        out[f"{split}_correct"] = int((predictions[mask] == client.y[mask]).sum())
        out[f"{split}_total"] = int(mask.sum())
    return out
