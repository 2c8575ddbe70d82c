"""The messages between fedgraph's server and its clients, as data: for every message type the
ClientApp answers (:mod:`fedgraph.simulations.client_app`), the method it belongs to, the
records the server sends and the records the client replies with, each record's keys (or
tensor names) with their type, shape and meaning.

This is the protocol, not an implementation detail: ``tests/test_protocol.py`` checks that the
ClientApp routes exactly the types listed in :data:`MESSAGES` and, on real small runs of every
method, that every request carries only the records and keys listed here (optional ones may
be absent) and every reply exactly those listed. The reference page
``docs/reference/protocol.md`` is generated from it (``docs/_gen/refs.py``). What each reply
field means for privacy (noised and accounted, public, or an evaluation output):
``docs/explanations/client-releases.md``.

Conventions. A message carries a Flower ``RecordDict``: record name -> ``ConfigRecord``,
``ArrayRecord`` or ``MetricRecord``. A :class:`Field` of a ``ConfigRecord`` or ``MetricRecord``
has a Python value type (``str``, ``int``, ``float``, ``bool``, ``bytes``, ``list[bytes]``);
one of an ``ArrayRecord`` a dtype (alternatives separated by ``|``, ``any``: the model's own)
and a shape in symbols (``[n]``: the client's node count, ``N``: the node universe, ``m``: rows
released, ``e``/``h``: embedding widths, ``C``: classes, ``any``). A field name with ``*`` is a
pattern (:func:`fnmatch.fnmatch`): the entries of a model's state dict, a mechanism's report.
``json_keys``: a ``str`` value that holds a JSON object, and its keys.

Plain data (dataclasses, no torch, no Flower): importable anywhere, at the bottom of the
import-linter layers (``pyproject.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Field",
    "Record",
    "Content",
    "MessageType",
    "MESSAGES",
    "RECORD_KINDS",
    "message",
    "methods",
]

#: the Flower record kinds a message holds
RECORD_KINDS = ("ConfigRecord", "ArrayRecord", "MetricRecord")


@dataclass(frozen=True)
class Field:
    """One key of a record (a tensor name of an ``ArrayRecord``).

    Args:
        name: the key; with ``*`` a pattern (:func:`fnmatch.fnmatch`).
        type: value type (``ConfigRecord``/``MetricRecord``) or dtype (``ArrayRecord``;
            alternatives ``"float32 | int64"``, ``"any"``).
        meaning: what it holds (and, for a reply, what it is for privacy where it matters).
        shape: tensors only, in symbols (``[m, e]``; ``any``).
        required: present in every message of its type (else ``when`` says when).
        when: the condition of an optional field.
        json_keys: for a ``str`` holding a JSON object: its keys, as :class:`Field`.
    """

    name: str
    type: str
    meaning: str
    shape: str = ""
    required: bool = True
    when: str = ""
    json_keys: tuple[Field, ...] = ()


@dataclass(frozen=True)
class Record:
    """One record of a message: its name, kind (:data:`RECORD_KINDS`) and fields.

    Args:
        one_of: groups of field names of which exactly one is present (e.g. the dense or the
            sparse encoding of a tensor).
        names_within: an ``ArrayRecord`` of a reply whose tensor names are among those of the
            request's record of this name (a model's state dict, or part of it).
    """

    name: str
    kind: str
    meaning: str
    fields: tuple[Field, ...]
    required: bool = True
    when: str = ""
    one_of: tuple[tuple[str, ...], ...] = ()
    names_within: str = ""


@dataclass(frozen=True)
class Content:
    """What one side sends: its records; ``one_of``: groups of record names of which exactly
    one is present (e.g. the reply of each step of a two-step message)."""

    records: tuple[Record, ...]
    one_of: tuple[tuple[str, ...], ...] = ()

    def record(self, name: str) -> Record:
        """The record ``name``. Raises ``KeyError`` naming the records there are."""
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(f"no record {name!r}; records: {[r.name for r in self.records]}")


@dataclass(frozen=True)
class MessageType:
    """One message type: ``type`` as Flower routes it (``query.gap_pma``, ``train``), the
    ``method`` (run config ``method``) whose strategy sends it, what the client does
    (``summary``), who sends it (``sender``) and answers it (``handler``, a dotted path), the
    request (``sends``) and the reply (``replies``)."""

    type: str
    method: str
    summary: str
    sender: str
    handler: str
    sends: Content
    replies: Content


# ------------------------------------------------------------------ shared records and fields
def _json(key: str, meaning: str, /, **keys: str) -> Field:
    """A ``str`` field holding a JSON object with ``keys`` (name -> meaning)."""
    return Field(key, "str", meaning, json_keys=tuple(Field(k, "json", v) for k, v in keys.items()))


CONFIG = Record(
    "config",
    "ConfigRecord",
    "the run config (every message carries it)",
    (
        Field(
            "json",
            "str",
            "the run config as JSON (the method's config model's `model_dump()`: "
            "the run-config keys); the client parses and checks it "
            "(`fedgraph.config.parse_run_config`)",
        ),
    ),
)

SCHEMA = _json(
    "schema",
    "the dataset's public schema (`fedgraph.federation.SCHEMA_FIELDS`), "
    "identical on every client and on neighbouring graphs",
    name="dataset name",
    num_nodes="size of the public node universe N",
    num_features="feature count F",
    num_classes="class count C",
)

WORKER = _json(
    "worker",
    "where the client runs (`fedgraph.messaging.worker_info`): no data",
    partition_id="the client's partition id",
    hostname="its host",
    pid="its process id",
    device="`cpu` or `cuda`, as torch sees it",
    ray_node_id="the Ray node (null outside Ray)",
    ray_node_ip="the Ray node's address (null outside Ray)",
)

IDS = Record(
    "ids",
    "ArrayRecord",
    "the client's node ids: the public node directory",
    (Field("node_ids", "int64", "global ids of the client's nodes", "[n]"),),
)

PUBLIC_KEY = Record(
    "secagg",
    "ConfigRecord",
    "secure aggregation's key advertisement",
    (
        Field(
            "public-key",
            "bytes",
            "a fresh X25519 public key (32 bytes; the private key stays "
            "in the client's state, `<method>.secagg`)",
        ),
        Field("partition-id", "int", "the client's partition id, which the key is signed for"),
        Field(
            "signature",
            "bytes",
            "Ed25519 signature (64 bytes) of the public key under the "
            "client's identity key, provisioned outside the server (`fedgraph.identity`), bound "
            "to the run id, the method, the partition id and the label `query.<method>_keys` "
            "(`fedgraph.identity.key_statement`)",
        ),
    ),
)


def _secagg_keys(when: str) -> Record:
    return Record(
        "secagg",
        "ConfigRecord",
        "secure aggregation: every client's public key",
        (
            Field(
                "public-keys",
                "list[bytes]",
                "every client's X25519 public key, by client index (from the key exchange)",
            ),
            Field(
                "partition-ids",
                "list[int]",
                "the partition id each key is signed for, by client index",
            ),
            Field(
                "signatures",
                "list[bytes]",
                "each key's Ed25519 signature, by client "
                "index; the client verifies every one against its own directory of "
                "identity keys and refuses a list it cannot verify "
                "(`fedgraph.secure_aggregation.verify_key_list`)",
            ),
            Field("index", "int", "this client's index among them"),
        ),
        required=False,
        when=when,
    )


def _owner(when: str) -> Record:
    return Record(
        "owner",
        "ArrayRecord",
        "the node directory as client indices",
        (Field("owner", "int64", "the client index holding each node (public)", "[N]"),),
        required=False,
        when=when,
    )


def _incoming(width: str, meaning: str, **kw) -> Record:
    return Record(
        "incoming",
        "ArrayRecord",
        meaning,
        (
            Field(
                "ids", "int64", "sorted global ids of this client's nodes that received rows", "[m]"
            ),
            Field(
                "sums",
                "float32",
                "per node, the sum of the noisy rows the other clients "
                "released for it (`fedgraph.methods.gap.server.sum_partial_sums`; from masked "
                "rows under secure aggregation)",
                f"[m, {width}]",
            ),
        ),
        **kw,
    )


def _partial_sums(width: str, ledger: str, **kw) -> Record:
    return Record(
        "partial_sums",
        "ArrayRecord",
        "the client's noisy rows for every node held elsewhere",
        (
            Field(
                "ids",
                "int64",
                "every remote node of the graph (fixed by the directory, not by the edges)",
                "[m]",
            ),
            Field(
                "sums",
                "float32",
                f"noisy sums over the client's edges into them (ledger `{ledger}`)",
                f"[m, {width}]",
                required=False,
                when="without secure aggregation, or no remote row",
            ),
            Field(
                "masked",
                "int64",
                f"the noisy rows in fixed point, pairwise-masked "
                f"(`fedgraph.secure_aggregation.mask_rows`; ledger `{ledger}`)",
                f"[m, {width}]",
                required=False,
                when="secure aggregation, at least one remote row",
            ),
        ),
        one_of=(("sums", "masked"),),
        **kw,
    )


def _state_dict(name: str, model: str, meaning: str, **kw) -> Record:
    return Record(
        name,
        "ArrayRecord",
        meaning,
        (
            Field(
                "*",
                "any",
                f"the state dict of the {model}: every parameter and buffer",
                "any",
                required=False,
                when="empty: no weights yet",
            ),
        ),
        **kw,
    )


def _ledger(**kw) -> Record:
    """A reply's ``ledger``: the client's own ledger summary, charged before the reply left."""
    return Record(
        "ledger",
        "ConfigRecord",
        "the client's own ledger "
        "(`fedgraph.client_authority.ClientAuthority.summary`), public: a function of "
        "its plan and of the requests it answered; the report puts it beside the "
        "server's (`privacy.client_ledgers`)",
        (
            Field(
                "json",
                "str",
                "a JSON object: subject -> `epsilon` (at its own "
                "delta), `budget` (its own), `releases` (charged so far)",
            ),
        ),
        **kw,
    )


def _counts() -> Record:
    fields = []
    for split in ("train", "val", "test"):
        fields += [
            Field(f"{split}_correct", "int", f"correct predictions on its {split} nodes"),
            Field(f"{split}_total", "int", f"its {split} nodes"),
        ]
    return Record(
        "metrics",
        "MetricRecord",
        "evaluation outputs (the report's accuracy), outside the guarantee as in the papers",
        tuple(fields),
    )


def _trained(meaning: str) -> Record:
    """A training reply's ``arrays``: entries of the state dict the request sent."""
    return Record(
        "arrays",
        "ArrayRecord",
        meaning,
        (Field("*", "any", "entries of the state dict received", "any"),),
        names_within="arrays",
    )


