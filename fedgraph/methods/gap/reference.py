"""Centralized GAP, one client holding the whole graph, end to end: :func:`run_gap` (encoder,
PMA, classifier, with the run's calibration), and its baselines (``method="mlp"``,
``"gap-inf"``, and ``"sage"``, GraphSAGE with or without DP-SGD: :mod:`.baselines`).

This is the reference a federated run is compared against (``bench/``, the equivalence tests):
with one client, federated GAP runs the same steps. One ``seed`` seeds torch's global generator
(initialization) and the run's own generator (sampling, degree bounding, noise).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import torch
from torch import Tensor

from ...nn.gap import MLP, GAPClassifier, GAPEncoder, stack_hops
from ...procstats import peak_rss_mib
from ...utils.graph import bound_out_degree, out_degree
from .aggregation import pma
from .baselines import (
    SAGE_COMBINATIONS,
    SAGE_DP_DEFAULTS,
    calibrate_sage_dp,
    sage_dp_events,
    sage_dp_features,
    sage_dp_sensitivity,
    train_sage,
    train_sage_dp,
)
from .privacy import (
    LEVELS,
    _compose,
    calibrate_gap,
    default_delta,
    edge_sensitivity,
    gap_events,
    node_sensitivity,
)
from .training import DPSGD, dpsgd_schedule, evaluate, train_classifier, train_encoder

METHODS = ("gap", "gap-inf", "mlp", "sage")


# Defaults of the paper's experiments (reference code, experiments.ipynb): Adam, lr 0.01,
# hidden 16, encoder 2 layers, base 1, head 1, cat, SELU, dropout 0; edge level and
# non-private: 100 + 100 epochs full batch with batch norm; node level: 10 + 10 epochs, batch
# 256 (Facebook), clipping norm 1, no batch norm, D tuned in {10, 20, 50, 100, 200}.
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "edge": dict(
        encoder_epochs=100,
        classifier_epochs=100,
        batch_size=None,
        batch_norm=True,
        select_on_val=True,
    ),
    "node": dict(
        encoder_epochs=10,
        classifier_epochs=10,
        batch_size=256,
        batch_norm=False,
        select_on_val=False,
    ),
}


def _seeded(seed: int) -> torch.Generator:
    """Seed torch's global generator (initialization) and return a CPU generator for the
    run's sampling and noise."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _shape(data) -> tuple[Tensor, Tensor, int, int, int]:
    """``(x, y, num_nodes, num_classes, num_train)`` of a split graph."""
    return (data.x, data.y, int(data.num_nodes), int(data.y.max()) + 1, int(data.train_mask.sum()))


