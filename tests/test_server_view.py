"""The curious server of issue 28: with everything it receives (the run config, its own
messages, the replies), it tries each of the audit's attacks and must learn nothing beyond
the guarantee. One test per fault; each failed on a730c48.

1. whole-graph statistics in the replies and the report (an edge, a test label detected);
2. PPGNN's levels recomputed from the public run config;
3. ``noise-source = "secret"`` repeating its noise on data that differ in one edge;
5. node level stated for the degree-bounded graph with public node ids;
6. the SAGE-DP baseline's DP-SGD normaliser from a public count.
(Fault 4, the default generator, is ``tests/test_randomness.py``'s.)
"""

from __future__ import annotations

import json

import pytest
import torch

from fedgraph import randomness
from fedgraph.data import register_dataset
from fedgraph.simulations.local import LocalGrid, run_local

SECRET = "server-view-test-secret"
#: what a client may say about the dataset (fedgraph.federation.SCHEMA_FIELDS)
SCHEMA_FIELDS = ("name", "num_nodes", "num_features", "num_classes")
GAP = {
    "method": "gap",
    "num-clients": 2,
    "partitioner": "random",
    "hops": 1,
    "encoder-rounds": 1,
    "classifier-rounds": 1,
    "encoder-dim": 8,
    "hidden": 8,
    "client-epsilons": "4",
    "seed": 5,
}
PPGNN = {"method": "ppgnn", "num-clients": 2, "partitioner": "random", "epochs": 3, "seed": 5}


@pytest.fixture(autouse=True)
def _unregister_afterwards():
    """The test graphs are unregistered after each test (other tests list the registry)."""
    from fedgraph.data.datasets import DATASETS

    yield
    for name in [n for n in DATASETS if n.startswith("sv-cora")]:
        DATASETS.pop(name)


def _cora():
    from fedgraph.data import load_dataset

    return load_dataset("cora")


def _register(name: str, change=None) -> str:
    """Register Cora, changed by ``change(data)`` (in place), under ``name``; the views kept
    within this process are dropped, so a run of the same name (one run config: the run digest
    the same) reads the new graph (the partition cache keys on its content)."""
    from fedgraph import federation

    def loader(root):
        data = _cora().clone()
        if change is not None:
            change(data)
        return data

    register_dataset(name, loader, replace=True)
    federation._client_views.cache_clear()
    return name


def _cross_client_edge(cfg_dict: dict) -> tuple[int, int]:
    """An undirected edge of Cora whose ends the ``random`` partition puts on different
    clients (the partition depends on the seed and the node count only)."""
    from fedgraph.config import parse_run_config
    from fedgraph.federation import load_federated

    cfg = parse_run_config({**cfg_dict, "dataset": _register("sv-cora")})
    _, clients = load_federated(cfg)
    owner = torch.empty(2708, dtype=torch.long)
    for c in clients:
        owner[c.node_ids] = c.client_id
    ei = _cora().edge_index
    cross = (owner[ei[0]] != owner[ei[1]]) & (ei[0] < ei[1])
    u, v = ei[:, cross.nonzero()[0, 0]].tolist()
    return u, v


def _without_edge(u: int, v: int):
    def change(data):
        ei = data.edge_index
        keep = ~(((ei[0] == u) & (ei[1] == v)) | ((ei[0] == v) & (ei[1] == u)))
        data.edge_index = ei[:, keep]

    return change


def _run(config: dict, tmp_path, name: str):
    grid = LocalGrid(config["num-clients"], record=True)
    report = run_local({**config, "output-dir": str(tmp_path), "run-name": name}, grid=grid)
    assert report["status"] == "ok", report.get("error")
    return report, grid


def _meta(grid, message_type: str) -> list[dict]:
    return [
        dict(reply.content["meta"])
        for m, reply in grid.log
        if m.metadata.message_type == message_type
    ]


# ------------------------------------------------------------------------------- fault 1
def test_one_edge_is_not_detected_in_replies_or_report(tmp_path):
    """Edge level, Cora: removing one undirected cross-client edge changed ``num_edges``
    (10556 -> 10554) in every client's ``gap_setup`` reply and in the report."""
    u, v = _cross_client_edge(GAP)
    d = {**GAP, "dataset": _register("sv-cora")}
    d2 = {**GAP, "dataset": _register("sv-cora-edge", _without_edge(u, v))}
    rep, grid = _run(d, tmp_path, "d")
    rep2, grid2 = _run(d2, tmp_path, "d2")
    meta, meta2 = _meta(grid, "query.gap_setup"), _meta(grid2, "query.gap_setup")
    for a, b in zip(meta, meta2):
        assert "statistics" not in a
        assert a["schema"] == b["schema"] and a["plan"] == b["plan"]
        assert set(json.loads(a["schema"])) == set(SCHEMA_FIELDS)
    assert set(rep["dataset"]) == set(SCHEMA_FIELDS)
    assert {k: v for k, v in rep["dataset"].items() if k != "name"} == {
        k: v for k, v in rep2["dataset"].items() if k != "name"
    }
    # the simulation's ground truth sees the edge, labelled as such
    assert (
        rep["ground_truth"]["dataset"]["num_edges"]
        == rep2["ground_truth"]["dataset"]["num_edges"] + 2
    )
    assert "never sent by a client" in rep["ground_truth"]["note"]
    from fedgraph.federation import SCHEMA_FIELDS as fields

    assert tuple(fields) == SCHEMA_FIELDS