_TRAIN_LOSS = Field(
    "train-loss", "float", "its mean training loss", required=False, when="edge level"
)


#: a FedSGD training reply's validation of the weights it received (StrictFedSGD)
_FUSED_VALIDATION = (
    Field(
        "val-accuracy",
        "float",
        "validation accuracy of the weights received",
        required=False,
        when="the config says `evaluate`",
    ),
    Field(
        "val-loss",
        "float",
        "their mean validation loss",
        required=False,
        when="the config says `evaluate`",
    ),
    Field(
        "val-examples",
        "int",
        "its validation nodes",
        required=False,
        when="the config says `evaluate`",
    ),
)

#: an evaluation round's reply (model selection, edge level)
_VALIDATION = Record(
    "metrics",
    "MetricRecord",
    "validation of the weights received",
    (
        Field("num-examples", "int", "its validation nodes"),
        Field("val-accuracy", "float", "validation accuracy"),
        Field("val-loss", "float", "mean validation loss"),
    ),
)


def _config_only() -> Content:
    return Content((CONFIG,))


_ROUTES = "fedgraph.simulations.routes"

# ------------------------------------------------------------------ PPGNN
_PPGNN = (
    MessageType(
        "query.ppgnn",
        "ppgnn",
        "draws its users' privacy levels, perturbs their features with the configured "
        "mechanism and releases the report (`fedgraph.methods.ppgnn.client.client_query`)",
        "fedgraph.strategies.ppgnn.PPGNNStrategy.run",
        f"{_ROUTES}.ppgnn.ppgnn_query",
        _config_only(),
        Content(
            (
                Record(
                    "report",
                    "ArrayRecord",
                    "what the client releases (global ids)",
                    (
                        Field("node_ids", "int64", "its users' ids", "[n]"),
                        Field(
                            "mech.*",
                            "any",
                            "the feature mechanism's report (noised, ledger per "
                            "level), e.g. PPM: `mech.released_level [n]`, `mech.row`, `mech.col`, "
                            "`mech.sign` (int8); multi-bit: `row`, `col`, `sign`, `num_rows [1]`; "
                            "one-bit: `sign [n, F]`; laplace/gaussian: `x [n, F]`",
                            "any",
                        ),
                        Field("labelled_ids", "int64", "its training and validation users", "[l]"),
                        Field(
                            "labels",
                            "int64",
                            "their labels (randomized response with `label-epsilon > 0`)",
                            "[l]",
                        ),
                        Field("is_train", "bool", "which of them are training users", "[l]"),
                        Field(
                            "edge_index",
                            "int32 | int64",
                            "its local and boundary edges, global ids "
                            "(int32 when every id fits: `fedgraph.methods.ppgnn.client.report_edges`)",
                            "[2, E]",
                        ),
                    ),
                ),
                Record("meta", "ConfigRecord", "public facts", (SCHEMA, WORKER)),
                _ledger(),
            )
        ),
    ),
    MessageType(
        "evaluate.ppgnn",
        "ppgnn",
        "counts the server's correct predictions for its users per split (test labels never "
        "leave it; `fedgraph.methods.ppgnn.client.count_correct`)",
        "fedgraph.strategies.ppgnn.PPGNNStrategy.run",
        f"{_ROUTES}.ppgnn.ppgnn_evaluate",
        Content(
            (
                CONFIG,
                Record(
                    "predictions",
                    "ArrayRecord",
                    "the server's predictions",
                    (
                        Field(
                            "node_ids", "int64", "this client's users' ids, as in its report", "[n]"
                        ),
                        Field("pred", "int64", "the predicted class of each", "[n]"),
                    ),
                ),
            )
        ),
        Content((_counts(), _ledger())),
    ),
)

