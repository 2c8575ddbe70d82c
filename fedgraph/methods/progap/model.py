r"""ProGAP's progressive model (Sajadmanesh and Gatica-Perez, "ProGAP: Progressive Graph Neural
Networks with Differential Privacy Guarantees", WSDM 2024, Sec. 4, Fig. 2), as in the official
code (github.com/sisaman/ProGAP, ``core/modules/prog.py``, ``core/nn/mlp.py``, ``core/nn/jk.py``).

Stage ``i`` (``0..depth``) reads the cached inputs :math:`X^{(0)} = X` (features) and
:math:`X^{(1..i)}` (the private aggregations of the earlier stages' embeddings) and computes

.. math:: H^{(j)} = \mathrm{MLP}^{(j)}_{base}(X^{(j)}),\ j = 0..i;\quad
          Z = \mathrm{JK}(H^{(0)}, .., H^{(i)}) / \lVert\cdot\rVert_2;\quad
          \hat Y = \mathrm{MLP}^{(i)}_{head}(Z),

training base MLPs ``0..i`` and head ``i`` (the official ``layerwise = False``); its embedding
:math:`H^{(i)}` is what the next stage aggregates. Every layer is :class:`torch.nn.Linear`
(Opacus computes per-example gradients); a base MLP is ``Linear -> SELU -> BatchNorm (GroupNorm(1, C) under DP-SGD) ->
dropout`` per layer (the official ``MLP`` with ``plain_last = False``: the activation before the
batch norm), a head MLP the same with a plain last layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.gap import MLP

JK_MODES = ("cat", "sum", "mean", "max")


class StageMLP(MLP):
    """:class:`fedgraph.nn.gap.MLP`'s layers (``num_layers`` linear layers; after each, but the
    last when ``plain_last``, a batch norm when ``batch_norm``, and dropout) in the official
    ProGAP order (``core/nn/mlp.py``): SELU, then batch norm, then dropout (GAP's: batch norm,
    dropout, SELU). Shapes: ``[*, in_dim] -> [*, out_dim]``."""

    def __init__(self, *args, group_norm: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if group_norm:  # per example: what DP-SGD can clip (the official Opacus fix)
            self.norms = nn.ModuleList(
                nn.GroupNorm(1, layer.out_features)
                for layer in list(self.layers)[: len(self.norms)]
            )

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.norms):
                x = self.dropout(self.norms[i](F.selu(x)))
        return x


class ProgressiveModel(nn.Module):
    r"""All ``depth + 1`` stages of ProGAP; :meth:`set_stage` chooses the one trained and run.

    Args:
        in_dim: features ``F``; num_classes: ``C``; depth: ``K`` (``K + 1`` stages, ``K``
            aggregations); hidden: width of every embedding and hidden layer (16);
        base_layers, head_layers: layers of each base / head MLP (1, 1);
        jk: ``cat`` (the paper's), ``sum``, ``mean``, ``max`` (parameter-free combinations;
            the official ``attn``/``wsum``/``lstm`` are not offered);
        dropout, batch_norm: as :class:`StageMLP` (batch norm: never with DP-SGD).
        group_norm: ``GroupNorm(1, width)`` where ``batch_norm`` puts a batch norm: each
            example normalized over its own features, so DP-SGD can clip it per example (the
            official code's replacement under DP-SGD: its Opacus fixer, ``core/__init__.py``).

    The input of stage ``i`` is one tensor ``[N, F + i * hidden]``, the cached
    :math:`X^{(0)}, .., X^{(i)}` concatenated (:func:`stage_input`), so that batches are rows.
    Shapes: ``forward: [N, F + i h] -> [N, C]``; ``embed: [N, F + i h] -> [N, h]``.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        depth: int,
        hidden: int = 16,
        base_layers: int = 1,
        head_layers: int = 1,
        jk: str = "cat",
        dropout: float = 0.0,
        batch_norm: bool = False,
        group_norm: bool = False,
    ):
        super().__init__()
        if batch_norm and group_norm:
            raise ValueError("batch_norm or group_norm, not both")
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        if jk not in JK_MODES:
            raise ValueError(f"jk: unknown {jk!r}; allowed: {', '.join(JK_MODES)}")
        self.in_dim, self.hidden, self.jk, self.depth = in_dim, hidden, jk, depth
        self.base = nn.ModuleList(
            StageMLP(
                in_dim if i == 0 else hidden,
                hidden,
                hidden,
                base_layers,
                dropout,
                batch_norm,
                plain_last=False,
                group_norm=group_norm,
            )
            for i in range(depth + 1)
        )
        self.head = nn.ModuleList(
            StageMLP(
                hidden * (i + 1) if jk == "cat" else hidden,
                hidden,
                num_classes,
                head_layers,
                dropout,
                batch_norm,
                plain_last=True,
                group_norm=group_norm,
            )
            for i in range(depth + 1)
        )
        self.stage = 0
        self.set_stage(0)

    def set_stage(self, stage: int) -> None:
        """Run stage ``stage``; only its parameters (base ``0..stage``, head ``stage``) require
        gradients (:meth:`stage_parameter_names`)."""
        if not 0 <= stage <= self.depth:
            raise ValueError(f"stage must be in [0, {self.depth}], got {stage}")
        self.stage = stage
        names = set(self.stage_parameter_names())
        for name, p in self.named_parameters():
            p.requires_grad_(name in names)

    def stage_parameter_names(self) -> list[str]:
        """Names (as in ``state_dict``) of the parameters stage ``self.stage`` trains."""
        return [
            n
            for n, _ in self.named_parameters()
            if any(n.startswith(f"base.{j}.") for j in range(self.stage + 1))
            or n.startswith(f"head.{self.stage}.")
        ]

    def _split(self, x: Tensor) -> list[Tensor]:
        widths = [self.in_dim] + [self.hidden] * self.stage
        if x.size(-1) != sum(widths):
            raise ValueError(
                f"stage {self.stage} expects inputs of width {sum(widths)} "
                f"(features + {self.stage} x {self.hidden}), got {x.size(-1)}"
            )
        return list(torch.split(x, widths, dim=-1))

    def forward(self, x: Tensor) -> Tensor:
        hs = [self.base[j](xj) for j, xj in enumerate(self._split(x))]
        if self.jk == "cat":
            z = torch.cat(hs, dim=-1)
        else:
            stacked = torch.stack(hs, dim=-1)
            z = {
                "sum": lambda t: t.sum(-1),
                "mean": lambda t: t.mean(-1),
                "max": lambda t: t.max(-1).values,
            }[self.jk](stacked)
        return self.head[self.stage](F.normalize(z, p=2.0, dim=-1))

    @torch.no_grad()
    def embed(self, x: Tensor) -> Tensor:
        """The current stage's embedding :math:`H^{(i)}` (eval mode, the previous mode
        restored): what the next stage aggregates (normalized there)."""
        was = self.training
        self.eval()
        out = self.base[self.stage](self._split(x)[-1])
        self.train(was)
        return out


def stage_input(cache: list[Tensor]) -> Tensor:
    """``[N, F + i h]``: the cached inputs :math:`X^{(0)}, .., X^{(i)}` side by side."""
    return torch.cat(cache, dim=-1)
