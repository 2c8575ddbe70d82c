"""PrivGNN (Olatunji, Funke & Khosla, "Releasing Graph Neural Networks with Differential Privacy
Guarantees", TMLR 2023, arXiv 2109.08907), client and server halves as plain functions.

Setting (paper Sec. 3, App. F): a *private* labelled graph and a *public* graph whose nodes
have features but (for training) no labels. The released model is a *student* GNN trained on the
public graph; its labels come from private *teachers* through two noise mechanisms:

1. Private data selection (Alg. 1 lines 4-5, Sec. 3.1.1): for every query node ``v`` the holder
   of the private graph draws a Poisson subsample of its nodes (each node independently with
   probability ``gamma``), keeps the ``K`` sampled nodes nearest to ``v`` in feature space, and
   trains a teacher GNN on their induced subgraph (a *personalised* teacher per query).
2. Noisy pseudo-labels (lines 6-7, Sec. 3.1.2): the teacher predicts ``v`` from ``v``'s
   ``l``-hop public neighbourhood and releases its class posterior with Laplace noise on every
   coordinate (scale ``beta = 1/lambda`` in the paper's units, see below).
3. Student (Sec. 3.1.3): the public server takes the argmax of the (summed) noisy answers as
   pseudo-labels and trains a GraphSAGE student transductively on the public graph.

Privacy (Sec. 3.1.4, Thm. 7, App. B): per answered query the release is the Laplace mechanism
applied to a Poisson subsample, so ``Q`` queries compose ``Q`` Poisson-subsampled Laplace
mechanisms (:func:`privgnn_events`). We make the sensitivity explicit: a probability vector or a
one-hot vote changes by at most 2 in L1 norm (whatever two subsamples are compared), so the
noise scale is ``2 / lambda`` and the accountant sees a noise multiplier (scale / sensitivity)
of ``1 / lambda``; the paper's RDP curve (``b = 1/lambda`` at sensitivity 1) gives the same
epsilon. Everything after the noise (aggregation, student training) is post-processing.

Federation: the server holds the public graph (:func:`select_queries`,
:func:`query_neighbourhoods`, :func:`aggregate_answers`, :func:`train_student`); every client
holds private graphs, answers queries (:func:`answer_queries`) and refuses beyond its own budget
(:class:`QueryBudget`). One client is the paper's centralized setting.

Batched teachers (our addition, same privacy): the teachers of a block of queries are trained as
one model with per-teacher parameters (:class:`BatchedSAGE`) on the disjoint union of their
subgraphs. The loss is the *sum* of the teachers' losses and Adam (with L2 decay) acts element
by element, so each teacher's parameters follow exactly the trajectory of training it alone;
its output depends only on its own subsample, its query's public data and independent
randomness, which is all the per-query analysis needs.

Devices: a client's teachers (retrieval, training, prediction) run on the ``device`` given to
:func:`answer_queries` (the federated client passes its run config's ``device``: the GPU Ray
assigned, else the CPU). Every random draw (Poisson subsamples, teacher initialisation,
dropout masks, Laplace noise) comes from the caller's CPU :class:`torch.Generator` (or a
:class:`fedgraph.randomness.SecureRandom`; a federated client's:
:func:`fedgraph.randomness.client_generator`) and is then moved to the device, so a seed gives
the same draws on every device; the released answers are
CPU tensors.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.nn.models import GraphSAGE
from torch_geometric.utils import k_hop_subgraph, subgraph

from ..nn import adjacency_for
from .. import randomness as rng
from .training import TrainResult, accuracy, train_node_classifier

Mode = Literal["posterior", "vote", "log-softmax-paper"]
#: answer modes whose release is differentially private (the others reproduce a published rule)
DP_MODES = ("posterior", "vote")
#: why ``log-softmax-paper`` is not DP (the report's reason)
NOT_DP_REASON = (
    "answer-mode log-softmax-paper reproduces the authors' code: Laplace noise of scale "
    "1/lam on the teachers' log-softmax outputs, accounted by the paper as sensitivity 1. "
    "Log-probabilities are unbounded (one private node can move a log-probability from near "
    "0 to below -100), so no finite sensitivity, hence no finite epsilon, holds")

#: L1 sensitivity of a released answer: a probability vector or a one-hot vote (any two differ
#: by at most 2 in L1 norm).
SENSITIVITY = 2.0


# --------------------------------------------------------------------------------------------
# Data split (paper App. F, Table 11)
# --------------------------------------------------------------------------------------------
def _check_fraction(value: float, name: str, *, allow_zero: bool = False) -> float:
    value = float(value)
    lo_ok = value >= 0.0 if allow_zero else value > 0.0
    if not (math.isfinite(value) and lo_ok and value < 1.0):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must lie in {interval} (got {value})")
    return value


def _induced(data: Data, nodes: Tensor) -> Data:
    """Induced subgraph on ``nodes`` (global ids, sorted); keeps ``node_ids`` = those ids."""
    nodes = nodes.sort().values
    edge_index, _ = subgraph(nodes, data.edge_index, relabel_nodes=True,
                             num_nodes=int(data.num_nodes))
    out = Data(x=data.x[nodes], y=data.y[nodes], edge_index=edge_index, num_nodes=nodes.numel())
    out.node_ids = nodes
    for key in ("name", "feature_domain"):
        if key in data:
            out[key] = data[key]
    return out


def privgnn_split(data: Data, *, public_fraction: float = 0.5,
                  public_test_fraction: float = 0.5, audit_fraction: float = 0.0,
                  seed: int = 0) -> tuple[Data, Data] | tuple[Data, Data, Data]:
    """The paper's inductive split into a private and a public graph (App. F).

    A seeded permutation puts ``round(audit_fraction * N)`` nodes aside (membership-inference
    audits only; by default none), then ``round(public_fraction * rest)`` in the public graph,
    the others in the private graph. Each graph is the *induced* subgraph of its nodes: edges
    between the two parts are dropped (the paper's private and public graphs are disjoint).

    The paper splits Facebook evenly between private and public graphs and reserves a share of
    the public nodes for testing: 50% (Amazon, Amazon2M, Reddit, Credit), 40% (ArXiv) or 20%
    (Facebook); hence the defaults ``public_fraction=0.5`` and ``public_test_fraction=0.5``.

    Args:
        data: graph with ``x [N, F]``, ``y [N]``, ``edge_index``.
        public_fraction: share of the (non-audit) nodes in the public graph, in (0, 1).
        public_test_fraction: share of the public nodes that are test nodes, in (0, 1); the
            others form the query pool (``train_mask``).
        audit_fraction: share of all nodes kept out of both graphs, in [0, 1).
        seed: seed of the permutation (a local generator).

    Returns:
        ``(private, public)``, or ``(private, public, audit)`` if ``audit_fraction > 0``.
        ``private``: all nodes labelled, ``train_mask`` all true (ready for
        :func:`fedgraph.data.partition`). ``public``: ``train_mask`` = query pool (their labels
        are kept for baselines and diagnostics only), ``test_mask`` = test nodes, ``val_mask``
        all false. Each carries ``node_ids`` (ids in ``data``).
    """
    public_fraction = _check_fraction(public_fraction, "public_fraction")
    public_test_fraction = _check_fraction(public_test_fraction, "public_test_fraction")
    audit_fraction = _check_fraction(audit_fraction, "audit_fraction", allow_zero=True)
    n = int(data.num_nodes)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    n_audit = int(round(audit_fraction * n))
    rest = perm[n_audit:]
    n_pub = int(round(public_fraction * rest.numel()))
    if n_pub < 2 or rest.numel() - n_pub < 1:
        raise ValueError(f"privgnn_split: {n} nodes are too few for public_fraction="
                         f"{public_fraction}")
    pub_nodes, priv_nodes = rest[:n_pub], rest[n_pub:]
    private = _induced(data, priv_nodes)
    private.train_mask = torch.ones(private.num_nodes, dtype=torch.bool)
    private.val_mask = torch.zeros(private.num_nodes, dtype=torch.bool)
    private.test_mask = torch.zeros(private.num_nodes, dtype=torch.bool)
    public = _induced(data, pub_nodes)
    n_test = min(n_pub - 1, max(1, int(round(public_test_fraction * n_pub))))
    order = torch.randperm(n_pub, generator=torch.Generator().manual_seed(int(seed) + 1))
    public.test_mask = torch.zeros(n_pub, dtype=torch.bool)
    public.test_mask[order[:n_test]] = True
    public.train_mask = ~public.test_mask
    public.val_mask = torch.zeros(n_pub, dtype=torch.bool)
    if n_audit == 0:
        return private, public
    audit = _induced(data, perm[:n_audit])
    return private, public, audit


# --------------------------------------------------------------------------------------------
# Client side: sampling, teachers, noisy answers, budget
# --------------------------------------------------------------------------------------------
def poisson_subsample(num_nodes: int, rate: float,
                      generator: torch.Generator | None = None) -> Tensor:
    """Poisson subsample (paper Sec. 3.1.1, App. B.1): every node is kept independently with
    probability ``rate``; the subsampled-mechanism accountant assumes exactly this.

    Returns:
        bool ``[num_nodes]``.
    """
    rate = float(rate)
    if not (0.0 < rate <= 1.0):
        raise ValueError(f"rate (gamma) must lie in (0, 1] (got {rate})")
    return rng.rand(int(num_nodes), generator, torch.float64) < rate


def max_neighbours(num_candidates: int, rate: float) -> int:
    """The largest valid ``K`` (``num-neighbours``) for a private graph of ``num_candidates``
    labelled nodes at Poisson rate ``gamma``: ``floor(gamma * num_candidates)``, the expected
    size of a subsample (paper Sec. 3.1.1 retrieves ``K`` of the sampled nodes; a larger ``K``
    would silently use every sampled node, i.e. a teacher on the whole subsample)."""
    return int(math.floor(float(rate) * int(num_candidates) + 1e-9))


def check_neighbours(k: int, num_candidates: int, rate: float, where: str = "") -> int:
    """``k`` if it is a valid ``K`` for ``num_candidates`` labelled nodes at rate ``gamma``.

    Rule: ``1 <= K <= floor(gamma * num_candidates)`` (:func:`max_neighbours`). A subsample
    that happens to be smaller than ``K`` (Poisson fluctuation below its mean) uses all its
    nodes; :class:`TeacherTiming` counts those teachers (``short_samples``).

    Raises:
        ValueError: naming ``num-neighbours`` and the largest valid value.
    """
    k = int(k)
    largest = max_neighbours(num_candidates, rate)
    if k < 1 or k > largest:
        raise ValueError(
            f"num-neighbours (K) = {k} exceeds the expected Poisson sample "
            f"gamma * n = {float(rate):g} * {int(num_candidates)} = "
            f"{float(rate) * int(num_candidates):.1f}{where}: every teacher would be trained on "
            f"its whole subsample; allowed: 1 <= num-neighbours <= {largest} (or raise gamma)"
            if k >= 1 else f"num-neighbours (K) must be >= 1 (got {k})")
    return k


def laplace_noise(shape, scale: float, generator: torch.Generator | None = None) -> Tensor:
    """i.i.d. ``Laplace(0, scale)`` samples (inversion of a uniform; float32).

    Raises:
        ValueError: ``scale`` not finite and > 0.
    """
    from ..mechanisms._checks import check_noise_scale

    scale = check_noise_scale(scale, "scale (Laplace noise)")
    u = rng.rand(shape, generator, torch.float64) - 0.5
    return (-float(scale) * torch.sign(u) * torch.log1p(-2.0 * u.abs())).float()


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


class BatchedSAGE(nn.Module):
    r"""``B`` independent GraphSAGE models (mean aggregation, as PyG's ``SAGEConv``:
    :math:`h_i' = W_l \,\mathrm{mean}_{j \to i} h_j + b + W_r h_i`), one per teacher, evaluated
    together on ``B`` graphs of up to ``N`` nodes.

    Forward: ``x [B, N, F]`` (dense) or a block-diagonal sparse ``[B*N, B*F]`` matrix (the
    union of the ``B`` feature matrices; exact and much faster for sparse bag-of-words), and
    ``adj [B, N, N]`` row-normalised (``adj[b, i, j] = 1/deg_in(i)`` for an edge ``j -> i``)
    -> logits ``[B, N, C]``.
    """

    def __init__(self, num_models: int, in_channels: int, hidden_channels: int,
                 out_channels: int, num_layers: int = 2, dropout: float = 0.5,
                 generator: torch.Generator | None = None):
        super().__init__()
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.num_models, self.dims, self.dropout = num_models, dims, float(dropout)
        self.weight = nn.ParameterList()  # [B, d_in, 2 d_out] = [W_l^T | W_r^T]
        self.bias = nn.ParameterList()    # [B, 1, d_out] (lin_l's bias)
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


def train_teachers(xs: Tensor, adjs: Tensor, ys: Tensor, mask: Tensor, num_classes: int,
                   cfg: TeacherConfig, generator: torch.Generator | None = None) -> BatchedSAGE:
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
    model = BatchedSAGE(B, Fd, cfg.hidden, num_classes, cfg.num_layers, cfg.dropout,
                        generator).to(xs.device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                           fused=True)
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


@dataclass
class QueryGraphs:
    """The public neighbourhoods of ``Q`` query nodes, as sent by the server: the disjoint
    union of the ``l``-hop subgraphs (``x [M, F]``, ``edge_index [2, E]`` in union ids),
    ``ptr [Q+1]`` (graph ``q`` is nodes ``ptr[q]:ptr[q+1]``) and ``center [Q]`` (union id of
    query ``q``)."""

    x: Tensor
    edge_index: Tensor
    ptr: Tensor
    center: Tensor

    @property
    def query_x(self) -> Tensor:
        return self.x[self.center]

    def graph(self, q: int) -> tuple[Tensor, Tensor, int]:
        """``(x [m, F], edge_index [2, e] local ids, center local id)`` of query ``q``."""
        lo, hi = int(self.ptr[q]), int(self.ptr[q + 1])
        e = self.edge_index
        keep = (e[0] >= lo) & (e[0] < hi)
        return self.x[lo:hi], e[:, keep] - lo, int(self.center[q]) - lo


def query_neighbourhoods(public: Data, query_idx: Tensor, hops: int = 2,
                         max_nodes: int | None = 2000,
                         generator: torch.Generator | None = None) -> QueryGraphs:
    """Server side: the ``hops``-hop public neighbourhood of every query (paper Sec. 3.1.2: a
    teacher predicts a query from its ``l``-hop neighbourhood; ``l`` = number of layers).

    ``max_nodes`` caps a neighbourhood (a uniform random subset of the non-centre nodes, the
    public graph is public so this choice costs no privacy); ``None`` keeps all.
    """
    xs, edges, ptr, centers, offset = [], [], [0], [], 0
    for v in query_idx.tolist():
        nodes, ei, mapping, _ = k_hop_subgraph(int(v), hops, public.edge_index, relabel_nodes=True,
                                               num_nodes=int(public.num_nodes))
        c = int(mapping[0])
        if max_nodes is not None and nodes.numel() > max_nodes:
            others = torch.tensor([i for i in range(nodes.numel()) if i != c])
            keep = others[rng.randperm(others.numel(), generator)[:max_nodes - 1]]
            keep = torch.cat([torch.tensor([c]), keep]).sort().values
            ei, _ = subgraph(keep, ei, relabel_nodes=True, num_nodes=nodes.numel())
            c = int((keep == c).nonzero())
            nodes = nodes[keep]
        xs.append(public.x[nodes])
        edges.append(ei + offset)
        centers.append(c + offset)
        offset += nodes.numel()
        ptr.append(offset)
    return QueryGraphs(torch.cat(xs), torch.cat(edges, 1), torch.tensor(ptr),
                       torch.tensor(centers))


@dataclass
class FeatureProjection:
    """A linear map of features fitted on *public* data only (so it costs no privacy), applied
    to every teacher's input: ``(x - mean) @ components``. Retrieval still uses raw features."""

    mean: Tensor        # [F]
    components: Tensor  # [F, d]

    def __call__(self, x: Tensor) -> Tensor:
        return (x.float() - self.mean) @ self.components


def public_projection(public_x: Tensor, dim: int = 64, seed: int = 0) -> FeatureProjection:
    """Server side: PCA of the public features (``torch.pca_lowrank``) to ``dim`` components,
    sent to clients so that their teachers are small (:func:`answer_queries`'s
    ``projection``). Public data only: no privacy cost."""
    torch.manual_seed(int(seed))
    mean = public_x.float().mean(0)
    dim = min(int(dim), *public_x.shape)
    _, _, v = torch.pca_lowrank(public_x.float() - mean, q=dim, center=False, niter=4)
    return FeatureProjection(mean, v[:, :dim])


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


def teacher_posteriors(private, query_x: Tensor, *, rate: float, k: int, num_classes: int,
                       teacher: TeacherConfig | None = None,
                       neighbourhoods: QueryGraphs | None = None,
                       projection: FeatureProjection | None = None,
                       generator: torch.Generator | None = None,
                       timing: TeacherTiming | None = None,
                       device: torch.device | str | None = None) -> Tensor:
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
        neighbourhoods = QueryGraphs(neighbourhoods.x.to(dev), neighbourhoods.edge_index.to(dev),
                                     neighbourhoods.ptr, neighbourhoods.center)
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
                    gx = torch.cat([xs[j, :m], proj(query_x[q:q + 1])])
                    star = torch.stack([torch.arange(m, device=dev),
                                        torch.full((m,), m, device=dev)])
                    gei, c = torch.cat([sub_edges[j], star], 1), m
                out[q] = model.single(j, gx, gei)[c].softmax(-1)
    if timing is not None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # kernels run asynchronously: time them to the end
        timing.seconds += time.perf_counter() - t0
        timing.queries += Q
        timing.short_samples += short
    return out


def noisy_answers(posteriors: Tensor, lam: float, mode: Mode = "posterior",
                  generator: torch.Generator | None = None) -> Tensor:
    """Laplace mechanism on the teachers' outputs (paper Sec. 3.1.2): ``posterior`` releases
    the probability vector, ``vote`` the one-hot argmax, each plus i.i.d. Laplace noise of scale
    ``SENSITIVITY / lam`` (= 2 / lambda) per coordinate. The noise is drawn from
    ``generator`` on the CPU and moved to ``posteriors``' device (the same draws everywhere).

    ``log-softmax-paper`` (a reproduction, **not differentially private**): the authors' code
    releases ``log(posterior) + Laplace(1 / lambda)`` (log-softmax outputs, the paper's
    ``beta = 1/lambda`` at an assumed sensitivity of 1); log-probabilities have no finite
    sensitivity (:data:`NOT_DP_REASON`). Probabilities are clamped at the float32 ``tiny``
    (``log`` of an underflowed softmax is ``-87.3`` instead of ``-inf``).

    Returns:
        ``[Q, C]`` noisy answers, on ``posteriors``' device.
    """
    lam = float(lam)
    if not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"lam (lambda) must be finite and > 0 (got {lam})")
    if mode == "posterior":
        clean = posteriors
    elif mode == "vote":
        clean = F.one_hot(posteriors.argmax(-1), posteriors.shape[-1]).float()
    elif mode == "log-softmax-paper":
        clean = posteriors.float().clamp_min(torch.finfo(torch.float32).tiny).log()
        return clean + laplace_noise(clean.shape, 1.0 / lam, generator).to(clean.device)
    else:
        raise ValueError(f"answer-mode: unknown {mode!r}; allowed: "
                         "['posterior', 'vote', 'log-softmax-paper']")
    return clean + laplace_noise(clean.shape, SENSITIVITY / lam, generator).to(clean.device)


