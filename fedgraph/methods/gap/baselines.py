r"""GAP's baselines (paper Sec. 6): GraphSAGE without DP and with node-level DP-SGD; run end to
end by :func:`~fedgraph.methods.gap.reference.run_gap` (``method="sage"``).

The extract we work from lacks that section's details, so the setup below is rebuilt from the
reference code, ``core/methods/node/sage/`` and ``core/privacy/algorithms/graph/gnn_sgd.py``,
and argued here (the other baselines, MLP and GAP without noise, are ``run_gap``'s
``method="mlp"`` and ``"gap-inf"``):

* GraphSAGE without DP (``method="sage"``, ``level="edge"``, ``epsilon=inf``): PyG's
  ``GraphSAGE``, ``K`` mean-aggregation layers, full batch, Adam, best validation epoch
  (:func:`train_sage`).
* GraphSAGE with DP-SGD (``method="sage"``, ``level="node"``, finite epsilon): one SAGE layer
  with mean aggregation on the graph with out-degrees bounded by ``D``
  (:func:`fedgraph.utils.bound_out_degree`; mean aggregation collects in-neighbours, so node
  ``v`` enters the aggregates of its out-neighbours: the out-degree is what must be bounded,
  in-degrees stay free). The aggregation has no parameters, so node ``i``'s input is the fixed
  row :math:`[\hat x_i, \mathrm{mean}_{j \to i} \hat x_j]` (:func:`sage_dp_features`) and the
  model an MLP of ``nn.Linear`` layers whose per-example gradients Opacus clips. Removing node
  ``v`` removes its own clipped gradient (norm <= ``C``) and changes those of its <= ``D``
  out-neighbours (by <= ``2C`` each: both versions have norm <= ``C``), so the summed gradient
  has L2 sensitivity :math:`(2D + 1) C` (:func:`sage_dp_sensitivity`) and Opacus is given the
  noise multiplier :math:`z (2D + 1)`. Accounting: every step is a Gaussian mechanism with
  multiplier ``z`` relative to that sensitivity, composed over all ``T`` steps with **no**
  credit for subsampling (Opacus's Poisson amplification assumes that one individual is one
  example; here one node affects up to ``D + 1`` of them; the reference code claims a
  hypergeometric amplification bound, which we do not use): conservative. Predictions use the
  neighbours' features, so inference uses the mean aggregation released once with Gaussian
  noise (sensitivity :math:`\sqrt D`, multiplier ``z``), one more event, as the reference code
  does (noise at inference only; training sees the exact rows, protected by DP-SGD).
  One multiplier ``z`` for all, calibrated with :func:`fedgraph.accounting.calibrate`
  (:func:`calibrate_sage_dp`; :func:`sage_dp_events`). The degree-bounding caveat of
  :mod:`fedgraph.utils.graph` (the sampling itself depends on the neighbourhood) applies as for
  GAP.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.gap import normalize_rows
from ...utils.graph import MAX_MESSAGE_ELEMENTS, in_degree
from ...utils.sparse import sum_over_edges
from .aggregation import perturb
from .training import DPSGD, FitResult, _BestEpoch, _indices, dpsgd_schedule

#: The (method, level, epsilon) combinations :func:`run_gap` accepts for ``method="sage"``.
SAGE_COMBINATIONS = (
    "method='sage', level='edge', epsilon=inf (GraphSAGE without DP)",
    "method='sage', level='node', finite epsilon (GraphSAGE with DP-SGD)",
)


#: Training defaults of node-level GraphSAGE-DP (``"auto"`` in :func:`run_gap`): full batch
#: (no amplification by sampling is claimed, so smaller batches only add steps, each paying
#: the full Gaussian mechanism), 10 epochs (= 10 noisy steps) as the level's other modules.
SAGE_DP_DEFAULTS: dict[str, Any] = dict(epochs=10, batch_size=None)


def mean_aggregate(
    h: Tensor, edge_index: Tensor, num_nodes: int, max_elements: int = MAX_MESSAGE_ELEMENTS
) -> Tensor:
    r"""GraphSAGE's mean aggregation over in-neighbours:
    ``out[v] = mean over (u, v) in E of h[u]`` (zero rows for nodes without in-edges).

    The sum by :func:`fedgraph.utils.sparse.sum_over_edges` (never an ``N x N`` matrix: a
    sparse matmul on target-sorted edges, else at most ``max_elements`` message elements at a
    time: raw features are wide, ``[E, F]`` would be 10 GB on Facebook100 Wisconsin87),
    divided by the in-degree.

    Args:
        h: ``[N_src, e]`` source rows; edge_index: long ``[2, E]``, ``edge_index[0] ->
            edge_index[1]``; num_nodes: target rows ``N``; max_elements: message block cap.

    Returns:
        ``[N, e]``.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    sums = sum_over_edges(h, edge_index[0], edge_index[1], num_nodes, max_elements)
    deg = in_degree(edge_index, num_nodes).clamp(min=1).to(sums.dtype)
    return sums / deg.unsqueeze(-1)


