"""What leaves a client, and when the ledger learns of it (issue 13, faults 4, 6 and 7).

* Every field of every reply of every method's client handler is either a noised release that
  the run's ledger holds, public by construction, or an evaluation output (declared outside
  the guarantee): :data:`ALLOWED` says which and why, per privacy level; a field that is not
  listed fails the test.
* The ledger records each release when its reply arrives: a run where a client fails after
  others answered reports exactly the releases that left (never less), and a run that fails
  before any release reports none.
* A subject over its budget is flagged; the report composes at the run's delta.
"""

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from fedgraph.accounting import Gaussian, PrivacyLedger, PureDP, SubsampledGaussian, compose
from fedgraph.messaging import tensors
from fedgraph.methods import privgnn as pg
from fedgraph.report import format_table
from fedgraph.simulations.local import LocalGrid

# FedAvg (weights leave the clients), explicitly: local-epochs 1 at edge level is FedSGD's
# default schedule otherwise, and GAP_FEDSGD below covers the gradients
GAP = {
    "method": "gap",
    "dataset": "cora",
    "num-clients": 2,
    "encoder-rounds": 1,
    "classifier-rounds": 2,
    "local-epochs": 1,
    "schedule": "fedavg",
    "hops": 2,
    "client-epsilons": "4,2",
    "delta": 1e-5,
}
GAP_NODE = {
    **GAP,
    "level": "node",
    "max-degree": 5,
    "batch-size": 256,
    "accountant": "rdp",
}  # calibration in seconds (prv: a minute per client)
GAP_SECURE = {**GAP, "num-clients": 3, "client-epsilons": "4,2,8", "secure-aggregation": True}
GAP_FEDSGD = {**GAP, "schedule": "fedsgd", "local-epochs": 1}  # gradients instead of weights
PPGNN = {"method": "ppgnn", "dataset": "cora", "num-clients": 2, "epochs": 5}
PRIVGNN = {
    "method": "privgnn",
    "dataset": "cora",
    "num-clients": 2,
    "num-queries": 6,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 20,
    "teacher-epochs": 5,
    "teacher-hidden": 8,
    "teacher-batch-size": 8,
    "projection-dim": 16,
    "epochs": 20,
    "hidden": 8,
    "neighbourhood-size": 10,
}
PRIVGNN_SECURE = {
    **PRIVGNN,
    "answer-mode": "ensemble",
    "num-teachers": 4,
    "sigma-votes": 3.0,
    "secure-aggregation": True,
}
# depth 2: a stage trained on an aggregation of an aggregation; 2 rounds per stage
PROGAP = {
    "method": "progap",
    "dataset": "cora",
    "num-clients": 2,
    "depth": 2,
    "epochs": 2,
    "hidden": 8,
    "client-epsilons": "4,2",
    "delta": 1e-5,
    "accountant": "rdp",
}  # closed-form Gaussian curves: calibration in milliseconds
# node level: DP-SGD on full batches (rate 1: calibration and the report's cross-check in
# a second; the subsampled schedule's public normaliser is tested below, for GAP's local_train)
PROGAP_NODE = {
    **PROGAP,
    "level": "node",
    "depth": 1,
    "epochs": 1,
    "max-degree": 5,
    "batch-size": 4096,
}
PROGAP_SECURE = {
    **PROGAP,
    "depth": 1,
    "num-clients": 3,
    "client-epsilons": "4,2,8",
    "secure-aggregation": True,
}


# ------------------------------------------------------------------------ the allow-list
def _noised(release):
    return ("noised", release)


def _public(why):
    return ("public", why)


#: secure aggregation's key advertisement (``query.<method>_keys``), every method alike
KEY_ADVERTISEMENT = {
    "secagg.public-key": _public("a fresh X25519 public key: no data"),
    "secagg.partition-id": _public("the client's partition id: the directory, no data"),
    "secagg.signature": _public(
        "Ed25519 signature of the fresh key under the client's "
        "identity key (run, method, partition): no data"
    ),
}


EVALUATION = (
    "evaluation",
    "an evaluation output (the report's accuracy), outside the "
    "guarantee as in every DP paper; the report says so",
)
DIRECTORY = _public(
    "the node directory (which client holds which node id, the public split): "
    "needed to route cross-client rows, fixed before any data are read"
)
SCHEMA = _public(
    "the dataset's public schema (name, node universe, feature and class counts), "
    "identical on every client and on neighbouring graphs "
    "(tests/test_neighbouring_inputs.py)"
)
WORKER = _public("where the client runs (host, process, device): no data")
PLAN = _public("the client's calibration: from the public config and the directory counts")

