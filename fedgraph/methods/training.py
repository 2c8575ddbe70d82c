"""Full-batch node-classification training with model selection on the validation set."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class TrainResult:
    """Best model (by validation accuracy) and its accuracies; ``epochs`` actually run."""

    model: nn.Module
    best_epoch: int
    train_accuracy: float
    val_accuracy: float
    epochs: int


def accuracy(logits: Tensor, y: Tensor, mask: Tensor) -> float:
    """Fraction of ``mask`` nodes whose argmax prediction equals ``y`` (nan if mask is empty)."""
    if int(mask.sum()) == 0:
        return float("nan")
    return float((logits[mask].argmax(-1) == y[mask]).float().mean())


def train_node_classifier(
    model: nn.Module,
    x: Tensor,
    edge_index: Tensor,
    y: Tensor,
    train_mask: Tensor,
    val_mask: Tensor,
    epochs: int = 200,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    patience: int | None = None,
) -> TrainResult:
    """Train ``model(x, edge_index)`` with Adam and cross-entropy on ``train_mask``; keep the
    weights of the epoch with the best validation accuracy (ties: lowest validation loss).

    Args:
        x: ``[N, F]``; edge_index: ``[2, E]``; y: long ``[N]`` (only ``train_mask`` and
            ``val_mask`` entries are read); masks: bool ``[N]``.
        patience: stop after this many epochs without improvement (None: run all epochs).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    best = (-1.0, float("inf"))
    best_state, best_epoch, since = copy.deepcopy(model.state_dict()), 0, 0
    epoch = 0
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        out = model(x, edge_index)
        F.cross_entropy(out[train_mask], y[train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            out = model(x, edge_index)
            val_acc = accuracy(out, y, val_mask)
            val_loss = float(F.cross_entropy(out[val_mask], y[val_mask]))
        if (val_acc, -val_loss) > (best[0], -best[1]):
            best, best_state, best_epoch, since = (
                (val_acc, val_loss),
                copy.deepcopy(model.state_dict()),
                epoch,
                0,
            )
        else:
            since += 1
            if patience is not None and since >= patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        out = model(x, edge_index)
    return TrainResult(
        model, best_epoch, accuracy(out, y, train_mask), accuracy(out, y, val_mask), epoch
    )
