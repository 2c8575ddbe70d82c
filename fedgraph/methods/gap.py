r"""GAP (Sajadmanesh et al., "GAP: Differentially Private Graph Neural Networks with Aggregation
Perturbation", USENIX Security 2023) as plain functions, usable without Flower.

Three modules (paper Sec. 4, Fig. 3, Alg. 2):

1. **Encoder (EM)**: an MLP with a linear softmax head, pre-trained on features and labels
   without the graph (:class:`~fedgraph.nn.gap.GAPEncoder`, :func:`train_encoder`); its
   row-normalized output :math:`\check X^{(0)}` goes to the aggregation module.
2. **Aggregation (AM)**: the Private Multi-hop Aggregation (PMA, Alg. 1, Eq. 7-9),
   :func:`pma`: for ``k = 1..K`` sum-aggregate the normalized previous hop over in-neighbours,
   add :math:`\mathcal N(0, \sigma^2 I)` to every row, row-normalize. Its pieces
   (:func:`aggregate`, :func:`perturb`, :func:`normalize_rows`) are exposed so that a federation
   can run PMA across clients.
3. **Classifier (CM)**: one base MLP per hop, a combination, a head MLP
   (:class:`~fedgraph.nn.gap.GAPClassifier`, :func:`train_classifier`), trained on the private
   aggregations only; inference uses the same aggregations (no further access to the edges).

Privacy (paper Sec. 5; its theorems were lost in the text extraction, rebuilt from the text and
the reference code github.com/sisaman/GAP):

* Edge level: PMA is ``K`` Gaussian mechanisms with L2 sensitivity :math:`\sqrt 2` per hop
  for the default unit, an undirected edge stored as two directed edges (rows ``u`` and ``v``
  both change), or 1 for a directed edge ``u -> v`` (adding it adds the unit-norm row
  :math:`\check X^{(k-1)}_u` to row ``v``; the paper's unit, one half of an undirected
  friendship) (:func:`edge_sensitivity`). EM and CM do not use the edges, so edge-level DP
  costs PMA only.
* Node level: out-degrees bounded by ``D`` (:func:`fedgraph.utils.bound_out_degree`, the
  reference code's ``BoundOutDegree``), sensitivity :math:`\sqrt D` per hop centrally,
  :math:`\sqrt{D + n - 1}` across ``n`` clients (:func:`node_sensitivity`); EM and CM are trained with DP-SGD (Poisson sampling, per-example
  clipping, Opacus). The reference code calibrates **one** noise multiplier shared by the
  encoder's DP-SGD, PMA (noise std = multiplier x :math:`\sqrt D`) and the classifier's
  DP-SGD, by root finding on the composed privacy curve; :func:`calibrate_gap` does the same.
* ``delta="auto"`` follows the reference code: :math:`10^{-\#digits}` of the number of edges
  (edge level) or training nodes (node level), i.e. :math:`\delta < 1/|E|` or :math:`1/N`.

Federating it (a client holds a :class:`fedgraph.data.ClientGraph`; with one client every step
below is the centralized one): EM and CM train with FedAvg rounds of :func:`local_train`
(node level: ``dp=DPSGD(...)``; account ``rounds * local_epochs`` epochs with
:func:`dpsgd_schedule`). For each PMA hop a client sums its normalized rows over its local edges
(:func:`aggregate` with local ids) and, separately, over its boundary edges grouped by remote
target (:func:`aggregate` with targets renumbered ``0..T-1``), adds :func:`perturb` noise to
every partial sum it releases, and the owner of a target adds the noisy partial sums it receives
to its own noisy local sum before :func:`normalize_rows`. Each edge enters exactly one noisy
partial sum, so the per-hop edge-level sensitivity is unchanged (the total noise at a target
with remote in-neighbours is larger than centrally). Node level: a client bounds the
out-degrees of its own nodes over local and boundary edges together
(:func:`fedgraph.utils.bound_out_degree`): it owns every out-edge of its nodes; a node's
in-edges from another client are that client's out-edges, summed in the row it releases for the
node, so every remote row is clipped to norm 1 and the sensitivity grows to
:math:`\sqrt{D + n - 1}` (:func:`node_sensitivity` has the argument).

Baselines (paper Sec. 6; the extract we work from lacks that section's details, so the setup
below is rebuilt from the reference code, ``core/methods/node/sage/`` and
``core/privacy/algorithms/graph/gnn_sgd.py``, and argued here):

* MLP (``method="mlp"``: no edges; at node level trained with DP-SGD, i.e. MLP-DP) and GAP
  without noise (``method="gap-inf"``).
* GraphSAGE without DP (``method="sage"``, ``level="edge"``, ``epsilon=inf``): PyG's
  ``GraphSAGE``, ``K`` mean-aggregation layers, full batch, Adam, best validation epoch.
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
  (:func:`calibrate_sage_dp`). The degree-bounding caveat of :mod:`fedgraph.utils.graph` (the
  sampling itself depends on the neighbourhood) applies as for GAP.

Randomness comes from the caller's generator: a seeded ``torch.Generator`` in the centralized
runs here; a federated client's from :func:`fedgraph.randomness.client_generator` (a
``torch.Generator`` (``mt19937``) keyed so the server cannot rebuild it, or (the default) an
AES-256-CTR :class:`~fedgraph.randomness.SecureRandom`, which :func:`local_train` accepts too).

Model selection: at edge level the features and labels are not protected, so the epoch with the
best validation accuracy is kept (as in the paper's code). At node level validation labels are
private: the reference code still selects on them, which is not accounted for; we keep the last
epoch by default (``select_on_val=False``) and report validation accuracy as a metric only.
"""
from __future__ import annotations

import copy
import math
import resource
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import randomness as rng
from ..nn.gap import MLP, GAPClassifier, GAPEncoder, normalize_rows, stack_hops
from ..utils.graph import (MAX_MESSAGE_ELEMENTS, bound_out_degree, in_degree, out_degree,
                           scatter_sum_chunked)

