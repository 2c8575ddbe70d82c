"""PrivGNN's aggregation on the server (paper Alg. 1 line 8), post-processing of the clients'
noisy answers: sum each query's answers over the clients that answered it, drop queries nobody
answered (or, in the ensemble mode, below the Confident-GNMax threshold), argmax ->
pseudo-labels. With secure aggregation the server first unmasks the sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def aggregate_answers(answers: Sequence[Tensor]) -> Tensor:
    """Pseudo-labels: argmax of the clients' summed noisy answers (posteriors or votes),
    ``[Q, C]`` each -> long ``[Q]`` (post-processing)."""
    if not answers:
        raise ValueError("aggregate_answers: no answers")
    return torch.stack([a.float() for a in answers]).sum(0).argmax(-1)


def margin_filter(scores: Tensor, keep_fraction: float) -> Tensor:
    """bool ``[Q]``: the ``ceil(keep_fraction * Q)`` queries with the largest gap between the
    top two of ``scores [Q, C]`` (e.g. the summed *noisy* histograms the server received).
    On released values only, it is post-processing: no privacy cost (unlike a threshold copy,
    whose own noise is accounted); ``keep_fraction`` 1 keeps all.

    Raises:
        ValueError: ``keep_fraction`` outside (0, 1].
    """
    if not 0.0 < float(keep_fraction) <= 1.0:
        raise ValueError(f"keep-fraction must lie in (0, 1] (got {keep_fraction})")
    top2 = scores.float().topk(2, -1).values
    gap = top2[:, 0] - top2[:, 1]
    keep = torch.zeros(scores.shape[0], dtype=torch.bool)
    keep[gap.argsort(descending=True)[: math.ceil(float(keep_fraction) * scores.shape[0])]] = True
    return keep


def confident_aggregate(
    releases: Sequence[Tensor], num_classes: int, threshold: float | None = None
) -> tuple[Tensor, Tensor]:
    """Server side of the ensemble mode (post-processing of the clients' noisy histograms):
    sums the releases ``[Q, C]`` or ``[Q, 2C]`` (:func:`noisy_votes`) over the clients; with
    ``threshold`` (needs the threshold copies) a query is answered iff the summed threshold
    copy's maximum is ``>= threshold`` (Confident-GNMax); labels = argmax of the summed GNMax
    copies.

    Returns:
        ``(answered bool [Q], labels long [Q])`` (labels of unanswered queries are
        meaningless).
    """
    if not releases:
        raise ValueError("confident_aggregate: no release")
    total = torch.stack([r.float() for r in releases]).sum(0)
    C = int(num_classes)
    if total.shape[1] == 2 * C:
        check, gnmax = total[:, :C], total[:, C:]
    elif total.shape[1] == C:
        if threshold:
            raise ValueError("a threshold needs the clients' threshold copies (sigma-threshold)")
        check, gnmax = None, total
    else:
        raise ValueError(f"releases must be [Q, {C}] or [Q, {2 * C}] (got {tuple(total.shape)})")
    answered = (
        check.max(-1).values >= float(threshold)
        if threshold and check is not None
        else torch.ones(total.shape[0], dtype=torch.bool)
    )
    return answered, gnmax.argmax(-1)


def unmask_histograms(masked: dict[int, Tensor], num_clients: int) -> Tensor:
    """Server side of secure aggregation: the clients' masked histograms (client index ->
    ``[m, W]`` ``int64`` from :func:`masked_histograms`; every one of the ``num_clients``
    clients must send the same ``m``) added in the ring, which cancels the masks: the sum of the noisy histograms
    ``[m, W]`` (float32, up to :func:`~fedgraph.secure_aggregation.quantization_error_bound`).

    Raises:
        ValueError: a client's reply is missing or covers other queries (the masks do not
            cancel; no dropout recovery), or the widths differ.
    """
    import numpy as np

    from ...secure_aggregation import unmask_sum

    sizes = {int(t.shape[0]) for t in masked.values()}
    if len(sizes) != 1:
        raise ValueError(
            f"secure aggregation: the clients answered different numbers of "
            f"queries {sorted(sizes)}; the masks cancel only over the same rows"
        )
    m = sizes.pop()
    width = max(int(t.shape[1]) for t in masked.values())
    if m == 0:
        return torch.zeros(0, width)
    contributions = {i: (np.arange(m), t.numpy().view(np.uint64)) for i, t in masked.items()}
    ids, sums = unmask_sum(contributions, np.full(m, -1), int(num_clients))
    if ids.size != m:
        raise ValueError("secure aggregation: not every query was summed")
    return torch.from_numpy(sums).float()


@dataclass
class Aggregate:
    """Pseudo-labels of the answered queries: ``kept`` bool ``[Q]`` (answered by at least one
    client), ``labels`` long ``[kept.sum()]``, ``votes`` long ``[Q]`` (answers per query)."""

    kept: Tensor
    labels: Tensor
    votes: Tensor


def aggregate_partial(answers: list[Tensor], num_queries: int, num_classes: int) -> Aggregate:
    """Server side (post-processing): sum each query's noisy answers over the clients that
    answered it (each client answers a prefix ``[m_c, C]`` of the ``num_queries`` queries),
    drop queries with no answer, argmax (paper Alg. 1 line 8, :func:`aggregate_answers`
    on the answering clients)."""
    total = torch.zeros(int(num_queries), int(num_classes))
    votes = torch.zeros(int(num_queries), dtype=torch.long)
    for a in answers:
        m = int(a.shape[0])
        if m > num_queries:
            raise ValueError(f"a client answered {m} of {num_queries} queries")
        total[:m] += a.float()
        votes[:m] += 1
    kept = votes > 0
    return Aggregate(kept, total[kept].argmax(-1), votes)


def aggregate_ensemble(
    answers: list[Tensor],
    num_queries: int,
    num_classes: int,
    threshold: float = 0.0,
    keep_fraction: float = 1.0,
) -> Aggregate:
    """Server side of the ensemble mode (post-processing): each client answered a prefix
    ``[m_c, C]`` or ``[m_c, 2C]`` of the queries with noisy vote histograms; per query, sum
    over the clients that answered it, keep it if someone answered and (with ``threshold``)
    the summed threshold copy's maximum reaches it (Confident-GNMax), label = argmax of the
    summed GNMax copies (:func:`confident_aggregate`). ``keep_fraction < 1`` then
    keeps only that share of the kept queries with the widest noisy top-2 margin
    (:func:`margin_filter`)."""
    counts = torch.zeros(int(num_queries), dtype=torch.long)
    width = max([int(a.shape[1]) for a in answers if a.numel()], default=int(num_classes))
    padded = []
    for a in answers:
        m = int(a.shape[0])
        if m > num_queries:
            raise ValueError(f"a client answered {m} of {num_queries} queries")
        full = torch.zeros(int(num_queries), width)
        full[:m] = a.float()
        counts[:m] += 1
        padded.append(full)
    answered, labels = confident_aggregate(
        padded or [torch.zeros(int(num_queries), width)], num_classes, threshold or None
    )
    kept = answered & (counts > 0)
    if keep_fraction < 1.0 and int(kept.sum()):
        gnmax = torch.stack(padded).sum(0)[:, -int(num_classes) :]
        ids = kept.nonzero().view(-1)
        kept = torch.zeros_like(kept)
        kept[ids[margin_filter(gnmax[ids], keep_fraction)]] = True
    return Aggregate(kept, labels[kept], counts)


__all__ = [
    "aggregate_answers",
    "margin_filter",
    "confident_aggregate",
    "unmask_histograms",
    "Aggregate",
    "aggregate_partial",
    "aggregate_ensemble",
]
