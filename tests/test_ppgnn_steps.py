"""PPGNN's server trained per K (fit_each_steps) and issue 18's K-sweep bench on top of it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedgraph.config import parse_run_config
from fedgraph.federation import load_federated
from fedgraph.methods import ppgnn

ROOT = Path(__file__).parents[1]


def _reports(steps: str, **extra):
    cfg = parse_run_config(
        {
            "dataset": "synthetic-sbm:400:4",
            "num-clients": 1,
            "seed": 3,
            "budgets": "1,2,4",
            "mechanism": "ppm",
            "denoiser": "flexprop",
            "steps": steps,
            "epochs": 15,
            **extra,
        }
    )
    data, clients = load_federated(cfg, cfg.budgets, cfg.shares)
    rep = ppgnn.client_report(
        clients[0],
        cfg,
        data.feature_domain,
        int(data.y.max()) + 1,
        torch.Generator().manual_seed(0),
    )
    return cfg, data, rep


def test_each_k_equals_a_run_with_that_k_alone_and_server_fit_selects_on_validation():
    cfg, data, rep = _reports("0,1,3")
    c = int(data.y.max()) + 1
    fits = list(ppgnn.fit_each_steps([rep], cfg, data.num_nodes, data.num_features, c))
    assert [f.train.steps for f in fits] == [0, 1, 3]
    alone = ppgnn.server_fit(
        [rep], cfg.model_copy(update={"steps": [3]}), data.num_nodes, data.num_features, c
    )
    assert torch.allclose(fits[2].features, alone.features, atol=1e-5)
    assert torch.equal(fits[2].predictions, alone.predictions)
    chosen = ppgnn.server_fit([rep], cfg, data.num_nodes, data.num_features, c)
    best = max(fits, key=lambda f: f.train.val_accuracy)  # first of ties: the smaller K
    assert chosen.train.steps == best.train.steps
    assert torch.equal(chosen.predictions, best.predictions)


@pytest.mark.parametrize("self_loops", [False, True])
def test_self_loops_key_reaches_the_propagation(self_loops):
    from fedgraph.nn import weighted_propagation

    cfg, data, rep = _reports("2", **{"self-loops": self_loops})
    c = int(data.y.max()) + 1
    fit = ppgnn.server_fit([rep], cfg, data.num_nodes, data.num_features, c)
    mech = ppgnn.build_mechanism(cfg)
    x_hat, level_hat, *_ = ppgnn.assemble([rep], mech, data.num_nodes, data.num_features)
    from fedgraph.mechanisms.ppm import PPMParams, posterior_inverse_variance

    w = posterior_inverse_variance(
        level_hat, PPMParams(tuple(cfg.budgets), cfg.gamma, None), data.num_features
    )
    for loops in (self_loops, not self_loops):
        h = weighted_propagation(x_hat, fit.edge_index, 2, w, loops)
        h = (h - h.mean(0)) / h.std(0).clamp_min(1e-6)
        assert torch.allclose(h, fit.features, atol=1e-5) == (loops == self_loops)


def test_k_sweep_bench_tables(tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ppgnn_table.py"),
            "--datasets",
            "synthetic-sbm:300:4",
            "--steps",
            "0",
            "2",
            "--seeds",
            "2",
            "--out",
            str(out),
            "--set",
            "epochs=5",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    ds = "synthetic-sbm:300:4"
    for name in ("B: LPGNN eps=1 (all)", "ref: LPGNN eps=4 (all)", "B: PPGNN E={1,2,4} posterior"):
        for k in (0, 2):
            row = results[f"{ds} | {name} | K={k}"]
            assert row["seeds"] == [0, 1] and len(row["runs"]) == len(row["val_runs"]) == 2
    # no propagation: K = 0 only, and PPGNN at K = 0 is BASE (the same reports, undenoised)
    assert f"{ds} | B: BASE E={{1,2,4}} | K=2" not in results
    assert (
        results[f"{ds} | B: BASE E={{1,2,4}} | K=0"]["runs"]
        == results[f"{ds} | B: PPGNN E={{1,2,4}} posterior | K=0"]["runs"]
    )
    assert "| setting | K = 0 | K = 2 |" in proc.stdout
    assert "| Δ PPGNN - LPGNN eps=1 (points) |" in proc.stdout
    merged = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ppgnn_table.py"),
            "--merge",
            str(out),
            "--out",
            str(tmp_path / "m.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert "| setting | K = 0 | K = 2 |" in merged.stdout