# --------------------------------------------------------------------------------------------
# Ensemble answers (PATE for graphs: Papernot et al., ICLR 2018, "Scalable Private Learning
# with PATE"; our federated adaptation)
# --------------------------------------------------------------------------------------------
def teacher_groups(num_candidates: int, num_teachers: int,
                   generator: torch.Generator | None = None) -> list[Tensor]:
    """A uniform random partition of ``0..num_candidates-1`` into ``num_teachers`` disjoint
    groups of sizes differing by at most one (the draw does not look at the data).

    Raises:
        ValueError: ``num_teachers`` outside ``[1, num_candidates]`` (names ``num-teachers``).
    """
    if not 1 <= int(num_teachers) <= int(num_candidates):
        raise ValueError(f"num-teachers must lie in [1, {int(num_candidates)}] (the client's "
                         f"labelled private nodes; got {num_teachers})")
    perm = rng.randperm(int(num_candidates), generator)
    return [g.sort().values for g in torch.tensor_split(perm, int(num_teachers))]


def ensemble_votes(private, query_x: Tensor, *, num_teachers: int, num_classes: int,
                   teacher: TeacherConfig | None = None,
                   neighbourhoods: QueryGraphs | None = None,
                   projection: FeatureProjection | None = None,
                   generator: torch.Generator | None = None,
                   timing: TeacherTiming | None = None,
                   device: torch.device | str | None = None) -> Tensor:
    """Noise-free vote histograms of a client's teacher ensemble, ``[Q, C]`` float counts
    summing to ``num_teachers`` per query (internal to the client: never release them).

    The client's labelled private nodes are split into ``num_teachers`` disjoint random groups
    (:func:`teacher_groups`); teacher ``t`` is a GraphSAGE trained on the subgraph *induced* by
    group ``t`` (edges to other groups dropped), so a private node (its features, label and
    edges) influences exactly one teacher, and its removal changes at most one vote per query:
    the histogram moves by at most ``sqrt 2`` in L2 norm, whatever ``num_teachers``. Each
    teacher votes for the argmax of its prediction of the query from its public neighbourhood
    (``neighbourhoods``; ``None``: the query's features alone, no edges). Teachers are trained
    together (:class:`BatchedSAGE`: exactly as one by one).
    """
    cfg = teacher or TeacherConfig()
    dev = torch.device("cpu") if device is None else torch.device(device)
    x, y, ei, cand = (t.to(dev) for t in _private_view(private))
    n, Q = x.shape[0], query_x.shape[0]
    if neighbourhoods is not None and neighbourhoods.center.numel() != Q:
        raise ValueError("neighbourhoods must describe exactly the Q queries")
    t0 = time.perf_counter()
    proj = ((lambda z: (z.float() - projection.mean.to(dev)) @ projection.components.to(dev))
            if projection is not None else (lambda z: z.float()))
    tx = proj(x)
    ids = cand.nonzero().view(-1)
    groups = [ids[g.to(dev)] for g in teacher_groups(ids.numel(), num_teachers, generator)]
    T, K = len(groups), max(g.numel() for g in groups)
    xs, adjs = tx.new_zeros(T, K, tx.shape[1]), tx.new_zeros(T, K, K)
    ys = torch.zeros(T, K, dtype=torch.long, device=dev)
    mask = torch.zeros(T, K, dtype=torch.bool, device=dev)
    for t, idx in enumerate(groups):
        m = idx.numel()
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
            pred = model.single(t, gx, gei)[centers].argmax(-1)
            votes += F.one_hot(pred, num_classes).float()
    if timing is not None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        timing.seconds += time.perf_counter() - t0
        timing.queries += Q
    return votes