def test_a_test_users_label_does_not_leave_ppgnn_clients(tmp_path, monkeypatch):
    """PPGNN, label-epsilon 0.5: one test user's label changed ``class_counts`` (817/427 vs
    818/426) in the replies and the report. With the same noise on both sides, every field
    of every reply is identical."""
    from fedgraph.config import parse_run_config
    from fedgraph.federation import load_federated

    monkeypatch.setenv(randomness.SECRET_ENV, SECRET)
    # the same noise on both sides (one run config; the data digest held fixed)
    monkeypatch.setattr(randomness, "client_data_digest", lambda *a, **k: "fixed", raising=False)
    base = {**PPGNN, "label-epsilon": 0.5, "noise-source": "secret"}
    data, _ = load_federated(parse_run_config({**base, "dataset": _register("sv-cora")}))
    node = int(data.test_mask.nonzero()[0, 0])
    label = int(data.y[node])

    def flip(d):
        d.y = d.y.clone()
        d.y[node] = (label + 1) % 7

    _, grid = _run({**base, "dataset": _register("sv-cora")}, tmp_path, "p")
    _, grid2 = _run({**base, "dataset": _register("sv-cora", flip)}, tmp_path, "p2")
    queries = [(m, r) for m, r in grid.log if m.metadata.message_type == "query.ppgnn"]
    queries2 = [(m, r) for m, r in grid2.log if m.metadata.message_type == "query.ppgnn"]
    assert len(queries) == len(queries2) == 2
    for (_, a), (_, b) in zip(queries, queries2):
        meta_a, meta_b = dict(a.content["meta"]), dict(b.content["meta"])
        assert meta_a.keys() == meta_b.keys()
        for k in meta_a.keys() - {"worker"}:
            assert meta_a[k] == meta_b[k], k
        ra, rb = (
            a.content["report"].to_torch_state_dict(),
            b.content["report"].to_torch_state_dict(),
        )
        assert ra.keys() == rb.keys()
        for k in ra:
            assert torch.equal(ra[k], rb[k]), k


# ------------------------------------------------------------------------------- fault 2
def _levels_used(config, tmp_path, monkeypatch, name) -> torch.Tensor:
    """The levels the clients' users drew (captured inside the handler: never sent)."""
    from fedgraph.methods.ppgnn import client as ppgnn

    seen = {}
    real = ppgnn.client_report

    def spy(client, *args, **kwargs):
        seen[client.client_id] = (client.node_ids, client.levels)
        return real(client, *args, **kwargs)

    monkeypatch.setattr(ppgnn, "client_report", spy)
    _run(config, tmp_path, name)
    levels = torch.zeros(2708, dtype=torch.long)
    for ids, lv in seen.values():
        levels[ids] = lv
    return levels


@pytest.mark.parametrize("source", ["default", "secret"])
def test_the_server_cannot_recompute_ppgnn_levels_from_the_run_config(
    tmp_path, monkeypatch, source
):
    """``assign_privacy_levels(num_nodes, budgets, shares, seed)`` recomputed every user's
    level (Cora 2708 of 2708). The levels are drawn on the clients now: the server's best
    recomputation from the config agrees at chance (1/3 for three equal shares), and two runs
    with one config draw different levels."""
    from fedgraph.data import assign_privacy_levels

    config = {**PPGNN, "dataset": "cora"}
    if source == "secret":
        monkeypatch.setenv(randomness.SECRET_ENV, SECRET)
        config["noise-source"] = "secret"
    levels = _levels_used(config, tmp_path, monkeypatch, "l1")
    assert set(levels.unique().tolist()) == {1, 2, 3}
    budgets = [1.0, 2.0, 4.0]
    guess = assign_privacy_levels(2708, budgets, None, seed=config["seed"])
    agree = float((guess == levels).float().mean())
    assert agree < 0.40, agree  # chance: 1/3; the old code: 1.0
    if source == "secret":  # reproducible from the client's secret, not from the config
        monkeypatch.setenv(randomness.SECRET_ENV, SECRET + "-other")
    again = _levels_used(config, tmp_path, monkeypatch, "l2")
    assert float((again == levels).float().mean()) < 0.40


# ------------------------------------------------------------------------------- fault 3
def _pma_rows(grid) -> dict[int, torch.Tensor]:
    out = {}
    for m, reply in grid.log:
        if m.metadata.message_type == "query.gap_pma":
            rec = reply.content["partial_sums"].to_torch_state_dict()
            if rec["ids"].numel():
                out[m.metadata.dst_node_id] = rec["sums"][rec["ids"].argsort()]
    return out


