"""PrivGNN's student (paper Sec. 3.1.3, App. G.1): a GraphSAGE trained transductively on the
public graph with the released pseudo-labels, optionally smoothed by label propagation;
post-processing of the releases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.nn.models import GraphSAGE

from ...nn import adjacency_for
from ..training import TrainResult, accuracy, train_node_classifier


def make_sage(
    in_channels: int, out_channels: int, hidden: int = 64, num_layers: int = 2, dropout: float = 0.5
) -> nn.Module:
    """The paper's GraphSAGE (App. G.1: mean aggregation, ReLU, dropout)."""
    return GraphSAGE(in_channels, hidden, num_layers, out_channels, dropout=dropout, act="relu")


@dataclass
class StudentResult:
    """A trained GraphSAGE and its accuracies (``holdout_accuracy`` against pseudo-labels)."""

    model: nn.Module
    train: TrainResult
    holdout_accuracy: float
    test_accuracy: float
    predictions: Tensor = field(repr=False)


def propagate_labels(
    public: Data,
    query_idx: Tensor,
    labels: Tensor,
    num_classes: int,
    base: Tensor | None = None,
    alpha: float = 0.9,
    num_layers: int = 10,
) -> Tensor:
    """Label propagation over the public graph (Zhou et al., NeurIPS 2004; PyG's
    ``LabelPropagation``: ``Y <- alpha * D^-1/2 A D^-1/2 Y + (1 - alpha) Y0``, ``num_layers``
    steps) from ``Y0`` = one-hot released ``labels`` at ``query_idx`` and ``base`` (``[N, C]``
    class probabilities, e.g. a student's) elsewhere (zeros without it).

    Uses only released labels and public data: post-processing, no privacy cost.

    Returns:
        ``[N, C]`` propagated scores (argmax = prediction).
    """
    from torch_geometric.nn.models import LabelPropagation

    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"student-propagation (alpha) must lie in (0, 1) (got {alpha})")
    n = int(public.num_nodes)
    y0 = base.detach().float().clone() if base is not None else torch.zeros(n, int(num_classes))
    y0[query_idx] = F.one_hot(labels.long(), int(num_classes)).float()
    return LabelPropagation(int(num_layers), float(alpha))(y0, public.edge_index)


def train_student(
    public: Data,
    query_idx: Tensor,
    labels: Tensor,
    *,
    holdout_fraction: float = 0.2,
    hidden: int = 64,
    dropout: float = 0.5,
    epochs: int = 200,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    seed: int = 0,
    propagation: float = 0.0,
) -> StudentResult:
    """Server side: the student (paper Sec. 3.1.3), a 2-layer GraphSAGE trained transductively
    on the public graph with ``labels`` at ``query_idx``.

    Model selection uses a held-out slice (``holdout_fraction``) of the pseudo-labelled queries,
    never the public test labels; the test accuracy on ``public.test_mask`` is reported after
    selection (evaluation only). ``holdout_fraction = 0``: every pseudo-label is trained on
    and the epoch that fits them best is kept (``holdout_accuracy`` is NaN); with few noisy
    labels (the ensemble mode) a small held-out slice selects erratically (docs/explanations/privgnn.md).

    ``propagation`` in (0, 1) (our addition; 0: off): the student's class probabilities are
    smoothed over the public graph by label propagation with the released labels clamped in
    (:func:`propagate_labels` with ``alpha = propagation``); predictions and test accuracy are
    the smoothed ones. Public graph and released labels only: no privacy cost.
    """
    num_classes = (
        int(public.y.max()) + 1
        if labels.numel() == 0
        else max(int(public.y.max()), int(labels.max())) + 1
    )
    gen = torch.Generator().manual_seed(int(seed))
    perm = query_idx[torch.randperm(query_idx.numel(), generator=gen)]
    lab = torch.full((int(public.num_nodes),), -1, dtype=torch.long)
    lab[query_idx] = labels
    n_hold = int(round(holdout_fraction * perm.numel())) if perm.numel() > 1 else 0
    train_mask = torch.zeros(int(public.num_nodes), dtype=torch.bool)
    val_mask = torch.zeros_like(train_mask)
    val_mask[perm[:n_hold]] = True
    train_mask[perm[n_hold:]] = True
    if n_hold == 0:
        val_mask = train_mask
    torch.manual_seed(int(seed))
    model = make_sage(public.x.shape[1], num_classes, hidden, 2, dropout)
    graph = adjacency_for("sage", public.edge_index, int(public.num_nodes))
    res = train_node_classifier(
        model,
        public.x,
        graph,
        lab.clamp_min(0),
        train_mask,
        val_mask,
        epochs=epochs,
        lr=lr,
        weight_decay=weight_decay,
    )
    with torch.no_grad():
        logits = res.model(public.x, graph)
        if propagation:
            logits = propagate_labels(
                public, query_idx, labels, num_classes, logits.softmax(-1), alpha=propagation
            )
    return StudentResult(
        res.model,
        res,
        res.val_accuracy if n_hold else float("nan"),
        accuracy(logits, public.y, public.test_mask),
        logits.argmax(-1),
    )


__all__ = ["make_sage", "StudentResult", "propagate_labels", "train_student"]