def noisy_votes(votes: Tensor, sigma_votes: float, sigma_threshold: float | None = None,
                generator: torch.Generator | None = None, shares: int = 1) -> Tensor:
    """A client's release of its vote histograms ``[Q, C]``: ``votes + N(0, sigma_votes^2 /
    shares)`` per coordinate (the GNMax copy) and, with ``sigma_threshold``, an independent
    ``votes + N(0, sigma_threshold^2 / shares)`` (the copy for Confident-GNMax's threshold
    check), concatenated: ``[Q, C]`` or ``[Q, 2C]`` (threshold copy first), on the CPU.

    ``shares = 1`` (no secure aggregation): each copy is the Gaussian mechanism of std
    ``sigma`` on a histogram of L2 sensitivity ``sqrt 2`` (:func:`ensemble_events`), against
    everyone who sees the reply, the server included.

    ``shares = n`` (secure aggregation over the ``n`` clients; distributed DP, e.g. Kairouz
    et al., ICML 2021, "The Distributed Discrete Gaussian Mechanism", Sec. 1): each client adds
    only ``1/n`` of the variance, so the *sum* the server learns carries ``N(0, sigma^2)``,
    the same events as above, against a server that sees only that sum and does not collude
    with the other clients; against a coalition of the server and all ``n - 1`` other clients
    a client is protected by its own share only (std ``sigma / sqrt n``,
    :func:`ensemble_collusion_epsilon`).

    Raises:
        ValueError: a noise std not finite and > 0 (names the key), or ``shares < 1``.
    """
    from ..mechanisms._checks import check_noise_scale

    if int(shares) < 1:
        raise ValueError(f"shares must be >= 1 (the clients that split the noise), got {shares}")
    root = math.sqrt(int(shares))
    votes = votes.detach().float().cpu()
    sigma_votes = check_noise_scale(sigma_votes, "sigma-votes")
    # a CSPRNG's noise is added in float64 and rounded once (fedgraph.randomness.add_gaussian)
    out = rng.add_gaussian(votes, sigma_votes / root, generator)
    if sigma_threshold:
        sigma_threshold = check_noise_scale(sigma_threshold, "sigma-threshold")
        out = torch.cat([rng.add_gaussian(votes, sigma_threshold / root, generator), out], 1)
    return out


