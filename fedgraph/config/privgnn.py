"""PrivGNN's run config (:class:`PrivGNNConfig`)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from .base import DataConfig, _client_epsilons, _delta, _epsilons_per_client


class PrivGNNConfig(DataConfig):
    """PrivGNN (Olatunji et al., TMLR 2023, arXiv 2109.08907) federated: the server holds the
    public graph, the clients hold the private graph (split by ``partitioner``) and answer the
    server's ``num_queries`` queries with Laplace-noised teacher posteriors.

    Data: :func:`fedgraph.methods.privgnn.privgnn_split` (``public_fraction`` of the nodes in
    the public graph, ``public_test_fraction`` of those are its labelled test nodes; ``split``
    is not used). Privacy per client: ``Q`` compositions of a Poisson-subsampled (rate
    ``gamma``) Laplace mechanism of scale ``2 / lam`` (sensitivity 2, noise multiplier
    ``1 / lam``); a client answers only as many queries as keep its epsilon at ``delta``
    (PLD) within its own target in ``client_epsilons`` (cycled over clients; ``inf``: no
    limit). ``num_neighbours`` must not exceed ``floor(gamma * n_c)`` for any client (preflight).
    ``answer_mode``: ``log-softmax-paper`` is the authors' rule and NOT DP (epsilon inf in the
    report); ``ensemble`` is PATE's GNMax with ``num_teachers`` disjoint teachers per client and
    per-client Gaussian noise ``sigma_votes`` (``sigma_threshold``, ``threshold``:
    Confident-GNMax), accounted as Gaussian events (multiplier sigma / sqrt 2 per copy).
    """

    method: Literal["privgnn"] = "privgnn"
    partitioner: str = "random"
    public_fraction: float = Field(
        0.5, gt=0, lt=1, description="share of nodes in the public graph"
    )
    public_test_fraction: float = Field(
        0.5, gt=0, lt=1, description="share of public nodes that are test nodes"
    )
    num_queries: int = Field(
        1000, ge=1, description="Q: public nodes the clients are asked to label"
    )
    query_policy: Literal["random", "entropy"] = Field(
        "random", description="entropy: half random, half where a first student is least certain"
    )
    lam: float = Field(0.2, gt=0, description="Laplace parameter lambda: noise scale 2 / lambda")
    gamma: float = Field(0.3, gt=0, le=1, description="Poisson sampling rate of private nodes")
    num_neighbours: int = Field(
        30,
        ge=1,
        description="K: sampled private nodes per teacher (at most floor(gamma * n) of the smallest client)",
    )
    answer_mode: Literal["posterior", "vote", "log-softmax-paper", "ensemble"] = Field(
        "posterior",
        description="log-softmax-paper: the authors' rule, NOT DP (report: no "
        "finite epsilon); ensemble: PATE's (Confident-)GNMax",
    )
    num_teachers: int = Field(10, ge=1, description="ensemble: disjoint teachers per client")
    sigma_votes: float | None = Field(
        None,
        ge=1,
        description="ensemble: std of each client's "
        "Gaussian noise on its vote histogram (GNMax copy; with secure "
        "aggregation, of the summed noise); at least 1 vote (below, the "
        "histogram is released almost exactly and the PLD cross-check "
        'needs gigabytes); unset (""): calibrated by the strategy so '
        "that num-queries histograms spend the smallest client-epsilons "
        "at delta",
    )
    sigma_threshold: float = Field(
        0.0,
        ge=0,
        description="ensemble: std of each client's "
        "threshold copy (with secure aggregation, of the sum); 0: no "
        "threshold check, else at least 1",
    )
    threshold: float = Field(
        0.0,
        ge=0,
        description="ensemble: Confident-GNMax threshold on "
        "the summed votes (needs sigma-threshold > 0); 0: answer all",
    )
    keep_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="ensemble: keep this share of the "
        "answered queries with the widest noisy top-2 margin (free)",
    )
    secure_aggregation: bool = Field(
        False,
        description="ensemble: pairwise-masked secure aggregation of the clients' "
        "histograms (fedgraph.secure_aggregation, no dropout recovery): the server learns only "
        "their sum; sigma-votes / sigma-threshold are then the std of the summed noise, each "
        "client adding a 1/n share of the variance; every client answers the same queries "
        "(the smallest client limit)",
    )
    client_epsilons: list[float] = Field(default_factory=lambda: [10.0])
    delta: float = Field(1e-4)
    hops: int = Field(2, ge=1, le=10, description="public neighbourhood of a query (l hops)")
    neighbourhood_size: int = Field(50, ge=1, description="cap on a query's public neighbourhood")
    projection_dim: int = Field(0, ge=0, description="0: raw features; d: public PCA for teachers")
    teacher_hidden: int = Field(64, ge=1)
    teacher_epochs: int = Field(200, ge=1)
    teacher_batch_size: int = Field(64, ge=1, description="teachers trained together (speed only)")
    hidden: int = Field(64, ge=1, description="student hidden size")
    student_propagation: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="label-propagation alpha smoothing the student over the public graph; 0: off",
    )
    student_holdout: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="share of the pseudo-labelled "
        "queries held out to select the student's epoch; 0: train "
        "on all, keep the epoch that fits them best",
    )
    dropout: float = Field(0.5, ge=0, lt=1)
    epochs: int = Field(200, ge=1, description="student epochs")
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    output_dir: str = "outputs"
    run_name: str = ""
    timeout: float = Field(600.0, gt=0)

    _parse_eps = field_validator("client_epsilons", mode="before")(_client_epsilons)
    _per_client = field_validator("client_epsilons")(_epsilons_per_client)
    _check_delta = field_validator("delta", mode="after")(_delta)

    @field_validator("secure_aggregation", mode="after")
    @classmethod
    def _secure_aggregation_needs_ensemble(cls, v: bool, info) -> bool:
        if v and info.data.get("answer_mode") != "ensemble":
            raise ValueError(
                "secure aggregation of PrivGNN answers is built for answer-mode = "
                "ensemble only (allowed: secure-aggregation = false, or "
                "answer-mode = 'ensemble')"
            )
        if v and info.data.get("num_clients", 2) < 2:
            raise ValueError(
                "needs num-clients >= 2 (with one client the sum is its own "
                "release: nothing to mask)"
            )
        return v

    @field_validator("sigma_votes", mode="before")
    @classmethod
    def _sigma_votes_unset(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("sigma_threshold", mode="after")
    @classmethod
    def _sigma_threshold_off_or_at_least_one(cls, v: float) -> float:
        if 0 < v < 1 or not math.isfinite(v):
            raise ValueError(f"must be 0 (no threshold check) or a finite std >= 1 vote (got {v})")
        return v

    @field_validator("threshold", mode="after")
    @classmethod
    def _threshold_needs_noise(cls, v: float, info) -> float:
        if v > 0 and not info.data.get("sigma_threshold"):
            raise ValueError(
                f"threshold {v} needs sigma-threshold > 0 (the threshold check's "
                "own noise); allowed: threshold = 0, or sigma-threshold > 0"
            )
        return v

    @field_validator("lam", "gamma", "lr", "delta", "alpha", mode="after")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be a finite number (allowed: (0, inf)), got {v}")
        return v

    def client_epsilon(self, partition_id: int) -> float:
        """Epsilon target of client ``partition_id`` (``inf``: no limit)."""
        return self.client_epsilons[partition_id % len(self.client_epsilons)]
