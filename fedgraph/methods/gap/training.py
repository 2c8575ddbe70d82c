r"""Training and evaluation of GAP's encoder and classifier (paper Sec. 4: EM pre-trained with
its softmax head on features and labels, Eq. 4; CM on the private aggregations), centralized and
as a federated client's step.

* :func:`local_train`: the local step of a FedAvg round, or one epoch of :func:`fit`; Adam, or
  DP-SGD through Opacus (:class:`DPSGD`; node level) with the schedule :func:`dpsgd_schedule`
  that the accounting (:mod:`.privacy`) uses too.
* :func:`local_gradient`: a client's half of a FedSGD round.
* :func:`evaluate`: counts, accuracy and loss on a mask.
* :func:`fit`, :func:`train_encoder`, :func:`train_classifier`: epochs with one optimizer and,
  optionally, the best validation epoch kept.

Model selection: at edge level the features and labels are not protected, so the epoch with the
best validation accuracy is kept (as in the paper's code). At node level validation labels are
private: the reference code still selects on them, which is not accounted for; we keep the last
epoch by default (``select_on_val=False``) and report validation accuracy as a metric only.

Everything here trains a model on fixed rows (a row per node); the graph-model trainer of the
other methods is :func:`fedgraph.methods.training.train_node_classifier`.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import randomness as rng
from ...nn.gap import GAPClassifier, GAPEncoder, stack_hops


@dataclass(frozen=True)
class DPSGD:
    """DP-SGD settings: per-example gradients clipped to ``max_grad_norm`` (L2), Gaussian noise
    of std ``noise_multiplier * max_grad_norm`` on their sum, Poisson sampling."""

    noise_multiplier: float
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(
                f"noise_multiplier must be finite and > 0, got {self.noise_multiplier}"
            )
        if not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            raise ValueError(f"max_grad_norm must be finite and > 0, got {self.max_grad_norm}")


def dpsgd_schedule(num_examples: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """Poisson sampling rate and number of steps of DP-SGD, as :func:`local_train` runs it:
    ``q = min(1, batch_size / n)`` and ``epochs * max(1, n // batch_size)`` steps (the reference
    code's ``epochs * n // batch_size``). Use the same call for training and accounting."""
    if num_examples < 1 or batch_size < 1 or epochs < 0:
        raise ValueError(
            f"need num_examples >= 1, batch_size >= 1, epochs >= 0 "
            f"(got {num_examples}, {batch_size}, {epochs})"
        )
    q = min(1.0, batch_size / num_examples)
    return q, epochs * max(1, num_examples // batch_size)


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


def local_train(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    mask: Tensor | None,
    epochs: int,
    batch_size: int | None,
    lr: float,
    dp: DPSGD | None = None,
    *,
    weight_decay: float = 0.0,
    optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
    num_public: int | None = None,
    proximal_mu: float = 0.0,
) -> tuple[int, float]:
    r"""Train ``model`` for ``epochs`` epochs on the rows ``mask`` of ``(x, y)`` with
    cross-entropy: the local step of a FedAvg round, or one epoch of :func:`fit`.

    With ``proximal_mu`` :math:`\mu > 0` (FedProx, Li et al. MLSys 2020, Eq. 2 / Algorithm 2),
    each step minimises :math:`\ell(w) + \frac{\mu}{2} \lVert w - w^t \rVert^2`, with
    :math:`w^t` the weights ``model`` holds on entry (the round's global model). With ``dp``
    the proximal gradient :math:`\mu (w - w^t)` is added after Opacus clipped and noised the
    data gradient: it reads no example, so the step's privacy is DP-SGD's unchanged.

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
            directory and split; :func:`~fedgraph.methods.gap.privacy.privacy_plan` uses the
            same); ``None``: the number of rows in ``mask``, for data whose size is public.

    Returns:
        ``(num_examples, mean training loss over the steps)`` (``nan`` if nothing ran).
    """
    idx = _indices(mask, x.size(0), x.device)
    n = int(idx.numel())
    if n == 0 or epochs == 0:
        return n, float("nan")
    opt = (
        optimizer
        if optimizer is not None
        else torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    )
    model.train()
    losses: list[float] = []
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None

    def proximal_gradient():
        """Adds mu (w - w^t) to every parameter's gradient (FedProx's term)."""
        for p, p0 in zip(model.parameters(), anchor or ()):
            if p.grad is not None:
                p.grad.add_(p.detach() - p0, alpha=proximal_mu)

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
                proximal_gradient()
                opt.step()
                losses.append(loss.item())
        return n, sum(losses) / len(losses)

    from ..._lazy import import_without_root_logging

    GradSampleModule = import_without_root_logging("opacus").GradSampleModule

    if batch_size is None:
        raise ValueError("DP-SGD needs a batch_size (the expected Poisson batch size)")
    n_pub = n if num_public is None else int(num_public)
    q, steps = dpsgd_schedule(n_pub, batch_size, epochs)
    gsm = GradSampleModule(model, loss_reduction="sum", strict=True)  # refuses BatchNorm
    # Opacus draws the noise on the parameters' device: rng.dp_optimizer gives it a generator
    # there (seeded from ``generator``), or draws it from a SecureRandom.
    dp_opt = rng.dp_optimizer(
        opt,
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        expected_batch_size=min(batch_size, n_pub),
        generator=generator,
        device=x.device,
    )
    try:
        for _ in range(steps):
            # Poisson sampling at q rounded down to the 2^-53 grid (fedgraph.randomness.
            # bernoulli): the real rate never exceeds the one the accountant amplifies with
            # (a float32 uniform against q rounded it to 2^-24 either way; issue 60, fault 7)
            pick = rng.bernoulli(q, n, generator).to(idx.device)
            b = idx[pick]
            dp_opt.zero_grad(set_to_none=True)
            # sum of per-example losses; DPOptimizer clips each example's gradient, adds
            # noise to the sum and divides by the expected batch size
            loss = F.cross_entropy(gsm(x[b]), y[b], reduction="sum")
            with warnings.catch_warnings():  # "full backward hook ... no inputs require grad"
                warnings.simplefilter("ignore", UserWarning)
                loss.backward()
            if dp_opt.pre_step():  # clip, noise, scale (Opacus), then FedProx's term, then Adam
                proximal_gradient()
                dp_opt.original_optimizer.step()
            if b.numel():
                losses.append(loss.item() / b.numel())
    finally:
        gsm._close()
        for p in model.parameters():
            p.grad = None
    return n, (sum(losses) / len(losses)) if losses else float("nan")


def local_gradient(
    model: nn.Module, x: Tensor, y: Tensor, mask: Tensor | None
) -> tuple[int, float, dict[str, Tensor]]:
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
    return (
        int(idx.numel()),
        loss.item(),
        {
            k: torch.zeros_like(p) if g is None else g.detach()
            for (k, p), g in zip(params.items(), grads)
        },
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, mask: Tensor | None, batch_size: int | None = None
) -> dict[str, float]:
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
        b = idx[s : s + step]
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


def fit(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    train_mask: Tensor,
    val_mask: Tensor | None,
    *,
    epochs: int,
    batch_size: int | None = None,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    dp: DPSGD | None = None,
    select_on_val: bool = True,
    generator: torch.Generator | None = None,
) -> FitResult:
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
        _, loss = local_train(
            model, x_tr, y_tr, None, 1, batch_size, lr, dp, optimizer=opt, generator=generator
        )
        result.train_loss.append(loss)
        if use_val:
            ev = evaluate(model, x_va, y_va, None)
            result.val_accuracy.append(ev["accuracy"])
            key = (ev["accuracy"], -ev["loss"])
            best.update(model, key, epoch, result)
    best.restore(model)
    return result


def train_encoder(
    encoder: GAPEncoder,
    x: Tensor,
    y: Tensor,
    train_mask: Tensor,
    val_mask: Tensor | None = None,
    **kwargs,
) -> FitResult:
    """Pre-train GAP's encoder with its softmax head on ``(x, y)`` (paper Eq. 4; no edges).
    Keyword arguments as in :func:`fit` (node level: ``dp=DPSGD(...)``, a ``batch_size``)."""
    return fit(encoder, x, y, train_mask, val_mask, **kwargs)


def train_classifier(
    classifier: GAPClassifier,
    hops: Tensor | list[Tensor],
    y: Tensor,
    train_mask: Tensor,
    val_mask: Tensor | None = None,
    **kwargs,
) -> FitResult:
    """Train GAP's classifier on the private aggregations ``hops`` (``[N, K+1, e]`` or a list of
    ``K+1`` tensors ``[N, e]``). Per-example gradients are per node: under node-level DP-SGD a
    node's example is its own row of the (already private) aggregations and its label.
    Keyword arguments as in :func:`fit`."""
    x = stack_hops(hops) if isinstance(hops, (list, tuple)) else hops
    return fit(classifier, x, y, train_mask, val_mask, **kwargs)