# ------------------------------------------------------------------ GAP
_GAP_PLAN = _json(
    "plan",
    "the client's calibration for its own target "
    "(`fedgraph.methods.gap.privacy.PrivacyPlan.to_dict`), from the public config and the "
    "directory's counts",
    epsilon_target="its epsilon target",
    delta="its delta",
    noise_multiplier="the noise multiplier z",
    sensitivity="PMA's sensitivity per hop",
    sigma="PMA's noise std (z x sensitivity)",
    hops="K, the PMA hops",
    remote_norm="node level: remote rows' L2 clip (else null)",
    encoder_schedule="node level: DP-SGD's (sample rate, steps) of the encoder (else null)",
    classifier_schedule="node level: the classifier's (else null)",
    partition_id="its partition id",
    num_nodes="its node count n",
    num_train="its training-node count",
)

_PHASE = Field("phase", "str", "`gap.encoder` or `gap.classifier`: the model trained")
_SERVER_ROUND = Field(
    "server-round",
    "int",
    "the round, 1.. (the client refuses a train round "
    "outside its plan or not after its last: "
    "`fedgraph.methods.gap.client.admit_round`)",
)


def _round_config(*optional: Field) -> Record:
    return Record(
        "config",
        "ConfigRecord",
        "the run config and the round (the rounds' Flower "
        "strategy adds `server-round`, and its own keys)",
        (CONFIG.fields[0], _PHASE, _SERVER_ROUND, *optional),
    )