#: L2 sensitivity of a vote histogram: one teacher's vote moves from one class to another
VOTE_SENSITIVITY = math.sqrt(2.0)


def ensemble_events(num_queries: int, sigma_votes: float,
                    sigma_threshold: float | None = None) -> list:
    """Privacy events of ``num_queries`` released noisy histograms (:func:`noisy_votes`): per
    query a Gaussian of noise multiplier ``sigma / sqrt 2`` per copy (RDP ``alpha / sigma^2``:
    PATE 2018 Prop. 8's data-independent bound of GNMax, which also covers the whole noisy
    histogram)."""
    from ..accounting import Gaussian

    if num_queries < 1:
        return []
    out = [Gaussian(float(sigma_votes) / VOTE_SENSITIVITY, count=int(num_queries))]
    if sigma_threshold:
        out.append(Gaussian(float(sigma_threshold) / VOTE_SENSITIVITY, count=int(num_queries)))
    return out


def ensemble_epsilon(num_queries: int, sigma_votes: float, sigma_threshold: float | None,
                     delta: float, accountant: str = "analytic") -> float:
    """Epsilon at ``delta`` of ``num_queries`` released histograms (0 for none); by default
    the exact composition of Gaussians (analytic Gaussian, Balle & Wang 2018: microseconds,
    where PLD's discretisation needs gigabytes once epsilon is in the hundreds)."""
    from ..accounting import compose_epsilon

    if num_queries < 1:
        return 0.0
    return float(compose_epsilon(ensemble_events(num_queries, sigma_votes, sigma_threshold),
                                 delta, accountant=accountant))