__all__ = [
    "aggregate", "perturb", "normalize_rows", "pma", "edge_sensitivity", "node_sensitivity",
    "DPSGD", "dpsgd_schedule", "default_delta", "gap_events", "calibrate_gap", "local_train",
    "local_gradient", "evaluate", "FitResult", "fit", "train_encoder", "train_classifier",
    "run_gap", "METHODS",
    "mean_aggregate", "sage_dp_features", "sage_dp_sensitivity", "sage_dp_events",
    "calibrate_sage_dp", "train_sage_dp", "train_sage", "SAGE_COMBINATIONS",
]

METHODS = ("gap", "gap-inf", "mlp", "sage")
LEVELS = ("edge", "node")

# Defaults of the paper's experiments (reference code, experiments.ipynb): Adam, lr 0.01,
# hidden 16, encoder 2 layers, base 1, head 1, cat, SELU, dropout 0; edge level and
# non-private: 100 + 100 epochs full batch with batch norm; node level: 10 + 10 epochs, batch
# 256 (Facebook), clipping norm 1, no batch norm, D tuned in {10, 20, 50, 100, 200}.
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "edge": dict(encoder_epochs=100, classifier_epochs=100, batch_size=None, batch_norm=True,
                 select_on_val=True),
    "node": dict(encoder_epochs=10, classifier_epochs=10, batch_size=256, batch_norm=False,
                 select_on_val=False),
}