#: the client's own ledger summary (fedgraph.client_authority), sent with every release
LEDGER = {
    "ledger.json.*": _public(
        "the client's own ledger: epsilon, budget and releases per "
        "subject, a function of its plan (public config and "
        "directory counts) and of the requests it answered"
    )
}

#: FedSGD's fused validation (fedgraph.strategies.fedavg.StrictFedSGD): a training reply's metrics
#: hold the evaluation round's fields for the weights received, edge level only
VAL_OF_RECEIVED = {
    module: {
        f"metrics.{field}": {"edge": _public(why)}
        for field, why in (
            ("val-examples", "a count of nodes: not the unit"),
            ("val-accuracy", f"labels are not the unit; {reads}"),
            ("val-loss", f"labels are not the unit; {reads}"),
        )
    }
    for module, reads in (
        ("encoder", "the encoder reads no edge"),
        ("classifier", "the model is post-processing of PMA"),
    )
}

#: method -> message kind -> field -> (kind, why or ledger release) or {level: (...)}
ALLOWED = {
    "gap": {
        "query.gap_setup": {
            "ids.node_ids": DIRECTORY,
            "meta.schema": SCHEMA,
            "meta.worker": WORKER,
            **{
                f"meta.plan.{k}": PLAN
                for k in (
                    "epsilon_target",
                    "delta",
                    "noise_multiplier",
                    "sensitivity",
                    "sigma",
                    "hops",
                    "encoder_schedule",
                    "classifier_schedule",
                    "partition_id",
                    "remote_norm",
                )
            },
            "meta.plan.num_nodes": DIRECTORY,
            "meta.plan.num_train": DIRECTORY,
        },
        "train[gap.encoder]": {
            "arrays.*": {
                "edge": _public("the encoder reads features and labels, no edge"),
                "node": _noised("encoder dp-sgd"),
            },
            **VAL_OF_RECEIVED["encoder"],
            "metrics.num-examples": {
                "edge": _public("a count of nodes: not the protected unit (an edge)"),
                "node": _public("the constant 1: uniform FedAvg weights"),
            },
            "metrics.train-loss": {"edge": _public("features and labels only, no edge")},
        },
        "train[gap.classifier]": {
            "arrays.*": {
                "edge": _public(
                    "post-processing of PMA's noisy rows (ledger 'pma') and of features and labels"
                ),
                "node": _noised("classifier dp-sgd"),
            },
            "metrics.num-examples": {
                "edge": _public("a count of nodes: not the protected unit (an edge)"),
                "node": _public("the constant 1: uniform FedAvg weights"),
            },
            "metrics.train-loss": {"edge": _public("post-processing of PMA's noisy rows")},
            **VAL_OF_RECEIVED["classifier"],
        },
        "query.gap_pma": {
            "partial_sums.ids": _public(
                "every remote node of the graph: fixed by the directory, not by the edges"
            ),
            "partial_sums.sums": _noised("pma"),
            "partial_sums.masked": _noised("pma"),
            **LEDGER,
        },  # masked noisy rows (secagg)
        "query.gap_keys": {  # secure aggregation's key advertisement
            **KEY_ADVERTISEMENT
        },
        "evaluate[gap.classifier]": {  # per-round validation: edge level only
            "metrics.num-examples": {"edge": _public("a count of nodes: not the unit")},
            "metrics.val-accuracy": {
                "edge": _public("labels are not the unit; the model is post-processing of PMA")
            },
            "metrics.val-loss": {
                "edge": _public("labels are not the unit; the model is post-processing of PMA")
            },
        },
        "evaluate[gap.encoder]": {  # per-round validation of the encoder: edge level only
            "metrics.num-examples": {"edge": _public("a count of nodes: not the unit")},
            "metrics.val-accuracy": {
                "edge": _public("labels are not the unit; the encoder reads no edge")
            },
            "metrics.val-loss": {
                "edge": _public("labels are not the unit; the encoder reads no edge")
            },
        },
        "evaluate.gap": {
            **{
                f"metrics.{s}_{c}": EVALUATION
                for s in ("train", "val", "test")
                for c in ("correct", "total")
            },
            **LEDGER,
        },
    },
    "ppgnn": {
        "query.ppgnn": {
            "report.node_ids": _public("the users' ids: the server knows the graph (paper)"),
            "report.edge_index": _public("the graph structure: known to the server (paper)"),
            "report.labelled_ids": _public(
                "which users are training/validation users: known to the server (paper)"
            ),
            "report.is_train": _public("the public split of the labelled users"),
            "report.labels": _public(
                "labels of training/validation users: given to the "
                "server in the paper's setting (randomized response with "
                "label-epsilon > 0, ledger 'labels (randomized response)')"
            ),
            "report.mech.*": _noised("*"),  # the mechanism's parts, e.g. ESW and MLR
            "meta.schema": SCHEMA,
            "meta.worker": WORKER,
            **LEDGER,
        },
        "evaluate.ppgnn": {
            **{
                f"metrics.{s}_{c}": EVALUATION
                for s in ("train", "val", "test")
                for c in ("correct", "total")
            },
            **LEDGER,
        },
    },
    "privgnn": {
        "query.privgnn": {
            # "level" here: None for the posterior modes, "ensemble" for the secure ensemble
            # (masked noisy histograms: the ledger's release is the sum's)
            "answers.answers": {
                None: _noised("noisy answers"),
                "ensemble": _noised("noisy vote histograms"),
            },
            **{
                f"meta.{k}": _public(
                    "fixed by public parameters (target, gamma, lam, delta) "
                    "and the number of queries asked"
                )
                for k in (
                    "partition_id",
                    "asked",
                    "answered",
                    "refused",
                    "limit",
                    "answered_total",
                    "epsilon_target",
                )
            },
            **LEDGER,
        },
        "query.privgnn_keys": {  # secure aggregation's key advertisement
            **KEY_ADVERTISEMENT
        },
    },
    "progap": {
        "query.progap_setup": {
            "ids.node_ids": DIRECTORY,
            "meta.schema": SCHEMA,
            "meta.worker": WORKER,
            **{
                f"meta.plan.{k}": PLAN
                for k in (
                    "epsilon_target",
                    "delta",
                    "noise_multiplier",
                    "sensitivity",
                    "sigma",
                    "depth",
                    "remote_norm",
                    "stage_schedule",
                    "partition_id",
                )
            },
            "meta.plan.num_nodes": DIRECTORY,
            "meta.plan.num_train": DIRECTORY,
        },
        "query.progap_keys": {  # secure aggregation's key advertisement
            **KEY_ADVERTISEMENT
        },
        "train.progap_stage": {
            "arrays.*": {
                "edge": _public(
                    "the full-batch gradient (and batch-norm statistics) "
                    "of a stage: post-processing of the aggregations' "
                    "noisy rows (ledger 'aggregation') and of features "
                    "and labels; stage 0 reads no edge"
                ),
                "node": _noised("stage dp-sgd"),
            },
            "metrics.num-examples": {
                "edge": _public("a count of nodes: not the protected unit (an edge)"),
                "node": _public("the constant 1: uniform FedAvg weights"),
            },
            "metrics.train-loss": {
                "edge": _public(
                    "post-processing of the aggregations' noisy rows, features and labels"
                )
            },
            "metrics.val-examples": {"edge": _public("a count of nodes: not the unit")},
            **{
                f"metrics.val-{k}": {
                    "edge": _public(
                        "labels are not the unit; the model is post-processing of the aggregations"
                    )
                }
                for k in ("accuracy", "loss")
            },
        },
        "evaluate.progap_stage": {  # a stage's last weights, edge level only
            "metrics.num-examples": {"edge": _public("a count of nodes: not the unit")},
            **{
                f"metrics.val-{k}": {
                    "edge": _public(
                        "labels are not the unit; the model is post-processing of the aggregations"
                    )
                }
                for k in ("accuracy", "loss")
            },
        },
        "query.progap_aggregate[release]": {
            "partial_sums.ids": _public(
                "every remote node of the graph: fixed by the directory, not by the edges"
            ),
            "partial_sums.sums": _noised("aggregation"),
            "partial_sums.masked": _noised("aggregation"),
            **LEDGER,
        },  # masked: secagg
        "query.progap_aggregate[finish]": {
            "done.stage": _public("the stage number the server sent")
        },
        "query.progap_eval": {
            **{
                f"metrics.{s}_{c}": EVALUATION
                for s in ("train", "val", "test")
                for c in ("correct", "total")
            },
            **LEDGER,
        },
    },
}