def sage_dp_features(
    x: Tensor,
    edge_index: Tensor,
    num_nodes: int,
    sigma: float = 0.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Inputs of node-level GraphSAGE-DP: row ``i`` is
    :math:`[\hat x_i,\ \bar x_i + \mathcal N(0, \sigma^2 I)]` with
    :math:`\hat x_i = x_i / \lVert x_i \rVert_2` and
    :math:`\bar x_i = \mathrm{mean}_{j \to i} \hat x_j` over the (degree-bounded) in-neighbours.

    A linear layer on this row is a SAGE convolution with mean aggregation
    (:math:`W_1 \hat x_i + W_2 \bar x_i + b`), so a model on these rows is a plain MLP whose
    per-example gradients Opacus computes. ``sigma = 0`` gives the exact rows (training);
    ``sigma > 0`` the noisy aggregation of private inference (every row of :math:`\bar x` has
    norm <= 1 and removing a node ``v`` changes only the rows of its out-neighbours, each by at
    most 1 in L2: a mean of ``d`` unit vectors moves by at most ``2 / d`` when one is removed,
    to zero when ``d = 1``; so a Gaussian mechanism with sensitivity :math:`\sqrt D` when
    out-degrees are bounded by ``D``, :func:`~fedgraph.methods.gap.privacy.node_sensitivity`).

    Args:
        x: ``[N, F]`` features; edge_index: ``[2, E]``; num_nodes: ``N``.
        sigma: noise std on the aggregation (``0``: none).
        generator: noise source.

    Returns:
        ``[N, 2F]``.
    """
    xh = normalize_rows(x)
    agg = perturb(mean_aggregate(xh, edge_index, num_nodes), sigma, generator)
    return torch.cat([xh, agg], dim=-1)


def sage_dp_sensitivity(max_degree: int, max_grad_norm: float = 1.0) -> float:
    r"""Node-level L2 sensitivity :math:`(2D + 1) C` of the sum of clipped per-example gradients
    of one-layer mean-aggregation GraphSAGE on a graph with out-degrees bounded by ``D``.

    Removing node ``v`` removes its own term (norm <= ``C``) and changes the terms of its at most
    ``D`` out-neighbours (the only aggregates that contain ``v``); a changed term goes from one
    vector of norm <= ``C`` to another, a change of up to ``2C``. Nothing else changes. (Counting
    ``C`` per changed term, ``(D + 1) C``, holds only for terms that vanish.) The GAP reference
    code (``GNNBasedNoisySGD``) uses the slightly larger ``2 (D + 1) C``.
    """
    if isinstance(max_degree, bool) or int(max_degree) != max_degree or max_degree < 1:
        raise ValueError(f"max_degree must be an integer >= 1, got {max_degree}")
    if not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
        raise ValueError(f"max_grad_norm must be finite and > 0, got {max_grad_norm}")
    return (2 * int(max_degree) + 1) * float(max_grad_norm)


def sage_dp_events(noise_multiplier: float, steps: int, inference: bool = True) -> list:
    """Privacy events of node-level GraphSAGE-DP: ``steps`` Gaussian mechanisms (the noisy
    gradient sums, multiplier relative to :func:`sage_dp_sensitivity`, **no** subsampling
    credit) and, with ``inference``, one more (the noisy aggregation of inference, multiplier
    relative to :math:`\\sqrt D`); one multiplier for all."""
    from ...accounting import Gaussian

    count = int(steps) + (1 if inference else 0)
    return [Gaussian(noise_multiplier, count=count)] if count > 0 else []


def calibrate_sage_dp(
    target_epsilon: float,
    delta: float,
    steps: int,
    *,
    inference: bool = True,
    accountant: str = "prv",
) -> float:
    """Smallest noise multiplier for which :func:`sage_dp_events` meets
    ``(target_epsilon, delta)`` (``inf``: 0, no noise)."""
    from ...accounting import calibrate

    if math.isinf(target_epsilon):
        return 0.0
    return float(
        calibrate(
            target_epsilon,
            delta,
            lambda z: sage_dp_events(z, steps, inference),
            accountant=accountant,
        )
    )


def train_sage_dp(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    train_mask: Tensor,
    *,
    epochs: int,
    batch_size: int | None,
    noise_multiplier: float,
    max_grad_norm: float,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    physical_batch_size: int = 1024,
    generator: torch.Generator | None = None,
    num_public: int | None = None,
) -> FitResult:
    r"""DP-SGD (Opacus, around Adam) on the fixed rows ``x`` (:func:`sage_dp_features`).

    The sampling rate, the number of steps and Opacus's normaliser (the expected batch size)
    come from ``num_public``, a public count of training rows (the public split's; ``None``:
    the rows of ``train_mask``, which is the public split's count when the mask is the public
    split), never from the rows a step actually used, as in the federated client
    (:func:`local_train`): dividing the noisy sum by a count that moves with the protected
    node would not be post-processing (Opacus issue 819's kind).

    Each step takes a Poisson sample of the training rows with rate ``q = batch_size / n``
    (``batch_size=None``: all rows, one step per epoch; :func:`dpsgd_schedule` gives the
    steps), clips every per-example gradient to ``max_grad_norm`` and adds Gaussian noise of
    std ``noise_multiplier * max_grad_norm`` to their sum (so pass the calibrated multiplier
    times ``2D + 1``: see :func:`sage_dp_sensitivity`). A sample is processed in chunks of
    ``physical_batch_size`` rows (per-example gradients of a ``2F x hidden`` layer for 10^4
    rows would not fit) with Opacus's skipped steps: clipped gradients accumulate and the noise
    is added once per step. The model is trained in place; hooks are removed afterwards.

    The accounting (:func:`sage_dp_events`) takes no credit for the sampling: each step is a
    Gaussian mechanism on the sampled sum (sensitivity ``(2D + 1) C`` whatever the sample;
    with ``q < 1`` a mixture over the other nodes' coins of such mechanisms, which is no less
    private), so full batch, the default of :func:`run_gap`, gives the fewest noisy steps.

    Returns:
        a :class:`FitResult` with the last epoch's model (no selection on validation labels).
    """
    from ..._lazy import import_without_root_logging

    GradSampleModule = import_without_root_logging("opacus").GradSampleModule
    from opacus.optimizers import DPOptimizer

    DPSGD(noise_multiplier, max_grad_norm)  # ValueError unless both are finite and > 0
    idx = _indices(train_mask, x.size(0), x.device)
    n = int(idx.numel())
    if n == 0:
        raise ValueError("no training rows")
    n_pub = n if num_public is None else int(num_public)
    bsz = n_pub if batch_size is None else min(int(batch_size), n_pub)
    q, steps = dpsgd_schedule(n_pub, bsz, epochs)
    per_epoch = steps // epochs if epochs else 0
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    gsm = GradSampleModule(model, loss_reduction="sum", strict=True)
    noise_gen = generator
    if generator is not None and x.device.type != "cpu":
        noise_gen = torch.Generator(device=x.device).manual_seed(
            int(torch.randint(2**62, (1,), generator=generator))
        )
    dp_opt = DPOptimizer(
        opt,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=bsz,
        loss_reduction="mean",
        generator=noise_gen,
    )
    result = FitResult(model, epochs, epochs)
    model.train()
    try:
        for _ in range(epochs):
            losses = []
            for _ in range(per_epoch):
                b = idx if q >= 1.0 else idx[torch.rand(n, generator=generator).to(idx.device) < q]
                chunks = list(torch.split(b, physical_batch_size)) or [b]
                dp_opt.zero_grad(set_to_none=True)
                total = 0.0
                for c, chunk in enumerate(chunks):
                    if c:
                        dp_opt.zero_grad(set_to_none=True)  # keeps the accumulated sum
                    loss = F.cross_entropy(gsm(x[chunk]), y[chunk], reduction="sum")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)
                        loss.backward()
                    if c < len(chunks) - 1:
                        dp_opt.signal_skip_step(True)  # clip and accumulate, no noise yet
                    dp_opt.step()
                    total += loss.item()
                if b.numel():
                    losses.append(total / b.numel())
            result.train_loss.append(sum(losses) / len(losses) if losses else float("nan"))
    finally:
        gsm._close()
        for p in model.parameters():
            p.grad = None
    model.eval()
    return result


def train_sage(
    model: nn.Module,
    x: Tensor,
    edge_index: Tensor,
    y: Tensor,
    train_mask: Tensor,
    val_mask: Tensor | None,
    *,
    epochs: int,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    select_on_val: bool = True,
) -> FitResult:
    """Full-batch Adam on a graph model ``model(x, edge_index) -> [N, C]`` logits (no DP;
    ``edge_index`` may be anything the model takes, e.g. a sparse ``adj_t``),
    keeping the epoch with the best validation accuracy (ties: lower validation loss) when
    ``select_on_val``, else the last."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = FitResult(model, epochs, epochs)
    tr = _indices(train_mask, x.size(0), x.device)
    va = _indices(val_mask, x.size(0), x.device) if val_mask is not None else None
    best = _BestEpoch()
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, edge_index)[tr], y[tr])
        loss.backward()
        opt.step()
        result.train_loss.append(loss.item())
        if select_on_val and va is not None and va.numel():
            model.eval()
            with torch.no_grad():
                out = model(x, edge_index)[va]
            acc = float((out.argmax(-1) == y[va]).float().mean())
            result.val_accuracy.append(acc)
            key = (acc, -float(F.cross_entropy(out, y[va])))
            best.update(model, key, epoch, result)
    best.restore(model)
    return result