# --------------------------------------------------------------------------------------------
# Aggregation module: PMA (Alg. 1)
# --------------------------------------------------------------------------------------------
def aggregate(h: Tensor, edge_index: Tensor, num_nodes: int, chunk_size: int = 2**22) -> Tensor:
    r"""Sum aggregation over in-neighbours, :math:`A^T H` (paper Eq. 7):
    ``out[v] = sum_{(u, v) in E} h[u]``.

    Args:
        h: ``[N_src, e]`` rows of the source nodes (indexed by ``edge_index[0]``).
        edge_index: long ``[2, E]``, messages ``edge_index[0] -> edge_index[1]``.
        num_nodes: number of target rows ``N`` (targets are ``edge_index[1]`` in
            ``[0, N)``; sources and targets may be numbered differently, e.g. a client's partial
            sums for remote targets).
        chunk_size: edges per chunk; memory is ``chunk_size * e`` floats beyond the output.

    Returns:
        ``[N, e]`` (zero rows for nodes without in-edges).
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    src, dst = edge_index
    out = h.new_zeros((num_nodes, h.size(1)))
    for s in range(0, src.numel(), chunk_size):
        out.index_add_(0, dst[s:s + chunk_size], h[src[s:s + chunk_size]])
    return out


def perturb(sums: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
    r"""Gaussian mechanism on every row (paper Eq. 8):
    :math:`\tilde X_v = X_v + \mathcal N(0, \sigma^2 I)`.

    Args:
        sums: ``[N, e]`` aggregations.
        sigma: noise standard deviation (noise multiplier x L2 sensitivity); ``0`` adds nothing.
        generator: noise source (``None``: the global RNG).
    """
    from ..mechanisms._checks import check_noise_scale

    sigma = check_noise_scale(sigma, "sigma", allow_zero=True)
    if sigma == 0:
        return sums
    noise = torch.randn(sums.shape, generator=generator, dtype=sums.dtype, device="cpu")
    return sums + sigma * noise.to(sums.device)


def pma(x0: Tensor, edge_index: Tensor, num_hops: int, sigma: float,
        generator: torch.Generator | None = None, chunk_size: int = 2**22) -> list[Tensor]:
    r"""Private Multi-hop Aggregation (paper Alg. 1).

    :math:`\check X^{(0)} = x_0 / \lVert x_0 \rVert` (rows; Eq. 6, so the sensitivity holds
    whatever the caller passes), then for ``k = 1..K``: :math:`X^{(k)} = A^T \check X^{(k-1)}`
    (Eq. 7), :math:`\tilde X^{(k)} = X^{(k)} + \mathcal N(0, \sigma^2 I)` row-wise (Eq. 8),
    :math:`\check X^{(k)} = \tilde X^{(k)} / \lVert \tilde X^{(k)} \rVert` (Eq. 9).

    Args:
        x0: ``[N, e]`` encoder output.
        edge_index: ``[2, E]``, ``edge_index[0] -> edge_index[1]`` (degree-bounded for node-level
            DP, see :func:`fedgraph.utils.bound_out_degree`).
        num_hops: ``K >= 0``.
        sigma: noise std per hop (noise multiplier x sensitivity); ``0``: GAP without noise.
        generator: noise source.

    Returns:
        ``K + 1`` tensors ``[N, e]``: hop 0 (normalized ``x0``) to hop ``K``; every row has unit
        norm (with ``sigma = 0`` a node without in-neighbours keeps a zero row).
    """
    if num_hops < 0:
        raise ValueError(f"num_hops must be >= 0, got {num_hops}")
    n = x0.size(0)
    hops = [normalize_rows(x0)]
    for _ in range(num_hops):
        sums = aggregate(hops[-1], edge_index, n, chunk_size)
        hops.append(normalize_rows(perturb(sums, sigma, generator)))
    return hops


def edge_sensitivity(unit: str = "undirected") -> float:
    r"""L2 sensitivity of one PMA hop for edge-level DP: :math:`\sqrt 2` for an undirected edge
    stored as ``u -> v`` and ``v -> u`` (rows ``u`` and ``v`` both change; the default: every
    graph fedgraph loads is undirected); 1 for a directed edge ``u -> v`` (row ``v`` changes by
    a unit vector; GAP's paper protects this unit, which on an undirected graph is half a
    friendship)."""
    if unit == "directed":
        return 1.0
    if unit == "undirected":
        return math.sqrt(2.0)
    raise ValueError(f"edge unit: unknown {unit!r}; allowed: directed, undirected")


def node_sensitivity(max_degree: int, other_clients: int = 0, summed: bool = False) -> float:
    r"""L2 sensitivity of one PMA hop for node-level DP: :math:`\sqrt{D + m}` with ``m`` other
    clients releasing rows (:math:`\sqrt{D + m^2}` when they are ``summed``), :math:`\sqrt D`
    centrally (``m = 0``).

    Neighbouring relation (GAP, paper 000, Sec. 5 "node-level privacy": a node influences at
    most ``D`` other nodes): node ``w`` is removed with all its edges, in and out, on every
    client (in the code: ``w`` becomes isolated; the ids that rows are released for are public
    and do not change), on the degree-bounded graph (the caveat of
    :mod:`fedgraph.utils.graph`: the sampling of out-edges is taken as given). Per hop ``k``,
    given the previous hop (adaptive composition), whose rows all have L2 norm <= 1
    (row-normalized), the rows that change are:

    1. **Rows that ``w``'s out-edges enter**, released by ``w``'s own client: its local sums
       (kept by the client, an output of the same Gaussian mechanism) and its remote partial
       sums (released to the server, routed to the target's owner). Out-degrees are bounded by
       ``D`` over local and boundary edges together, so at most ``D`` rows change, each by
       ``w``'s row (norm <= 1); a remote row is clipped to norm <= 1 before its noise (below),
       and clipping is a projection onto a ball, 1-Lipschitz, so it still changes by <= 1.
    2. **Rows that ``w``'s in-edges enter**: an in-edge ``u -> w`` from another client ``X`` is
       ``X``'s out-edge, summed in ``X``'s released row for ``w``. Nothing bounds ``w``'s
       in-degree from ``X`` (removing ``w`` changed that row by up to its in-degree, e.g. 168),
       so federated node-level PMA clips every remote row to L2 norm <= 1
       (:data:`fedgraph.methods.gap_federated.REMOTE_ROW_NORM`, a public constant): removing
       ``w`` changes ``X``'s row for ``w`` by <= 1 (from ``clip(s)`` to ``clip(0) = 0``), and
       removing a node ``u`` at ``X`` still changes each of ``X``'s rows by <= 1 (1-Lipschitz),
       as in 1. So each of the ``m = num_clients - 1`` other clients releases one row that
       changes by <= 1. With secure aggregation the server sees only the sum over those ``m``
       clients of their rows for ``w``, which can change by ``m`` (all in one direction):
       ``summed=True`` counts it as one row of norm ``m``.
    3. **``w``'s own row at its own client** (the sum over its local in-edges plus the noisy rows
       received for it) is never released: the client keeps it as ``w``'s input to the
       classifier, whose training is DP-SGD at node level (``w``'s per-example gradient is
       clipped whatever its input), and it reaches other nodes only through ``w``'s out-edges,
       normalized (counted in 1 at the next hop). It is ``w``'s own data, like its features.
    4. Nothing else: other nodes' rows and out-edges are unchanged given the previous hop.

    So the change over all rows of all clients is at most
    :math:`\sqrt{D \cdot 1^2 + m \cdot 1^2}` (``summed``: :math:`\sqrt{D + m^2}`). Each client
    calibrates its noise multiplier ``z`` for its own target and uses std
    ``sigma = z x`` this sensitivity on its local rows; remote rows carry at least every
    client's own sigma (the largest, :func:`fedgraph.methods.gap_federated.remote_noise`), so for
    the owner ``c`` of ``w`` the ratio sensitivity / noise over all changed rows is at most
    :math:`\sqrt{D / \sigma_c^2 + m / \sigma_{max}^2} \le 1 / z_c`: ``K`` Gaussian mechanisms
    with multiplier ``z_c`` hold against the server, the other clients and the released model.

    Args:
        max_degree: ``D >= 1``, the out-degree bound.
        other_clients: ``m >= 0``, the clients other than ``w``'s that release a (clipped) row
            for ``w``: ``num_clients - 1`` with cross-client edges, else 0.
        summed: the server learns only the sum of those ``m`` rows (secure aggregation).

    Raises:
        ValueError: ``max_degree`` not an integer >= 1, or ``other_clients`` not an integer >= 0.
    """
    if isinstance(max_degree, bool) or int(max_degree) != max_degree or max_degree < 1:
        raise ValueError(f"max_degree must be an integer >= 1, got {max_degree}")
    if isinstance(other_clients, bool) or int(other_clients) != other_clients or other_clients < 0:
        raise ValueError(f"other_clients must be an integer >= 0, got {other_clients}")
    m = int(other_clients)
    return math.sqrt(max_degree + (m * m if summed else m))


# --------------------------------------------------------------------------------------------
# DP-SGD and accounting
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DPSGD:
    """DP-SGD settings: per-example gradients clipped to ``max_grad_norm`` (L2), Gaussian noise
    of std ``noise_multiplier * max_grad_norm`` on their sum, Poisson sampling."""

    noise_multiplier: float
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier}")
        if not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            raise ValueError(f"max_grad_norm must be finite and > 0, got {self.max_grad_norm}")


def dpsgd_schedule(num_examples: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """Poisson sampling rate and number of steps of DP-SGD, as :func:`local_train` runs it:
    ``q = min(1, batch_size / n)`` and ``epochs * max(1, n // batch_size)`` steps (the reference
    code's ``epochs * n // batch_size``). Use the same call for training and accounting."""
    if num_examples < 1 or batch_size < 1 or epochs < 0:
        raise ValueError(f"need num_examples >= 1, batch_size >= 1, epochs >= 0 "
                         f"(got {num_examples}, {batch_size}, {epochs})")
    q = min(1.0, batch_size / num_examples)
    return q, epochs * max(1, num_examples // batch_size)


def default_delta(count: int) -> float:
    r""":math:`10^{-d}` with ``d`` the number of digits of ``count`` (< 1/count): the reference
    code's ``delta="auto"`` (``count`` = edges at edge level, training nodes at node level)."""
    return 10.0 ** -len(str(int(count)))


def gap_events(noise_multiplier_pma: float, num_hops: int, *, node_level: bool = False,
               encoder_dpsgd: tuple[float, float, int] | None = None,
               classifier_dpsgd: tuple[float, float, int] | None = None) -> list:
    """Privacy events of one GAP run (for :func:`fedgraph.accounting.compose_epsilon`).

    Args:
        noise_multiplier_pma: PMA noise std / sensitivity (the sensitivity, 1, sqrt(2) or
            sqrt(D), is already divided out).
        num_hops: ``K``: PMA is ``K`` Gaussian mechanisms.
        node_level: node-level DP; then the encoder and classifier must come with their DP-SGD
            (a private module trained without it would leak), unless it was not trained
            (``steps = 0``).
        encoder_dpsgd, classifier_dpsgd: ``(sample_rate, noise_multiplier, steps)`` of each
            module's DP-SGD (see :func:`dpsgd_schedule`), or ``None``.

    Returns:
        list of events: ``Gaussian(noise_multiplier_pma, count=K)`` (if ``K > 0``) and one
        ``SubsampledGaussian`` per DP-SGD training with ``steps > 0``.
    """
    from ..accounting import Gaussian, SubsampledGaussian

    if node_level and (encoder_dpsgd is None or classifier_dpsgd is None):
        raise ValueError("node-level GAP needs encoder_dpsgd and classifier_dpsgd "
                         "(use (q, noise, 0) for a module that is not trained)")
    events = []
    if num_hops > 0:
        events.append(Gaussian(noise_multiplier_pma, count=num_hops))
    for spec in (encoder_dpsgd, classifier_dpsgd):
        if spec is not None and spec[2] > 0:
            q, noise, steps = spec
            events.append(SubsampledGaussian(q, noise, steps))
    return events


def calibrate_gap(target_epsilon: float, delta: float, *, num_hops: int, level: str = "edge",
                  encoder_schedule: tuple[float, int] | None = None,
                  classifier_schedule: tuple[float, int] | None = None,
                  accountant: str = "prv") -> float:
    r"""Smallest noise multiplier for which GAP meets ``(target_epsilon, delta)``.

    Edge level: PMA only (``K`` Gaussian mechanisms; schedules must be ``None``). Node level:
    one multiplier shared by the encoder's DP-SGD, PMA and the classifier's DP-SGD (the
    reference code's choice, ``ComposedNoisyMechanism`` with one ``noise_scale``), found by
    root finding on the composed curve.

    Args:
        target_epsilon: ``> 0`` (``inf``: returns 0, no noise).
        delta: target delta.
        num_hops: ``K``.
        level: ``"edge"`` or ``"node"``.
        encoder_schedule, classifier_schedule: ``(sample_rate, steps)`` from
            :func:`dpsgd_schedule` (node level; ``None`` or ``steps = 0`` if not trained).
        accountant: passed to :func:`fedgraph.accounting.calibrate` / ``compose_epsilon``.

    Returns:
        the noise multiplier (PMA's noise std is it times the sensitivity; DP-SGD's noise std
        is it times the clipping norm).
    Raises:
        ValueError: unknown ``level``; ``delta`` outside ``[1e-12, 1)``
            (:func:`fedgraph.accounting.check_delta`).
        fedgraph.accounting.CalibrationError: the search ran out of its evaluation or time
            budget (:func:`fedgraph.accounting.calibrate`).
    """
    from ..accounting import calibrate, check_delta

    check_delta(delta)
    if level not in LEVELS:
        raise ValueError(f"level: unknown {level!r}; allowed: {', '.join(LEVELS)}")
    if math.isinf(target_epsilon):
        return 0.0
    enc = encoder_schedule if encoder_schedule is not None else (1.0, 0)
    cls = classifier_schedule if classifier_schedule is not None else (1.0, 0)
    if level == "edge":
        if encoder_schedule is not None or classifier_schedule is not None:
            raise ValueError("edge-level GAP trains EM and CM without DP-SGD: no schedules")
        if num_hops == 0:
            return 0.0
    elif num_hops == 0 and enc[1] == 0 and cls[1] == 0:
        return 0.0

    def make_events(z: float) -> list:
        return gap_events(z, num_hops, node_level=level == "node",
                          encoder_dpsgd=(enc[0], z, enc[1]) if level == "node" else None,
                          classifier_dpsgd=(cls[0], z, cls[1]) if level == "node" else None)

    return float(calibrate(target_epsilon, delta, make_events, accountant=accountant))


def _compose(events: list, delta: float, accountant: str) -> float:
    from ..accounting import compose_epsilon

    return float(compose_epsilon(events, delta, accountant=accountant))


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
def _indices(mask: Tensor | None, n: int, device) -> Tensor:
    if mask is None:
        return torch.arange(n, device=device)
    if mask.dtype == torch.bool:
        return mask.nonzero().view(-1)
    return mask.to(torch.long).view(-1)


class _BestEpoch:
    """Keeps the model state of the epoch with the largest ``(val accuracy, -val loss)``."""

    def __init__(self):
        self.key, self.state = None, None

    def update(self, model: nn.Module, key: tuple, epoch: int, result) -> None:
        if self.key is None or key > self.key:
            self.key, self.state = key, copy.deepcopy(model.state_dict())
            result.best_epoch = epoch

    def restore(self, model: nn.Module) -> None:
        """Load the best state (if any epoch was scored) and switch to eval mode."""
        if self.state is not None:
            model.load_state_dict(self.state)
        model.eval()


def local_train(model: nn.Module, x: Tensor, y: Tensor, mask: Tensor | None, epochs: int,
                batch_size: int | None, lr: float, dp: DPSGD | None = None, *,
                weight_decay: float = 0.0, optimizer: torch.optim.Optimizer | None = None,
                generator: torch.Generator | None = None,
                num_public: int | None = None) -> tuple[int, float]:
    r"""Train ``model`` for ``epochs`` epochs on the rows ``mask`` of ``(x, y)`` with
    cross-entropy: the local step of a FedAvg round, or one epoch of :func:`fit`.

    Without ``dp``: Adam (or ``optimizer``), full batch if ``batch_size`` is ``None`` (or not
    smaller than the data), else shuffled mini-batches. With ``dp``: DP-SGD through Opacus
    (``GradSampleModule`` for per-example gradients, ``DPOptimizer`` for clipping and noise,
    wrapped around Adam as in the paper's code); each step samples every example independently
    with probability ``q`` (Poisson sampling) and there are ``max(1, n // batch_size)`` steps
    per epoch (:func:`dpsgd_schedule`: account for exactly that). Hooks are removed afterwards,
    so ``model`` comes back a plain module (its ``state_dict`` keys unchanged).

    With ``dp``, ``q``, the number of steps and Opacus' normaliser (``expected_batch_size``
    ``= q * num_public = min(batch_size, num_public)``) come from ``num_public``, a count
    fixed before the data are read, never from the number of rows in ``mask``: under
    node-level DP that number is private (removing a node changes it), and a normaliser equal
    to it would release it in every update (Opacus issue 819, with fewer training rows than
    the batch size).

    Args:
        model: maps ``x[idx]`` to logits ``[b, C]`` (batch first).
        x: ``[n, ...]`` inputs; y: long ``[n]`` labels; mask: bool ``[n]`` or indices (``None``:
            all rows).
        epochs: ``>= 0``; batch_size: expected batch size (required with ``dp``).
        lr, weight_decay: Adam's, when ``optimizer`` is ``None``.
        dp: :class:`DPSGD` or ``None``.
        optimizer: an optimizer over ``model``'s parameters to reuse (keeps Adam's state across
            calls).
        generator: source of shuffling, Poisson sampling and DP noise.
        num_public: with ``dp``, the public number of training examples the schedule is
            computed from (federated GAP: the client's training slots, from the public node
            directory and split; :func:`fedgraph.methods.gap_federated.privacy_plan` uses the
            same); ``None``: the number of rows in ``mask``, for data whose size is public.

    Returns:
        ``(num_examples, mean training loss over the steps)`` (``nan`` if nothing ran).
    """
    idx = _indices(mask, x.size(0), x.device)
    n = int(idx.numel())
    if n == 0 or epochs == 0:
        return n, float("nan")
    opt = optimizer if optimizer is not None else torch.optim.Adam(
        model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    losses: list[float] = []
    if dp is None:
        for _ in range(epochs):
            if batch_size is None or batch_size >= n:
                batches = [idx]
            else:
                perm = idx[rng.randperm(n, generator).to(idx.device)]
                batches = list(torch.split(perm, batch_size))
            for b in batches:
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x[b]), y[b])
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return n, sum(losses) / len(losses)

    from opacus import GradSampleModule

    if batch_size is None:
        raise ValueError("DP-SGD needs a batch_size (the expected Poisson batch size)")
    n_pub = n if num_public is None else int(num_public)
    q, steps = dpsgd_schedule(n_pub, batch_size, epochs)
    gsm = GradSampleModule(model, loss_reduction="sum", strict=True)  # refuses BatchNorm
    # Opacus draws the noise on the parameters' device: rng.dp_optimizer gives it a generator
    # there (seeded from ``generator``), or draws it from a SecureRandom.
    dp_opt = rng.dp_optimizer(opt, noise_multiplier=dp.noise_multiplier,
                              max_grad_norm=dp.max_grad_norm,
                              expected_batch_size=min(batch_size, n_pub), generator=generator,
                              device=x.device)
    try:
        for _ in range(steps):
            pick = rng.rand(n, generator).to(idx.device) < q
            b = idx[pick]
            dp_opt.zero_grad(set_to_none=True)
            # sum of per-example losses; DPOptimizer clips each example's gradient, adds
            # noise to the sum and divides by the expected batch size
            loss = F.cross_entropy(gsm(x[b]), y[b], reduction="sum")
            with warnings.catch_warnings():  # "full backward hook ... no inputs require grad"
                warnings.simplefilter("ignore", UserWarning)
                loss.backward()
            dp_opt.step()
            if b.numel():
                losses.append(loss.item() / b.numel())
    finally:
        gsm._close()
        for p in model.parameters():
            p.grad = None
    return n, (sum(losses) / len(losses)) if losses else float("nan")


def local_gradient(model: nn.Module, x: Tensor, y: Tensor,
                   mask: Tensor | None) -> tuple[int, float, dict[str, Tensor]]:
    r"""The client's half of a FedSGD round: the full-batch gradient of the mean cross-entropy
    over the rows ``mask`` at ``model``'s current weights (training mode), and nothing else.

    The server's weighted mean of these gradients, with weights the clients' training-node
    counts ``n_c``, is :math:`\sum_c \frac{n_c}{n} \nabla \frac{1}{n_c} \sum_{i \in c} \ell_i
    = \nabla \frac{1}{n} \sum_i \ell_i`: the gradient of one centralized full-batch epoch
    (:func:`fit`), provided the forward pass of a row depends on that row only (no batch
    norm in training mode: its batch statistics would be the client's).

    Args:
        model: maps ``x[idx]`` to logits ``[b, C]``; its weights are not changed.
        x: ``[n, ...]`` inputs; y: long ``[n]``; mask: bool ``[n]`` or indices (``None``: all).

    Returns:
        ``(num_examples, mean loss, {parameter name: gradient})``; the gradients have the
        parameters' shapes, zeros (and loss ``nan``) when ``mask`` selects no row.
    """
    idx = _indices(mask, x.size(0), x.device)
    params = dict(model.named_parameters())
    if idx.numel() == 0:
        return 0, float("nan"), {k: torch.zeros_like(p) for k, p in params.items()}
    model.train()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[idx]), y[idx])
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return int(idx.numel()), loss.item(), {
        k: torch.zeros_like(p) if g is None else g.detach() for (k, p), g in zip(params.items(), grads)}


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, mask: Tensor | None,
             batch_size: int | None = None) -> dict[str, float]:
    """``{"correct", "total", "accuracy", "loss"}`` of ``model`` on the rows ``mask`` (eval
    mode; the previous mode is restored). ``accuracy``/``loss`` are ``nan`` on an empty mask."""
    idx = _indices(mask, x.size(0), x.device)
    total = int(idx.numel())
    if total == 0:
        return {"correct": 0, "total": 0, "accuracy": float("nan"), "loss": float("nan")}
    was_training = model.training
    model.eval()
    step = batch_size or total
    correct, loss = 0, 0.0
    for s in range(0, total, step):
        b = idx[s:s + step]
        out = model(x[b])
        correct += int((out.argmax(-1) == y[b]).sum())
        loss += float(F.cross_entropy(out, y[b], reduction="sum"))
    model.train(was_training)
    return {"correct": correct, "total": total, "accuracy": correct / total, "loss": loss / total}