def _run(config, tmp_path, name, fail=None, tamper=None):
    from fedgraph.federation import preflight
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(
        {**config, "output-dir": str(tmp_path), "run-name": name}
    )
    preflight(cfg)
    grid = LocalGrid(cfg.num_clients, fail=fail, tamper=tamper, record=True)
    try:
        strategy_cls(cfg).start(grid)
    except Exception:  # noqa: BLE001 - the failure tests read the report on disk
        if fail is None and tamper is None:
            raise
    return json.loads((tmp_path / f"{name}.json").read_text()), grid


def message_kind(m) -> str:
    """A request's kind in :data:`ALLOWED`: its message type, with the phase of a ``train`` or
    ``evaluate`` round (``train[gap.encoder]``) and the step of a ProGAP aggregation
    (``query.progap_aggregate[release]``, ``[finish]``)."""
    t = m.metadata.message_type
    if t in ("train", "evaluate"):
        return f"{t}[{m.content['config']['phase']}]"
    if t == "query.progap_aggregate":
        return f"{t}[{m.content['agg']['step']}]"
    return t


def reply_fields(reply) -> dict[str, object]:
    """Every field of a reply: ``record.key`` for ArrayRecord, MetricRecord and ConfigRecord
    keys, and ``record.key.sub`` for the keys of a ConfigRecord value that holds a JSON
    object other than the schema and worker info (checked as a whole)."""
    out = {}
    for name, rec in reply.content.items():
        assert isinstance(rec, (ArrayRecord, ConfigRecord, MetricRecord)), (name, type(rec))
        for key, value in rec.items():
            if (
                isinstance(rec, ConfigRecord)
                and isinstance(value, str)
                and key not in ("schema", "worker")
                and value.startswith("{")
            ):
                for sub, v in json.loads(value).items():
                    out[f"{name}.{key}.{sub}"] = v
            else:
                out[f"{name}.{key}"] = value
    return out


