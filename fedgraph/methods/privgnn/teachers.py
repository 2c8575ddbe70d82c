"""PrivGNN's teachers, internal to a client (paper Alg. 1 lines 4-6, Sec. 3.1.1-3.1.2, App.
G.1): per-query teachers trained on the ``K`` nearest nodes of a Poisson subsample
(:func:`teacher_posteriors`), or an ensemble of teachers on disjoint groups, each private node
assigned to one teacher independently (:func:`ensemble_votes`, :func:`teacher_assignment`: PATE
for graphs; one node changes one teacher). Their outputs are noise-free: never release them;
the releases are :func:`~.privacy.noisy_answers` and :func:`~.privacy.noisy_votes`.

Batched teachers (our addition, same privacy): the teachers of a block of queries are trained as
one model with per-teacher parameters (:class:`BatchedSAGE`) on the disjoint union of their
subgraphs. The loss is the *sum* of the teachers' losses and Adam (with L2 decay) acts element
by element, so each teacher's parameters follow exactly the trajectory of training it alone;
its output depends only on its own subsample, its query's public data and independent
randomness, which is all the per-query analysis needs.

Devices: a client's teachers (retrieval, training, prediction) run on the ``device`` given to
:func:`teacher_posteriors` (the federated client passes its run config's ``device``: the GPU
Ray assigned, else the CPU). Every random draw (Poisson subsamples, teacher initialisation,
dropout masks) comes from the caller's CPU :class:`torch.Generator` (or a
:class:`fedgraph.randomness.SecureRandom`; a federated client's:
:func:`fedgraph.randomness.client_generator`) and is then moved to the device, so a seed gives
the same draws on every device.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import subgraph

from ... import randomness as rng
from ...config import PrivGNNConfig
from .queries import FeatureProjection, QueryGraphs
from .split import check_neighbours, poisson_subsample


@dataclass
class TeacherConfig:
    """A query's teacher: a GraphSAGE with mean aggregation (paper App. G.1: 2 layers, hidden
    64, ReLU, dropout 0.5, Adam with learning rate 0.01, NLL loss, 200 epochs).

    ``batch_size`` teachers are trained together (:class:`BatchedSAGE`); it changes speed and
    memory only, never the result's distribution.
    """

    hidden: int = 64
    num_layers: int = 2
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 0.0
    epochs: int = 200
    batch_size: int = 64


def teacher_config(cfg: PrivGNNConfig) -> TeacherConfig:
    """The clients' per-query teachers (paper App. G.1 apart from the sizes in ``cfg``)."""
    return TeacherConfig(
        hidden=cfg.teacher_hidden,
        epochs=cfg.teacher_epochs,
        batch_size=cfg.teacher_batch_size,
        dropout=cfg.dropout,
        lr=cfg.lr,
    )


