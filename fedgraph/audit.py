"""Membership-inference audits of released node classifiers.

Shadow-model attack (Shokri et al. 2017), as used by PrivGNN's appendix C (Olatunji et al.,
arXiv 2109.08907, Attack-1; the graph version follows Olatunji et al. 2021, "Membership
inference attack on graph neural networks"):

1. Shadow model: the attacker trains a model of the target's kind on a *shadow* graph drawn from
   the same distribution (``shadow_train(graph) -> predict_fn``).
2. Attack model: a binary MLP on the *sorted* posterior vectors of the shadow model, members =
   nodes of its training graph, non-members = nodes of a disjoint graph.
3. Inference: the attack model scores the target's posteriors on members and non-members; the
   audit reports the AUROC (0.5: random guessing).

A ``predict_fn(graph) -> [n, C]`` returns class probabilities of every node of a graph (a
:class:`torch_geometric.data.Data` with ``x`` and ``edge_index``), so a target is queried in the
inductive way the paper uses: member and non-member nodes are each presented in their own
induced subgraph of the same size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data

PredictFn = Callable[[Data], Tensor]


def auroc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (1 = positive), by the
    Mann-Whitney statistic with ties counted one half."""
    scores, labels = scores.double().view(-1), labels.view(-1).bool()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auroc needs positives and negatives")
    order = torch.argsort(scores)
    s = scores[order]
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, s.numel() + 1, dtype=torch.float64)
    # average ranks of ties
    uniq, inv, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    if uniq.numel() < scores.numel():
        sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, ranks)
        ranks = (sums / counts)[inv]
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def attack_features(posteriors: Tensor, top: int | None = 3) -> Tensor:
    """Attack input: the posterior sorted in decreasing order (first ``top`` entries; ``None``
    keeps all), so the attack is label-agnostic."""
    p = posteriors.float().sort(-1, descending=True).values
    return p if top is None else p[:, :top]


def train_attack(
    member_post: Tensor,
    nonmember_post: Tensor,
    *,
    top: int | None = 3,
    hidden: int = 64,
    epochs: int = 300,
    lr: float = 0.01,
    seed: int = 0,
) -> Callable[[Tensor], Tensor]:
    """Trains the attack MLP on a shadow model's posteriors; returns ``score(posteriors) ->
    [n]`` (higher = more likely a member). Classes are balanced by weighting."""
    gen = torch.Generator().manual_seed(int(seed))
    x = torch.cat([attack_features(member_post, top), attack_features(nonmember_post, top)])
    y = torch.cat([torch.ones(member_post.shape[0]), torch.zeros(nonmember_post.shape[0])])
    w = torch.where(
        y > 0, 0.5 / max(member_post.shape[0], 1), 0.5 / max(nonmember_post.shape[0], 1)
    )
    torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=gen)))
    model = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        opt.zero_grad()
        loss = (
            F.binary_cross_entropy_with_logits(model(x).view(-1), y, reduction="none") * w
        ).sum()
        loss.backward()
        opt.step()
    model.eval()

    def score(posteriors: Tensor) -> Tensor:
        with torch.no_grad():
            return model(attack_features(posteriors, top)).view(-1)

    return score


def membership_auroc(
    target_predict: PredictFn,
    members: Data,
    nonmembers: Data,
    *,
    shadow_train: Callable[[Data], PredictFn],
    shadow_members: Data,
    shadow_nonmembers: Data,
    top: int | None = 3,
    seed: int = 0,
    return_shadow: bool = False,
) -> float | tuple[float, float]:
    """AUROC of the shadow-model membership attack against ``target_predict``.

    Args:
        target_predict: the released model, ``graph -> [n, C]`` probabilities.
        members: a graph of nodes the target was trained on (or whose data it was built from);
            nonmembers: a graph of nodes it never saw, of the same size and distribution.
        shadow_train: the attacker's training procedure, ``graph (with y) -> predict_fn``.
        shadow_members: the attacker's shadow training graph; shadow_nonmembers: a disjoint
            graph of the same size.
        top: how many sorted posterior entries the attack reads (``None``: all).
        return_shadow: also return the attack's AUROC on the shadow model itself (how well the
            attack can work at all: an upper reference).

    Returns:
        AUROC on the target (and on the shadow model with ``return_shadow``).
    """
    shadow = shadow_train(shadow_members)
    s_in, s_out = shadow(shadow_members), shadow(shadow_nonmembers)
    score = train_attack(s_in, s_out, top=top, seed=seed)
    t_in, t_out = target_predict(members), target_predict(nonmembers)
    labels = torch.cat([torch.ones(t_in.shape[0]), torch.zeros(t_out.shape[0])])
    target = auroc(torch.cat([score(t_in), score(t_out)]), labels)
    if not return_shadow:
        return target
    shadow_auc = auroc(
        torch.cat([score(s_in), score(s_out)]),
        torch.cat([torch.ones(s_in.shape[0]), torch.zeros(s_out.shape[0])]),
    )
    return target, shadow_auc


def node_sample_graph(data: Data, num_nodes: int, generator: torch.Generator | None = None) -> Data:
    """The induced subgraph of ``num_nodes`` nodes of ``data`` drawn uniformly (to present
    members and non-members in graphs of equal size)."""
    from torch_geometric.utils import subgraph

    n = int(data.num_nodes)
    nodes = torch.randperm(n, generator=generator)[: min(int(num_nodes), n)].sort().values
    ei, _ = subgraph(nodes, data.edge_index, relabel_nodes=True, num_nodes=n)
    return Data(x=data.x[nodes], y=data.y[nodes], edge_index=ei, num_nodes=nodes.numel())


__all__ = ["auroc", "attack_features", "train_attack", "membership_auroc", "node_sample_graph"]