def test_secret_noise_is_fresh_when_only_the_data_change(tmp_path, monkeypatch):
    """Two ``secret`` runs, one config, one secret, graphs differing by one cross-client edge:
    the releases' difference was exactly 1.000 in that edge's two rows and ~1e-7 elsewhere.
    Now the keys cover the client's data: the difference is noise-sized everywhere; the same
    data still give the same release."""
    monkeypatch.setenv(randomness.SECRET_ENV, SECRET)
    u, v = _cross_client_edge(GAP)
    base = {**GAP, "noise-source": "secret"}
    _, grid = _run({**base, "dataset": _register("sv-cora")}, tmp_path, "s1")
    _, same = _run({**base, "dataset": _register("sv-cora")}, tmp_path, "s2")
    _, other = _run(
        {**base, "dataset": _register("sv-cora", _without_edge(u, v))}, tmp_path, "s3"
    )  # the same run config: only the data differ
    rows, rows_same, rows_other = _pma_rows(grid), _pma_rows(same), _pma_rows(other)
    assert rows.keys() == rows_other.keys() and rows
    for node in rows:
        assert torch.allclose(rows[node], rows_same[node], atol=1e-4)  # reproducible
        diff = (rows[node] - rows_other[node]).norm(dim=1)
        # independent noise: almost every row moves by about sigma * sqrt(2 dim), none by ~0
        assert float(diff.median()) > 1.0, float(diff.median())
        assert float((diff < 1e-3).float().mean()) < 0.01


# ------------------------------------------------------------------------------- fault 5
def test_node_level_states_the_degree_bounded_unit_and_public_ids():
    from fedgraph.config import parse_run_config
    from fedgraph.strategies.gap import _privacy_model

    cfg = parse_run_config({"method": "gap", "level": "node", "max-degree": 10})
    model = _privacy_model(cfg, {"sensitivity": 3.46, "hops": 2})
    assert "degree-bounded graph" in model and "node ids public" in model
    assert "raw graph" in model  # and where the bound does not hold


# ------------------------------------------------------------------------------- fault 6
def test_sage_dp_normaliser_is_the_public_count(monkeypatch):
    """Opacus divides the noisy sum by ``expected_batch_size``: it comes from ``num_public``,
    not from the rows the mask holds."""
    from opacus.optimizers import DPOptimizer

    from fedgraph.methods.gap import train_sage_dp
    from fedgraph.nn.gap import MLP

    seen = []
    real_init = DPOptimizer.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs["expected_batch_size"])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(DPOptimizer, "__init__", spy)
    x, y = torch.randn(30, 4), torch.randint(0, 2, (30,))
    mask = torch.zeros(30, dtype=torch.bool)
    mask[:19] = True  # 19 rows used, 20 public
    train_sage_dp(
        MLP(4, 8, 2, 2, 0.0, False),
        x,
        y,
        mask,
        epochs=1,
        batch_size=None,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        num_public=20,
    )
    assert seen == [20]


def test_the_strategy_never_sees_the_ground_truth(tmp_path):
    """The harness's whole-graph statistics reach the report only after ``run`` (a fresh
    user's finding: attached before ``start``, a strategy could read them)."""
    from fedgraph.federation import preflight
    from fedgraph.simulations.server_app import validate_run_config
    from fedgraph.strategies.gap import GAPStrategy

    seen = []

    class Peek(GAPStrategy):
        def run(self, grid):
            seen.append(
                (getattr(self, "ground_truth", None), self.report.extra.get("ground_truth"))
            )
            super().run(grid)

    _, cfg = validate_run_config(
        {**GAP, "dataset": "cora", "output-dir": str(tmp_path), "run-name": "peek"}
    )
    report = Peek(cfg).start(LocalGrid(2), ground_truth=preflight(cfg))
    assert seen == [(None, None)]
    assert report["ground_truth"]["dataset"]["num_edges"] == 10556


def test_mt19937_runs_say_so_in_the_printed_table():
    from fedgraph.report import format_table

    report = {
        "method": "gap",
        "status": "ok",
        "dataset": {"name": "cora"},
        "accuracy": {},
        "privacy": {"noise_source": "mt19937", "per_subject": {}},
    }
    assert "not a CSPRNG" in format_table(report)
    report["privacy"]["noise_source"] = "secure"
    assert "CSPRNG" not in format_table(report)


def test_client_drawn_levels_keep_the_configured_shares():
    """``draw_privacy_levels``: exactly the largest-remainder counts of the shares, in an order
    that depends on the client's generator only (not on a seed in the run config)."""
    from fedgraph.data import assign_privacy_levels, draw_privacy_levels

    budgets, shares = [1.0, 2.0, 4.0], [0.5, 0.3, 0.2]
    a = draw_privacy_levels(101, budgets, shares, randomness.SecureRandom(b"\1" * 32))
    b = draw_privacy_levels(101, budgets, shares, randomness.SecureRandom(b"\2" * 32))
    same = draw_privacy_levels(101, budgets, shares, randomness.SecureRandom(b"\1" * 32))
    want = torch.bincount(assign_privacy_levels(101, budgets, shares), minlength=4)
    assert torch.equal(torch.bincount(a, minlength=4), want)
    assert torch.equal(a, same) and not torch.equal(a, b)