def ensemble_collusion_epsilon(num_queries: int, sigma_votes: float,
                               sigma_threshold: float | None, delta: float,
                               num_clients: int) -> float:
    """Secure aggregation's weak point, stated: epsilon at ``delta`` of ``num_queries``
    histograms of one client against a server that colludes with all ``num_clients - 1``
    other clients (they know their own noise shares and subtract them from the sum), so only
    this client's share, std ``sigma / sqrt(num_clients)``, protects it (:func:`noisy_votes`
    with ``shares = num_clients``). With ``num_clients = 1`` it is :func:`ensemble_epsilon`."""
    root = math.sqrt(int(num_clients))
    return ensemble_epsilon(num_queries, sigma_votes / root,
                            sigma_threshold / root if sigma_threshold else None, delta)


def ensemble_sigma_for_epsilon(epsilon: float, delta: float, num_queries: int,
                               threshold_ratio: float | None = None) -> float:
    """``sigma_votes`` (per-client std) at which ``num_queries`` released histograms cost
    ``epsilon`` at ``delta`` (with a threshold copy of std ``threshold_ratio * sigma_votes``):
    :func:`fedgraph.accounting.calibrate` on the ledger's own events (:func:`ensemble_events`,
    the analytic Gaussian composition: exact), so the result never exceeds ``epsilon``.

    Raises:
        ValueError: ``epsilon`` not finite and > 0 or ``num_queries`` < 1.
    """
    from ..accounting import calibrate

    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1 (got {num_queries})")
    ratio = threshold_ratio or None
    return float(calibrate(epsilon, delta, lambda s: ensemble_events(
        num_queries, s, ratio * s if ratio else None), accountant="analytic", lower=1.0,
        upper=1e6))


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
    keep[gap.argsort(descending=True)[:math.ceil(float(keep_fraction) * scores.shape[0])]] = True
    return keep