_PROXIMAL_MU = Field(
    "proximal-mu",
    "float",
    "FedProx's proximal weight, applied in `train`'s local steps (in "
    "`evaluate` unread: Flower's FedProx writes it into the config record GAP's strategy passes "
    "for both)",
    required=False,
    when='`round-strategy = "fedprox"`',
)
_TRAIN_CONFIG = _round_config(
    Field(
        "evaluate",
        "bool",
        "also validate the weights received (reply `val-*`)",
        required=False,
        when="FedSGD with model selection (edge level), from round 2 "
        "(`fedgraph.strategies.fedavg.StrictFedSGD`)",
    ),
    _PROXIMAL_MU,
)

_GAP = (
    MessageType(
        "query.gap_setup",
        "gap",
        "calibrates its noise for its own epsilon target and reports its plan and node ids "
        "(`fedgraph.methods.gap.client.setup`)",
        "fedgraph.strategies.gap.GAPStrategy.run",
        f"{_ROUTES}.gap.gap_setup",
        _config_only(),
        Content(
            (
                IDS,
                Record(
                    "meta", "ConfigRecord", "public facts and the plan", (SCHEMA, WORKER, _GAP_PLAN)
                ),
            )
        ),
    ),
    MessageType(
        "query.gap_keys",
        "gap",
        "generates an X25519 key pair, keeps the private key, sends "
        "the public one (`fedgraph.secure_aggregation.generate_key_pair`)",
        "fedgraph.strategies.gap.GAPStrategy.run (secure-aggregation = true, remote rows)",
        f"{_ROUTES}.common.advertise_key",
        _config_only(),
        Content((PUBLIC_KEY,)),
    ),
    MessageType(
        "train",
        "gap",
        "one round (`fedgraph.methods.gap.client.train`): FedAvg's local epochs (node level "
        "DP-SGD) or FedSGD's full-batch gradient, at the weights received",
        "the rounds' Flower strategy (`fedgraph.strategies.fedavg`) in "
        "fedgraph.strategies.gap.GAPStrategy.run",
        f"{_ROUTES}.gap.gap_train",
        Content(
            (
                _state_dict(
                    "arrays",
                    "phase's model (`fedgraph.methods.gap.models`)",
                    "the global weights (Flower's `arrays`)",
                ),
                _TRAIN_CONFIG,
            )
        ),
        Content(
            (
                _trained(
                    "FedAvg: the weights after the local epochs (node level noised by "
                    "DP-SGD, ledger `encoder dp-sgd` / `classifier dp-sgd`); FedSGD: the "
                    "gradient of the mean training loss per parameter and the batch norms' "
                    "running statistics"
                ),
                Record(
                    "metrics",
                    "MetricRecord",
                    "the round's metrics",
                    (
                        Field(
                            "num-examples",
                            "int",
                            "edge level: its training nodes (FedAvg's weight; "
                            "FedSGD's, at least 1); node level: the constant 1 (uniform weights)",
                        ),
                        _TRAIN_LOSS,
                        *_FUSED_VALIDATION,
                    ),
                ),
            )
        ),
    ),
    MessageType(
        "query.gap_pma",
        "gap",
        "one hop of PMA (GAP Alg. 1 lines 3-6; `fedgraph.methods.gap.client.pma_step`): "
        "finishes hop k-1 with the rows received, releases hop k's noisy rows for the nodes "
        "held elsewhere; hop K+1 only finishes",
        "fedgraph.strategies.gap.GAPStrategy._pma",
        f"{_ROUTES}.gap.gap_pma",
        Content(
            (
                CONFIG,
                Record(
                    "pma",
                    "ConfigRecord",
                    "the hop",
                    (
                        Field("hop", "int", "k in 1..K+1"),
                        Field(
                            "graph",
                            "str",
                            "`all`; inductive inference `train` (the training graph) "
                            "or `test` (the held-out graph)",
                        ),
                        Field(
                            "remote-sigma",
                            "float",
                            "the common noise std of remote rows (the client "
                            "checks it is not below its own, "
                            "`fedgraph.methods.gap.privacy.check_remote_sigma`)",
                            required=False,
                            when="`fedgraph.methods.gap.privacy.remote_noise` sets one (secure "
                            "aggregation; node level or undirected edges with different sigmas)",
                        ),
                        Field(
                            "remote-contributors",
                            "int",
                            "how many clients' rows are summed per "
                            "remote node: only cross-checked, the client counts them itself (its "
                            "verified peers under secure aggregation, else 1) and refuses a "
                            "different figure (`fedgraph.methods.gap.privacy.own_contributors`)",
                            required=False,
                            when="with `remote-sigma`",
                        ),
                        Field(
                            "object-store",
                            "bool",
                            "the server reads Ray's object store (a Ray "
                            "simulation): a client in a Ray worker may send `partial_sums` as a "
                            "reference into it, and `incoming` may be one "
                            "(`fedgraph.messaging.bulk_record`); false: ArrayRecords",
                        ),
                    ),
                ),
                _incoming(
                    "e",
                    "the sums of the rows other clients released for this client's "
                    "nodes at hop k-1 (empty at hop 1)",
                ),
                _state_dict(
                    "encoder",
                    "encoder (`fedgraph.methods.gap.models.build_encoder`)",
                    "the encoder's weights (read at hop 1)",
                ),
                _secagg_keys("secure aggregation"),
                _owner("secure aggregation"),
            )
        ),
        Content((_partial_sums("e", "pma"), _ledger())),
    ),
    MessageType(
        "evaluate",
        "gap",
        "validates the weights received (`fedgraph.methods.gap.client.validate`); edge level "
        "only: refused at node level (the validation labels are private)",
        "the rounds' Flower strategy (`fedgraph.strategies.fedavg`) with model selection, in "
        "fedgraph.strategies.gap.GAPStrategy.run",
        f"{_ROUTES}.gap.gap_evaluate_round",
        Content(
            (
                _state_dict("arrays", "phase's model", "the weights to validate"),
                _round_config(_PROXIMAL_MU),
            )
        ),
        Content((_VALIDATION,)),
    ),
    MessageType(
        "evaluate.gap",
        "gap",
        "counts the classifier's correct predictions per split "
        "(`fedgraph.methods.gap.client.final_counts`)",
        "fedgraph.strategies.gap.GAPStrategy.run",
        f"{_ROUTES}.gap.gap_evaluate",
        Content((CONFIG, _state_dict("arrays", "classifier", "the selected classifier"))),
        Content((_counts(), _ledger())),
    ),
)

