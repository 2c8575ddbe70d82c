"""Validated run configuration (pydantic), one model per method, shared pieces reused.

Flower's run config is flat (``key = value`` with ``-`` in keys); :func:`parse_run_config`
maps it onto these models and turns validation errors into :class:`ConfigError` messages that
name the key and the allowed values.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError  # noqa: F401 (re-exported: its home for users)
from .limits import ESW_MAX_EPSILON, PPM_LEVEL_SCAN_MAX, ppm_level_scan_limit  # noqa: F401
from .secret import RETIRED_NOISE_SOURCES


def _floats(value: Any) -> list[float]:
    """Parse ``"1,2,4"`` (or a number, or a list) into floats; an empty entry is an error."""
    if isinstance(value, str):
        if not value.strip():
            return []
        value = value.replace(";", ",").split(",")
        if any(not v.strip() for v in value):
            raise ValueError(f"empty entry in the list {','.join(value)!r}")
    if isinstance(value, (int, float)):
        value = [value]
    out = []
    for v in value:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            raise ValueError(f"{v!r} is not a number (allowed: numbers separated by commas, "
                             "e.g. '1,2,4'; 'inf' for no limit)") from None
    return out


def _client_epsilons(cls, v: Any) -> list[float]:
    """``client-epsilons``: one epsilon target per client (cycled), each in (0, inf]."""
    vals = _floats(v)
    if not vals or any(not (e > 0) or math.isnan(e) for e in vals):
        raise ValueError(f"every epsilon must be > 0 (allowed: (0, inf]), got {v!r}")
    return vals


def _epsilons_per_client(cls, v: list[float], info) -> list[float]:
    """``client-epsilons`` after parsing: at most one per client (a shorter list is cycled; a
    longer one would leave values unused without a word)."""
    n = info.data.get("num_clients")
    if n is not None and len(v) > n:
        raise ValueError(f"{len(v)} values for {n} client(s): give at most one per client "
                         "(a shorter list is cycled over the clients)")
    return v


def _delta(cls, v: float) -> float:
    """``delta``: in ``[1e-12, 1)`` (:data:`fedgraph.accounting.DELTA_FLOOR`: below it the
    accountants are not reliable)."""
    from .accounting.accountants import check_delta

    return check_delta(v, "delta")


def _check_extension(kind: str, spec: str) -> str:
    """``spec`` as the registry of ``kind`` checks it (:meth:`~fedgraph.registry.Registry.
    check_name`); a built-in or unknown name is answered by :mod:`fedgraph.catalog` without
    importing the registry's module (torch), so that ``fedgraph run`` reports a config error
    in well under a second."""
    import importlib

    from . import catalog

    name = catalog.check_name(kind, spec)
    if name is not None:
        return name
    k = catalog.KINDS[kind]  # registered or "package.module:attribute"
    return getattr(importlib.import_module(k.module), k.attr).check_name(spec)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Base):
    """Which graph, how it is split into train/val/test, and how it is spread over clients."""

    dataset: str = Field("cora", description="name understood by fedgraph.data.load_dataset")
    data_root: str = Field("", description="dataset root; empty: $FEDGRAPH_DATA or the cache")
    split: Literal["random-50-25-25", "random-75-10-15", "planetoid"] = "random-50-25-25"
    partitioner: str = Field("users", description="random, louvain, label-skew, users")
    num_clients: int = Field(10, ge=1, le=100_000)
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration for label-skew")
    min_class_size: int = Field(1000, ge=1, description="facebook100: smallest class kept")
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when the process has a GPU (Ray's share), else cpu")
    noise_source: Literal["secure", "secret", "mt19937"] = Field(
        "secure", description="where a client's randomness comes from (fedgraph.randomness): "
        "secure (default: an AES-256-CTR CSPRNG keyed from fresh OS entropy, not reproducible), "
        "secret (the same CSPRNG keyed from each client's own secret, reproducible: node "
        "config noise-secret or $FEDGRAPH_NOISE_SECRET, never the run config), mt19937 "
        "(explicit opt-in, NOT a CSPRNG: PyTorch's MT19937 from OS entropy; a server can "
        "recover its state from the pure-noise values the clients release); 'os' (the old "
        "default, MT19937) is refused")

    @field_validator("noise_source", mode="before")
    @classmethod
    def _retired_noise_source(cls, v: Any) -> Any:
        if isinstance(v, str) and v in RETIRED_NOISE_SOURCES:
            raise ValueError(RETIRED_NOISE_SOURCES[v])
        return v

    @field_validator("dataset")
    @classmethod
    def _known(cls, v: str) -> str:
        from . import catalog  # built-in names without importing torch

        spec = catalog.dataset_spec(v)
        if spec is None:
            from .data import dataset_spec  # registered or "package.module:loader"

            spec = dataset_spec(v)
        return spec

    @field_validator("partitioner")
    @classmethod
    def _partitioner(cls, v: str) -> str:
        return _check_extension("partitioner", v)

    @field_validator("num_clients")
    @classmethod
    def _at_most_one_client_per_node(cls, v: int, info) -> int:
        """At once where the dataset's size is known without loading it (the preflight checks
        every dataset, :func:`fedgraph.federation.preflight`, with the same message)."""
        from . import catalog

        n = catalog.known_num_nodes(info.data["dataset"]) if "dataset" in info.data else None
        if n is not None and v > n:
            raise ValueError(f"must lie in [1, {n}] for dataset {info.data['dataset']!r} (one "
                             f"node at least per client), got {v}")
        return v

    @field_validator("run_name", check_fields=False)
    @classmethod
    def _plain_file_name(cls, v: str) -> str:
        """The report is ``<output-dir>/<run-name>.json``: a name, never a path out of it."""
        if v and (v in (".", "..") or "/" in v or "\\" in v or "\0" in v):
            raise ValueError(f"must be a plain file name without '/', '\\' or '..' (got {v!r}); "
                             "choose the folder with output-dir")
        return v


class PPGNNConfig(DataConfig):
    """PPGNN (personalized LDP on features, PPGNN paper) and its baselines BASE and LPGNN.

    ``budgets`` is the budget set E (total epsilon-LDP per user, per level), ``level_shares``
    the share of users at each level. ``mechanism`` ``ppm`` uses the levels; the uniform
    baselines (``multi-bit``, ``one-bit``, ``laplace``, ``gaussian``) give every user
    ``epsilon`` (default: the smallest level, as LPGNN would have to).
    """

    method: Literal["ppgnn"] = "ppgnn"
    budgets: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0])
    level_shares: list[float] = Field(default_factory=list, description="empty: equal shares")
    mechanism: str = "ppm"
    gamma: float = Field(0.1, gt=0, lt=1, description="share of a user's budget spent on its level")
    rescale: Literal["posterior", "released"] = Field(
        "posterior", description="PPM: server rescaling by level posterior or released level")
    epsilon: Optional[float] = Field(None, description="uniform mechanisms: epsilon per user")
    delta: float = Field(1e-5, description="gaussian mechanism only")
    label_epsilon: float = Field(0.0, ge=0, description="> 0: randomized response on labels")
    denoiser: Literal["flexprop", "kprop", "none"] = "flexprop"
    steps: list[int] = Field(default_factory=lambda: [16],
                             description="propagation steps K; several: chosen on validation")
    weights: Literal["level", "inverse-variance", "posterior"] = Field(
        "posterior", description="FlexProp source weights: posterior (default; expected inverse "
        "variance given the ESW-decoded level), level (the paper's Eq. 12), inverse-variance")
    self_loops: bool = Field(False, description="propagate over each user's neighbours and "
                             "itself (default: neighbours only, PPGNN Eq. 12 and LPGNN's code)")
    standardize: bool = Field(True, description="standardize features after propagation")
    backbone: Literal["gcn", "sage", "gat"] = "sage"
    hidden: int = Field(16, ge=1)
    # Training defaults chosen on issue 18's K sweep (bench/ppgnn_table.py --steps, README
    # Results): the LPGNN reference code's values for multi-bit features (sisaman/LPGNN
    # hparams/lwd.csv: lr 0.01, weight decay 0.01, dropout 0.75), with 300 epochs instead of
    # its 500 (500 measured within noise on Cora, paired +0.0 / +0.6 / +0.3 points at
    # K = 0 / 4 / 16, at 5/3 of the cost). Weight decay 0.05 measured 0.5 validation points
    # better on Cora and CiteSeer; stronger regularization costs Facebook page-page at large K.
    dropout: float = Field(0.75, ge=0, lt=1)
    epochs: int = Field(300, ge=1)
    patience: int = Field(0, ge=0, description="early stopping: stop after this many epochs "
                          "without a better validation accuracy (0: run every epoch)")
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    output_dir: str = Field("outputs", description="folder for the JSON report")
    run_name: str = ""
    timeout: float = Field(600.0, gt=0, description="seconds to wait for clients per phase")

    @field_validator("steps", mode="before")
    @classmethod
    def _parse_steps(cls, v: Any) -> list[int]:
        vals = _floats(v)
        if not vals or any(k != int(k) or not 0 <= k <= 256 for k in vals):
            raise ValueError(f"steps must be integers in [0, 256], got {v!r}")
        return [int(k) for k in vals]

    @field_validator("budgets", "level_shares", mode="before")
    @classmethod
    def _parse_list(cls, v: Any) -> list[float]:
        return _floats(v)

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        if not v or any(not math.isfinite(b) or b <= 0 for b in v):
            raise ValueError(f"every epsilon must be finite and > 0 (allowed: (0, inf)), got {v}")
        if any(b2 <= b1 for b1, b2 in zip(v, v[1:])):
            raise ValueError(f"levels must be strictly increasing, got {v}")
        return v

    @field_validator("epsilon", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: Optional[float], info) -> Optional[float]:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"epsilon must be finite and > 0 (allowed: (0, inf)), got {v}")
        budgets, mechanism = info.data.get("budgets"), info.data.get("mechanism")
        if v is not None and mechanism == "ppm":
            raise ValueError(
                f"has no effect with mechanism 'ppm' (each level spends its budget from "
                f"budgets): leave epsilon empty and set budgets (e.g. budgets = \"{v:g}\" for "
                f"everyone at {v:g}), or choose a uniform mechanism (multi-bit, one-bit, "
                f"laplace, gaussian)")
        if v is not None and budgets and mechanism != "ppm" and v > min(budgets) * (1 + 1e-9):
            # a uniform mechanism gives every user this epsilon: the lower levels would
            # overspend (fedgraph.federation.check_feature_budgets checks any mechanism)
            raise ValueError(
                f"{v:g} is above the smallest level's budget {min(budgets):g} (budgets "
                f"{', '.join(f'{b:g}' for b in budgets)}): mechanism {mechanism!r} gives every "
                f"user the same epsilon (allowed: (0, {min(budgets):g}]); for everyone at "
                f"{v:g}, set budgets = \"{v:g}\"")
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
                    f"budgets below {ESW_MAX_EPSILON / share:g}")
            limit = ppm_level_scan_limit(share)
            if max(self.budgets) >= limit:
                raise ValueError(
                    f"budgets: {max(self.budgets):g} is too large for PPM's level analysis over "
                    f"every feature count (allowed "
                    + (f"with gamma = {self.gamma:g}" if share else "with one level")
                    + f": budgets below {limit:g})")
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
        "undirected", description="edge level: the protected unit. undirected (default): one "
        "edge of the undirected graph, stored as two directed halves, sensitivity sqrt 2; "
        "directed: one half (GAP's paper), sensitivity 1")
    client_epsilons: list[float] = Field(default_factory=lambda: [4.0])
    delta: float = Field(1e-7)
    hops: int = Field(2, ge=0, le=10)
    encoder_dim: int = Field(16, ge=1)
    hidden: int = Field(16, ge=1)
    combine: Literal["cat", "sum", "attention"] = "cat"
    # None (unset, or "" from pyproject under flwr run): the schedule's own
    # (:data:`SCHEDULE_DEFAULTS`), once the schedule is resolved (_schedule_defaults)
    encoder_rounds: Optional[int] = Field(None, ge=0)
    classifier_rounds: Optional[int] = Field(None, ge=1)
    local_epochs: Optional[int] = Field(None, ge=1)
    server_optimizer: Literal["fedavg", "fedavgm", "fedadam", "fedyogi"] = Field(
        "fedavg", description="how the server applies the clients' averaged update (Flower's "
        "FedAvg, FedAvgM, FedAdam, FedYogi); the adaptive ones help label-skewed clients")
    server_lr: Optional[float] = Field(None, gt=0, description="server learning rate (FedAvgM: "
                                       "1.0, FedAdam/FedYogi eta: 0.1 when unset)")
    batch_size: int = Field(0, ge=0, description="0: full batch (edge level); node level: 256")
    lr: float = Field(0.01, gt=0)
    batch_norm: bool = Field(
        False, description="edge level: the reference code's batch norms (hidden layers, after "
        "the normalized encoder output and after the normalized combined hops); training uses "
        "each client's own statistics, evaluation the running statistics averaged over the "
        "clients weighted by training nodes. Off by default: measured on Wisconsin87 (one "
        "client, and without noise too) it costs 4-5 points, most of it the encoder's output norm (see "
        "README, GAP results)")
    schedule: Literal["auto", "fedavg", "fedsgd"] = Field(
        "auto", description="fedavg: local-epochs of Adam on each client per round, weights "
        "averaged (server-optimizer); fedsgd (edge level): each round a client sends the "
        "full-batch gradient of its mean training loss, the server averages them weighted by "
        "training nodes and takes one Adam step with lr (the centralized trajectory; a round "
        "is an epoch); auto (default): fedsgd at edge level (the measured best for clients "
        "holding communities, README GAP results) unless a FedAvg key is set (local-epochs "
        "other than 1, batch-size, server-optimizer), else fedavg. Unset rounds follow the "
        "schedule: fedsgd 100 + 100 rounds of 1 epoch, fedavg 10 + 10 rounds of 10 epochs")
    max_degree: int = Field(100, ge=1, description="node level: out-degree bound D")
    max_grad_norm: float = Field(1.0, gt=0)
    cross_client_edges: bool = True
    secure_aggregation: bool = Field(
        False, description="pairwise-masked secure aggregation (SecAgg without dropout "
        "recovery, fedgraph.secure_aggregation): the server learns only the sum of the clients' "
        "rows for a node; every client adds noise std sigma_max / sqrt(n - 1) to its remote "
        "rows instead of its own sigma (one client, or cross-client-edges false: no remote row, "
        "nothing to mask: runs as without)")
    accountant: Literal["analytic", "prv", "pld", "rdp"] = Field(
        "analytic", description="analytic: exact for Gaussian-only (edge level), else prv")
    inference: Literal["transductive", "inductive"] = Field(
        "transductive", description="inductive: train on the train/val graph, evaluate the test "
        "nodes on the held-out test graph (edges between the two dropped)")
    output_dir: str = "outputs"
    run_name: str = ""
    timeout: float = Field(600.0, gt=0)

    _parse_eps = field_validator("client_epsilons", mode="before")(_client_epsilons)
    _per_client = field_validator("client_epsilons")(_epsilons_per_client)

    @field_validator("hops")
    @classmethod
    def _hops(cls, v: int, info) -> int:
        if v == 0 and info.data.get("variant", "gap") != "mlp":
            raise ValueError("must be >= 1 for variant 'gap' / 'gap-inf' (PMA aggregates K >= 1 "
                             "hops); for the model without edges set variant = 'mlp'")
        return v
    _check_delta = field_validator("delta", mode="after")(_delta)

    @field_validator("secure_aggregation", mode="after")
    @classmethod
    def _secure_aggregation_needs_remote_rows(cls, v: bool, info) -> bool:
        if v and (not info.data.get("cross_client_edges", True) or info.data.get("variant") == "mlp"):
            raise ValueError("has no effect without cross-client edges (cross-client-edges = "
                             "true, variant gap or gap-inf): no row leaves a client")
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
            raise ValueError("must be a finite number > 0 (allowed: (0, inf), or empty for "
                             "Flower's default)")
        return v

    @field_validator("server_lr", mode="after")
    @classmethod
    def _server_lr_needs_a_server_optimizer(cls, v: Optional[float], info) -> Optional[float]:
        if v is not None and info.data.get("server_optimizer") == "fedavg":
            raise ValueError("has no effect with server-optimizer 'fedavg' (plain averaging); "
                             "set server-optimizer to 'fedavgm', 'fedadam' or 'fedyogi', or "
                             "leave server-lr empty")
        return v

    @field_validator("batch_norm", mode="after")
    @classmethod
    def _batch_norm_edge_level_only(cls, v: bool, info) -> bool:
        if v and info.data.get("level") == "node":
            raise ValueError("batch norm mixes the examples of a batch, which DP-SGD (node "
                             "level) cannot clip per example; allowed at node level: false")
        return v

    @field_validator("encoder_rounds", "classifier_rounds", "local_epochs", mode="before")
    @classmethod
    def _unset_rounds(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("schedule", mode="after")
    @classmethod
    def _fedsgd_edge_level_only(cls, v: str, info) -> str:
        if v == "fedsgd" and info.data.get("level") == "node":
            raise ValueError("fedsgd is edge level only (node level trains with DP-SGD on the "
                             "clients: allowed there: fedavg)")
        if v == "fedsgd" and info.data.get("server_optimizer", "fedavg") != "fedavg":
            raise ValueError("fedsgd applies the averaged gradient with the server's own Adam "
                             "(lr); set server-optimizer to 'fedavg' (allowed with fedsgd)")
        if v == "fedsgd" and info.data.get("batch_size"):
            raise ValueError("fedsgd sends full-batch gradients; set batch-size to 0")
        return v

    @model_validator(mode="after")
    def _schedule_defaults(self):
        """Resolve ``schedule = "auto"`` (see its description), then fill the unset rounds."""
        if self.schedule == "auto":
            fedavg_keys = (self.local_epochs not in (None, 1) or self.batch_size
                           or self.server_optimizer != "fedavg")
            # the model is frozen: set during validation, before anyone holds it
            object.__setattr__(self, "schedule",
                               "fedsgd" if self.level == "edge" and not fedavg_keys else "fedavg")
        for key, value in SCHEDULE_DEFAULTS[self.schedule].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        return self

    def client_epsilon(self, partition_id: int) -> float:
        return self.client_epsilons[partition_id % len(self.client_epsilons)]

    @property
    def dpsgd_batch_size(self) -> int:
        return self.batch_size or 256


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
    public_fraction: float = Field(0.5, gt=0, lt=1, description="share of nodes in the public graph")
    public_test_fraction: float = Field(0.5, gt=0, lt=1, description="share of public nodes that are test nodes")
    num_queries: int = Field(1000, ge=1, description="Q: public nodes the clients are asked to label")
    query_policy: Literal["random", "entropy"] = Field(
        "random", description="entropy: half random, half where a first student is least certain")
    lam: float = Field(0.2, gt=0, description="Laplace parameter lambda: noise scale 2 / lambda")
    gamma: float = Field(0.3, gt=0, le=1, description="Poisson sampling rate of private nodes")
    num_neighbours: int = Field(30, ge=1, description="K: sampled private nodes per teacher (at most floor(gamma * n) of the smallest client)")
    answer_mode: Literal["posterior", "vote", "log-softmax-paper", "ensemble"] = Field(
        "posterior", description="log-softmax-paper: the authors' rule, NOT DP (report: no "
                                 "finite epsilon); ensemble: PATE's (Confident-)GNMax")
    num_teachers: int = Field(10, ge=1, description="ensemble: disjoint teachers per client")
    sigma_votes: float = Field(20.0, ge=1, description="ensemble: std of each client's "
                               "Gaussian noise on its vote histogram (GNMax copy; with secure "
                               "aggregation, of the summed noise); at least 1 vote (below, the "
                               "histogram is released almost exactly and the PLD cross-check "
                               "needs gigabytes)")
    sigma_threshold: float = Field(0.0, ge=0, description="ensemble: std of each client's "
                                   "threshold copy (with secure aggregation, of the sum); 0: no "
                                   "threshold check, else at least 1")
    threshold: float = Field(0.0, ge=0, description="ensemble: Confident-GNMax threshold on "
                             "the summed votes (needs sigma-threshold > 0); 0: answer all")
    keep_fraction: float = Field(1.0, gt=0, le=1, description="ensemble: keep this share of the "
                                 "answered queries with the widest noisy top-2 margin (free)")
    secure_aggregation: bool = Field(
        False, description="ensemble: pairwise-masked secure aggregation of the clients' "
        "histograms (fedgraph.secure_aggregation, no dropout recovery): the server learns only "
        "their sum; sigma-votes / sigma-threshold are then the std of the summed noise, each "
        "client adding a 1/n share of the variance; every client answers the same queries "
        "(the smallest client limit)")
    client_epsilons: list[float] = Field(default_factory=lambda: [10.0])
    delta: float = Field(1e-4)
    hops: int = Field(2, ge=1, le=10, description="public neighbourhood of a query (l hops)")
    neighbourhood_size: int = Field(50, ge=1, description="cap on a query's public neighbourhood")
    projection_dim: int = Field(0, ge=0, description="0: raw features; d: public PCA for teachers")
    teacher_hidden: int = Field(64, ge=1)
    teacher_epochs: int = Field(200, ge=1)
    teacher_batch_size: int = Field(64, ge=1, description="teachers trained together (speed only)")
    hidden: int = Field(64, ge=1, description="student hidden size")
    student_propagation: float = Field(0.0, ge=0, lt=1, description="label-propagation alpha "
                                       "smoothing the student over the public graph; 0: off")
    student_holdout: float = Field(0.2, ge=0, lt=1, description="share of the pseudo-labelled "
                                   "queries held out to select the student's epoch; 0: train "
                                   "on all, keep the epoch that fits them best")
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
            raise ValueError("secure aggregation of PrivGNN answers is built for answer-mode = "
                             "ensemble only (allowed: secure-aggregation = false, or "
                             "answer-mode = 'ensemble')")
        if v and info.data.get("num_clients", 2) < 2:
            raise ValueError("needs num-clients >= 2 (with one client the sum is its own "
                             "release: nothing to mask)")
        return v

    @field_validator("sigma_threshold", mode="after")
    @classmethod
    def _sigma_threshold_off_or_at_least_one(cls, v: float) -> float:
        if 0 < v < 1 or not math.isfinite(v):
            raise ValueError(f"must be 0 (no threshold check) or a finite std >= 1 vote "
                             f"(got {v})")
        return v

    @field_validator("threshold", mode="after")
    @classmethod
    def _threshold_needs_noise(cls, v: float, info) -> float:
        if v > 0 and not info.data.get("sigma_threshold"):
            raise ValueError(f"threshold {v} needs sigma-threshold > 0 (the threshold check's "
                             "own noise); allowed: threshold = 0, or sigma-threshold > 0")
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


class ProGAPConfig(DataConfig):
    """ProGAP (Sajadmanesh and Gatica-Perez, WSDM 2024) federated: ``depth + 1`` stages; stage
    0 trains on the features, each later stage on the private aggregation of the previous
    stage's embedding across clients (cross-client rows through the server, optionally
    securely aggregated) and everything aggregated before it (jumping knowledge). Edge level:
    FedSGD rounds (one full-batch epoch each, server Adam), best validation round per stage;
    node level: FedAvg rounds of DP-SGD, last round. ``client_epsilons``: each client's own
    target for the whole run (cycled); see :mod:`fedgraph.methods.progap.privacy`."""

    method: Literal["progap"] = "progap"
    split: Literal["random-50-25-25", "random-75-10-15", "planetoid"] = "random-75-10-15"
    partitioner: str = "louvain"
    level: Literal["edge", "node"] = "edge"
    edge_unit: Literal["directed", "undirected"] = Field(
        "undirected", description="edge level: undirected (default, sensitivity sqrt 2: both "
        "halves of a friendship), directed (the paper's and official code's unit, 1)")
    client_epsilons: list[float] = Field(default_factory=lambda: [4.0])
    delta: float = Field(1e-7)
    depth: int = Field(5, ge=0, le=10, description="K: aggregations (K + 1 stages)")
    hidden: int = Field(16, ge=1)
    base_layers: int = Field(1, ge=1, le=4)
    head_layers: int = Field(1, ge=1, le=4)
    jk: Literal["cat", "sum", "mean", "max"] = "cat"
    batch_norm: bool = Field(False, description="edge level: the official code's batch norms "
                             "(after every base layer's SELU); training uses each client's "
                             "own statistics, evaluation the averaged running statistics")
    epochs: Optional[int] = Field(None, ge=1, description="rounds per stage (edge level: "
                                  "FedSGD epochs, default 100; node level: FedAvg rounds of "
                                  "local-epochs DP-SGD, default 5)")
    local_epochs: int = Field(1, ge=1, description="node level: DP-SGD epochs per round")
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(0, ge=0, description="node level: DP-SGD's expected batch "
                            "(0: 256); edge level full batch")
    max_degree: int = Field(100, ge=1, description="node level: out-degree bound D")
    max_grad_norm: float = Field(1.0, gt=0)
    cross_client_edges: bool = True
    secure_aggregation: bool = Field(False, description="pairwise-masked sums of the remote "
                                     "rows (as GAP's): each client adds sigma_max / sqrt(n-1)")
    accountant: Literal["analytic", "prv", "pld", "rdp"] = "analytic"
    output_dir: str = "outputs"
    run_name: str = ""
    timeout: float = Field(600.0, gt=0)

    _parse_eps = field_validator("client_epsilons", mode="before")(_client_epsilons)
    _per_client = field_validator("client_epsilons")(_epsilons_per_client)
    _check_delta = field_validator("delta", mode="after")(_delta)

    @field_validator("epochs", mode="before")
    @classmethod
    def _unset_epochs(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _level_checks(self):
        if self.batch_norm and self.level == "node":
            raise ValueError("batch-norm: mixes the examples of a batch, which DP-SGD (node "
                             "level) cannot clip per example; allowed at node level: false")
        if self.secure_aggregation and not (self.cross_client_edges and self.depth > 0):
            raise ValueError("secure-aggregation: has no effect without cross-client edges "
                             "and depth >= 1 (no row leaves a client)")
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


METHOD_CONFIGS: dict[str, type[_Base]] = {"ppgnn": PPGNNConfig, "gap": GAPConfig,
                                             "privgnn": PrivGNNConfig, "progap": ProGAPConfig}


def method_of(run_config: dict[str, Any]) -> str:
    """The method a flat run config selects: ``strategy`` if it names a method (``ppgnn``,
    ``gap``, ``privgnn``), else ``method`` (default ``ppgnn``); not validated here."""
    strategy = str(dict(run_config).get("strategy", "") or "")
    return strategy if strategy in METHOD_CONFIGS else str(dict(run_config).get("method", "ppgnn"))


def parse_run_config(run_config: dict[str, Any]) -> _Base:
    """Validate a flat Flower run config (keys with ``-`` or ``_``) into its method's model:
    ``strategy`` if it names a method (``ppgnn``, ``gap``, ``privgnn``), else ``method``.

    Raises:
        ConfigError: unknown method or key, or a value out of range; the message names the key.
    """
    cfg = {str(k).replace("-", "_"): v for k, v in dict(run_config).items() if k != "strategy"}
    cfg["method"] = method_of(run_config)
    bad = [k for k, v in cfg.items() if isinstance(v, float) and not math.isfinite(v)
           or isinstance(v, str) and v.strip().lower() in ("nan", "inf", "-inf", "+inf")]
    if bad and not all(k == "client_epsilons" and str(cfg[k]).strip().lower() == "inf" for k in bad):
        raise ConfigError("invalid run config:\n  " + "\n  ".join(
            f"{k.replace('_', '-')}: must be a finite number (got {cfg[k]!r})" for k in bad))
    method = cfg["method"]
    if method not in METHOD_CONFIGS:
        raise ConfigError(f"method: unknown {method!r}; allowed: {', '.join(METHOD_CONFIGS)}")
    model = METHOD_CONFIGS[method]
    # Keys declared for another method (pyproject declares them all) are not this method's.
    others = set().union(*(m.model_fields for m in METHOD_CONFIGS.values())) - set(model.model_fields)
    cfg = {k: v for k, v in cfg.items() if k not in others
           and not (k in METHOD_DEPENDENT and isinstance(v, str) and not v.strip())}
    try:
        return model(**cfg)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = "-".join(str(p) for p in e["loc"]).replace("_", "-") or "config"
            if key == "config":  # a check across fields: the field its message starts with
                field_ = e["msg"].removeprefix("Value error, ").split(":", 1)[0]
                if field_.replace("-", "_") in model.model_fields:
                    key = field_
            if e["type"] == "extra_forbidden":
                allowed = ", ".join(["strategy"] + [k.replace("_", "-") for k in model.model_fields])
                lines.append(f"{key}: unknown key; allowed keys: {allowed}")
            else:
                got = e.get("input")
                msg = e["msg"].removeprefix("Value error, ")
                msg = msg.removeprefix(f"{key}: ").removeprefix(f"{key.replace('-', '_')}: ")
                if "got" not in msg and not isinstance(got, dict):
                    msg += f" (got {got!r})"
                lines.append(f"{key}: {msg}")
        raise ConfigError("invalid run config:\n  " + "\n  ".join(lines)) from None


def _method_dependent() -> frozenset[str]:
    """Keys that several methods have with different defaults (e.g. ``delta``: PPGNN 1e-5, GAP
    1e-7, PrivGNN 1e-4). An empty value (``""``) of such a key means the run's method's own
    default: ``pyproject.toml`` declares them so, because ``flwr run`` passes every declared key
    to every run and a declared value would replace the other methods' defaults."""
    fields: dict[str, set] = {}
    for m in METHOD_CONFIGS.values():
        for name, f in m.model_fields.items():
            if name != "method":
                fields.setdefault(name, set()).add(repr(f.get_default(call_default_factory=True)))
    return frozenset(name for name, defaults in fields.items() if len(defaults) > 1)


