"""GAP's run config (:class:`GAPConfig`) and its schedule's round defaults."""

from __future__ import annotations

import math
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

#: GAP's round counts by schedule, where the run config leaves them unset: FedSGD needs an
#: epoch per round (the centralized trajectory: 100 + 100 epochs), FedAvg does 10 local
#: epochs per round.
SCHEDULE_DEFAULTS = {
    "fedsgd": {"encoder_rounds": 100, "classifier_rounds": 100, "local_epochs": 1},
    "fedavg": {"encoder_rounds": 10, "classifier_rounds": 10, "local_epochs": 10},
}


class GAPConfig(DataConfig):
    """GAP (Sajadmanesh et al. 2023) federated: encoder rounds (FedAvg), PMA on the clients with
    cross-client partial sums through the server, classifier rounds (FedAvg).

    ``client_epsilons`` are the clients' own epsilon targets (heterogeneous levels), cycled
    over the clients; each client calibrates its own noise for ``(epsilon, delta)``.
    """

    method: Literal["gap"] = "gap"
    split: Literal["random-50-25-25", "random-75-10-15", "planetoid"] = "random-75-10-15"
    partitioner: str = "louvain"
    variant: Literal["gap", "gap-inf", "mlp"] = "gap"
    level: Literal["edge", "node"] = "edge"
    edge_unit: Literal["directed", "undirected"] = Field(
        "undirected",
        description="edge level: the protected unit. undirected (default): one "
        "edge of the undirected graph, stored as two directed halves, sensitivity sqrt 2; "
        "directed: one half (GAP's paper), sensitivity 1",
    )
    client_epsilons: list[float] = Field(default_factory=lambda: [4.0])
    delta: float = Field(1e-7)
    hops: int = Field(2, ge=0, le=10)
    encoder_dim: int = Field(16, ge=1)
    hidden: int = Field(16, ge=1)
    combine: Literal["cat", "sum", "attention"] = "cat"
    # None (unset, or "" from pyproject under flwr run): the schedule's own
    # (:data:`SCHEDULE_DEFAULTS`), once the schedule is resolved (_schedule_defaults)
    encoder_rounds: int | None = Field(None, ge=0)
    classifier_rounds: int | None = Field(None, ge=1)
    local_epochs: int | None = Field(None, ge=1)
    server_optimizer: Literal["fedavg", "fedavgm", "fedadam", "fedyogi"] = Field(
        "fedavg",
        description="how the server applies the clients' averaged update (Flower's "
        "FedAvg, FedAvgM, FedAdam, FedYogi); the adaptive ones help label-skewed clients",
    )
    server_lr: float | None = Field(
        None,
        gt=0,
        description="server learning rate (FedAvgM: 1.0, FedAdam/FedYogi eta: 0.1 when unset)",
    )
    round_strategy: str = Field(
        "",
        description="the Flower strategy that drives the encoder and classifier rounds "
        "(FedAvg schedule): " + ROUND_STRATEGY_HELP + "; empty: server-optimizer's",
    )
    round_strategy_args: dict[str, Any] = Field(
        default_factory=dict, description=ROUND_STRATEGY_ARGS_HELP
    )
    batch_size: int = Field(0, ge=0, description="0: full batch (edge level); node level: 256")
    lr: float = Field(0.01, gt=0)
    batch_norm: bool = Field(
        False,
        description="edge level: the reference code's batch norms (hidden layers, after "
        "the normalized encoder output and after the normalized combined hops); training uses "
        "each client's own statistics, evaluation the running statistics averaged over the "
        "clients weighted by training nodes. Off by default: measured on Wisconsin87 (one "
        "client, and without noise too) it costs 4-5 points, most of it the encoder's output norm (see "
        "docs/results/accuracy.md, GAP)",
    )
    schedule: Literal["auto", "fedavg", "fedsgd"] = Field(
        "auto",
        description="fedavg: local-epochs of Adam on each client per round, weights "
        "averaged (server-optimizer); fedsgd (edge level): each round a client sends the "
        "full-batch gradient of its mean training loss, the server averages them weighted by "
        "training nodes and takes one Adam step with lr (the centralized trajectory; a round "
        "is an epoch); auto (default): fedsgd at edge level (the measured best for clients "
        "holding communities, docs/results/accuracy.md, GAP) unless a FedAvg key is set (local-epochs "
        "other than 1, batch-size, server-optimizer, round-strategy), else fedavg. Unset rounds "
        "follow the "
        "schedule: fedsgd 100 + 100 rounds of 1 epoch, fedavg 10 + 10 rounds of 10 epochs",
    )
    max_degree: int = Field(100, ge=1, description="node level: out-degree bound D")
    max_grad_norm: float = Field(1.0, gt=0)
    cross_client_edges: bool = True
    secure_aggregation: bool = Field(
        False,
        description="pairwise-masked secure aggregation (SecAgg without dropout "
        "recovery, fedgraph.secure_aggregation): the server learns only the sum of the clients' "
        "rows for a node; every client adds noise std sigma_max / sqrt(n - 1) to its remote "
        "rows instead of its own sigma (one client, or cross-client-edges false: no remote row, "
        "nothing to mask: runs as without)",
    )
    accountant: Literal["analytic", "prv", "pld", "rdp"] = Field(
        "analytic", description="analytic: exact for Gaussian-only (edge level), else prv"
    )
    inference: Literal["transductive", "inductive"] = Field(
        "transductive",
        description="inductive: train on the train/val graph, evaluate the test "
        "nodes on the held-out test graph (edges between the two dropped)",
    )
    output_dir: str = "outputs"
    run_name: str = ""
    timeout: float = Field(600.0, gt=0)

    _parse_eps = field_validator("client_epsilons", mode="before")(_client_epsilons)
    _per_client = field_validator("client_epsilons")(_epsilons_per_client)

    @field_validator("hops")
    @classmethod
    def _hops(cls, v: int, info) -> int:
        if v == 0 and info.data.get("variant", "gap") != "mlp":
            raise ValueError(
                "must be >= 1 for variant 'gap' / 'gap-inf' (PMA aggregates K >= 1 "
                "hops); for the model without edges set variant = 'mlp'"
            )
        return v

    _check_delta = field_validator("delta", mode="after")(_delta)

    @field_validator("secure_aggregation", mode="after")
    @classmethod
    def _secure_aggregation_needs_remote_rows(cls, v: bool, info) -> bool:
        if v and (
            not info.data.get("cross_client_edges", True) or info.data.get("variant") == "mlp"
        ):
            raise ValueError(
                "has no effect without cross-client edges (cross-client-edges = "
                "true, variant gap or gap-inf): no row leaves a client"
            )
        return v

    @field_validator("server_lr", mode="before")
    @classmethod
    def _server_lr(cls, v: Any) -> Any:
        if isinstance(v, str) and not v.strip():
            return None
        try:
            ok = v is None or math.isfinite(float(v))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                "must be a finite number > 0 (allowed: (0, inf), or empty for Flower's default)"
            )
        return v

    @field_validator("server_lr", mode="after")
    @classmethod
    def _server_lr_needs_a_server_optimizer(cls, v: float | None, info) -> float | None:
        if v is not None and info.data.get("server_optimizer") == "fedavg":
            raise ValueError(
                "has no effect with server-optimizer 'fedavg' (plain averaging); "
                "set server-optimizer to 'fedavgm', 'fedadam' or 'fedyogi', or "
                "leave server-lr empty"
            )
        return v

    @field_validator("round_strategy", mode="after")
    @classmethod
    def _round_strategy(cls, v: str, info) -> str:
        v = _round_strategy_name(cls, v)
        if v and (
            info.data.get("server_optimizer", "fedavg") != "fedavg"
            or info.data.get("server_lr") is not None
        ):
            raise ValueError(
                "set either round-strategy or server-optimizer / server-lr, not "
                "both (e.g. round-strategy = 'fedadam' with round-strategy-args "
                "'{\"eta\": 0.03}')"
            )
        return v

    _parse_round_args = field_validator("round_strategy_args", mode="before")(_round_strategy_args)
    _check_round_args = field_validator("round_strategy_args", mode="after")(
        _round_strategy_args_need_a_strategy
    )

    @field_validator("batch_norm", mode="after")
    @classmethod
    def _batch_norm_edge_level_only(cls, v: bool, info) -> bool:
        if v and info.data.get("level") == "node":
            raise ValueError(
                "batch norm mixes the examples of a batch, which DP-SGD (node "
                "level) cannot clip per example; allowed at node level: false"
            )
        return v

    @field_validator("encoder_rounds", "classifier_rounds", "local_epochs", mode="before")
    @classmethod
    def _unset_rounds(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("schedule", mode="after")
    @classmethod
    def _fedsgd_edge_level_only(cls, v: str, info) -> str:
        if v == "fedsgd" and info.data.get("level") == "node":
            raise ValueError(
                "fedsgd is edge level only (node level trains with DP-SGD on the "
                "clients: allowed there: fedavg)"
            )
        if v == "fedsgd" and info.data.get("server_optimizer", "fedavg") != "fedavg":
            raise ValueError(
                "fedsgd applies the averaged gradient with the server's own Adam "
                "(lr); set server-optimizer to 'fedavg' (allowed with fedsgd)"
            )
        if v == "fedsgd" and info.data.get("batch_size"):
            raise ValueError("fedsgd sends full-batch gradients; set batch-size to 0")
        if v == "fedsgd" and info.data.get("round_strategy"):
            raise ValueError(
                "fedsgd's rounds are the server's own Adam on the clients' "
                "gradients; round-strategy drives FedAvg rounds (allowed with "
                "round-strategy: fedavg, auto)"
            )
        return v

    @model_validator(mode="after")
    def _schedule_defaults(self):
        """Resolve ``schedule = "auto"`` (see its description), then fill the unset rounds."""
        if self.schedule == "auto":
            fedavg_keys = (
                self.local_epochs not in (None, 1)
                or self.batch_size
                or self.server_optimizer != "fedavg"
                or self.round_strategy
            )
            # the model is frozen: set during validation, before anyone holds it
            object.__setattr__(
                self, "schedule", "fedsgd" if self.level == "edge" and not fedavg_keys else "fedavg"
            )
        for key, value in SCHEDULE_DEFAULTS[self.schedule].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        return self

    def client_epsilon(self, partition_id: int) -> float:
        return self.client_epsilons[partition_id % len(self.client_epsilons)]

    @property
    def dpsgd_batch_size(self) -> int:
        return self.batch_size or 256