def _declared(method, kind, field, level):
    table = ALLOWED[method].get(kind, {})
    entry = table.get(field)
    if entry is None:
        prefix = field.split(".")[0] + ".*"
        entry = table.get(prefix) or table.get(".".join(field.split(".")[:2]) + ".*")
    if isinstance(entry, dict):
        entry = entry.get(level)
    return entry


def check_releases(method, level, grid, report) -> set:
    """Every reply field is declared for ``level``; every noised field's release is in the
    ledger of the run's report. Returns the fields seen."""
    releases = {
        r["release"] for row in report["privacy"]["per_subject"].values() for r in row["releases"]
    }
    seen, problems = set(), []
    for m, reply in grid.log:
        if reply.has_error():  # a dropped-out client: nothing but the error leaves it
            continue
        kind = message_kind(m)
        for field in reply_fields(reply):
            seen.add(f"{kind}:{field}")
            entry = _declared(method, kind, field, level)
            if entry is None:
                problems.append(
                    f"{kind}: {field} leaves the client at {level} level and is "
                    "neither noised-and-accounted nor declared public"
                )
            elif (
                entry[0] == "noised"
                and entry[1] != "*"
                and not any(r.startswith(entry[1]) for r in releases)
            ):
                problems.append(
                    f"{kind}: {field} is declared noised ({entry[1]!r}) but the "
                    f"ledger has no such release: {sorted(releases)}"
                )
    assert not problems, "\n".join(sorted(set(problems)))
    return seen


RUNS = {
    "gap-edge": GAP,
    "gap-node": GAP_NODE,
    "gap-secure": GAP_SECURE,
    "gap-fedsgd": GAP_FEDSGD,
    "ppgnn": PPGNN,
    "privgnn": PRIVGNN,
    "privgnn-secure": PRIVGNN_SECURE,
    "progap-edge": PROGAP,
    "progap-node": PROGAP_NODE,
    "progap-secure": PROGAP_SECURE,
}


class _Runs(dict):
    """``name -> (report, grid)`` of :data:`RUNS`, each run once, when first read (``-k``
    selects only the runs its tests read; ``--durations`` charges each to its first test)."""

    def __init__(self, tmp):
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name):
        self[name] = _run(RUNS[name], self.tmp, name)
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _Runs(tmp_path_factory.mktemp("releases"))