@dataclass
class FitResult:
    """The trained model (best validation epoch, or the last one) and its training record."""

    model: nn.Module
    best_epoch: int
    epochs: int
    train_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)


def fit(model: nn.Module, x: Tensor, y: Tensor, train_mask: Tensor, val_mask: Tensor | None,
        *, epochs: int, batch_size: int | None = None, lr: float = 0.01,
        weight_decay: float = 0.0, dp: DPSGD | None = None, select_on_val: bool = True,
        generator: torch.Generator | None = None) -> FitResult:
    """Run :func:`local_train` one epoch at a time with one Adam optimizer.

    With ``select_on_val`` the weights of the epoch with the best validation accuracy (ties: the
    lower validation loss) are kept; otherwise the last epoch's, and the validation set is not
    touched (node-level DP: validation labels are private).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = FitResult(model, epochs, epochs)
    best = _BestEpoch()
    tr = _indices(train_mask, x.size(0), x.device)
    x_tr, y_tr = x[tr], y[tr]  # slice once, not every epoch
    use_val = select_on_val and val_mask is not None
    if use_val:
        va = _indices(val_mask, x.size(0), x.device)
        x_va, y_va = x[va], y[va]
    for epoch in range(1, epochs + 1):
        _, loss = local_train(model, x_tr, y_tr, None, 1, batch_size, lr, dp, optimizer=opt,
                              generator=generator)
        result.train_loss.append(loss)
        if use_val:
            ev = evaluate(model, x_va, y_va, None)
            result.val_accuracy.append(ev["accuracy"])
            key = (ev["accuracy"], -ev["loss"])
            best.update(model, key, epoch, result)
    best.restore(model)
    return result


def train_encoder(encoder: GAPEncoder, x: Tensor, y: Tensor, train_mask: Tensor,
                  val_mask: Tensor | None = None, **kwargs) -> FitResult:
    """Pre-train GAP's encoder with its softmax head on ``(x, y)`` (paper Eq. 4; no edges).
    Keyword arguments as in :func:`fit` (node level: ``dp=DPSGD(...)``, a ``batch_size``)."""
    return fit(encoder, x, y, train_mask, val_mask, **kwargs)


def train_classifier(classifier: GAPClassifier, hops: Tensor | list[Tensor], y: Tensor,
                     train_mask: Tensor, val_mask: Tensor | None = None,
                     **kwargs) -> FitResult:
    """Train GAP's classifier on the private aggregations ``hops`` (``[N, K+1, e]`` or a list of
    ``K+1`` tensors ``[N, e]``). Per-example gradients are per node: under node-level DP-SGD a
    node's example is its own row of the (already private) aggregations and its label.
    Keyword arguments as in :func:`fit`."""
    x = stack_hops(hops) if isinstance(hops, (list, tuple)) else hops
    return fit(classifier, x, y, train_mask, val_mask, **kwargs)


# --------------------------------------------------------------------------------------------
# GraphSAGE baselines (paper Sec. 6): without DP, and with DP-SGD at node level
# --------------------------------------------------------------------------------------------
#: The (method, level, epsilon) combinations :func:`run_gap` accepts for ``method="sage"``.
SAGE_COMBINATIONS = ("method='sage', level='edge', epsilon=inf (GraphSAGE without DP)",
                     "method='sage', level='node', finite epsilon (GraphSAGE with DP-SGD)")

#: Training defaults of node-level GraphSAGE-DP (``"auto"`` in :func:`run_gap`): full batch
#: (no amplification by sampling is claimed, so smaller batches only add steps, each paying
#: the full Gaussian mechanism), 10 epochs (= 10 noisy steps) as the level's other modules.
SAGE_DP_DEFAULTS: dict[str, Any] = dict(epochs=10, batch_size=None)


def mean_aggregate(h: Tensor, edge_index: Tensor, num_nodes: int,
                   max_elements: int = MAX_MESSAGE_ELEMENTS) -> Tensor:
    r"""GraphSAGE's mean aggregation over in-neighbours:
    ``out[v] = mean over (u, v) in E of h[u]`` (zero rows for nodes without in-edges).

    The sum by :func:`fedgraph.utils.graph.scatter_sum_chunked` (never an ``N x N`` matrix, and
    at most ``max_elements`` message elements at a time: raw features are wide, ``[E, F]`` would
    be 10 GB on Facebook100 Wisconsin87), divided by the in-degree.

    Args:
        h: ``[N_src, e]`` source rows; edge_index: long ``[2, E]``, ``edge_index[0] ->
            edge_index[1]``; num_nodes: target rows ``N``; max_elements: message block cap.

    Returns:
        ``[N, e]``.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    sums = scatter_sum_chunked(h, edge_index[0], edge_index[1], num_nodes, max_elements)
    deg = in_degree(edge_index, num_nodes).clamp(min=1).to(sums.dtype)
    return sums / deg.unsqueeze(-1)


