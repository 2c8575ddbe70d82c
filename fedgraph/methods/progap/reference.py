r"""Centralized ProGAP (one party holding the whole graph): the paper's algorithm end to end.

Sajadmanesh and Gatica-Perez, ProGAP, WSDM 2024, Alg. 1; the official code's pipeline
(``core/methods/progap/base.py: pipeline``): for stage ``i = 0..K``, if ``i > 0`` the previous
stage's embedding is aggregated privately, :math:`X^{(i)} = A^T \mathrm{norm}(H^{(i-1)}) +
\mathcal N(0, \sigma^2 I)` (:func:`noisy_aggregation`; the official ``NAP``: normalize,
aggregate, perturb, no normalization after the noise), cached, and stage ``i`` is trained on
:math:`X^{(0..i)}` for ``epochs`` epochs with a fresh Adam (edge level: full batch, the weights
of the best validation epoch kept, as the official ``Trainer``; node level: DP-SGD, the last
epoch kept: validation labels are private there). Inference reuses the cached aggregations.

The federated strategy (``strategies/progap.py``) with one client computes the same; this is
what ``tests/test_progap_equivalence.py`` and ``bench/progap.py`` compare it with.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from ...nn.gap import normalize_rows
from ...utils.graph import bound_out_degree

# GAP's pieces this module reuses (one place, to repoint when GAP's modules move)
from ..gap.aggregation import aggregate, perturb
from ..gap.privacy import default_delta
from ..gap.training import evaluate, fit
from .model import ProgressiveModel, stage_input
from .privacy import aggregation_sensitivity, calibrate_progap, dpsgd_schedule, progap_events

__all__ = ["noisy_aggregation", "run_progap", "LEVEL_DEFAULTS"]

#: The official scripts' settings (test/facebook/progap-edge.sh, progap-node.sh): edge level
#: depth 5, base 1, head 1, 100 full-batch epochs per stage, batch norm; node level depth 4,
#: base 2, 5 epochs per stage, batch 256, D 100, clipping 1, the batch norms as GroupNorm(1, C)
#: (the official Opacus fixer, ``core/__init__.py``: per example, what DP-SGD can clip).
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "edge": dict(
        depth=5, base_layers=1, epochs=100, batch_size=None, batch_norm=True, select_on_val=True
    ),
    "node": dict(
        depth=4, base_layers=2, epochs=5, batch_size=256, batch_norm=True, select_on_val=False
    ),
}


def noisy_aggregation(
    h: Tensor, edge_index: Tensor, num_nodes: int, sigma: float, generator=None
) -> Tensor:
    r"""One ProGAP aggregation (paper Eq. 4, the official ``NAP``):
    :math:`A^T (h / \lVert h \rVert_{rows}) + \mathcal N(0, \sigma^2 I)`.

    Args:
        h: ``[N, e]`` embeddings; edge_index: ``[2, E]`` (``edge_index[0] -> [1]``);
        num_nodes: ``N``; sigma: noise std (multiplier x sensitivity; 0: none);
        generator: noise source.
    Returns:
        ``[N, e]``, not normalized (the next stage's base MLP reads it as it is).
    """
    return perturb(aggregate(normalize_rows(h), edge_index, num_nodes), sigma, generator)


def run_progap(
    data,
    *,
    level: str = "edge",
    epsilon: float = math.inf,
    delta: float | str = "auto",
    depth: int | None = None,
    hidden: int = 16,
    base_layers: int | None = None,
    head_layers: int = 1,
    jk: str = "cat",
    dropout: float = 0.0,
    batch_norm: bool | None = None,
    epochs: int | None = None,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    batch_size: int | None | str = "auto",
    max_degree: int = 100,
    max_grad_norm: float = 1.0,
    edge_unit: str = "directed",
    select_on_val: bool | None = None,
    accountant: str = "analytic",
    seed: int = 0,
) -> dict[str, Any]:
    r"""Centralized ProGAP.

    Args:
        data: PyG ``Data`` with ``x [N, F]``, ``y [N]``, ``edge_index [2, E]`` and the bool
            masks ``train_mask``/``val_mask``/``test_mask``.
        level: ``edge`` or ``node`` (defaults per level: :data:`LEVEL_DEFAULTS`).
        epsilon, delta: the target for the whole run (``delta="auto"``: the official
            :math:`10^{-\#digits}` of the edges / training nodes); ``inf``: no noise.
        depth: ``K`` aggregations (``K + 1`` stages).
        hidden, base_layers, head_layers, jk, dropout, batch_norm: the model
            (:class:`~fedgraph.methods.progap.model.ProgressiveModel`).
        epochs: per stage; lr, weight_decay: Adam; batch_size: ``None`` full batch (node
            level: DP-SGD's expected batch).
        max_degree, max_grad_norm: node level's ``D`` and clipping norm.
        edge_unit: ``directed`` (the official unit, sensitivity 1) or ``undirected``.
        select_on_val: keep each stage's best validation epoch (edge level default).
        accountant: of calibration and of the reported ``epsilon_spent``.
        seed: initialization (torch's global generator) and the run's noise and sampling.

    Returns:
        dict: ``train_acc``/``val_acc``/``test_acc``, ``stage_val_acc`` (per stage), privacy
        (``epsilon``, ``delta``, ``noise_multiplier``, ``sigma``, ``sensitivity``,
        ``epsilon_spent`` recomputed from ``events``), ``timings`` and ``config``.
    """
    from ...accounting import compose_epsilon

    if level not in LEVEL_DEFAULTS:
        raise ValueError(f"level: unknown {level!r}; allowed: edge, node")
    d = LEVEL_DEFAULTS[level]
    depth = d["depth"] if depth is None else depth
    base_layers = d["base_layers"] if base_layers is None else base_layers
    epochs = d["epochs"] if epochs is None else epochs
    bsz = d["batch_size"] if batch_size == "auto" else batch_size
    select = d["select_on_val"] if select_on_val is None else select_on_val
    private = not math.isinf(epsilon)
    use_dpsgd = private and level == "node"
    bn = d["batch_norm"] if batch_norm is None else batch_norm
    if use_dpsgd and bsz is None:
        raise ValueError("node-level DP-SGD needs a batch_size")
    t0, timings = time.perf_counter(), {}
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x, y, n = data.x, data.y, int(data.num_nodes)
    num_classes, n_train = int(y.max()) + 1, int(data.train_mask.sum())

    if delta == "auto":
        delta = default_delta(n_train if level == "node" else int(data.edge_index.size(1)))
    delta = float(delta)
    sens = aggregation_sensitivity(level, edge_unit=edge_unit, max_degree=max_degree)
    sched = dpsgd_schedule(n_train, bsz, epochs) if use_dpsgd else None
    z = (
        calibrate_progap(
            epsilon, delta, depth=depth, level=level, stage_schedule=sched, accountant=accountant
        )
        if private
        else 0.0
    )
    events = progap_events(z, depth, sched) if private else []
    spent = (
        float(compose_epsilon(events, delta, accountant=accountant))
        if events
        else (math.inf if depth > 0 or level == "node" else 0.0)
    )
    sigma = z * sens
    dp = None
    if use_dpsgd:
        from ..gap import DPSGD

        dp = DPSGD(z, max_grad_norm)
    timings["calibration"] = time.perf_counter() - t0

    edge_index = data.edge_index
    if level == "node" and depth > 0:
        edge_index = bound_out_degree(edge_index, n, max_degree, gen)
    model = ProgressiveModel(
        x.size(1),
        num_classes,
        depth,
        hidden,
        base_layers,
        head_layers,
        jk,
        dropout,
        bn and level == "edge",
        group_norm=bn and level == "node",
    )  # (node level: per example)
    cache, stage_val = [x], []
    timings["aggregation"] = timings["training"] = 0.0
    for stage in range(depth + 1):
        if stage > 0:
            t = time.perf_counter()
            h = model.embed(stage_input(cache))
            cache.append(noisy_aggregation(h, edge_index, n, sigma, gen))
            timings["aggregation"] += time.perf_counter() - t
        t = time.perf_counter()
        model.set_stage(stage)
        res = fit(
            model,
            stage_input(cache),
            y,
            data.train_mask,
            data.val_mask,
            epochs=epochs,
            batch_size=bsz,
            lr=lr,
            weight_decay=weight_decay,
            dp=dp,
            select_on_val=select,
            generator=gen,
        )
        stage_val.append(evaluate(model, stage_input(cache), y, data.val_mask)["accuracy"])
        timings["training"] += time.perf_counter() - t
        del res
    xs = stage_input(cache)
    metrics = {
        f"{s}_acc": evaluate(model, xs, y, getattr(data, f"{s}_mask"))["accuracy"]
        for s in ("train", "val", "test")
    }
    timings["total"] = time.perf_counter() - t0
    return {
        "method": "progap",
        "level": level,
        **metrics,
        "stage_val_acc": stage_val,
        "epsilon": epsilon,
        "delta": delta,
        "epsilon_spent": spent,
        "noise_multiplier": z,
        "sigma": sigma,
        "sensitivity": sens,
        "events": [repr(e) for e in events],
        "accountant": accountant,
        "timings": timings,
        "config": dict(
            depth=depth,
            hidden=hidden,
            base_layers=base_layers,
            head_layers=head_layers,
            jk=jk,
            dropout=dropout,
            batch_norm=bn,
            epochs=epochs,
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