def confident_aggregate(releases: Sequence[Tensor], num_classes: int,
                        threshold: float | None = None) -> tuple[Tensor, Tensor]:
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
    answered = (check.max(-1).values >= float(threshold) if threshold and check is not None
                else torch.ones(total.shape[0], dtype=torch.bool))
    return answered, gnmax.argmax(-1)


def privgnn_events(num_queries: int, rate: float, lam: float,
                   sensitivity: float = SENSITIVITY) -> list:
    """Privacy events of answering ``num_queries`` queries (paper Thm. 7): that many
    Poisson-subsampled (rate ``gamma``) Laplace mechanisms of scale ``sensitivity / lam`` on an
    answer of L1 sensitivity ``sensitivity``, i.e. noise multiplier ``1 / lam``."""
    from ..accounting import Laplace

    if num_queries < 1:
        return []
    scale = sensitivity / float(lam)
    return [Laplace(scale / sensitivity, count=int(num_queries), sample_rate=float(rate))]


def privgnn_epsilon(num_queries: int, rate: float, lam: float, delta: float,
                    accountant: str = "pld") -> float:
    """Epsilon of ``num_queries`` answers at ``delta`` (0 for no query)."""
    from ..accounting import compose_epsilon

    if num_queries < 1:
        return 0.0
    return float(compose_epsilon(privgnn_events(num_queries, rate, lam), delta,
                                 accountant=accountant))


def lam_for_epsilon(epsilon: float, delta: float, num_queries: int, rate: float) -> float:
    """The largest ``lam`` (least noise) at which ``num_queries`` answers cost at most
    ``epsilon`` at ``delta`` (:func:`privgnn_epsilon`, PLD): :func:`fedgraph.accounting.calibrate`
    on the ledger's own events (:func:`privgnn_events`) over the noise multiplier ``1 / lam``.

    Raises:
        ValueError: ``epsilon`` not finite and > 0, or ``num_queries`` < 1.
    """
    from ..accounting import calibrate

    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1 (got {num_queries})")
    z = calibrate(epsilon, delta, lambda s: privgnn_events(num_queries, rate, 1.0 / s),
                  accountant="pld", lower=0.01, upper=1e6)
    return 1.0 / float(z)


def max_queries(epsilon_budget: float, delta: float, rate: float, lam: float, *,
                accountant: str = "pld", cap: int = 1_000_000) -> int:
    """The largest number of queries whose composed epsilon stays within ``epsilon_budget``
    (binary search over the count; epsilon grows with it). At most ``cap``."""
    if not (epsilon_budget > 0):
        raise ValueError(f"epsilon_budget must be > 0 (got {epsilon_budget})")

    def fits(q: int) -> bool:
        return privgnn_epsilon(q, rate, lam, delta, accountant) <= epsilon_budget

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    if hi > cap:
        return cap if fits(cap) else _bisect(fits, lo, cap)
    return _bisect(fits, lo, hi)