def sage_dp_features(x: Tensor, edge_index: Tensor, num_nodes: int, sigma: float = 0.0,
                     generator: torch.Generator | None = None) -> Tensor:
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
    out-degrees are bounded by ``D``, :func:`node_sensitivity`).

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
    from ..accounting import Gaussian

    count = int(steps) + (1 if inference else 0)
    return [Gaussian(noise_multiplier, count=count)] if count > 0 else []


def calibrate_sage_dp(target_epsilon: float, delta: float, steps: int, *,
                      inference: bool = True, accountant: str = "prv") -> float:
    """Smallest noise multiplier for which :func:`sage_dp_events` meets
    ``(target_epsilon, delta)`` (``inf``: 0, no noise)."""
    from ..accounting import calibrate

    if math.isinf(target_epsilon):
        return 0.0
    return float(calibrate(target_epsilon, delta,
                           lambda z: sage_dp_events(z, steps, inference), accountant=accountant))


def train_sage_dp(model: nn.Module, x: Tensor, y: Tensor, train_mask: Tensor, *, epochs: int,
                  batch_size: int | None, noise_multiplier: float, max_grad_norm: float,
                  lr: float = 0.01, weight_decay: float = 0.0, physical_batch_size: int = 1024,
                  generator: torch.Generator | None = None,
                  num_public: int | None = None) -> FitResult:
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
    from opacus import GradSampleModule
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
            int(torch.randint(2 ** 62, (1,), generator=generator)))
    dp_opt = DPOptimizer(opt, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                         expected_batch_size=bsz, loss_reduction="mean", generator=noise_gen)
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