# ------------------------------------------------------------------ PrivGNN
_PRIVGNN = (
    MessageType(
        "query.privgnn_keys",
        "privgnn",
        "generates an X25519 key pair, keeps the private key, sends the public one",
        "fedgraph.strategies.privgnn.PrivGNNStrategy.run (secure-aggregation = true)",
        f"{_ROUTES}.common.advertise_key",
        _config_only(),
        Content((PUBLIC_KEY,)),
    ),
    MessageType(
        "query.privgnn",
        "privgnn",
        "answers the first m queries its budget allows with noisy teacher posteriors, votes "
        "or vote histograms (paper Alg. 1 lines 3-7; "
        "`fedgraph.methods.privgnn.client.query_round`)",
        "fedgraph.strategies.privgnn.PrivGNNStrategy.run",
        f"{_ROUTES}.privgnn.privgnn_query",
        Content(
            (
                CONFIG,
                Record(
                    "queries",
                    "ArrayRecord",
                    "the queries' public neighbourhoods "
                    "(`fedgraph.methods.privgnn.queries.encode_queries`): public data",
                    (
                        Field(
                            "edge_index", "int64", "edges of the union of neighbourhoods", "[2, E]"
                        ),
                        Field("ptr", "int64", "neighbourhood q is nodes ptr[q]:ptr[q+1]", "[Q+1]"),
                        Field("center", "int64", "the query node of each neighbourhood", "[Q]"),
                        Field(
                            "x",
                            "float32",
                            "the neighbourhoods' features, dense",
                            "[M, F]",
                            required=False,
                            when="density >= SPARSE_DENSITY",
                        ),
                        Field(
                            "x_index",
                            "int64",
                            "sparse features: (row, column) of each non-zero",
                            "[2, nnz]",
                            required=False,
                            when="sparse",
                        ),
                        Field(
                            "x_value",
                            "float32",
                            "sparse features: the values",
                            "[nnz]",
                            required=False,
                            when="sparse",
                        ),
                        Field(
                            "x_shape",
                            "int64",
                            "sparse features: [M, F]",
                            "[2]",
                            required=False,
                            when="sparse",
                        ),
                        Field(
                            "proj_mean",
                            "float32",
                            "the public PCA map's mean",
                            "[F]",
                            required=False,
                            when="`projection-dim > 0`",
                        ),
                        Field(
                            "proj_components",
                            "float32",
                            "its components",
                            "[F, d]",
                            required=False,
                            when="`projection-dim > 0`",
                        ),
                    ),
                    one_of=(("x", "x_index"),),
                ),
                _secagg_keys("secure aggregation (ensemble mode)"),
            )
        ),
        Content(
            (
                Record(
                    "answers",
                    "ArrayRecord",
                    "the release",
                    (
                        Field(
                            "answers",
                            "float32 | int64",
                            "noisy answers to the first m queries "
                            "(ledger `noisy answers`); ensemble: noisy vote histograms (width 2C "
                            "with `sigma-threshold`; ledger `noisy vote histograms`), int64 ring "
                            "elements when masked (secure aggregation); m = 0: refused; W: C, or 2C",
                            "[m, W]",
                        ),
                    ),
                ),
                Record(
                    "meta",
                    "ConfigRecord",
                    "counts fixed by public parameters and the queries asked",
                    tuple(
                        Field(k, t, v)
                        for k, t, v in (
                            ("partition_id", "int", "its partition id"),
                            ("asked", "int", "queries asked this round"),
                            ("answered", "int", "answers released this round (m)"),
                            ("refused", "int", "asked - answered"),
                            ("limit", "int", "the answers its budget allows in all"),
                            ("answered_total", "int", "answers released so far"),
                            ("epsilon_target", "float", "its epsilon target (inf: none)"),
                        )
                    ),
                ),
                _ledger(),
            )
        ),
    ),
)