@pytest.mark.parametrize(
    "name,method,level",
    [
        ("gap-edge", "gap", "edge"),
        ("gap-node", "gap", "node"),
        ("gap-secure", "gap", "edge"),
        ("gap-fedsgd", "gap", "edge"),
        ("ppgnn", "ppgnn", None),
        ("privgnn", "privgnn", None),
        ("privgnn-secure", "privgnn", "ensemble"),
        ("progap-edge", "progap", "edge"),
        ("progap-node", "progap", "node"),
        ("progap-secure", "progap", "edge"),
    ],
)
def test_every_reply_field_is_noised_and_accounted_or_public(runs, name, method, level):
    report, grid = runs[name]
    assert report["status"] == "ok"
    seen = check_releases(method, level, grid, report)
    kinds = {s.split(":")[0] for s in seen}
    want = {
        "gap": {
            "query.gap_setup",
            "train[gap.encoder]",
            "train[gap.classifier]",
            "query.gap_pma",
            "evaluate.gap",
        },
        "ppgnn": {"query.ppgnn", "evaluate.ppgnn"},
        "privgnn": {"query.privgnn"},
        "progap": {
            "query.progap_setup",
            "train.progap_stage",
            "query.progap_eval",
            "query.progap_aggregate[release]",
            "query.progap_aggregate[finish]",
        },
    }[method]
    assert want <= kinds  # the run exercised every handler of the method
    if level == "edge" and method == "gap":
        assert {"evaluate[gap.classifier]", "evaluate[gap.encoder]"} <= kinds
    if level == "edge" and method == "progap":  # validation fused, then the stage's last
        assert "evaluate.progap_stage" in kinds
        assert {
            "train.progap_stage:metrics.val-accuracy",
            "train.progap_stage:metrics.val-examples",
        } <= seen
    if method == "gap":  # the report's statement of what the rounds release matches them
        note = report["privacy"]["schedule"]
        assert ("full-batch gradient" in note) == (name == "gap-fedsgd"), note
        assert ("DP-SGD" in note) == (level == "node"), note
        val_seen = any(
            f.split(":")[1].startswith(("metrics.val-", "metrics.val_"))
            for f in seen
            if f.startswith(("train[", "evaluate["))
        )
        assert ("validation accuracy" in note and "leave" in note) == val_seen, note
    if name == "gap-fedsgd":  # validation fused into the training replies (StrictFedSGD)
        assert {
            "train[gap.classifier]:metrics.val-accuracy",
            "train[gap.classifier]:metrics.val-examples",
        } <= seen
    if name == "gap-secure":  # the masked path ran: keys out, no plain sums
        assert {"query.gap_keys:secagg.public-key", "query.gap_pma:partial_sums.masked"} <= seen
        plain = [
            reply.content["partial_sums"]["sums"].numpy()
            for m, reply in grid.log
            if m.metadata.message_type == "query.gap_pma"
            and "sums" in reply.content["partial_sums"]
        ]
        assert all(a.size == 0 for a in plain)  # only the finish-only hop's empty record
    if name == "privgnn-secure":  # keys out, then only masked ring elements
        assert "query.privgnn_keys:secagg.public-key" in seen
        answers = [
            reply.content["answers"]["answers"].numpy()
            for m, reply in grid.log
            if m.metadata.message_type == "query.privgnn"
        ]
        assert len(answers) == 2 and all(a.dtype == np.int64 for a in answers)
    if name == "progap-secure":  # the masked path ran: keys out, no plain rows
        assert {
            "query.progap_keys:secagg.public-key",
            "query.progap_aggregate[release]:partial_sums.masked",
        } <= seen
        assert "query.progap_aggregate[release]:partial_sums.sums" not in seen
    if level == "node":  # no per-round validation at node level: the labels are private
        assert not {"evaluate[gap.classifier]", "evaluate[gap.encoder]"} & kinds
        assert not [
            f
            for f in seen
            if f.startswith("train.progap_stage:metrics.")
            and f != "train.progap_stage:metrics.num-examples"
        ]
        assert not [f for f in seen if f.startswith("evaluate.progap_stage:")]
    schemas = {
        reply.content["meta"]["schema"]
        for m, reply in grid.log
        if "meta" in reply.content and "schema" in reply.content["meta"]
    }
    assert len(schemas) <= 1  # the same public schema from every client
    assert all(
        set(json.loads(s)) == {"name", "num_nodes", "num_features", "num_classes"} for s in schemas
    )  # no whole-graph statistic (edge or class counts)


def test_node_level_training_replies_carry_no_count_and_no_loss(runs):
    """The fault 6 example: node-level GAP training replies sent the exact number of private
    training nodes (1026 / 1005 on Cora, 2 clients) and their exact mean loss; node-level
    ProGAP's rounds send neither."""
    for name, message_type in (("gap-node", "train"), ("progap-node", "train.progap_stage")):
        _, grid = runs[name]
        metrics = [
            dict(reply.content["metrics"])
            for m, reply in grid.log
            if m.metadata.message_type == message_type
        ]
        assert metrics and all(mt == {"num-examples": 1} for mt in metrics), name