class BatchedSAGE(nn.Module):
    r"""``B`` independent GraphSAGE models (mean aggregation, as PyG's ``SAGEConv``:
    :math:`h_i' = W_l \,\mathrm{mean}_{j \to i} h_j + b + W_r h_i`), one per teacher, evaluated
    together on ``B`` graphs of up to ``N`` nodes.

    Forward: ``x [B, N, F]`` (dense) or a block-diagonal sparse ``[B*N, B*F]`` matrix (the
    union of the ``B`` feature matrices; exact and much faster for sparse bag-of-words), and
    ``adj [B, N, N]`` row-normalised (``adj[b, i, j] = 1/deg_in(i)`` for an edge ``j -> i``)
    -> logits ``[B, N, C]``.
    """

    def __init__(
        self,
        num_models: int,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.num_models, self.dims, self.dropout = num_models, dims, float(dropout)
        self.weight = nn.ParameterList()  # [B, d_in, 2 d_out] = [W_l^T | W_r^T]
        self.bias = nn.ParameterList()  # [B, 1, d_out] (lin_l's bias)
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(d_in)  # torch.nn.Linear's default initialisation
            w = (rng.rand((num_models, d_in, 2 * d_out), generator) * 2 - 1) * bound
            b = (rng.rand((num_models, 1, d_out), generator) * 2 - 1) * bound
            self.weight.append(nn.Parameter(w))
            self.bias.append(nn.Parameter(b))

    def forward(self, x: Tensor, adj: Tensor, generator: torch.Generator | None = None) -> Tensor:
        B, N = adj.shape[0], adj.shape[1]
        h = x
        for layer, (w, b) in enumerate(zip(self.weight, self.bias)):
            d_out = w.shape[-1] // 2
            if h.is_sparse:  # block-diagonal [B*N, B*F] @ [B*F, 2 d_out]
                z = torch.sparse.mm(h, w.reshape(-1, 2 * d_out)).view(B, N, 2 * d_out)
            else:
                z = torch.bmm(h, w)
            h = torch.bmm(adj, z[..., :d_out]) + b + z[..., d_out:]
            if layer < len(self.weight) - 1:
                h = F.relu(h)
                if self.training and self.dropout > 0:
                    # drawn on the CPU generator, then moved: the same mask on every device
                    keep = (rng.rand(h.shape, generator) >= self.dropout).to(h.device)
                    h = h * keep / (1.0 - self.dropout)
        return h

    def single(self, b: int, x: Tensor, edge_index: Tensor) -> Tensor:
        """Evaluation of model ``b`` alone on a graph ``(x [n, F], edge_index [2, E])`` with
        sparse mean aggregation -> logits ``[n, C]`` (no dropout)."""
        n = x.shape[0]
        src, dst = edge_index
        deg = x.new_zeros(n).index_add_(0, dst, x.new_ones(dst.numel())).clamp_min(1.0)
        h = x
        for layer, (w, bias) in enumerate(zip(self.weight, self.bias)):
            d_out = w.shape[-1] // 2
            z = h @ w[b]
            agg = z.new_zeros(n, d_out).index_add_(0, dst, z[src, :d_out]) / deg[:, None]
            h = agg + bias[b] + z[:, d_out:]
            if layer < len(self.weight) - 1:
                h = F.relu(h)
        return h


def _mean_adjacency(edge_index: Tensor, n: int) -> Tensor:
    """Dense ``[n, n]`` mean-aggregation matrix of ``edge_index`` (row = target), on
    ``edge_index``'s device."""
    a = torch.zeros(n, n, device=edge_index.device)
    if edge_index.numel():
        a[edge_index[1], edge_index[0]] = 1.0
    return a / a.sum(1, keepdim=True).clamp_min(1.0)


def _block_features(x: Tensor) -> Tensor:
    """``[B, N, F]`` -> sparse block-diagonal ``[B*N, B*F]`` (COO, coalesced)."""
    B, N, Fd = x.shape
    b, i, j = x.nonzero(as_tuple=True)
    idx = torch.stack([b * N + i, b * Fd + j])
    return torch.sparse_coo_tensor(idx, x[b, i, j], (B * N, B * Fd)).coalesce()


def train_teachers(
    xs: Tensor,
    adjs: Tensor,
    ys: Tensor,
    mask: Tensor,
    num_classes: int,
    cfg: TeacherConfig,
    generator: torch.Generator | None = None,
) -> BatchedSAGE:
    """Trains ``B`` teachers at once, teacher ``b`` on graph ``b`` only (paper Alg. 1 line 5).

    Args:
        xs: ``[B, K, F]`` features; adjs: ``[B, K, K]`` mean-aggregation matrices;
        ys: long ``[B, K]``; mask: bool ``[B, K]`` real (not padding) nodes.

    Every teacher is trained on all its real nodes for ``cfg.epochs`` epochs (there is no
    validation split inside a teacher's ``K`` nodes; as in the authors' code). The loss is the
    sum over teachers of each teacher's mean cross-entropy, so each teacher receives exactly its
    own gradient (see the module docstring). The teachers are trained on ``xs``'s device; their
    initial weights and dropout masks are drawn from ``generator`` (CPU) and moved there.
    """
    B, K, Fd = xs.shape
    model = BatchedSAGE(B, Fd, cfg.hidden, num_classes, cfg.num_layers, cfg.dropout, generator).to(
        xs.device
    )
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    density = float((xs != 0).float().mean()) if xs.numel() else 1.0
    feats = _block_features(xs) if density < 0.1 else xs
    counts = mask.sum(1).clamp_min(1).float()
    weights = (mask.float() / counts[:, None]).view(-1)  # per-teacher mean, summed over teachers
    target = ys.clamp_min(0).view(-1)
    model.train()
    for _ in range(cfg.epochs):
        opt.zero_grad()
        logits = model(feats, adjs, generator).reshape(B * K, -1)
        loss = (F.cross_entropy(logits, target, reduction="none") * weights).sum()
        loss.backward()
        opt.step()
    model.eval()
    return model


def _private_view(private) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x, y, edge_index, candidate)`` of a ClientGraph-like object; candidate = labelled
    (``train_mask`` if present, else all) nodes."""
    x, y, ei = private.x, private.y, private.edge_index
    cand = getattr(private, "train_mask", None)
    if cand is None:
        cand = torch.ones(x.shape[0], dtype=torch.bool)
    return x.float(), y, ei, cand


@dataclass
class TeacherTiming:
    """Measured cost of answering: seconds in total and per query."""

    seconds: float = 0.0
    queries: int = 0
    #: teachers whose Poisson subsample held fewer than K labelled nodes (they used them all)
    short_samples: int = 0

    @property
    def per_query(self) -> float:
        return self.seconds / max(self.queries, 1)


def teacher_posteriors(
    private,
    query_x: Tensor,
    *,
    rate: float,
    k: int,
    num_classes: int,
    teacher: TeacherConfig | None = None,
    neighbourhoods: QueryGraphs | None = None,
    projection: FeatureProjection | None = None,
    generator: torch.Generator | None = None,
    timing: TeacherTiming | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The noise-free posteriors of the per-query teachers, ``[Q, C]`` on ``device`` (``None``:
    the CPU). Internal to a client: never release these; :func:`answer_queries` is the release.

    For query ``q``: a fresh Poisson subsample (rate ``gamma``) of the private nodes, the ``k``
    sampled labelled nodes nearest to the query's features (Euclidean, ``torch.cdist``), a
    teacher trained on their induced subgraph, and its softmax at the query. The query is
    predicted from its public neighbourhood ``neighbourhoods.graph(q)`` when given (paper),
    else attached to its ``k`` retrieved nodes by edges ``neighbour -> query`` (a private-only
    variant: the teacher sees the query through the nodes it was retrieved with). A query whose
    subsample is empty gets the uniform posterior. With ``projection`` the teachers read
    projected features (retrieval still uses the raw ones).

    Every tensor and teacher lives on ``device``; the random draws come from ``generator``
    (CPU) and are moved there, so they do not depend on the device.
    """
    cfg = teacher or TeacherConfig()
    dev = torch.device("cpu") if device is None else torch.device(device)
    x, y, ei, cand = (t.to(dev) for t in _private_view(private))
    n = x.shape[0]
    Q = query_x.shape[0]
    check_neighbours(k, int(cand.sum()), rate)
    if neighbourhoods is not None and neighbourhoods.center.numel() != Q:
        raise ValueError("neighbourhoods must describe exactly the Q queries")
    if neighbourhoods is not None:  # ptr/center stay on the CPU: they only index
        neighbourhoods = QueryGraphs(
            neighbourhoods.x.to(dev),
            neighbourhoods.edge_index.to(dev),
            neighbourhoods.ptr,
            neighbourhoods.center,
        )
    if projection is not None:
        projection = FeatureProjection(projection.mean.to(dev), projection.components.to(dev))
    query_x = query_x.to(dev)
    t0 = time.perf_counter()
    dist = torch.cdist(query_x.float(), x)  # [Q, n]
    proj = projection if projection is not None else (lambda z: z.float())
    tx = proj(x)  # teacher inputs
    out = torch.full((Q, num_classes), 1.0 / num_classes, device=dev)
    short = 0
    for start in range(0, Q, cfg.batch_size):
        qs = list(range(start, min(Q, start + cfg.batch_size)))
        chosen = []
        for q in qs:
            sample = poisson_subsample(n, rate, generator).to(dev) & cand
            d = dist[q].masked_fill(~sample, float("inf"))
            kk = min(k, int(sample.sum()))  # below K only by a Poisson fluctuation
            short += int(kk < k)
            chosen.append(torch.topk(d, kk, largest=False).indices if kk else None)
        live = [i for i, c in enumerate(chosen) if c is not None]
        if not live:
            continue
        K = max(chosen[i].numel() for i in live)
        B = len(live)
        xs, adjs = tx.new_zeros(B, K, tx.shape[1]), tx.new_zeros(B, K, K)
        ys = torch.zeros(B, K, dtype=torch.long, device=dev)
        mask = torch.zeros(B, K, dtype=torch.bool, device=dev)
        sub_edges = []
        for j, i in enumerate(live):
            idx = chosen[i]
            m = idx.numel()
            sei, _ = subgraph(idx, ei, relabel_nodes=True, num_nodes=n)
            xs[j, :m], ys[j, :m], mask[j, :m] = tx[idx], y[idx], True
            adjs[j, :m, :m] = _mean_adjacency(sei, m)
            sub_edges.append(sei)
        model = train_teachers(xs, adjs, ys, mask, num_classes, cfg, generator)
        with torch.no_grad():
            for j, i in enumerate(live):
                q = qs[i]
                if neighbourhoods is not None:
                    gx, gei, c = neighbourhoods.graph(q)
                    gx = proj(gx)
                else:  # query attached to its retrieved nodes: node m, edges j -> m
                    m = chosen[i].numel()
                    gx = torch.cat([xs[j, :m], proj(query_x[q : q + 1])])
                    star = torch.stack(
                        [torch.arange(m, device=dev), torch.full((m,), m, device=dev)]
                    )
                    gei, c = torch.cat([sub_edges[j], star], 1), m
                out[q] = model.single(j, gx, gei)[c].softmax(-1)
    if timing is not None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # kernels run asynchronously: time them to the end
        timing.seconds += time.perf_counter() - t0
        timing.queries += Q
        timing.short_samples += short
    return out


