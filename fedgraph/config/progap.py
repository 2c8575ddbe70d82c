"""ProGAP's run config (:class:`ProGAPConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import (
    ROUND_STRATEGY_ARGS_HELP,
    ROUND_STRATEGY_HELP,
    DataConfig,
    _client_epsilons,
    _delta,
    _epsilons_per_client,
    _round_strategy_args,
    _round_strategy_args_need_a_strategy,
    _round_strategy_name,
)


class ProGAPConfig(DataConfig):
    """ProGAP (Sajadmanesh and Gatica-Perez, WSDM 2024) federated: ``depth + 1`` stages; stage
    0 trains on the features, each later stage on the private aggregation of the previous
    stage's embedding across clients (cross-client rows through the server, optionally
    securely aggregated) and everything aggregated before it (jumping knowledge). Edge level:
    FedSGD rounds (one full-batch epoch each, server Adam), best validation round per stage;
    node level: FedAvg rounds of DP-SGD (or ``round-strategy``'s), last round.
    ``client_epsilons``: each client's own
    target for the whole run (cycled); see :mod:`fedgraph.methods.progap.privacy`."""

    method: Literal["progap"] = "progap"
    split: Literal["random-50-25-25", "random-75-10-15", "planetoid"] = "random-75-10-15"
    partitioner: str = "louvain"
    level: Literal["edge", "node"] = "edge"
    edge_unit: Literal["directed", "undirected"] = Field(
        "undirected",
        description="edge level: undirected (default, sensitivity sqrt 2: both "
        "halves of a friendship), directed (the paper's and official code's unit, 1)",
    )
    client_epsilons: list[float] = Field(default_factory=lambda: [4.0])
    delta: float = Field(1e-7)
    depth: int = Field(5, ge=0, le=10, description="K: aggregations (K + 1 stages)")
    hidden: int = Field(16, ge=1)
    base_layers: int = Field(
        1,
        ge=1,
        le=4,
        description="ProGAP: layers of each stage's base "
        "MLP (the one whose normalized output the next stage aggregates)",
    )
    head_layers: int = Field(
        1, ge=1, le=4, description="ProGAP: layers of each stage's classification head"
    )
    jk: Literal["cat", "sum", "mean", "max"] = Field(
        "cat",
        description="ProGAP: how a stage combines its inputs (the features' embedding "
        "and every aggregation so far): jumping knowledge by concatenation, sum, mean or max",
    )
    batch_norm: bool = Field(
        False,
        description="edge level: the official code's batch norms "
        "(after every base layer's SELU); training uses each client's "
        "own statistics, evaluation the averaged running statistics. "
        "Node level: GroupNorm(1, C) in their place (each node "
        "normalized over its own features, which DP-SGD clips per "
        "example), as the official code under DP-SGD",
    )
    epochs: int | None = Field(
        None,
        ge=1,
        description="rounds per stage (edge level: "
        "FedSGD epochs, default 100; node level: FedAvg rounds of "
        "local-epochs DP-SGD, default 5)",
    )
    local_epochs: int = Field(1, ge=1, description="node level: DP-SGD epochs per round")
    round_strategy: str = Field(
        "",
        description="node level: the Flower strategy that drives each stage's rounds of "
        "DP-SGD: " + ROUND_STRATEGY_HELP + "; empty: FedAvg. Edge level trains FedSGD with the "
        "server's Adam (the official optimizer)",
    )
    round_strategy_args: dict[str, Any] = Field(
        default_factory=dict, description=ROUND_STRATEGY_ARGS_HELP
    )
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(
        0, ge=0, description="node level: DP-SGD's expected batch (0: 256); edge level full batch"
    )
    max_degree: int = Field(100, ge=1, description="node level: out-degree bound D")
    max_grad_norm: float = Field(1.0, gt=0)
    cross_client_edges: bool = True
    secure_aggregation: bool = Field(
        False,
        description="pairwise-masked sums of the remote "
        "rows (as GAP's): each client adds sigma_max / sqrt(n-1)",
    )
    accountant: Literal["analytic", "prv", "pld", "rdp"] = "analytic"
    output_dir: str = "outputs"
    run_name: str = ""
    timeout: float = Field(600.0, gt=0)

    _parse_eps = field_validator("client_epsilons", mode="before")(_client_epsilons)
    _per_client = field_validator("client_epsilons")(_epsilons_per_client)
    _check_delta = field_validator("delta", mode="after")(_delta)
    _round_strategy = field_validator("round_strategy", mode="after")(_round_strategy_name)
    _parse_round_args = field_validator("round_strategy_args", mode="before")(_round_strategy_args)
    _check_round_args = field_validator("round_strategy_args", mode="after")(
        _round_strategy_args_need_a_strategy
    )

    @field_validator("epochs", mode="before")
    @classmethod
    def _unset_epochs(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _level_checks(self):
        if self.round_strategy and self.level == "edge":
            raise ValueError(
                "round-strategy: edge level trains FedSGD with the server's Adam "
                "(the official optimizer: a client sends gradients, not weights); "
                "allowed at edge level: empty; round-strategy drives node level's "
                "rounds (level = 'node')"
            )
        if self.secure_aggregation and not (self.cross_client_edges and self.depth > 0):
            raise ValueError(
                "secure-aggregation: has no effect without cross-client edges "
                "and depth >= 1 (no row leaves a client)"
            )
        if self.epochs is None:  # frozen: set during validation
            object.__setattr__(self, "epochs", 100 if self.level == "edge" else 5)
        return self

    def client_epsilon(self, partition_id: int) -> float:
        return self.client_epsilons[partition_id % len(self.client_epsilons)]

    @property
    def dpsgd_batch_size(self) -> int:
        return self.batch_size or 256

    @property
    def stage_epochs(self) -> int:
        """Epochs of training per stage (node level: DP-SGD's schedule)."""
        return self.epochs * (self.local_epochs if self.level == "node" else 1)
