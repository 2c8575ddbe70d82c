"""The messages between server and clients are a protocol (issue 30): ``fedgraph.protocol``
lists every message type the ClientApp routes, and real small runs of every method send and
answer exactly the records and keys it lists.

* The ClientApp (``simulations/client_app.py``, read by AST: Flower's ``ClientApp`` has no
  public list of its routes) routes exactly :data:`fedgraph.protocol.MESSAGES`'s types, each
  to the handler the protocol names.
* In-process runs (``run_local`` on a recording ``LocalGrid``): every request holds only the
  records and keys listed for its type (optional ones may be absent), every reply exactly
  those listed (kinds, value types, tensor dtypes and ranks); across the runs every message
  type and every listed key occurs.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import importlib
import io
from functools import cache
from pathlib import Path

import pytest
import torch

from fedgraph import protocol
from fedgraph.protocol import MESSAGES, Content, Field, Record

ROOT = Path(__file__).resolve().parents[1]

SBM = "synthetic-sbm:300:6"
GAP = {
    "method": "gap",
    "dataset": SBM,
    "num-clients": 2,
    "encoder-rounds": 1,
    "classifier-rounds": 2,
    "local-epochs": 1,
    "hops": 1,
    "client-epsilons": "4",
    "delta": 1e-5,
    "accountant": "rdp",
}  # one target: the report composes once
PRIVGNN = {
    "method": "privgnn",
    "dataset": SBM,
    "num-clients": 2,
    "num-queries": 4,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 20,
    "teacher-epochs": 2,
    "teacher-hidden": 8,
    "teacher-batch-size": 8,
    "projection-dim": 16,
    "epochs": 5,
    "hidden": 8,
    "neighbourhood-size": 10,
}
PROGAP = {
    "method": "progap",
    "dataset": SBM,
    "num-clients": 2,
    "depth": 1,
    "epochs": 1,
    "hidden": 8,
    "client-epsilons": "4",
    "device": "cpu",
}

#: run name -> run config: every method, every path through its messages
RUNS = {
    "gap-fedsgd": {**GAP, "schedule": "fedsgd"},  # validation fused into round 2
    "gap-fedavg": {
        **GAP,
        "schedule": "fedavg",
        "round-strategy": "fedprox",  # proximal-mu
        "round-strategy-args": {"proximal_mu": 0.1},
    },
    "gap-node": {
        **GAP,
        "schedule": "fedavg",
        "classifier-rounds": 1,
        "level": "node",
        "max-degree": 5,
        "batch-size": 256,
    },
    "gap-secure": {
        **GAP,
        "schedule": "fedavg",
        "classifier-rounds": 1,
        "num-clients": 3,
        "secure-aggregation": True,
    },
    "ppgnn": {"method": "ppgnn", "dataset": SBM, "num-clients": 2, "epochs": 3},
    "privgnn": PRIVGNN,
    "privgnn-ensemble-secure": {
        **PRIVGNN,
        "answer-mode": "ensemble",
        "num-teachers": 4,
        "sigma-votes": 3.0,
        "secure-aggregation": True,
    },
    "progap-edge": {**PROGAP, "epochs": 2},  # validation fused into round 2
    "progap-node": {
        **PROGAP,
        "client-epsilons": "8",
        "level": "node",
        "max-degree": 5,
        "batch-size": 256,
        "accountant": "rdp",
        "round-strategy": "fedprox",
        "round-strategy-args": {"proximal_mu": 0.1},
    },  # proximal-mu
    "progap-secure": {**PROGAP, "num-clients": 3, "secure-aggregation": True},
}


# ------------------------------------------------------------------ the ClientApp's routes
def client_app_routes() -> dict[str, str]:
    """Message type -> the dotted path of its handler, as ``simulations/client_app.py``
    registers them (``app.query("x")(module.fn)``, ``app.train()(module.fn)``, ...)."""
    tree = ast.parse((ROOT / "simulations" / "client_app.py").read_text())
    modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
    routes = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)):
            continue
        reg = node.func
        if not (
            isinstance(reg.func, ast.Attribute)
            and isinstance(reg.func.value, ast.Name)
            and reg.func.value.id == "app"
            and reg.func.attr in ("train", "evaluate", "query")
        ):
            continue
        action = [a.value for a in reg.args if isinstance(a, ast.Constant)]
        mtype = reg.func.attr + (f".{action[0]}" if action else "")
        (handler,) = node.args
        assert isinstance(handler, ast.Attribute) and isinstance(handler.value, ast.Name)
        assert mtype not in routes, f"{mtype} registered twice"
        routes[mtype] = f"{modules[handler.value.id]}.{handler.attr}"
    return routes


def test_the_client_app_routes_exactly_the_protocols_message_types():
    routes = client_app_routes()
    assert set(routes) == set(MESSAGES), (
        f"routed, not in fedgraph.protocol: {sorted(set(routes) - set(MESSAGES))}; "
        f"in fedgraph.protocol, not routed: {sorted(set(MESSAGES) - set(routes))}"
    )
    for mtype, handler in routes.items():
        assert MESSAGES[mtype].handler == handler, mtype
        module, name = handler.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), name)), handler


def test_the_protocol_is_well_formed():
    assert protocol.methods() == ["ppgnn", "gap", "privgnn", "progap"]
    for m in MESSAGES.values():
        assert protocol.message(m.type) is m
        for content in (m.sends, m.replies):
            names = [r.name for r in content.records]
            assert len(names) == len(set(names)), m.type
            assert all(set(g) <= set(names) for g in content.one_of), m.type
            for r in content.records:
                assert r.kind in protocol.RECORD_KINDS, (m.type, r.name)
                keys = [f.name for f in r.fields]
                assert len(keys) == len(set(keys)) and all(set(g) <= set(keys) for g in r.one_of), (
                    m.type,
                    r.name,
                )
                assert all(bool(f.shape) == (r.kind == "ArrayRecord") for f in r.fields)
                assert all(f.required or f.when for f in r.fields), (m.type, r.name)
                assert r.required or r.when, (m.type, r.name)
        assert "config" in [r.name for r in m.sends.records]  # the run config, always
        for r in m.replies.records:
            assert not r.names_within or m.sends.record(r.names_within).kind == "ArrayRecord"
    with pytest.raises(KeyError, match="known: query.ppgnn"):
        protocol.message("query.nope")


# ------------------------------------------------------------------ what the runs send
_PY_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "bytes": bytes}


def _type_ok(spec: str, value) -> bool:
    if spec == "list[bytes]":
        return isinstance(value, list) and all(isinstance(v, bytes) for v in value)
    if spec == "list[int]":
        return isinstance(value, list) and all(type(v) is int for v in value)
    if spec == "float":  # a float metric may be integral; never a bool
        return type(value) in (float, int)
    return type(value) is _PY_TYPES[spec]


def _field(record: Record, key: str) -> Field | None:
    return next((f for f in record.fields if f.name == key), None) or next(
        (f for f in record.fields if "*" in f.name and fnmatch.fnmatchcase(key, f.name)), None
    )


def check_content(spec: Content, content, where: str, request=None) -> list[tuple[str, str]]:
    """Problems of a message's ``content`` (a Flower ``RecordDict``) against ``spec``; also
    returns the ``(record, key)`` pairs seen, for the coverage test."""
    import json

    problems, seen = [], []
    present = set(content.keys())
    declared = {r.name: r for r in spec.records}
    problems += [f"{where}: record {n!r} is not in the protocol" for n in present - set(declared)]
    problems += [
        f"{where}: required record {r.name!r} missing"
        for r in spec.records
        if r.required and r.name not in present
    ]
    problems += [
        f"{where}: exactly one of the records {g} expected, got {sorted(present & set(g))}"
        for g in spec.one_of
        if len(present & set(g)) != 1
    ]
    for name in present & set(declared):
        rec, spec_rec = content[name], declared[name]
        at = f"{where} {name}"
        seen.append((name, ""))
        if type(rec).__name__ != spec_rec.kind:
            problems.append(f"{at}: a {type(rec).__name__}, the protocol says {spec_rec.kind}")
            continue
        keys = set(rec.keys())
        problems += [
            f"{at}: required key {f.name!r} missing"
            for f in spec_rec.fields
            if f.required and "*" not in f.name and f.name not in keys
        ]
        problems += [
            f"{at}: exactly one of {g} expected, got {sorted(keys & set(g))}"
            for g in spec_rec.one_of
            if len(keys & set(g)) != 1
        ]
        if spec_rec.names_within:
            outside = keys - set(request[spec_rec.names_within].keys())
            problems += (
                [f"{at}: {sorted(outside)} not in the request's {spec_rec.names_within!r}"]
                if outside
                else []
            )
        for key, value in rec.items():
            f = _field(spec_rec, key)
            if f is None:
                problems.append(f"{at}: key {key!r} is not in the protocol")
                continue
            seen.append((name, f.name))
            if spec_rec.kind == "ArrayRecord":
                dtypes = [d.strip() for d in f.type.split("|")]
                if f.type != "any" and str(value.dtype) not in dtypes:
                    problems.append(f"{at}[{key!r}]: dtype {value.dtype}, protocol {f.type}")
                if f.shape != "any" and len(value.shape) != f.shape.count(",") + 1:
                    problems.append(f"{at}[{key!r}]: shape {value.shape}, protocol {f.shape}")
            elif not _type_ok(f.type, value):
                problems.append(f"{at}[{key!r}]: {type(value).__name__}, protocol {f.type}")
            elif f.json_keys:
                got, want = set(json.loads(value)), {k.name for k in f.json_keys}
                if got != want:
                    problems.append(f"{at}[{key!r}]: JSON keys {sorted(got ^ want)} differ")
    return problems, seen


@cache
def recorded_run(name: str) -> tuple[dict, list]:
    """``(report, [(request, reply), ...])`` of run ``name`` (:data:`RUNS`), made once."""
    from fedgraph.simulations.local import LocalGrid, run_local

    torch.set_num_threads(1)
    cfg = RUNS[name]
    grid = LocalGrid(cfg["num-clients"], record=True)
    with contextlib.redirect_stdout(io.StringIO()):
        report = run_local({**cfg, "output-dir": str(_out_dir()), "run-name": name}, grid)
    return report, grid.log


@cache
def _out_dir() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="fedgraph-protocol-"))


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_sends_and_answers_what_the_protocol_says(name):
    report, log = recorded_run(name)
    assert report["status"] == "ok", report.get("error")
    problems = []
    for request, reply in log:
        assert not reply.has_error(), reply.error.reason[-2000:]
        spec = protocol.message(request.metadata.message_type)
        assert spec.method == RUNS[name]["method"]
        problems += check_content(spec.sends, request.content, f"{spec.type} request")[0]
        problems += check_content(
            spec.replies, reply.content, f"{spec.type} reply", request.content
        )[0]
    assert not problems, "\n".join(sorted(set(problems)))


#: listed keys the runs above do not send, and why
NOT_IN_THE_RUNS = {
    ("query.privgnn", "sends", "queries", "x"): "dense query features: only for features of "
    "density >= SPARSE_DENSITY (the small graphs' are sparser): test_dense_queries_...",
}


def test_dense_queries_are_what_the_protocol_says():
    """The dense encoding of the queries' features (``x``), which the runs' sparse features
    never take, against the protocol."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from fedgraph.methods.privgnn.queries import QueryGraphs, encode_queries

    hoods = QueryGraphs(
        torch.ones(5, 3),
        torch.tensor([[0, 1], [1, 0]]),
        torch.tensor([0, 2, 5]),
        torch.tensor([0, 2]),
    )
    arrays = encode_queries(hoods)
    assert "x" in arrays and "x_index" not in arrays
    content = RecordDict({"config": ConfigRecord({"json": "{}"}), "queries": ArrayRecord(arrays)})
    problems, seen = check_content(MESSAGES["query.privgnn"].sends, content, "query.privgnn")
    assert not problems and ("queries", "x") in seen, problems


def test_the_runs_use_every_message_type_and_key():
    """Nothing in the protocol is dead: every message type, record and named key occurs in
    one of the runs (patterns, e.g. a state dict, and :data:`NOT_IN_THE_RUNS` excepted)."""
    seen = set()
    for name in RUNS:
        for request, reply in recorded_run(name)[1]:
            mtype = request.metadata.message_type
            spec = MESSAGES[mtype]
            for side, content, msg in (
                ("sends", spec.sends, request),
                ("replies", spec.replies, reply),
            ):
                seen |= {
                    (mtype, side, r, k)
                    for r, k in check_content(content, msg.content, mtype, request.content)[1]
                }
    missing = []
    for m in MESSAGES.values():
        for side in ("sends", "replies"):
            for r in getattr(m, side).records:
                missing += [] if (m.type, side, r.name, "") in seen else [(m.type, side, r.name)]
                missing += [
                    (m.type, side, r.name, f.name)
                    for f in r.fields
                    if "*" not in f.name and (m.type, side, r.name, f.name) not in seen
                ]
    assert set(missing) == set(NOT_IN_THE_RUNS), set(missing) ^ set(NOT_IN_THE_RUNS)