def teacher_assignment(
    num_candidates: int, num_teachers: int, generator: torch.Generator | None = None
) -> Tensor:
    r"""Each of ``num_candidates`` labelled private nodes gets its own teacher, drawn
    independently and uniformly from ``0..num_teachers-1`` (long ``[num_candidates]``, CPU;
    :func:`fedgraph.randomness.randint` on the client's generator: never looks at the data).

    Why independent and not positional (issue 60, fault 6). PATE's sensitivity argument
    (Papernot et al., ICLR 2017, Sec. 2.1 and 3: disjoint partitions, one training point
    affects one teacher; ICLR 2018, "Scalable Private Learning with PATE", GNMax and its
    data-independent bound, Prop. 8) needs the teachers' training sets to be disjoint *and* a
    neighbouring private set to change exactly one of them; the GNMax histogram then moves by
    one vote, ``sqrt 2`` in L2 (:data:`~.privacy.VOTE_SENSITIVITY`). PrivGNN's ``PateG``
    baseline (paper Sec. 1 and Sec. 4.1) trains GNN teachers on disjoint splits of the private
    graph; our ensemble mode is that baseline, federated. The unit is node-level DP (paper
    Sec. 3.1.4, Thm. 7): add or remove one private node with its features, label and edges.

    - *Coupling.* Let ``D' = D \ {v}``. The entries are i.i.d., so the assignment of ``D``
      with ``v``'s entry deleted, ``a_{-v}``, has exactly the law of the assignment drawn for
      ``D'`` (the entries are drawn in candidate order from the same generator key, so ``D'``
      gets the same *law*; draws after ``v`` shift by one position, which the law does not
      see). Run ``D'`` with ``a_{-v}``: every node other than ``v`` keeps its teacher, group
      ``a_v`` loses ``v``, the other ``T - 1`` groups are identical.
    - *What a teacher's training data depends on* (:func:`ensemble_votes`): the features and
      labels of its group's nodes and the edges *among them* (the induced subgraph; an edge
      from ``v`` to another group is in no teacher's data, with or without ``v``), plus its own
      training randomness (initial weights, dropout masks: independent of the data and of the
      other teachers, so coupled teacher by teacher; the implementation draws them from one
      stream whose layout depends on the padded group size, which changes the draws, not their
      law). The query side (public neighbourhoods, the public PCA map) is public. So one node
      changes one teacher's inputs, hence at most one vote per query.
    - *Empty or tiny teachers.* A group may be small or empty (probability
      ``(1 - 1/T)^n`` per teacher). A teacher with no node abstains (votes nothing) instead
      of voting its random initialisation. Under the coupling the changed teacher's vote goes
      from one class to another (L2 ``sqrt 2``) or between a vote and an abstention (L2 1), so
      the histogram's L2 sensitivity stays ``sqrt 2``; the vote total (number of non-empty
      teachers) is part of the histogram and covered by the same bound.
    - *Mixture.* The release is a mixture over assignments with the same weights under ``D``
      and ``D'``; the hockey-stick divergence is jointly convex, so the Gaussian bound that
      holds for every fixed (coupled) assignment holds for the mixture. A round draws its own
      assignment (its own generator); rounds compose.

    The positional split it replaces (a permutation cut into ``T`` consecutive blocks of sizes
    ``ceil``/``floor(n/T)``) fails the coupling when ``n mod T != 0``: removing a node of a
    smaller block leaves sizes that no split of ``n - 1`` nodes produces, so any coupling
    moves a second node and two teachers change (worst case both move their vote between the
    same two classes: L2 sensitivity ``2 sqrt 2``). For ``n = 141``, ``T = 10`` that is 126 of
    141 nodes; at ``Q = 100``, ``sigma-votes = 40``, ``delta = 1e-5`` the ledger's 1.36 would
    then be 2.94 (analytic Gaussian, noise multiplier ``sigma / (2 sqrt 2)``). Group sizes are
    now ``Binomial(n, 1/T)``, not balanced; nothing downstream needs them equal.

    Raises:
        ValueError: ``num_teachers`` outside ``[1, num_candidates]`` (names ``num-teachers``;
            a simulation checks it before any client starts:
            :func:`~.graphs.check_config_neighbours`).
    """
    if not 1 <= int(num_teachers) <= int(num_candidates):
        raise ValueError(
            f"num-teachers must lie in [1, {int(num_candidates)}] (the client's "
            f"labelled private nodes; got {num_teachers})"
        )
    return rng.randint(0, int(num_teachers), (int(num_candidates),), generator)