# ------------------------------------------------------------------ ProGAP
_PROGAP_PLAN = _json(
    "plan",
    "the client's calibration for its own target "
    "(`fedgraph.methods.progap.privacy.PrivacyPlan.to_dict`)",
    epsilon_target="its epsilon target",
    delta="its delta",
    noise_multiplier="the noise multiplier z",
    sensitivity="an aggregation's sensitivity",
    sigma="an aggregation's noise std",
    depth="K, the private aggregations",
    remote_norm="node level with remote rows: their L2 clip (else null)",
    stage_schedule="node level: DP-SGD's (sample rate, steps) per stage (else null)",
    partition_id="its partition id",
    num_nodes="its node count n",
    num_train="its training-node count",
)

_PROGAP_MODEL = "ProGAP model (`fedgraph.methods.progap.client.build_model`, all stages)"

_PROGAP = (
    MessageType(
        "query.progap_setup",
        "progap",
        "calibrates its noise for its own target, reports its "
        "plan and node ids (`fedgraph.methods.progap.client.setup`)",
        "fedgraph.strategies.progap.ProGAPStrategy.run",
        f"{_ROUTES}.progap.progap_setup",
        _config_only(),
        Content(
            (
                IDS,
                Record(
                    "meta",
                    "ConfigRecord",
                    "public facts and the plan",
                    (SCHEMA, WORKER, _PROGAP_PLAN),
                ),
            )
        ),
    ),
    MessageType(
        "query.progap_keys",
        "progap",
        "generates an X25519 key pair, keeps the private key, sends the public one",
        "fedgraph.strategies.progap.ProGAPStrategy.run (secure-aggregation = true, remote rows)",
        f"{_ROUTES}.common.advertise_key",
        _config_only(),
        Content((PUBLIC_KEY,)),
    ),
    MessageType(
        "train.progap_stage",
        "progap",
        "one round of a stage (`fedgraph.methods.progap.client.train_round`): edge level "
        "FedSGD's gradient over the stage's parameters (and, with `evaluate`, the validation "
        "of the weights received); node level the weights after DP-SGD's local epochs",
        "the stage's Flower strategy (`fedgraph.strategies.fedavg`: StrictFedSGD at edge "
        "level, FedAvg or `round-strategy` at node level) in "
        "fedgraph.strategies.progap.ProGAPStrategy._train",
        f"{_ROUTES}.progap.progap_train",
        Content(
            (
                _state_dict(
                    "arrays",
                    _PROGAP_MODEL,
                    "the global weights (Flower's `arrays`; earlier stages' parameters are frozen)",
                ),
                Record(
                    "config",
                    "ConfigRecord",
                    "the run config and the round (the Flower "
                    "strategy adds `server-round`, and its own keys)",
                    (
                        CONFIG.fields[0],
                        Field("stage", "int", "the stage, 0..K"),
                        Field(
                            "server-round",
                            "int",
                            "the round within the stage, 1.. (the "
                            "client refuses a round outside its plan or not after its last: "
                            "`fedgraph.methods.progap.client.admit_round`)",
                        ),
                        Field(
                            "evaluate",
                            "bool",
                            "also validate the weights received (reply `val-*`)",
                            required=False,
                            when="edge level, from round 2 "
                            "(`fedgraph.strategies.fedavg.StrictFedSGD`)",
                        ),
                        _PROXIMAL_MU,
                    ),
                ),
            )
        ),
        Content(
            (
                _trained(
                    "edge level: the gradient of the mean training loss over the stage's "
                    "parameters and the buffers; node level: the whole state after DP-SGD "
                    "(ledger `stage dp-sgd`)"
                ),
                Record(
                    "metrics",
                    "MetricRecord",
                    "the round's metrics",
                    (
                        Field(
                            "num-examples",
                            "int",
                            "edge level: its training nodes; node level: the "
                            "constant 1 (uniform FedAvg weights)",
                        ),
                        _TRAIN_LOSS,
                        *_FUSED_VALIDATION,
                    ),
                ),
            )
        ),
    ),
    MessageType(
        "evaluate.progap_stage",
        "progap",
        "validates a stage's last weights (`fedgraph.methods.progap.client.validation`); edge "
        "level only: refused at node level (the validation labels are private)",
        "the stage's StrictFedSGD (`fedgraph.strategies.fedavg`) after its last round, in "
        "fedgraph.strategies.progap.ProGAPStrategy._train",
        f"{_ROUTES}.progap.progap_validate",
        Content(
            (
                _state_dict("arrays", _PROGAP_MODEL, "the weights to validate"),
                Record(
                    "config",
                    "ConfigRecord",
                    "the run config and the round",
                    (
                        CONFIG.fields[0],
                        Field("stage", "int", "the stage, 0..K"),
                        Field("server-round", "int", "the stage's last round"),
                    ),
                ),
            )
        ),
        Content((_VALIDATION,)),
    ),
    MessageType(
        "query.progap_aggregate",
        "progap",
        "a stage's private aggregation (paper Eq. 4 across clients): step `release` "
        "(`fedgraph.methods.progap.client.release`) sends the noisy rows for remote nodes and "
        "keeps its local sums; step `finish` (`fedgraph.methods.progap.client.finish`) adds "
        "the rows received and caches the next stage's input",
        "fedgraph.strategies.progap.ProGAPStrategy._aggregate",
        f"{_ROUTES}.progap.progap_aggregate",
        Content(
            (
                CONFIG,
                Record(
                    "agg",
                    "ConfigRecord",
                    "the aggregation step",
                    (
                        Field("stage", "int", "the stage whose input is aggregated, 1..K"),
                        Field("step", "str", "`release` or `finish`"),
                        Field(
                            "remote-sigma",
                            "float",
                            "the common noise std of remote rows",
                            required=False,
                            when="`release`, when "
                            "`fedgraph.methods.progap.privacy.remote_noise` sets one",
                        ),
                        Field(
                            "remote-contributors",
                            "int",
                            "clients summed per remote node: only "
                            "cross-checked against the client's own count "
                            "(`fedgraph.methods.gap.privacy.own_contributors`)",
                            required=False,
                            when="with `remote-sigma`",
                        ),
                        Field(
                            "object-store",
                            "bool",
                            "the server reads Ray's object store: the "
                            "release may be a reference into it, and the finish's `incoming` may be "
                            "one (`fedgraph.messaging.bulk_record`)",
                            required=False,
                            when="`release`",
                        ),
                    ),
                ),
                _state_dict(
                    "arrays",
                    _PROGAP_MODEL,
                    "the global weights (whose stage - 1 embedding is aggregated)",
                    required=False,
                    when="`release`",
                ),
                _secagg_keys("`release`, secure aggregation"),
                _owner("`release`, secure aggregation"),
                _incoming(
                    "h", "the summed rows for this client's nodes", required=False, when="`finish`"
                ),
            )
        ),
        Content(
            (
                _partial_sums("h", "aggregation", required=False, when="`release`"),
                Record(
                    "done",
                    "ConfigRecord",
                    "the aggregation is cached",
                    (Field("stage", "int", "the stage"),),
                    required=False,
                    when="`finish`",
                ),
                _ledger(required=False, when="`release`"),
            ),
            one_of=(("partial_sums", "done"),),
        ),
    ),
    MessageType(
        "query.progap_eval",
        "progap",
        "correct predictions and totals per split at the final stage "
        "(`fedgraph.methods.progap.client.counts`)",
        "fedgraph.strategies.progap.ProGAPStrategy.run",
        f"{_ROUTES}.progap.progap_eval",
        Content(
            (
                CONFIG,
                _state_dict("arrays", _PROGAP_MODEL, "the final weights"),
                Record(
                    "stage",
                    "ConfigRecord",
                    "the stage evaluated",
                    (Field("stage", "int", "K, the last stage"),),
                ),
            )
        ),
        Content((_counts(), _ledger())),
    ),
)

#: message type -> :class:`MessageType`, every type the ClientApp answers, by method
MESSAGES: dict[str, MessageType] = {m.type: m for m in (*_PPGNN, *_GAP, *_PRIVGNN, *_PROGAP)}


def message(message_type: str) -> MessageType:
    """The :class:`MessageType` of ``message_type``.

    Raises:
        KeyError: an unknown type (the message lists the known ones).
    """
    try:
        return MESSAGES[message_type]
    except KeyError:
        raise KeyError(
            f"unknown message type {message_type!r}; known: " + ", ".join(MESSAGES)
        ) from None


def methods() -> list[str]:
    """The methods with messages, in :data:`MESSAGES` order."""
    return list(dict.fromkeys(m.method for m in MESSAGES.values()))
