"""What the server sees of ProGAP (issues 28 and 33), on Cora graphs that differ in one
cross-client edge: the setup replies and the report's dataset are the same (no edge count
leaves a client), and one aggregation release, with the noise held fixed, moves by at most
the plan's sensitivity jointly over the clients (the neighbouring-input property of the
ledgered ``aggregation`` event)."""

import json

import pytest
import torch
from test_server_view import (
    SCHEMA_FIELDS,
    _cross_client_edge,
    _meta,
    _register,
    _run,
    _unregister_afterwards,  # noqa: F401 (the fixture)
    _without_edge,
)

PROGAP = {
    "method": "progap",
    "num-clients": 2,
    "partitioner": "random",
    "depth": 1,
    "epochs": 1,
    "hidden": 8,
    "client-epsilons": "4",
    "seed": 5,
    "min-class-size": 1,
    "device": "cpu",
}


@pytest.fixture(scope="module", autouse=True)
def _threads():
    torch.set_num_threads(1)


def test_one_edge_is_not_detected_in_progap_setup_or_report(tmp_path):
    u, v = _cross_client_edge(PROGAP)
    rep, grid = _run({**PROGAP, "dataset": _register("sv-cora")}, tmp_path, "d")
    rep2, grid2 = _run(
        {**PROGAP, "dataset": _register("sv-cora-edge", _without_edge(u, v))}, tmp_path, "d2"
    )
    meta, meta2 = _meta(grid, "query.progap_setup"), _meta(grid2, "query.progap_setup")
    assert len(meta) == 2
    for a, b in zip(meta, meta2):
        assert a["schema"] == b["schema"] and a["plan"] == b["plan"]
        assert set(json.loads(a["schema"])) == set(SCHEMA_FIELDS)
    assert {k: x for k, x in rep["dataset"].items() if k != "name"} == {
        k: x for k, x in rep2["dataset"].items() if k != "name"
    }
    assert (
        rep["ground_truth"]["dataset"]["num_edges"]
        == rep2["ground_truth"]["dataset"]["num_edges"] + 2
    )
    for i in range(2):  # every client's epsilon recomputed from the ledger, within its target
        assert float(rep["privacy"]["per_subject"][f"client-{i}"]["epsilon"]) <= 4 * (1 + 1e-6)


def test_an_aggregation_release_moves_by_at_most_the_sensitivity():
    from fedgraph.config import parse_run_config
    from fedgraph.federation import client_view
    from fedgraph.methods.progap.client import build_model, client_plan, release, stage_model

    u, v = _cross_client_edge(PROGAP)
    rows = []
    for name, change in (("sv-cora", None), ("sv-cora-edge", _without_edge(u, v))):
        cfg = parse_run_config({**PROGAP, "dataset": _register(name, change)})
        torch.manual_seed(0)
        weights = build_model(cfg, 1433, 7).state_dict()
        out = {}
        for pid in range(2):
            view = client_view(cfg, pid)
            model, x = stage_model(cfg, view, 0, weights, [])
            local, rel = release(
                cfg,
                pid,
                view,
                model,
                x,
                remote_sigma=None,
                contributors=None,
                secagg=None,
                generator=lambda p: torch.Generator().manual_seed(1),
            )
            out[pid] = (local, rel["sums"])
        rows.append((out, client_plan(cfg, 0, client_view(cfg, 0))))
    (d, plan), (d2, _) = rows
    diff2 = sum(float((d[p][k] - d2[p][k]).pow(2).sum()) for p in range(2) for k in range(2))
    assert 0.5 < diff2**0.5 <= plan.sensitivity + 1e-5  # sqrt 2: the two halves
    # each client's released remote rows move by at most 1 (one half)
    for p in range(2):
        assert float((d[p][1] - d2[p][1]).norm()) <= 1 + 1e-5