def _bisect(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest q in [lo, hi) with fits(q), given fits(lo) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


class BudgetExceededError(RuntimeError):
    """A client refused queries beyond its privacy budget."""


@dataclass
class QueryBudget:
    """A client's query budget: it answers at most ``limit`` queries (from :func:`max_queries`
    for its ``(epsilon, delta)`` target, or given directly) and refuses beyond it.

    Use :meth:`for_epsilon` to compute the limit; ``answered`` counts what was released.
    """

    limit: int
    answered: int = 0
    epsilon: float | None = None
    delta: float | None = None

    @classmethod
    def for_epsilon(cls, epsilon: float, delta: float, rate: float, lam: float,
                    accountant: str = "pld") -> "QueryBudget":
        return cls(max_queries(epsilon, delta, rate, lam, accountant=accountant), 0,
                   epsilon, delta)

    @property
    def remaining(self) -> int:
        return max(self.limit - self.answered, 0)

    def charge(self, num_queries: int) -> None:
        """Reserve ``num_queries`` answers, or refuse all of them.

        Raises:
            BudgetExceededError: if they exceed :attr:`remaining`.
        """
        if num_queries > self.remaining:
            target = f" (epsilon={self.epsilon}, delta={self.delta})" if self.epsilon else ""
            raise BudgetExceededError(
                f"privacy budget exhausted{target}: {num_queries} queries asked, "
                f"{self.remaining} of {self.limit} left; ask at most {self.remaining}")
        self.answered += int(num_queries)


def answer_queries(private, query_x: Tensor, *, rate: float, k: int, lam: float,
                   num_classes: int, teacher: TeacherConfig | None = None,
                   mode: Mode = "posterior", neighbourhoods: QueryGraphs | None = None,
                   projection: FeatureProjection | None = None,
                   budget: QueryBudget | None = None, generator: torch.Generator | None = None,
                   timing: TeacherTiming | None = None,
                   device: torch.device | str | None = None) -> Tensor:
    """Client side of PrivGNN: noisy answers to ``Q`` queries (paper Alg. 1 lines 3-7).

    Args:
        private: a :class:`~fedgraph.data.ClientGraph` or any object with ``x [n, F]``,
            ``y [n]``, ``edge_index [2, e]`` (local ids) and optionally ``train_mask``
            (labelled nodes; others are never retrieved).
        query_x: ``[Q, F]`` features of the public query nodes.
        rate: Poisson sampling rate gamma; k: neighbours retrieved per query;
        lam: Laplace parameter lambda (noise scale 2 / lambda);
        num_classes: ``C``; teacher: teacher configuration; mode: ``posterior`` or ``vote``;
        neighbourhoods: the queries' public neighbourhoods (:func:`query_neighbourhoods`);
            ``None`` attaches each query to its retrieved nodes instead.
        projection: a public feature map for the teachers' inputs (:func:`public_projection`;
            ``None``: raw features, the paper's setting).
        budget: refuses (raises before any computation) if ``Q`` exceeds what is left.
        generator: every random draw (CPU; see the module docstring).
        device: where the teachers run (``None``: the CPU).

    Returns:
        ``[Q, C]`` noisy answers, a CPU tensor (the release). Privacy: :func:`privgnn_events`
        with ``num_queries=Q``.

    Raises:
        BudgetExceededError: if ``budget`` has fewer than ``Q`` queries left.
    """
    if budget is not None:
        budget.charge(int(query_x.shape[0]))
    post = teacher_posteriors(private, query_x, rate=rate, k=k, num_classes=num_classes,
                              teacher=teacher, neighbourhoods=neighbourhoods,
                              projection=projection, generator=generator, timing=timing,
                              device=device)
    return noisy_answers(post, lam, mode, generator).cpu()


# --------------------------------------------------------------------------------------------
# Server side: queries, aggregation, student
# --------------------------------------------------------------------------------------------
def make_sage(in_channels: int, out_channels: int, hidden: int = 64, num_layers: int = 2,
              dropout: float = 0.5) -> nn.Module:
    """The paper's GraphSAGE (App. G.1: mean aggregation, ReLU, dropout)."""
    return GraphSAGE(in_channels, hidden, num_layers, out_channels, dropout=dropout, act="relu")


def select_queries(public: Data, num_queries: int, policy: str = "random",
                   student: nn.Module | None = None,
                   generator: torch.Generator | None = None) -> Tensor:
    """Server side: ``num_queries`` query nodes from the public pool (``public.train_mask``).

    ``random`` (paper): uniform without replacement. ``entropy``: the nodes on which
    ``student`` (a model trained earlier, e.g. on a first round of pseudo-labels) is least
    certain (highest predictive entropy); public data only, so no privacy cost.

    Returns:
        long ``[min(num_queries, pool)]`` public node ids.
    """
    pool = public.train_mask.nonzero().view(-1)
    num_queries = min(int(num_queries), pool.numel())
    if policy == "random":
        return pool[torch.randperm(pool.numel(), generator=generator)[:num_queries]]
    if policy == "entropy":
        if student is None:
            raise ValueError("select_queries: policy 'entropy' needs a student model")
        student.eval()
        with torch.no_grad():
            p = student(public.x, adjacency_for("sage", public.edge_index,
                                                int(public.num_nodes)))[pool].softmax(-1)
        ent = -(p * p.clamp_min(1e-12).log()).sum(-1)
        return pool[torch.argsort(ent, descending=True)[:num_queries]]
    raise ValueError(f"policy: unknown {policy!r}; allowed: ['random', 'entropy']")


def aggregate_answers(answers: Sequence[Tensor]) -> Tensor:
    """Pseudo-labels: argmax of the clients' summed noisy answers (posteriors or votes),
    ``[Q, C]`` each -> long ``[Q]`` (post-processing)."""
    if not answers:
        raise ValueError("aggregate_answers: no answers")
    return torch.stack([a.float() for a in answers]).sum(0).argmax(-1)


@dataclass
class StudentResult:
    """A trained GraphSAGE and its accuracies (``holdout_accuracy`` against pseudo-labels)."""

    model: nn.Module
    train: TrainResult
    holdout_accuracy: float
    test_accuracy: float
    predictions: Tensor = field(repr=False)


def propagate_labels(public: Data, query_idx: Tensor, labels: Tensor, num_classes: int,
                     base: Tensor | None = None, alpha: float = 0.9,
                     num_layers: int = 10) -> Tensor:
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


def train_student(public: Data, query_idx: Tensor, labels: Tensor, *,
                  holdout_fraction: float = 0.2, hidden: int = 64, dropout: float = 0.5,
                  epochs: int = 200, lr: float = 0.01, weight_decay: float = 0.0,
                  seed: int = 0, propagation: float = 0.0) -> StudentResult:
    """Server side: the student (paper Sec. 3.1.3), a 2-layer GraphSAGE trained transductively
    on the public graph with ``labels`` at ``query_idx``.

    Model selection uses a held-out slice (``holdout_fraction``) of the pseudo-labelled queries,
    never the public test labels; the test accuracy on ``public.test_mask`` is reported after
    selection (evaluation only). ``holdout_fraction = 0``: every pseudo-label is trained on
    and the epoch that fits them best is kept (``holdout_accuracy`` is NaN); with few noisy
    labels (the ensemble mode) a small held-out slice selects erratically (README "PrivGNN").

    ``propagation`` in (0, 1) (our addition; 0: off): the student's class probabilities are
    smoothed over the public graph by label propagation with the released labels clamped in
    (:func:`propagate_labels` with ``alpha = propagation``); predictions and test accuracy are
    the smoothed ones. Public graph and released labels only: no privacy cost.
    """
    num_classes = int(public.y.max()) + 1 if labels.numel() == 0 else max(
        int(public.y.max()), int(labels.max())) + 1
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
    res = train_node_classifier(model, public.x, graph, lab.clamp_min(0), train_mask, val_mask,
                                epochs=epochs, lr=lr, weight_decay=weight_decay)
    with torch.no_grad():
        logits = res.model(public.x, graph)
        if propagation:
            logits = propagate_labels(public, query_idx, labels, num_classes,
                                      logits.softmax(-1), alpha=propagation)
    return StudentResult(res.model, res, res.val_accuracy if n_hold else float("nan"),
                         accuracy(logits, public.y, public.test_mask), logits.argmax(-1))


# --------------------------------------------------------------------------------------------
# Baselines (paper Sec. 4.1, App. G)
# --------------------------------------------------------------------------------------------
@dataclass
class BaselineResult:
    model: nn.Module
    val_accuracy: float
    test_accuracy: float


def nonprivate_teacher(private: Data, public: Data, *, hidden: int = 64, dropout: float = 0.5,
                       epochs: int = 200, lr: float = 0.01, val_fraction: float = 0.2,
                       seed: int = 0) -> BaselineResult:
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
    res = train_node_classifier(model, private.x, adjacency_for("sage", private.edge_index, n),
                                private.y, ~val_mask, val_mask, epochs=epochs, lr=lr)
    with torch.no_grad():
        logits = res.model(public.x, adjacency_for("sage", public.edge_index,
                                                   int(public.num_nodes)))
    return BaselineResult(res.model, res.val_accuracy,
                          accuracy(logits, public.y, public.test_mask))


def public_label_student(public: Data, query_idx: Tensor, **kwargs) -> StudentResult:
    """Baseline B2 (non-private, transductive): the student trained with the true public labels
    of the query nodes (the best the public data allows with ``Q`` labels)."""
    return train_student(public, query_idx, public.y[query_idx], **kwargs)


def majority_accuracy(public: Data) -> float:
    """Accuracy of predicting the most frequent test class (a floor for every method)."""
    y = public.y[public.test_mask]
    return float(torch.bincount(y).max()) / max(y.numel(), 1)


# --------------------------------------------------------------------------------------------
# Centralized run (one client)
# --------------------------------------------------------------------------------------------
@dataclass
class PrivGNNRun:
    """A centralized run: the student, pseudo-label accuracy, epsilon and timing."""

    student: StudentResult
    query_idx: Tensor
    pseudo_labels: Tensor
    label_accuracy: float
    epsilon: float | None
    timing: TeacherTiming


def run_centralized(private: Data, public: Data, *, num_queries: int = 1000, rate: float = 0.3,
                    k: int = 300, lam: float = 0.2, delta: float = 1e-4,
                    mode: Mode = "posterior", hops: int | None = 2,
                    teacher: TeacherConfig | None = None, projection_dim: int | None = None,
                    student_epochs: int = 200, seed: int = 0,
                    accountant: str | None = "pld") -> PrivGNNRun:
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
    answers = answer_queries(private, public.x[qidx], rate=rate, k=k, lam=lam,
                             num_classes=num_classes, teacher=teacher, mode=mode,
                             neighbourhoods=hoods, projection=proj, generator=gen,
                             timing=timing)
    labels = aggregate_answers([answers])
    student = train_student(public, qidx, labels, epochs=student_epochs, seed=seed)
    eps = privgnn_epsilon(qidx.numel(), rate, lam, delta, accountant) if accountant else None
    return PrivGNNRun(student, qidx, labels, float((labels == public.y[qidx]).float().mean()),
                      eps, timing)


__all__ = [
    "SENSITIVITY", "DP_MODES", "NOT_DP_REASON", "privgnn_split", "poisson_subsample", "laplace_noise", "TeacherConfig",
    "BatchedSAGE", "train_teachers", "QueryGraphs", "query_neighbourhoods", "TeacherTiming",
    "teacher_posteriors", "max_neighbours", "check_neighbours", "FeatureProjection", "public_projection", "noisy_answers", "privgnn_events", "privgnn_epsilon", "lam_for_epsilon", "max_queries",
    "BudgetExceededError", "QueryBudget", "answer_queries", "make_sage", "select_queries",
    "aggregate_answers", "teacher_groups", "ensemble_votes", "noisy_votes", "VOTE_SENSITIVITY",
    "ensemble_events", "ensemble_epsilon", "ensemble_collusion_epsilon", "ensemble_sigma_for_epsilon",
    "confident_aggregate",
    "propagate_labels", "margin_filter", "StudentResult", "train_student", "BaselineResult",
    "nonprivate_teacher", "public_label_student", "majority_accuracy", "PrivGNNRun",
    "run_centralized",
]
