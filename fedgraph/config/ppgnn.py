"""PPGNN's run config (:class:`PPGNNConfig`: PPGNN, and its baselines BASE and LPGNN)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..limits import ESW_MAX_EPSILON, MIN_FEATURE_EPSILON, ppm_level_scan_limit
from .base import DataConfig, _check_extension, _delta, _floats

#: the most propagation steps a ``steps`` entry may ask for
MAX_STEPS = 256


def _check_floor(values: list[float], what: str) -> None:
    """Refuse a feature epsilon below :data:`~fedgraph.limits.MIN_FEATURE_EPSILON` (its
    estimates overflow float32 in training; the bound's reason is there)."""
    low = [b for b in values if b < MIN_FEATURE_EPSILON]
    if low:
        raise ValueError(
            f"{what} must be at least {MIN_FEATURE_EPSILON:g} (allowed: "
            f"[{MIN_FEATURE_EPSILON:g}, inf); below it the mechanism's unbiased "
            f"estimates, about 2 x features / epsilon, overflow float32 in the "
            f"server's training, and the features carry no signal), got "
            f"{', '.join(f'{b:g}' for b in low)}"
        )


class PPGNNConfig(DataConfig):
    """PPGNN (personalized LDP on features, PPGNN paper) and its baselines BASE and LPGNN.

    ``budgets`` is the budget set E (total epsilon-LDP per user, per level), ``level_shares``
    the share of users at each level. ``mechanism`` ``ppm`` uses the levels; the uniform
    baselines (``multi-bit``, ``one-bit``, ``laplace``, ``gaussian``) give every user
    ``epsilon`` (default: the smallest level, as LPGNN would have to). ``label_epsilon > 0``
    (randomized response on the labels, as LPGNN's) comes out of each level's budget: the
    features get :attr:`feature_budgets`, ``budgets - label_epsilon`` (basic composition), so
    a user's whole release stays within its level's budget.
    """

    method: Literal["ppgnn"] = "ppgnn"
    budgets: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0])
    level_shares: list[float] = Field(default_factory=list, description="empty: equal shares")
    mechanism: str = "ppm"
    gamma: float = Field(0.1, gt=0, lt=1, description="share of a user's budget spent on its level")
    rescale: Literal["posterior", "released"] = Field(
        "posterior", description="PPM: server rescaling by level posterior or released level"
    )
    epsilon: float | None = Field(None, description="uniform mechanisms: epsilon per user")
    delta: float = Field(1e-5, description="gaussian mechanism only")
    label_epsilon: float = Field(
        0.0,
        ge=0,
        description="> 0: randomized response on labels, "
        "out of each level's budget (the features get the rest)",
    )
    denoiser: Literal["flexprop", "kprop", "none"] = "flexprop"
    steps: list[int] = Field(
        default_factory=lambda: [16],
        description="propagation steps K; several: chosen on validation",
    )
    weights: Literal["level", "inverse-variance", "posterior"] = Field(
        "posterior",
        description="FlexProp source weights: posterior (default; expected inverse "
        "variance given the ESW-decoded level), level (the paper's Eq. 12), inverse-variance",
    )
    self_loops: bool = Field(
        False,
        description="propagate over each user's neighbours and "
        "itself (default: neighbours only, PPGNN Eq. 12 and LPGNN's code)",
    )
    standardize: bool = Field(True, description="standardize features after propagation")
    backbone: Literal["gcn", "sage", "gat"] = "sage"
    hidden: int = Field(16, ge=1)
    # Training defaults chosen on issue 18's K sweep (bench/ppgnn_table.py --steps,
    # docs/results/accuracy.md): the LPGNN reference code's values for multi-bit features (sisaman/LPGNN
    # hparams/lwd.csv: lr 0.01, weight decay 0.01, dropout 0.75), with 300 epochs instead of
    # its 500 (500 measured within noise on Cora, paired +0.0 / +0.6 / +0.3 points at
    # K = 0 / 4 / 16, at 5/3 of the cost). Weight decay 0.05 measured 0.5 validation points
    # better on Cora and CiteSeer; stronger regularization costs Facebook page-page at large K.
    dropout: float = Field(0.75, ge=0, lt=1)
    epochs: int = Field(300, ge=1)
    patience: int = Field(
        0,
        ge=0,
        description="early stopping: stop after this many epochs "
        "without a better validation accuracy (0: run every epoch)",
    )
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    output_dir: str = Field("outputs", description="folder for the JSON report")
    run_name: str = ""
    timeout: float = Field(
        600.0, gt=0, description="seconds to wait for the replies of one message exchange"
    )

    @field_validator("steps", mode="before")
    @classmethod
    def _parse_steps(cls, v: Any) -> list[int]:
        vals = _floats(v, f"integers in [0, {MAX_STEPS}] separated by commas, e.g. '2,4,8'")
        if not vals or any(k != int(k) or not 0 <= k <= MAX_STEPS for k in vals):
            raise ValueError(f"steps must be integers in [0, {MAX_STEPS}], got {v!r}")
        return [int(k) for k in vals]

    @field_validator("budgets", "level_shares", mode="before")
    @classmethod
    def _parse_list(cls, v: Any, info) -> list[float]:
        return _floats(
            v,
            "finite numbers > 0 separated by commas, e.g. '1,2,4'"
            if info.field_name == "budgets"
            else "one share in [0, 1] per level separated by commas, e.g. '0.5,0.3,0.2'",
        )

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        if not v or any(not math.isfinite(b) or b <= 0 for b in v):
            raise ValueError(f"every epsilon must be finite and > 0 (allowed: (0, inf)), got {v}")
        _check_floor(v, "every epsilon")
        if any(b2 <= b1 for b1, b2 in zip(v, v[1:])):
            raise ValueError(f"levels must be strictly increasing, got {v}")
        return v

    @field_validator("epsilon", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: float | None, info) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"epsilon must be finite and > 0 (allowed: (0, inf)), got {v}")
        if v is not None:
            _check_floor([v], "epsilon")
        budgets, mechanism = info.data.get("budgets"), info.data.get("mechanism")
        if v is not None and mechanism == "ppm":
            raise ValueError(
                f"has no effect with mechanism 'ppm' (each level spends its budget from "
                f'budgets): leave epsilon empty and set budgets (e.g. budgets = "{v:g}" for '
                f"everyone at {v:g}), or choose a uniform mechanism (multi-bit, one-bit, "
                f"laplace, gaussian)"
            )
        if v is not None and budgets and mechanism != "ppm" and v > min(budgets) * (1 + 1e-9):
            # a uniform mechanism gives every user this epsilon: the lower levels would
            # overspend (fedgraph.federation.check_feature_budgets checks any mechanism;
            # _label_share, the room left beside label_epsilon)
            raise ValueError(
                f"{v:g} is above the smallest level's budget {min(budgets):g} (budgets "
                f"{', '.join(f'{b:g}' for b in budgets)}): mechanism {mechanism!r} gives every "
                f"user the same epsilon (allowed: (0, {min(budgets):g}]); for everyone at "
                f'{v:g}, set budgets = "{v:g}"'
            )
        return v

    _check_delta = field_validator("delta", mode="after")(_delta)

    @field_validator("gamma", "label_epsilon", "lr", "delta", "alpha", mode="after")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number (not NaN or infinity)")
        return v

    @field_validator("mechanism")
    @classmethod
    def _mechanism(cls, v: str) -> str:
        return _check_extension("mechanism", v)

    @model_validator(mode="after")
    def _label_share(self):
        """``label_epsilon`` is spent out of every level's budget: it must leave each level's
        features at least :data:`~fedgraph.limits.MIN_FEATURE_EPSILON`, and a uniform
        mechanism's ``epsilon`` must fit beside it in the smallest budget."""
        if self.label_epsilon <= 0:
            return self
        low = min(self.budgets)
        room = low - MIN_FEATURE_EPSILON
        if self.label_epsilon > room * (1 + 1e-9):
            raise ValueError(
                f"label-epsilon: {self.label_epsilon!r} is spent out of every level's budget "
                f"and leaves the smallest ({low:g}) less than {MIN_FEATURE_EPSILON:g} for the "
                f"features (allowed: [0, {max(room, 0):.10g}]; or raise budgets)"
            )
        if self.epsilon is not None and self.epsilon + self.label_epsilon > low * (1 + 1e-9):
            raise ValueError(
                f"epsilon: {self.epsilon:g} on the features and label-epsilon "
                f"{self.label_epsilon:g} on the labels exceed the smallest level's budget "
                f"{low:g} (allowed: epsilon in (0, {low - self.label_epsilon:g}] with this "
                f"label-epsilon)"
            )
        return self

    @property
    def feature_budgets(self) -> list[float]:
        """Each level's epsilon for a user's features: ``budgets`` less ``label_epsilon``
        (what the feature mechanism is built with; the ledger's budgets stay ``budgets``)."""
        return [b - self.label_epsilon for b in self.budgets]

    @model_validator(mode="after")
    def _ppm_budget_limit(self):
        """PPM's analysis of what a whole report reveals about the level (checked for every
        run, without the dataset's feature count) scans every ``d`` up to ``max(E)``'s MLR
        sample size: refuse budgets past :func:`ppm_level_scan_limit` here, in well under a
        second, rather than in the preflight."""
        if self.mechanism == "ppm":
            share = self.gamma if len(self.budgets) > 1 else 0.0
            if share and share * max(self.budgets) >= ESW_MAX_EPSILON:
                raise ValueError(
                    f"budgets: {max(self.budgets):g} gives the top level an ESW epsilon of "
                    f"gamma x {max(self.budgets):g} = {share * max(self.budgets):g}, at or past "
                    f"the {ESW_MAX_EPSILON:g} accepted (ESW's exp(epsilon) overflows float64 "
                    f"above 709.8); allowed with several levels and gamma = {self.gamma:g}: "
                    f"budgets below {ESW_MAX_EPSILON / share:g}"
                )
            limit = ppm_level_scan_limit(share)
            if max(self.budgets) >= limit:
                raise ValueError(
                    f"budgets: {max(self.budgets):g} is too large for PPM's level analysis over "
                    f"every feature count (allowed "
                    + (f"with gamma = {self.gamma:g}" if share else "with one level")
                    + f": budgets below {limit:g})"
                )
        return self

    @field_validator("level_shares")
    @classmethod
    def _shares(cls, s: list[float], info) -> list[float]:
        budgets = info.data.get("budgets")
        if s and budgets:
            if len(s) != len(budgets):
                raise ValueError(f"needs one share per level ({len(budgets)}), got {len(s)}")
            if any(x < 0 or not math.isfinite(x) for x in s) or abs(sum(s) - 1) > 1e-6:
                raise ValueError(f"shares must be >= 0 and sum to 1, got {s}")
        return s

    @property
    def shares(self) -> list[float]:
        return self.level_shares or [1.0 / len(self.budgets)] * len(self.budgets)
