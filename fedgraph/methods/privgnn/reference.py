"""PrivGNN's reference points: the centralized run (one client, the paper's setting) and the
baselines (paper Sec. 4.1, App. G).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from ...nn import adjacency_for
from ..training import accuracy, train_node_classifier
from .client import answer_queries
from .privacy import Mode, privgnn_epsilon
from .queries import public_projection, query_neighbourhoods, select_queries
from .server import aggregate_answers
from .student import StudentResult, make_sage, train_student
from .teachers import TeacherConfig, TeacherTiming


@dataclass
class BaselineResult:
    model: nn.Module
    val_accuracy: float
    test_accuracy: float


def nonprivate_teacher(
    private: Data,
    public: Data,
    *,
    hidden: int = 64,
    dropout: float = 0.5,
    epochs: int = 200,
    lr: float = 0.01,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> BaselineResult:
    """Baseline B1 (non-private, inductive): a GraphSAGE trained on the whole private graph
    (model selection on a random ``val_fraction`` of its nodes), evaluated on the public test
    nodes in the public graph."""
    n = int(private.num_nodes)
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=gen)
    n_val = int(round(val_fraction * n))
    val_mask = torch.zeros(n, dtype=torch.bool)
    val_mask[perm[:n_val]] = True
    num_classes = int(max(int(private.y.max()), int(public.y.max()))) + 1
    torch.manual_seed(int(seed))
    model = make_sage(private.x.shape[1], num_classes, hidden, 2, dropout)
    res = train_node_classifier(
        model,
        private.x,
        adjacency_for("sage", private.edge_index, n),
        private.y,
        ~val_mask,
        val_mask,
        epochs=epochs,
        lr=lr,
    )
    with torch.no_grad():
        logits = res.model(
            public.x, adjacency_for("sage", public.edge_index, int(public.num_nodes))
        )
    return BaselineResult(res.model, res.val_accuracy, accuracy(logits, public.y, public.test_mask))


def public_label_student(public: Data, query_idx: Tensor, **kwargs) -> StudentResult:
    """Baseline B2 (non-private, transductive): the student trained with the true public labels
    of the query nodes (the best the public data allows with ``Q`` labels)."""
    return train_student(public, query_idx, public.y[query_idx], **kwargs)


def majority_accuracy(public: Data) -> float:
    """Accuracy of predicting the most frequent test class (a floor for every method)."""
    y = public.y[public.test_mask]
    return float(torch.bincount(y).max()) / max(y.numel(), 1)


@dataclass
class PrivGNNRun:
    """A centralized run: the student, pseudo-label accuracy, epsilon and timing."""

    student: StudentResult
    query_idx: Tensor
    pseudo_labels: Tensor
    label_accuracy: float
    epsilon: float | None
    timing: TeacherTiming


def run_centralized(
    private: Data,
    public: Data,
    *,
    num_queries: int = 1000,
    rate: float = 0.3,
    k: int = 300,
    lam: float = 0.2,
    delta: float = 1e-4,
    mode: Mode = "posterior",
    hops: int | None = 2,
    teacher: TeacherConfig | None = None,
    projection_dim: int | None = None,
    student_epochs: int = 200,
    seed: int = 0,
    accountant: str | None = "pld",
) -> PrivGNNRun:
    """PrivGNN with one client (the paper's setting): queries, answers, student, epsilon.

    ``hops=None`` attaches queries to their retrieved private nodes instead of their public
    neighbourhoods. ``accountant=None`` skips the epsilon computation.
    """
    gen = torch.Generator().manual_seed(int(seed))
    num_classes = int(max(int(private.y.max()), int(public.y.max()))) + 1
    qidx = select_queries(public, num_queries, "random", generator=gen)
    hoods = query_neighbourhoods(public, qidx, hops, generator=gen) if hops else None
    proj = public_projection(public.x, projection_dim, seed) if projection_dim else None
    timing = TeacherTiming()
    answers = answer_queries(
        private,
        public.x[qidx],
        rate=rate,
        k=k,
        lam=lam,
        num_classes=num_classes,
        teacher=teacher,
        mode=mode,
        neighbourhoods=hoods,
        projection=proj,
        generator=gen,
        timing=timing,
    )
    labels = aggregate_answers([answers])
    student = train_student(public, qidx, labels, epochs=student_epochs, seed=seed)
    eps = privgnn_epsilon(qidx.numel(), rate, lam, delta, accountant) if accountant else None
    return PrivGNNRun(
        student, qidx, labels, float((labels == public.y[qidx]).float().mean()), eps, timing
    )


__all__ = [
    "BaselineResult",
    "nonprivate_teacher",
    "public_label_student",
    "majority_accuracy",
    "PrivGNNRun",
    "run_centralized",
]