def teacher_groups(
    num_candidates: int, num_teachers: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """A random partition of ``0..num_candidates-1`` into ``num_teachers`` disjoint groups
    (sorted; possibly empty): group ``t`` holds the nodes that :func:`teacher_assignment`
    sends to teacher ``t``, each node independently and uniformly (the draw does not look at
    the data). Removing one node changes exactly one group (the coupling and why:
    :func:`teacher_assignment`).

    Raises:
        ValueError: ``num_teachers`` outside ``[1, num_candidates]`` (names ``num-teachers``).
    """
    assign = teacher_assignment(num_candidates, num_teachers, generator)
    return [(assign == t).nonzero().view(-1) for t in range(int(num_teachers))]


def ensemble_votes(
    private,
    query_x: Tensor,
    *,
    num_teachers: int,
    num_classes: int,
    teacher: TeacherConfig | None = None,
    neighbourhoods: QueryGraphs | None = None,
    projection: FeatureProjection | None = None,
    generator: torch.Generator | None = None,
    timing: TeacherTiming | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Noise-free vote histograms of a client's teacher ensemble, ``[Q, C]`` float counts
    summing to the number of teachers with at least one node (``num_teachers`` unless a group
    drew no node) per query (internal to the client: never release them).

    Each of the client's labelled private nodes is assigned to one of ``num_teachers``
    teachers independently and uniformly (:func:`teacher_groups`, :func:`teacher_assignment`:
    the coupling and the PATE argument); teacher ``t`` is a GraphSAGE trained on the subgraph
    *induced* by its group (edges to other groups dropped), so adding or removing a private
    node (its features, label and edges) changes exactly one teacher's training data, and at
    most one vote per query moves: the histogram moves by at most ``sqrt 2`` in L2 norm,
    whatever ``num_teachers``. Each teacher votes for the argmax of its prediction of the
    query from its public neighbourhood (``neighbourhoods``; ``None``: the query's features
    alone, no edges); a teacher whose group is empty abstains (a vote to an abstention is an
    L2 change of 1, within ``sqrt 2``). Teachers are trained together (:class:`BatchedSAGE`:
    exactly as one by one).
    """
    cfg = teacher or TeacherConfig()
    dev = torch.device("cpu") if device is None else torch.device(device)
    x, y, ei, cand = (t.to(dev) for t in _private_view(private))
    n, Q = x.shape[0], query_x.shape[0]
    if neighbourhoods is not None and neighbourhoods.center.numel() != Q:
        raise ValueError("neighbourhoods must describe exactly the Q queries")
    t0 = time.perf_counter()
    proj = (
        (lambda z: (z.float() - projection.mean.to(dev)) @ projection.components.to(dev))
        if projection is not None
        else (lambda z: z.float())
    )
    tx = proj(x)
    ids = cand.nonzero().view(-1)
    groups = [ids[g.to(dev)] for g in teacher_groups(ids.numel(), num_teachers, generator)]
    T, K = len(groups), max(1, max(g.numel() for g in groups))  # K >= 1: all may be tiny
    xs, adjs = tx.new_zeros(T, K, tx.shape[1]), tx.new_zeros(T, K, K)
    ys = torch.zeros(T, K, dtype=torch.long, device=dev)
    mask = torch.zeros(T, K, dtype=torch.bool, device=dev)
    for t, idx in enumerate(groups):
        m = idx.numel()
        if m == 0:  # an empty teacher: no data, zero loss weight, abstains below
            continue
        sei, _ = subgraph(idx, ei, relabel_nodes=True, num_nodes=n)
        xs[t, :m], ys[t, :m], mask[t, :m] = tx[idx], y[idx], True
        adjs[t, :m, :m] = _mean_adjacency(sei, m)
    model = train_teachers(xs, adjs, ys, mask, num_classes, cfg, generator)
    if neighbourhoods is not None:
        gx, gei = proj(neighbourhoods.x.to(dev)), neighbourhoods.edge_index.to(dev)
        centers = neighbourhoods.center.to(dev)
    else:
        gx, gei = proj(query_x.to(dev)), torch.zeros(2, 0, dtype=torch.long, device=dev)
        centers = torch.arange(Q, device=dev)
    votes = torch.zeros(Q, num_classes, device=dev)
    with torch.no_grad():
        for t in range(T):
            if groups[t].numel() == 0:  # abstains (see the docstring)
                continue
            pred = model.single(t, gx, gei)[centers].argmax(-1)
            votes += F.one_hot(pred, num_classes).float()
    if timing is not None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        timing.seconds += time.perf_counter() - t0
        timing.queries += Q
    return votes


__all__ = [
    "TeacherConfig",
    "teacher_config",
    "BatchedSAGE",
    "train_teachers",
    "TeacherTiming",
    "teacher_posteriors",
    "teacher_assignment",
    "teacher_groups",
    "ensemble_votes",
]
