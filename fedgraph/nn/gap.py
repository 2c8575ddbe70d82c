r"""GAP's neural modules: the encoder (EM) and the classification module (CM).

Sajadmanesh et al., "GAP: Differentially Private Graph Neural Networks with Aggregation
Perturbation", USENIX Security 2023, Sec. 4.1 (encoder) and 4.3 (classifier). The equations of
these sections were lost in the text extraction we work from; they are rebuilt from the
surrounding text and from the authors' reference implementation (github.com/sisaman/GAP,
``core/modules/node/em.py``, ``core/models/multi_mlp.py``, ``core/models/mlp.py``):

* Eq. 3 (pre-training model): :math:`\hat Y = \mathrm{softmax}(\mathrm{MLP}_{enc}(X) W)`; the
  reference code row-normalizes the encoder output before the linear softmax layer (followed by
  dropout and the activation), which we follow.
* Eq. 5/6 (encoder features for PMA): :math:`X^{(0)} = \mathrm{MLP}_{enc}(X)`,
  :math:`\check X^{(0)}_v = X^{(0)}_v / \lVert X^{(0)}_v \rVert_2`.
* Eq. 10-12 (classifier): :math:`H^{(k)} = \mathrm{MLP}^{(k)}_{base}(\check X^{(k)})` for
  :math:`k = 0..K`, :math:`H = \mathrm{Combine}(H^{(0)}, .., H^{(K)})`,
  :math:`\hat Y = \mathrm{softmax}(\mathrm{MLP}_{head}(H))`; the reference code row-normalizes
  ``H`` and applies dropout and the activation before the head, which we follow.

Every layer is a :class:`torch.nn.Linear` so that Opacus computes per-example gradients
(``torch_geometric.nn.MLP`` uses PyG's own ``Linear``, which Opacus does not know). Batch
normalization is optional and must stay off under DP-SGD (it mixes examples of a batch): between
hidden layers (``batch_norm``) and, as the reference code does, after the normalized encoder
output and after the normalized combined hops (``output_batch_norm``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

COMBINE = ("cat", "sum", "attention")


def normalize_rows(x: Tensor, eps: float = 1e-12) -> Tensor:
    r"""Row-wise L2 normalization :math:`x_v / \max(\lVert x_v \rVert_2, \epsilon)` (paper Eq. 6
    and 9); a zero row stays zero."""
    return F.normalize(x, p=2.0, dim=-1, eps=eps)


def normalize_rows_(x: Tensor, eps: float = 1e-12) -> Tensor:
    """:func:`normalize_rows` in place (the same values: each row divided by
    ``max(norm, eps)``); returns ``x``. Not for a tensor that gradients flow through."""
    return x.div_(x.norm(p=2.0, dim=-1, keepdim=True).clamp_min_(eps))


class MLP(nn.Module):
    r"""``num_layers`` linear layers; between two layers (and after the last one unless
    ``plain_last``): optional batch norm, dropout, SELU (the reference code's order).

    Args:
        in_dim, hidden, out_dim: input, hidden and output widths (``num_layers = 1``: a single
            ``Linear(in_dim, out_dim)``).
        num_layers: ``>= 1``.
        dropout: dropout rate.
        batch_norm: ``BatchNorm1d`` after hidden layers (not with DP-SGD).
        plain_last: no normalization, dropout or activation after the last layer.

    Shapes: ``[*, in_dim] -> [*, out_dim]``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        batch_norm: bool = False,
        plain_last: bool = True,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        n_act = num_layers - 1 if plain_last else num_layers
        self.norms = nn.ModuleList(
            nn.BatchNorm1d(dims[i + 1]) if batch_norm else nn.Identity() for i in range(n_act)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.norms):
                x = F.selu(self.dropout(self.norms[i](x)))
        return x


class GAPEncoder(nn.Module):
    r"""GAP's encoder module (EM) with its pre-training head.

    ``forward(x)`` gives class logits for pre-training (paper Eq. 3-4; logits, the softmax is in
    the loss): encoder MLP, row normalization, dropout, SELU, a linear layer to the classes.
    ``embed(x)`` gives the row-normalized encoder output :math:`\check X^{(0)}` (Eq. 5-6) that
    PMA aggregates; it never uses the graph.

    Args:
        in_dim: number of input features ``F``.
        num_classes: ``C``.
        encoder_dim: output width ``e`` of the encoder (the paper: 16). (default: 16)
        hidden: width of the hidden layers. (default: 16)
        num_layers: layers of the encoder MLP (the paper: 2). (default: 2)
        dropout: dropout rate (the paper: 0). (default: 0)
        batch_norm: batch norm between hidden layers (edge-level and non-private runs of the
            paper; never with DP-SGD). (default: False)
        output_batch_norm: ``BatchNorm1d(e)`` after the row normalization of the pre-training
            path (the reference code's ``EncoderModule`` with ``batch_norm``); ``embed`` (what
            PMA aggregates) stays the normalized output. (default: False)

    Shapes: ``forward: [N, F] -> [N, C]``; ``embed: [N, F] -> [N, e]`` (unit-norm rows).
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        encoder_dim: int = 16,
        hidden: int = 16,
        num_layers: int = 2,
        dropout: float = 0.0,
        batch_norm: bool = False,
        output_batch_norm: bool = False,
    ):
        super().__init__()
        self.encoder = MLP(
            in_dim, hidden, encoder_dim, num_layers, dropout, batch_norm, plain_last=True
        )
        self.dropout = nn.Dropout(dropout)
        self.out_norm = nn.BatchNorm1d(encoder_dim) if output_batch_norm else nn.Identity()
        self.head = nn.Linear(encoder_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.out_norm(normalize_rows(self.encoder(x)))
        return self.head(F.selu(self.dropout(h)))

    @torch.no_grad()
    def embed(self, x: Tensor, batch_size: int | None = None) -> Tensor:
        """Row-normalized encoder output (eval mode; restores the previous mode)."""
        was_training = self.training
        self.eval()
        if batch_size is None:
            out = normalize_rows(self.encoder(x))
        else:
            out = torch.cat(
                [
                    normalize_rows(self.encoder(x[i : i + batch_size]))
                    for i in range(0, x.size(0), batch_size)
                ]
            )
        self.train(was_training)
        return out


class GAPClassifier(nn.Module):
    r"""GAP's classification module (CM): one base MLP per hop, a combination, a head MLP.

    Args:
        num_hops: ``K``; the input holds hops ``0..K``.
        in_dim: width ``e`` of every hop's features.
        hidden: width of the base MLPs' outputs and of hidden layers. (default: 16)
        num_classes: ``C``.
        combine: ``"cat"`` (concatenation, the paper's default), ``"sum"`` or ``"attention"``
            (a per-node softmax over hops of a learned score ``w^T h_k``, then the weighted sum
            of the hop representations). The reference code's attention normalizes its scores
            over the *nodes* of a batch, which mixes examples and breaks per-example DP-SGD; we
            normalize over hops. (default: ``"cat"``)
        base_layers: layers of each base MLP (the paper: 1). (default: 1)
        head_layers: layers of the head MLP (the paper: 1). (default: 1)
        dropout, batch_norm: as in :class:`MLP`.
        output_batch_norm: ``BatchNorm1d`` after the row normalization of the combined hops,
            before dropout and SELU (the reference code's ``MultiMLP`` with ``batch_norm``).
            (default: False)

    Shapes: ``forward: [N, K+1, e] -> [N, C]`` (see :func:`stack_hops`).
    """

    def __init__(
        self,
        num_hops: int,
        in_dim: int,
        hidden: int = 16,
        num_classes: int = 2,
        combine: str = "cat",
        base_layers: int = 1,
        head_layers: int = 1,
        dropout: float = 0.0,
        batch_norm: bool = False,
        output_batch_norm: bool = False,
    ):
        super().__init__()
        if num_hops < 0:
            raise ValueError(f"num_hops must be >= 0, got {num_hops}")
        if combine not in COMBINE:
            raise ValueError(f"combine: unknown {combine!r}; allowed: {', '.join(COMBINE)}")
        self.num_hops, self.combine = num_hops, combine
        self.base = nn.ModuleList(
            MLP(in_dim, hidden, hidden, base_layers, dropout, batch_norm, plain_last=True)
            for _ in range(num_hops + 1)
        )
        if combine == "attention":
            self.score = nn.Linear(hidden, 1, bias=False)
        width = hidden * (num_hops + 1) if combine == "cat" else hidden
        self.out_norm = nn.BatchNorm1d(width) if output_batch_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.head = MLP(
            width, hidden, num_classes, head_layers, dropout, batch_norm, plain_last=True
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.size(1) != self.num_hops + 1:
            raise ValueError(f"expected input [N, {self.num_hops + 1}, e], got {tuple(x.shape)}")
        hs = [mlp(x[:, k]) for k, mlp in enumerate(self.base)]
        if self.combine == "cat":
            h = torch.cat(hs, dim=-1)
        elif self.combine == "sum":
            h = torch.stack(hs, dim=1).sum(1)
        else:
            stacked = torch.stack(hs, dim=1)  # [N, K+1, hidden]
            alpha = F.leaky_relu(self.score(stacked), 0.2).softmax(dim=1)  # over hops
            h = (alpha * stacked).sum(1)
        h = F.selu(self.dropout(self.out_norm(normalize_rows(h))))
        return self.head(h)


def stack_hops(hops: list[Tensor]) -> Tensor:
    """``K+1`` tensors ``[N, e]`` -> one ``[N, K+1, e]`` (the classifier's input)."""
    return torch.stack(hops, dim=1)