METHOD_DEPENDENT = _method_dependent()


def keys_of_other_methods(run_config: dict[str, Any]) -> dict[str, list[str]]:
    """Keys of ``run_config`` that its method does not have but another method does, with the
    methods that have them: ``{"budgets": ["ppgnn"]}`` for a GAP run given ``budgets``.

    :func:`parse_run_config` ignores such keys, because ``flwr run`` passes every key
    ``pyproject.toml`` declares to every run; ``fedgraph run`` knows which keys the user set
    (preset and ``--set``) and rejects them with :func:`reject_keys_of_other_methods`.
    """
    method = method_of(run_config)
    if method not in METHOD_CONFIGS:
        return {}  # parse_run_config names the unknown method
    own = set(METHOD_CONFIGS[method].model_fields)
    found = {}
    for key in run_config:
        name = str(key).replace("-", "_")
        if key == "strategy" or name in own:
            continue
        owners = [m for m, model in METHOD_CONFIGS.items() if name in model.model_fields]
        if owners:
            found[str(key)] = owners
    return found


#: (key, value) -> {key set with it that would be ignored: the value it would have to be}
IGNORED_WITH = {("schedule", "fedsgd"): {"local-epochs": 1}}


def reject_keys_of_other_methods(run_config: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming every key of ``run_config`` that belongs only to
    another method (see :func:`keys_of_other_methods`), or that another key's value makes
    ignored (:data:`IGNORED_WITH`, e.g. ``local-epochs`` other than 1 with ``schedule =
    "fedsgd"``): such a key would be ignored."""
    found = keys_of_other_methods(run_config)
    method = method_of(run_config)
    problems = [f"{k}: a key of method {' and '.join(repr(m) for m in owners)}, not of this "
                f"run's method {method!r} (it would be ignored); remove it or set method"
                for k, owners in found.items()]
    for (key, value), ignored in IGNORED_WITH.items():
        if run_config.get(key) == value:
            problems += [f"{k}: ignored with {key} = {value!r} (it would have to be {want!r}); "
                         f"set {k}={want!r} or another {key}"
                         for k, want in ignored.items() if k in run_config
                         and run_config[k] != want]
    if problems:
        raise ConfigError("invalid run config:\n  " + "\n  ".join(problems))


def check_output_dir(cfg) -> None:
    """Raise :class:`ConfigError` naming ``output-dir`` when reports cannot be written there:
    creates the folder and a temporary file in it (cheap, no torch; called before anything
    starts and again by the preflight).

    Raises:
        ConfigError: the folder cannot be created or written to.
    """
    import tempfile
    from pathlib import Path

    out = Path(getattr(cfg, "output_dir", "") or ".").expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ConfigError(f"output-dir: cannot write reports to {out}: {err}") from None


def check_data_root(cfg) -> None:
    """Raise :class:`ConfigError` naming ``data-root`` when it is set but not a folder (cheap:
    no torch; called before anything starts and again by the preflight).

    Raises:
        ConfigError: ``data-root`` is not an existing folder.
    """
    from pathlib import Path

    root = getattr(cfg, "data_root", "")
    if root and not Path(root).expanduser().is_dir():
        raise ConfigError(f"data-root: {root} is not a folder (give an existing data root, or "
                          "leave data-root empty for $FEDGRAPH_DATA, the user cache and the "
                          "bundled Cora)")