def test_an_unlisted_field_fails_the_check(runs):
    """The check catches a new field: a reply with an extra metric is rejected."""
    report, grid = runs["gap-edge"]
    m, reply = next((m, r) for m, r in grid.log if m.metadata.message_type == "train")
    reply.content["metrics"]["grad-norm"] = 1.0
    try:
        with pytest.raises(AssertionError, match="grad-norm"):
            check_releases("gap", "edge", grid, report)
    finally:
        del reply.content["metrics"]["grad-norm"]


def test_opacus_normaliser_and_schedule_come_from_the_public_count(monkeypatch):
    """Opacus issue 819: with fewer training rows than the batch size the normaliser was the
    private count. Removing a node must not change the normaliser, the rate or the steps."""
    import opacus.optimizers

    from fedgraph.methods.gap import DPSGD, local_train

    seen = []
    real = opacus.optimizers.DPOptimizer

    def spy(*args, **kwargs):
        seen.append(kwargs["expected_batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", spy)
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    for rows in (40, 39):  # neighbouring datasets: one node removed from its slot
        mask = torch.zeros(40, dtype=torch.bool)
        mask[:rows] = True
        local_train(
            torch.nn.Linear(3, 2),
            x,
            y,
            mask,
            1,
            256,
            0.1,
            DPSGD(1.0, 1.0),
            generator=torch.Generator().manual_seed(0),
            num_public=40,
        )
    assert seen == [40, 40]


# ------------------------------------------------------------- releases recorded when made
def _events_epsilon(events, delta, accountant):
    return compose(events, delta, accountant).epsilon


def _fail_node(node, message_type, hop=None):
    def fail(m):
        if m.metadata.dst_node_id != node or m.metadata.message_type != message_type:
            return False
        return hop is None or int(m.content["pma"]["hop"]) == hop

    return fail


@pytest.mark.parametrize("mode", ["drop out", "extra row"])
def test_privgnn_failed_run_reports_the_answers_already_given(tmp_path, mode):
    """Fault 4: client 0 answers, then client 1 drops out (or sends one row more than its
    meta says): the run fails and its report holds client 0's answers (and client 1's rows)."""

    def extra_row(m, reply):
        if m.metadata.dst_node_id == 2 and not reply.has_error():
            a = tensors(reply.content["answers"])["answers"]
            reply.content["answers"] = ArrayRecord({"answers": torch.cat([a, a[:1]])})
        return reply

    report, _ = _run(
        {**PRIVGNN, "client-epsilons": "inf"},
        tmp_path,
        "privgnn-fail",
        *((_fail_node(2, "query.privgnn"), None) if mode == "drop out" else (None, extra_row)),
    )
    assert report["status"] == "failed"
    per = report["privacy"]["per_subject"]
    q = PRIVGNN["num-queries"]
    want = {"client-0": q} if mode == "drop out" else {"client-0": q, "client-1": q + 1}
    assert set(per) == set(want)
    for s, m in want.items():
        eps = _events_epsilon(pg.privgnn_events(m, 0.3, 1.0), 1e-4, "pld")
        assert per[s]["epsilon"] == pytest.approx(eps, rel=1e-6), s


def test_gap_failed_run_reports_exactly_the_hops_released(tmp_path):
    """Fault 4, GAP: client 1 fails at PMA hop 2 after both released hop 1 (and client 0 hop
    2): client 0 spent two Gaussian mechanisms, client 1 one; before the fix the whole plan
    was recorded at setup."""
    report, _ = _run(GAP, tmp_path, "gap-fail", _fail_node(2, "query.gap_pma", hop=2))
    assert report["status"] == "failed" and "gap_pma" in report["error"]
    per, plans = report["privacy"]["per_subject"], report["clients"]
    for c, hops in ((0, 2), (1, 1)):
        z = plans[f"client-{c}"]["noise_multiplier"]
        eps = _events_epsilon(
            [Gaussian(z, count=hops)], GAP["delta"], report["config"]["accountant"]
        )
        assert per[f"client-{c}"]["epsilon"] == pytest.approx(eps, rel=1e-3)
        assert per[f"client-{c}"]["epsilon"] < plans[f"client-{c}"]["epsilon_target"]


def test_gap_node_failure_in_a_later_phase_reports_the_dpsgd_and_pma_spent(tmp_path):
    """Node level: client 1 fails in classifier round 1 after the encoder round and PMA: both
    clients' encoder DP-SGD and PMA are reported, client 0's classifier round too."""

    def fail(m):
        return (
            m.metadata.dst_node_id == 2
            and m.metadata.message_type == "train"
            and m.content["config"]["phase"] == "gap.classifier"
        )

    report, _ = _run(GAP_NODE, tmp_path, "gap-node-fail", fail)
    assert report["status"] == "failed"
    per, plans = report["privacy"]["per_subject"], report["clients"]
    for c in (0, 1):
        p = plans[f"client-{c}"]
        z = p["noise_multiplier"]
        from fedgraph.methods.gap import dpsgd_schedule

        q, steps = dpsgd_schedule(p["num_train"], GAP_NODE["batch-size"], 1)
        events = [SubsampledGaussian(q, z, steps), Gaussian(z, count=GAP_NODE["hops"])]
        if c == 0:
            events.append(SubsampledGaussian(q, z, steps))
        eps = _events_epsilon(events, GAP_NODE["delta"], report["config"]["accountant"])
        assert per[f"client-{c}"]["epsilon"] == pytest.approx(eps, rel=1e-3), c


@pytest.mark.parametrize(
    "config,message_type",
    [
        (GAP, "train"),  # edge level: no release yet
        (PPGNN, "query.ppgnn"),
        (PRIVGNN, "query.privgnn"),
    ],
)
def test_a_run_that_fails_before_any_release_reports_none(tmp_path, config, message_type):
    """Every client fails at ``message_type`` (GAP edge level: the encoder round, which
    releases nothing about edges, before any PMA hop): nothing was spent, nothing reported."""
    report, _ = _run(config, tmp_path, "early", lambda m: m.metadata.message_type == message_type)
    assert report["status"] == "failed"
    assert report["privacy"]["per_subject"] == {}


def test_ppgnn_one_client_failing_still_reports_the_levels(tmp_path):
    """PPGNN has one release phase: client 0's users reported, client 1 failed; the levels
    are in the report with their epsilons."""
    report, _ = _run(PPGNN, tmp_path, "ppgnn-fail", _fail_node(2, "query.ppgnn"))
    assert report["status"] == "failed"
    per = report["privacy"]["per_subject"]
    assert [per[f"level-{i}"]["epsilon"] for i in (1, 2, 3)] == pytest.approx([1, 2, 4])


# ---------------------------------------------------------------------- budgets and delta
def test_ledger_flags_a_subject_over_its_budget():
    ledger = PrivacyLedger()
    ledger.set_budget("level-1", 1.0)
    ledger.set_budget("level-2", 2.0)
    ledger.set_budget("unused", 1.0)
    ledger.record("level-1", "esw+mlr", PureDP(1.0))
    ledger.record("level-1", "labels", PureDP(0.5))
    ledger.record("level-2", "esw+mlr", PureDP(2.0))
    rows = ledger.summary()
    assert rows["level-1"]["over_budget"] and rows["level-1"]["budget"] == 1.0
    assert rows["level-2"]["over_budget"] is False
    assert "unused" not in rows  # a budget alone is no release
    table = format_table(
        {"method": "x", "dataset": {"name": "d"}, "status": "ok", "privacy": {"per_subject": rows}}
    )
    assert "OVER BUDGET" in table.splitlines()[1] and "OVER" not in table.splitlines()[2]
    with pytest.raises(ValueError, match="level-3"):
        ledger.set_budget("level-3", -1.0)


def test_ledger_merges_repeated_rounds_of_one_release():
    ledger = PrivacyLedger()
    for _ in range(3):
        ledger.record("c", "dp-sgd", SubsampledGaussian(0.1, 1.0, 5))
    ledger.record("c", "pma", Gaussian(2.0))
    ledger.record("c", "pma", Gaussian(2.0))
    ledger.record("c", "pma", Gaussian(3.0))
    assert ledger.events("c") == [
        SubsampledGaussian(0.1, 1.0, 15),
        Gaussian(2.0, count=2),
        Gaussian(3.0),
    ]


def test_ppgnn_label_epsilon_comes_out_of_each_level_budget(runs, tmp_path):
    """With randomized response on the labels, a user's whole release (features and label)
    stays within its level's budget: the features get ``budget - label-epsilon``."""
    report, _ = _run({**PPGNN, "label-epsilon": 0.5}, tmp_path, "ppgnn-labels")
    assert report["status"] == "ok"
    per = report["privacy"]["per_subject"]
    for i, budget in ((1, 1.0), (2, 2.0), (3, 4.0)):
        row = per[f"level-{i}"]
        assert row["epsilon"] == pytest.approx(budget)
        assert row["budget"] == budget and row["over_budget"] is False
        assert row["cross_check"]["agrees"]
        spent = {r["release"]: r for r in row["releases"]}
        assert "labels (randomized response)" in spent and len(spent) == 3  # esw, mlr, labels
    base = runs["ppgnn"][0]["privacy"]["per_subject"]
    assert all(base[f"level-{i}"]["over_budget"] is False for i in (1, 2, 3))


def test_a_privgnn_client_too_poor_to_answer_is_named_not_dropped(tmp_path):
    """client-0's budget affords no answer: it has no ledger subject (it spent nothing), and
    the report and its table say so instead of leaving it out."""
    report, _ = _run({**PRIVGNN, "client-epsilons": "0.2,10"}, tmp_path, "privgnn-poor")
    assert report["status"] == "ok"
    assert report["clients"]["client-0"]["limit"] == 0
    assert "client-0" not in report["privacy"]["per_subject"]
    assert report["privacy"]["released_nothing"] == ["client-0"]
    assert "client-0: released nothing (epsilon 0;" in format_table(report)


def test_progap_with_directed_edges_states_a_whole_edges_cost(tmp_path):
    """ProGAP's edge-unit = "directed" (progap-edge-wisconsin's): a whole undirected edge costs
    more than the per-client epsilon, and the report and table say how much, as GAP's do."""
    report, _ = _run({**PROGAP, "level": "edge", "edge-unit": "directed"}, tmp_path, "pd")
    whole = report["privacy"]["undirected_edge_epsilon"]
    per = report["privacy"]["per_subject"]
    assert set(whole) == set(per) == {"client-0", "client-1"}
    for client, eps in whole.items():
        assert per[client]["epsilon"] < eps < 2 * per[client]["epsilon"] + 1
    assert "edge-unit directed: an undirected edge (both halves)" in format_table(report)
    # the figure itself, from the clients' reported noise: a whole edge is two rows of
    # sensitivity 1, one at the client's sigma and one at the smallest (cross-client edges),
    # in each of the depth aggregations; checked against the exact Gaussian curve too
    from fedgraph.accounting import Gaussian, compose_epsilon

    sigmas = {c: row["sigma"] for c, row in report["clients"].items()}
    low = min(sigmas.values())
    for client, sigma in sigmas.items():
        assert report["clients"][client]["sensitivity"] == 1.0
        z = 1 / math.sqrt(1 / sigma**2 + 1 / low**2)
        event = Gaussian(z, count=PROGAP["depth"])
        delta = report["clients"][client]["delta"]
        assert whole[client] == pytest.approx(compose_epsilon([event], delta, accountant="rdp"))
        assert whole[client] >= compose_epsilon([event], delta, accountant="analytic") - 1e-6


def test_gap_and_privgnn_clients_carry_their_targets_as_budgets(runs):
    for name in ("gap-edge", "gap-node", "progap-edge", "progap-node"):
        per = runs[name][0]["privacy"]["per_subject"]
        assert per["client-0"]["budget"] == 4.0 and per["client-1"]["budget"] == 2.0
        assert not per["client-0"]["over_budget"] and not per["client-1"]["over_budget"]
    per = runs["privgnn"][0]["privacy"]["per_subject"]
    assert all(row["budget"] == 10.0 and not row["over_budget"] for row in per.values())


@pytest.mark.parametrize(
    "name,delta", [("gap-edge", 1e-5), ("ppgnn", 1e-5), ("privgnn", 1e-4), ("progap-node", 1e-5)]
)
def test_report_composes_and_cross_checks_at_the_run_delta(runs, name, delta):
    report = runs[name][0]
    for row in report["privacy"]["per_subject"].values():
        assert row["cross_check"]["delta"] == pytest.approx(delta) or math.isinf(row["epsilon"])
    assert report["privacy"]["composed_at"]["delta"] == delta


def test_pure_cross_check_holds_at_the_run_delta_where_prv_fails():
    """PPGNN's level 2 (budget 2 split into ESW and MLR) at delta 1e-5: prv-accountant's
    discretisation fails; the cross-check still runs at that delta (PLD) and agrees."""
    from fedgraph.config import parse_run_config
    from fedgraph.methods import ppgnn

    cfg = parse_run_config({"method": "ppgnn", "dataset": "cora", "num-clients": 2})
    ledger = PrivacyLedger()
    ppgnn.record_privacy(ledger, cfg, ppgnn.build_mechanism(cfg))
    for subject, row in ledger.summary(1e-5).items():
        check = row["cross_check"]
        assert check["delta"] == 1e-5 and check["agrees"], (subject, check)