def train_sage(model: nn.Module, x: Tensor, edge_index: Tensor, y: Tensor, train_mask: Tensor,
               val_mask: Tensor | None, *, epochs: int, lr: float = 0.01,
               weight_decay: float = 0.0, select_on_val: bool = True) -> FitResult:
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


def _run_sage(data, *, level: str, epsilon: float, delta: float | str, num_hops: int,
              hidden: int, head_layers: int, dropout: float, batch_norm: bool | None,
              epochs: int | None, lr: float, weight_decay: float, batch_size: int | None | str,
              max_degree: int, max_grad_norm: float, select_on_val: bool | None,
              accountant: str, seed: int) -> dict[str, Any]:
    """GraphSAGE baselines for :func:`run_gap` (``method="sage"``; see its docstring)."""
    private = not math.isinf(epsilon)
    if (level == "edge") == private:
        raise ValueError(f"method='sage' with level={level!r} and epsilon={epsilon}: not "
                         f"supported; allowed: {'; '.join(SAGE_COMBINATIONS)}")
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
        raise ValueError("GraphSAGE-DP keeps the last epoch: validation labels are private "
                         "at node level (select_on_val must be None or False)")

    if level == "edge":  # GraphSAGE without DP: PyG's model, full batch
        from torch_geometric.nn import GraphSAGE
        from torch_geometric.utils import to_torch_csr_tensor

        bn = dflt["batch_norm"] if batch_norm is None else batch_norm
        ep = dflt["classifier_epochs"] if epochs is None else epochs
        model = GraphSAGE(x.size(1), hidden, num_layers=num_hops, out_channels=num_classes,
                          dropout=dropout, act="selu", norm="batchnorm" if bn else None)
        t = time.perf_counter()
        # sparse adj_t[target, source]: PyG then aggregates by sparse matmul; with edge_index
        # it would build the [E, F] message block (12.7 GB on Wisconsin87)
        with warnings.catch_warnings():  # "sparse CSR support is in beta", invariant checks
            warnings.simplefilter("ignore", UserWarning)
            adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(n, n))
        timings["aggregation"] = time.perf_counter() - t
        t = time.perf_counter()
        fit_result = train_sage(model, x, adj_t, y, data.train_mask, data.val_mask,
                                epochs=ep, lr=lr, weight_decay=weight_decay,
                                select_on_val=select)
        timings["classifier"] = time.perf_counter() - t
        with torch.no_grad():
            pred = model(x, adj_t).argmax(-1)
        metrics = {f"{s}_acc": float((pred[m] == y[m]).float().mean())
                   for s in ("train", "val", "test") for m in [getattr(data, f"{s}_mask")]}
        timings["total"] = time.perf_counter() - t_start
        return {
            "method": "sage", "level": level, **metrics, "epsilon": epsilon,
            "delta": default_delta(int(data.edge_index.size(1))) if delta == "auto"
            else float(delta),
            "epsilon_spent": float("inf"),  # edges and features used without noise
            "noise_multiplier": 0.0, "sigma": 0.0, "sensitivity": 0.0, "events": [],
            "accountant": accountant, "num_edges_used": int(data.edge_index.size(1)),
            "encoder_best_epoch": None, "classifier_best_epoch": fit_result.best_epoch,
            "timings": timings, "peak_rss_mib": _peak_rss_mib(),
            "config": dict(num_hops=num_hops, hidden=hidden, dropout=dropout, batch_norm=bn,
                           classifier_epochs=ep, lr=lr, weight_decay=weight_decay,
                           batch_size=None, select_on_val=select, seed=seed),
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
    fit_result = train_sage_dp(model, train_x, y, data.train_mask, epochs=ep, batch_size=bsz,
                               noise_multiplier=opacus_multiplier, max_grad_norm=max_grad_norm,
                               lr=lr, weight_decay=weight_decay, generator=gen,
                               num_public=n_train)  # the schedule's count, as calibrated
    timings["classifier"] = time.perf_counter() - t
    t = time.perf_counter()
    del train_x
    eval_x = sage_dp_features(x, edge_index, n, sigma, gen)  # private inference
    metrics = {f"{s}_acc": evaluate(model, eval_x, y, getattr(data, f"{s}_mask"))["accuracy"]
               for s in ("train", "val", "test")}
    timings["inference"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_start
    return {
        "method": "sage", "level": level, **metrics, "epsilon": epsilon, "delta": delta,
        "epsilon_spent": epsilon_spent, "noise_multiplier": noise_multiplier, "sigma": sigma,
        "sensitivity": sensitivity, "dpsgd_noise_multiplier": opacus_multiplier,
        "dpsgd_sensitivity": grad_sensitivity, "dpsgd_steps": steps,
        "events": [repr(e) for e in events], "accountant": accountant,
        "num_edges_used": int(edge_index.size(1)),
        "max_out_degree_used": int(out_degree(edge_index, n).max()) if edge_index.numel() else 0,
        "encoder_best_epoch": None, "classifier_best_epoch": fit_result.best_epoch,
        "timings": timings, "peak_rss_mib": _peak_rss_mib(),
        "config": dict(num_hops=1, hidden=hidden, head_layers=head_layers, dropout=dropout,
                       batch_norm=False, classifier_epochs=ep, lr=lr,
                       weight_decay=weight_decay, batch_size=bsz, sample_rate=q,
                       max_degree=max_degree, max_grad_norm=max_grad_norm,
                       select_on_val=False, seed=seed),
    }


# --------------------------------------------------------------------------------------------
# Centralized end-to-end run (one client)
# --------------------------------------------------------------------------------------------
def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _seeded(seed: int) -> torch.Generator:
    """Seed torch's global generator (initialization) and return a CPU generator for the
    run's sampling and noise."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _shape(data) -> tuple[Tensor, Tensor, int, int, int]:
    """``(x, y, num_nodes, num_classes, num_train)`` of a split graph."""
    return (data.x, data.y, int(data.num_nodes), int(data.y.max()) + 1,
            int(data.train_mask.sum()))


def run_gap(data, *, method: str = "gap", level: str = "edge",
            epsilon: float = float("inf"), delta: float | str = "auto", num_hops: int = 2,
            encoder_dim: int = 16, hidden: int = 16, encoder_layers: int = 2,
            base_layers: int = 1, head_layers: int = 1, combine: str = "cat",
            dropout: float = 0.0, batch_norm: bool | None = None,
            encoder_epochs: int | None = None, classifier_epochs: int | None = None,
            lr: float = 0.01, weight_decay: float = 0.0, batch_size: int | None | str = "auto",
            max_degree: int = 100, max_grad_norm: float = 1.0, edge_unit: str = "undirected",
            select_on_val: bool | None = None, accountant: str = "prv",
            encoder_output: Tensor | None = None, return_encoder_output: bool = False,
            seed: int = 0) -> dict[str, Any]:
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
        encoder_dim, hidden, encoder_layers, base_layers, head_layers, combine, dropout,
        batch_norm: architecture (``batch_norm=None``: the level's default; never with DP-SGD).
        encoder_epochs, classifier_epochs, batch_size: training (``None``/``"auto"``: the
            level's default; ``batch_size=None`` is full batch, not allowed with DP-SGD).
        lr, weight_decay: Adam.
        max_degree: ``D`` of node-level degree bounding.
        max_grad_norm: DP-SGD clipping norm.
        edge_unit: ``"undirected"`` (default) or ``"directed"`` (the paper's unit; edge level,
            see :func:`edge_sensitivity`).
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
            raise ValueError("method='sage' has no encoder: encoder_output and "
                             "return_encoder_output apply to GAP only")
        return _run_sage(data, level=level, epsilon=epsilon, delta=delta, num_hops=num_hops,
                         hidden=hidden, head_layers=head_layers, dropout=dropout,
                         batch_norm=batch_norm, epochs=classifier_epochs, lr=lr,
                         weight_decay=weight_decay, batch_size=batch_size,
                         max_degree=max_degree, max_grad_norm=max_grad_norm,
                         select_on_val=select_on_val, accountant=accountant, seed=seed)
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
        raise ValueError("encoder_output can only replace a non-private encoder of GAP "
                         "(node-level DP needs the encoder trained with DP-SGD, accounted here)")
    train_encoder_too = (method != "mlp" and encoder_layers > 0 and enc_epochs > 0
                         and encoder_output is None)

    # ---- calibration: noise multiplier, sensitivity, events (kept together) ---------------
    t = time.perf_counter()
    if delta == "auto":
        delta = default_delta(n_train if level == "node" else int(data.edge_index.size(1)))
    delta = float(delta)
    enc_sched = dpsgd_schedule(n_train, bsz, enc_epochs if train_encoder_too else 0) \
        if use_dpsgd else None
    cls_sched = dpsgd_schedule(n_train, bsz, cls_epochs) if use_dpsgd else None
    sensitivity = (node_sensitivity(max_degree) if level == "node"
                   else edge_sensitivity(edge_unit)) if k > 0 else 0.0
    noise_multiplier, events, epsilon_spent = 0.0, [], 0.0
    if private and (k > 0 or use_dpsgd):
        noise_multiplier = calibrate_gap(epsilon, delta, num_hops=k, level=level,
                                         encoder_schedule=enc_sched,
                                         classifier_schedule=cls_sched, accountant=accountant)
        events = gap_events(noise_multiplier, k, node_level=use_dpsgd,
                            encoder_dpsgd=(enc_sched[0], noise_multiplier, enc_sched[1])
                            if use_dpsgd else None,
                            classifier_dpsgd=(cls_sched[0], noise_multiplier, cls_sched[1])
                            if use_dpsgd else None)
        epsilon_spent = _compose(events, delta, accountant) if events else 0.0
    elif not private and (k > 0 or level == "node"):
        epsilon_spent = float("inf")  # edges (k > 0) or node data used without noise
    sigma = noise_multiplier * sensitivity
    dp = DPSGD(noise_multiplier, max_grad_norm) if use_dpsgd else None
    timings["calibration"] = time.perf_counter() - t

    # ---- encoder (EM) ---------------------------------------------------------------------
    t = time.perf_counter()
    train_kw = dict(batch_size=bsz, lr=lr, weight_decay=weight_decay, dp=dp,
                    select_on_val=select, generator=gen)
    enc_result = None
    if method == "mlp":
        x0 = x
    elif encoder_output is not None:
        x0 = encoder_output
    elif train_encoder_too:
        encoder = GAPEncoder(x.size(1), num_classes, encoder_dim, hidden, encoder_layers,
                             dropout, bn)
        enc_result = train_encoder(encoder, x, y, data.train_mask, data.val_mask,
                                   epochs=enc_epochs, **train_kw)
        x0 = encoder.embed(x)
    else:
        x0 = x  # GAP without encoder: PMA on the raw features
    timings["encoder"] = time.perf_counter() - t

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
    classifier = GAPClassifier(k, features.size(-1), hidden, num_classes, combine,
                               encoder_layers if method == "mlp" else base_layers,
                               head_layers, dropout, bn)
    cls_result = train_classifier(classifier, features, y, data.train_mask, data.val_mask,
                                  epochs=cls_epochs, **train_kw)
    timings["classifier"] = time.perf_counter() - t
    metrics = {f"{s}_acc": evaluate(classifier, features, y, getattr(data, f"{s}_mask"))["accuracy"]
               for s in ("train", "val", "test")}
    timings["total"] = time.perf_counter() - t_start

    extra = {"encoder_output": x0} if return_encoder_output else {}
    return {
        **extra, "method": method, "level": level, **metrics,
        "epsilon": epsilon, "delta": delta, "epsilon_spent": epsilon_spent,
        "noise_multiplier": noise_multiplier, "sigma": sigma, "sensitivity": sensitivity,
        "events": [repr(e) for e in events], "accountant": accountant,
        "num_edges_used": int(edge_index.size(1)) if k > 0 else 0,
        "encoder_best_epoch": enc_result.best_epoch if enc_result else None,
        "classifier_best_epoch": cls_result.best_epoch,
        "timings": timings, "peak_rss_mib": _peak_rss_mib(),
        "config": dict(num_hops=k, encoder_dim=encoder_dim, hidden=hidden,
                       encoder_layers=encoder_layers, base_layers=base_layers,
                       head_layers=head_layers, combine=combine, dropout=dropout,
                       batch_norm=bn, encoder_epochs=enc_epochs if train_encoder_too else 0,
                       shared_encoder=encoder_output is not None,
                       classifier_epochs=cls_epochs, lr=lr, weight_decay=weight_decay,
                       batch_size=bsz, max_degree=max_degree if level == "node" else None,
                       max_grad_norm=max_grad_norm if use_dpsgd else None,
                       edge_unit=edge_unit if level == "edge" else None,
                       select_on_val=select, seed=seed),
    }