def run_gap(
    data,
    *,
    method: str = "gap",
    level: str = "edge",
    epsilon: float = float("inf"),
    delta: float | str = "auto",
    num_hops: int = 2,
    encoder_dim: int = 16,
    hidden: int = 16,
    encoder_layers: int = 2,
    base_layers: int = 1,
    head_layers: int = 1,
    combine: str = "cat",
    dropout: float = 0.0,
    batch_norm: bool | None = None,
    encoder_epochs: int | None = None,
    classifier_epochs: int | None = None,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    batch_size: int | None | str = "auto",
    max_degree: int = 100,
    max_grad_norm: float = 1.0,
    edge_unit: str = "undirected",
    select_on_val: bool | None = None,
    accountant: str = "prv",
    encoder_output: Tensor | None = None,
    return_encoder_output: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    r"""Centralized GAP (one client holding the whole graph), end to end.

    Args:
        data: PyG ``Data`` with ``x [N, F]``, ``y [N]``, ``edge_index [2, E]`` and bool
            ``train_mask``/``val_mask``/``test_mask`` (e.g. :func:`fedgraph.data.gap_split`).
        method: ``"gap"``; ``"gap-inf"`` (GAP without noise, ``sigma = 0``); ``"mlp"`` (no
            edges: the classifier on hop 0 of the raw features, with ``encoder_layers`` base
            layers, as the paper's MLP baseline; at node level trained with DP-SGD = MLP-DP);
            ``"sage"``: GraphSAGE, only at ``level="edge"`` with ``epsilon=inf`` (without DP:
            ``num_hops`` layers, ``classifier_epochs`` epochs) or at ``level="node"`` with a
            finite epsilon (DP-SGD, see the module docstring: one layer, ``head_layers``
            linear layers after it, ``classifier_epochs`` epochs, default 10, full batch
            unless ``batch_size`` is given, last epoch kept; extra result keys
            ``dpsgd_noise_multiplier`` (given to Opacus), ``dpsgd_sensitivity``,
            ``dpsgd_steps``, ``max_out_degree_used``; ``sigma``/``sensitivity`` are those of
            the inference aggregation); other combinations raise ``ValueError``.
        level: ``"edge"`` or ``"node"`` (defaults per level in :data:`LEVEL_DEFAULTS`).
        epsilon, delta: privacy target (``delta="auto"``: :func:`default_delta`); ignored by
            ``gap-inf``; ``epsilon=inf`` trains without noise.
        num_hops: ``K`` (the paper tunes it in 1..5).
        encoder_dim, hidden, encoder_layers, base_layers, head_layers: architecture.
        combine, dropout, batch_norm: architecture (``batch_norm=None``: the level's
            default; never with DP-SGD).
        encoder_epochs, classifier_epochs, batch_size: training (``None``/``"auto"``: the
            level's default; ``batch_size=None`` is full batch, not allowed with DP-SGD).
        lr, weight_decay: Adam.
        max_degree: ``D`` of node-level degree bounding.
        max_grad_norm: DP-SGD clipping norm.
        edge_unit: ``"undirected"`` (default) or ``"directed"`` (the paper's unit; edge level,
            see :func:`~fedgraph.methods.gap.privacy.edge_sensitivity`).
        select_on_val: keep the best validation epoch (``None``: the level's default).
        accountant: accountant of calibration and of the reported epsilon.
        encoder_output: ``[N, e]`` encoder output to use instead of pre-training an encoder
            (e.g. one non-private encoder shared by a sweep over epsilon at edge level, where
            the encoder costs no privacy); refused when the encoder would need DP-SGD.
        return_encoder_output: add the encoder output (a tensor) under ``"encoder_output"``.
        seed: seeds the initialization, sampling, degree bounding and noise.

    Returns:
        dict with ``method``, ``level``, the accuracies ``train_acc``/``val_acc``/``test_acc``,
        the privacy figures (``epsilon`` target, ``delta``, ``noise_multiplier``, ``sigma``
        (PMA's noise std), ``sensitivity``, ``epsilon_spent`` recomputed by composing the events,
        ``events``), ``num_edges_used``, ``timings`` (seconds per phase), ``peak_rss_mib`` and
        ``config``.
    """
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; allowed: {', '.join(METHODS)}")
    if level not in LEVELS:
        raise ValueError(f"level: unknown {level!r}; allowed: {', '.join(LEVELS)}")
    for key in ("train_mask", "val_mask", "test_mask"):
        if getattr(data, key, None) is None:
            raise ValueError(f"data has no {key}: apply a split first (fedgraph.data.gap_split)")
    if method == "sage":
        if encoder_output is not None or return_encoder_output:
            raise ValueError(
                "method='sage' has no encoder: encoder_output and "
                "return_encoder_output apply to GAP only"
            )
        return _run_sage(
            data,
            level=level,
            epsilon=epsilon,
            delta=delta,
            num_hops=num_hops,
            hidden=hidden,
            head_layers=head_layers,
            dropout=dropout,
            batch_norm=batch_norm,
            epochs=classifier_epochs,
            lr=lr,
            weight_decay=weight_decay,
            batch_size=batch_size,
            max_degree=max_degree,
            max_grad_norm=max_grad_norm,
            select_on_val=select_on_val,
            accountant=accountant,
            seed=seed,
        )
    dflt = LEVEL_DEFAULTS[level]
    enc_epochs = dflt["encoder_epochs"] if encoder_epochs is None else encoder_epochs
    cls_epochs = dflt["classifier_epochs"] if classifier_epochs is None else classifier_epochs
    bsz = dflt["batch_size"] if batch_size == "auto" else batch_size
    select = dflt["select_on_val"] if select_on_val is None else select_on_val
    if method == "gap-inf":
        epsilon = float("inf")
    private = not math.isinf(epsilon)
    use_dpsgd = private and level == "node"
    bn = (dflt["batch_norm"] and not use_dpsgd) if batch_norm is None else batch_norm
    if use_dpsgd and bn:
        raise ValueError("batch_norm cannot be used with DP-SGD (node level)")
    if use_dpsgd and bsz is None:
        raise ValueError("node-level DP-SGD needs a batch_size")
    if private and not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    k = 0 if method == "mlp" else num_hops
    if method != "mlp" and k < 0:
        raise ValueError(f"num_hops must be >= 0, got {num_hops}")

    t_start, timings, gen = time.perf_counter(), {}, _seeded(seed)
    x, y, n, num_classes, n_train = _shape(data)
    if encoder_output is not None and (use_dpsgd or method == "mlp"):
        raise ValueError(
            "encoder_output can only replace a non-private encoder of GAP "
            "(node-level DP needs the encoder trained with DP-SGD, accounted here)"
        )
    train_encoder_too = (
        method != "mlp" and encoder_layers > 0 and enc_epochs > 0 and encoder_output is None
    )

    # ---- calibration: noise multiplier, sensitivity, events (kept together) ---------------
    t = time.perf_counter()
    if delta == "auto":
        delta = default_delta(n_train if level == "node" else int(data.edge_index.size(1)))
    delta = float(delta)
    enc_sched = (
        dpsgd_schedule(n_train, bsz, enc_epochs if train_encoder_too else 0) if use_dpsgd else None
    )
    cls_sched = dpsgd_schedule(n_train, bsz, cls_epochs) if use_dpsgd else None
    sensitivity = (
        (node_sensitivity(max_degree) if level == "node" else edge_sensitivity(edge_unit))
        if k > 0
        else 0.0
    )
    noise_multiplier, events, epsilon_spent = 0.0, [], 0.0
    if private and (k > 0 or use_dpsgd):
        noise_multiplier = calibrate_gap(
            epsilon,
            delta,
            num_hops=k,
            level=level,
            encoder_schedule=enc_sched,
            classifier_schedule=cls_sched,
            accountant=accountant,
        )
        events = gap_events(
            noise_multiplier,
            k,
            node_level=use_dpsgd,
            encoder_dpsgd=(enc_sched[0], noise_multiplier, enc_sched[1]) if use_dpsgd else None,
            classifier_dpsgd=(cls_sched[0], noise_multiplier, cls_sched[1]) if use_dpsgd else None,
        )
        epsilon_spent = _compose(events, delta, accountant) if events else 0.0
    elif not private and (k > 0 or level == "node"):
        epsilon_spent = float("inf")  # edges (k > 0) or node data used without noise
    sigma = noise_multiplier * sensitivity
    dp = DPSGD(noise_multiplier, max_grad_norm) if use_dpsgd else None
    timings["calibration"] = time.perf_counter() - t

    # ---- encoder (EM) ---------------------------------------------------------------------
    t = time.perf_counter()
    train_kw = dict(
        batch_size=bsz, lr=lr, weight_decay=weight_decay, dp=dp, select_on_val=select, generator=gen
    )
    enc_result, encoder = None, None
    if method == "mlp":
        x0 = x
    elif encoder_output is not None:
        x0 = encoder_output
    elif train_encoder_too:
        encoder = GAPEncoder(
            x.size(1), num_classes, encoder_dim, hidden, encoder_layers, dropout, bn
        )
        enc_result = train_encoder(
            encoder, x, y, data.train_mask, data.val_mask, epochs=enc_epochs, **train_kw
        )
    else:
        x0 = x  # GAP without encoder: PMA on the raw features
    timings["encoder"] = time.perf_counter() - t
    if encoder is not None:  # its output on every node, PMA's input (timed apart: a federated
        t = time.perf_counter()  # client computes it in PMA's first hop)
        x0 = encoder.embed(x)
        timings["embed"] = time.perf_counter() - t

    # ---- aggregation (AM) -----------------------------------------------------------------
    t = time.perf_counter()
    edge_index = data.edge_index
    if k > 0 and level == "node":
        edge_index = bound_out_degree(edge_index, n, max_degree, gen)
    hops = pma(x0, edge_index, k, sigma, gen)  # k = 0: [normalized x0], as the reference code
    features = stack_hops(hops)
    timings["aggregation"] = time.perf_counter() - t

    # ---- classifier (CM) ------------------------------------------------------------------
    t = time.perf_counter()
    classifier = GAPClassifier(
        k,
        features.size(-1),
        hidden,
        num_classes,
        combine,
        encoder_layers if method == "mlp" else base_layers,
        head_layers,
        dropout,
        bn,
    )
    cls_result = train_classifier(
        classifier, features, y, data.train_mask, data.val_mask, epochs=cls_epochs, **train_kw
    )
    timings["classifier"] = time.perf_counter() - t
    metrics = {
        f"{s}_acc": evaluate(classifier, features, y, getattr(data, f"{s}_mask"))["accuracy"]
        for s in ("train", "val", "test")
    }
    timings["total"] = time.perf_counter() - t_start

    extra = {"encoder_output": x0} if return_encoder_output else {}
    return {
        **extra,
        "method": method,
        "level": level,
        **metrics,
        "epsilon": epsilon,
        "delta": delta,
        "epsilon_spent": epsilon_spent,
        "noise_multiplier": noise_multiplier,
        "sigma": sigma,
        "sensitivity": sensitivity,
        "events": [repr(e) for e in events],
        "accountant": accountant,
        "num_edges_used": int(edge_index.size(1)) if k > 0 else 0,
        "encoder_best_epoch": enc_result.best_epoch if enc_result else None,
        "classifier_best_epoch": cls_result.best_epoch,
        "timings": timings,
        "peak_rss_mib": peak_rss_mib(),
        "config": dict(
            num_hops=k,
            encoder_dim=encoder_dim,
            hidden=hidden,
            encoder_layers=encoder_layers,
            base_layers=base_layers,
            head_layers=head_layers,
            combine=combine,
            dropout=dropout,
            batch_norm=bn,
            encoder_epochs=enc_epochs if train_encoder_too else 0,
            shared_encoder=encoder_output is not None,
            classifier_epochs=cls_epochs,
            lr=lr,
            weight_decay=weight_decay,
            batch_size=bsz,
            max_degree=max_degree if level == "node" else None,
            max_grad_norm=max_grad_norm if use_dpsgd else None,
            edge_unit=edge_unit if level == "edge" else None,
            select_on_val=select,
            seed=seed,
        ),
    }


def _run_sage(
    data,
    *,
    level: str,
    epsilon: float,
    delta: float | str,
    num_hops: int,
    hidden: int,
    head_layers: int,
    dropout: float,
    batch_norm: bool | None,
    epochs: int | None,
    lr: float,
    weight_decay: float,
    batch_size: int | None | str,
    max_degree: int,
    max_grad_norm: float,
    select_on_val: bool | None,
    accountant: str,
    seed: int,
) -> dict[str, Any]:
    """GraphSAGE baselines for :func:`run_gap` (``method="sage"``; see its docstring)."""
    private = not math.isinf(epsilon)
    if (level == "edge") == private:
        raise ValueError(
            f"method='sage' with level={level!r} and epsilon={epsilon}: not "
            f"supported; allowed: {'; '.join(SAGE_COMBINATIONS)}"
        )
    if private and not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if num_hops < 1:
        raise ValueError(f"num_hops must be >= 1 for GraphSAGE, got {num_hops}")
    if level == "node" and batch_norm:
        raise ValueError("batch_norm cannot be used with DP-SGD (node level)")
    t_start, timings, gen = time.perf_counter(), {}, _seeded(seed)
    x, y, n, num_classes, n_train = _shape(data)
    dflt = LEVEL_DEFAULTS[level]
    select = dflt["select_on_val"] if select_on_val is None else select_on_val
    if level == "node" and select_on_val:
        raise ValueError(
            "GraphSAGE-DP keeps the last epoch: validation labels are private "
            "at node level (select_on_val must be None or False)"
        )

    if level == "edge":  # GraphSAGE without DP: PyG's model, full batch
        from torch_geometric.nn import GraphSAGE
        from torch_geometric.utils import to_torch_csr_tensor

        bn = dflt["batch_norm"] if batch_norm is None else batch_norm
        ep = dflt["classifier_epochs"] if epochs is None else epochs
        model = GraphSAGE(
            x.size(1),
            hidden,
            num_layers=num_hops,
            out_channels=num_classes,
            dropout=dropout,
            act="selu",
            norm="batchnorm" if bn else None,
        )
        t = time.perf_counter()
        # sparse adj_t[target, source]: PyG then aggregates by sparse matmul; with edge_index
        # it would build the [E, F] message block (12.7 GB on Wisconsin87)
        with warnings.catch_warnings():  # "sparse CSR support is in beta", invariant checks
            warnings.simplefilter("ignore", UserWarning)
            adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(n, n))
        timings["aggregation"] = time.perf_counter() - t
        t = time.perf_counter()
        fit_result = train_sage(
            model,
            x,
            adj_t,
            y,
            data.train_mask,
            data.val_mask,
            epochs=ep,
            lr=lr,
            weight_decay=weight_decay,
            select_on_val=select,
        )
        timings["classifier"] = time.perf_counter() - t
        with torch.no_grad():
            pred = model(x, adj_t).argmax(-1)
        metrics = {
            f"{s}_acc": float((pred[m] == y[m]).float().mean())
            for s in ("train", "val", "test")
            for m in [getattr(data, f"{s}_mask")]
        }
        timings["total"] = time.perf_counter() - t_start
        return {
            "method": "sage",
            "level": level,
            **metrics,
            "epsilon": epsilon,
            "delta": default_delta(int(data.edge_index.size(1)))
            if delta == "auto"
            else float(delta),
            "epsilon_spent": float("inf"),  # edges and features used without noise
            "noise_multiplier": 0.0,
            "sigma": 0.0,
            "sensitivity": 0.0,
            "events": [],
            "accountant": accountant,
            "num_edges_used": int(data.edge_index.size(1)),
            "encoder_best_epoch": None,
            "classifier_best_epoch": fit_result.best_epoch,
            "timings": timings,
            "peak_rss_mib": peak_rss_mib(),
            "config": dict(
                num_hops=num_hops,
                hidden=hidden,
                dropout=dropout,
                batch_norm=bn,
                classifier_epochs=ep,
                lr=lr,
                weight_decay=weight_decay,
                batch_size=None,
                select_on_val=select,
                seed=seed,
            ),
        }

    # ---- GraphSAGE with DP-SGD (node level): calibration, sensitivity, events together ----
    ep = SAGE_DP_DEFAULTS["epochs"] if epochs is None else epochs
    bsz = SAGE_DP_DEFAULTS["batch_size"] if batch_size == "auto" else batch_size
    bsz = n_train if bsz is None else min(int(bsz), n_train)
    t = time.perf_counter()
    if delta == "auto":
        delta = default_delta(n_train)
    delta = float(delta)
    q, steps = dpsgd_schedule(n_train, bsz, ep)
    grad_sensitivity = sage_dp_sensitivity(max_degree, max_grad_norm)
    noise_multiplier = calibrate_sage_dp(epsilon, delta, steps, accountant=accountant)
    events = sage_dp_events(noise_multiplier, steps)
    epsilon_spent = _compose(events, delta, accountant)
    opacus_multiplier = noise_multiplier * grad_sensitivity / max_grad_norm  # = z (2D + 1)
    sensitivity = node_sensitivity(max_degree)  # of the inference aggregation
    sigma = noise_multiplier * sensitivity
    timings["calibration"] = time.perf_counter() - t

    t = time.perf_counter()
    edge_index = bound_out_degree(data.edge_index, n, max_degree, gen)
    train_x = sage_dp_features(x, edge_index, n)  # exact rows: DP-SGD protects training
    timings["aggregation"] = time.perf_counter() - t

    t = time.perf_counter()
    model = MLP(train_x.size(1), hidden, num_classes, 1 + head_layers, dropout, False)
    fit_result = train_sage_dp(
        model,
        train_x,
        y,
        data.train_mask,
        epochs=ep,
        batch_size=bsz,
        noise_multiplier=opacus_multiplier,
        max_grad_norm=max_grad_norm,
        lr=lr,
        weight_decay=weight_decay,
        generator=gen,
        num_public=n_train,
    )  # the schedule's count, as calibrated
    timings["classifier"] = time.perf_counter() - t
    t = time.perf_counter()
    del train_x
    eval_x = sage_dp_features(x, edge_index, n, sigma, gen)  # private inference
    metrics = {
        f"{s}_acc": evaluate(model, eval_x, y, getattr(data, f"{s}_mask"))["accuracy"]
        for s in ("train", "val", "test")
    }
    timings["inference"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_start
    return {
        "method": "sage",
        "level": level,
        **metrics,
        "epsilon": epsilon,
        "delta": delta,
        "epsilon_spent": epsilon_spent,
        "noise_multiplier": noise_multiplier,
        "sigma": sigma,
        "sensitivity": sensitivity,
        "dpsgd_noise_multiplier": opacus_multiplier,
        "dpsgd_sensitivity": grad_sensitivity,
        "dpsgd_steps": steps,
        "events": [repr(e) for e in events],
        "accountant": accountant,
        "num_edges_used": int(edge_index.size(1)),
        "max_out_degree_used": int(out_degree(edge_index, n).max()) if edge_index.numel() else 0,
        "encoder_best_epoch": None,
        "classifier_best_epoch": fit_result.best_epoch,
        "timings": timings,
        "peak_rss_mib": peak_rss_mib(),
        "config": dict(
            num_hops=1,
            hidden=hidden,
            head_layers=head_layers,
            dropout=dropout,
            batch_norm=False,
            classifier_epochs=ep,
            lr=lr,
            weight_decay=weight_decay,
            batch_size=bsz,
            sample_rate=q,
            max_degree=max_degree,
            max_grad_norm=max_grad_norm,
            select_on_val=False,
            seed=seed,
        ),
    }
