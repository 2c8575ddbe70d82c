"""Federated GAP: what leaves a client is noised, partial sums add up, calibration per client."""

import json
import math
from pathlib import Path

import pytest
import torch

from fedgraph.config import parse_run_config
from fedgraph.methods.gap.client_pma import client_edges, pma_finish, pma_partial_sums
from fedgraph.methods.gap.privacy import plan_events, privacy_plan
from fedgraph.nn.gap import normalize_rows

SHARED = Path(__file__).parents[2] / "shared" / "data"


def _toy_client(n=40, e=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    local = torch.randint(0, n, (2, 200), generator=g)
    boundary = torch.stack(
        [torch.randint(0, n, (60,), generator=g), 1000 + torch.randint(0, 15, (60,), generator=g)]
    )
    h = normalize_rows(torch.randn(n, e, generator=g))
    return h, local, boundary


def test_released_partial_sums_are_noised_with_std_sigma():
    """Every row that leaves the client (remote partial sums) carries N(0, sigma^2) noise: the
    residual against the clean sums has std sigma (chi-square bound below) and no row is clean."""
    h, local, boundary = _toy_client()
    sigma = 0.7
    clean_local, ids, clean_remote = pma_partial_sums(h, local, boundary, 0.0, torch.Generator())
    resid = []
    for s in range(500):
        loc, ids2, rem = pma_partial_sums(
            h, local, boundary, sigma, torch.Generator().manual_seed(s)
        )
        assert torch.equal(ids, ids2)
        assert not bool(((rem - clean_remote).abs().sum(1) == 0).any()), "a released row is clean"
        resid.append(rem - clean_remote)
        resid.append(loc - clean_local)
    r = torch.cat([x.flatten() for x in resid]).double()
    # n >= 2e5 draws: the sample std of a Gaussian is within 1% of sigma with prob > 1 - 1e-6.
    assert r.numel() > 2e5
    assert abs(float(r.std()) / sigma - 1) < 0.01
    assert abs(float(r.mean())) < 5 * sigma / math.sqrt(r.numel())


def test_released_ids_do_not_depend_on_the_edges():
    """The set of remote rows a client releases is fixed by who holds which node, never by its
    edges: two clients with different boundary edges release the same ids."""
    h, local, boundary = _toy_client()
    remote = torch.arange(1000, 1015)
    _, ids_a, _ = pma_partial_sums(
        h, local, boundary, 0.5, torch.Generator().manual_seed(0), remote
    )
    _, ids_b, _ = pma_partial_sums(
        h, local, boundary[:, :3], 0.5, torch.Generator().manual_seed(0), remote
    )
    assert torch.equal(ids_a, remote) and torch.equal(ids_b, remote)
    with pytest.raises(ValueError, match="every boundary target"):
        pma_partial_sums(h, local, boundary, 0.5, torch.Generator(), remote[:3])


def test_partial_sums_from_two_clients_reassemble_the_central_aggregate():
    """Without noise, a node's local sum plus the partial sums received equals the sum over all
    its in-neighbours, and pma_finish row-normalizes."""
    g = torch.Generator().manual_seed(3)
    n, e = 30, 4
    edges = torch.randint(0, n, (2, 150), generator=g)
    h = normalize_rows(torch.randn(n, e, generator=g))
    owner = torch.arange(n) % 2
    ids = [torch.nonzero(owner == c).flatten() for c in (0, 1)]
    local_id = torch.empty(n, dtype=torch.long)
    for c in (0, 1):
        local_id[ids[c]] = torch.arange(ids[c].numel())
    out = {}
    sums = {}
    for c in (0, 1):
        mine = owner[edges[0]] == c
        loc = mine & (owner[edges[1]] == c)
        bnd = mine & (owner[edges[1]] != c)
        local = local_id[edges[:, loc]]
        boundary = torch.stack([local_id[edges[0, bnd]], edges[1, bnd]])
        sums[c] = pma_partial_sums(h[ids[c]], local, boundary, 0.0, g)
    for c in (0, 1):
        other = sums[1 - c]
        out[c] = pma_finish(sums[c][0], ids[c], other[1], other[2])
    central = torch.zeros(n, e).index_add_(0, edges[1], h[edges[0]])
    central = normalize_rows(central)
    for c in (0, 1):
        assert torch.allclose(out[c], central[ids[c]], atol=1e-6)
    with pytest.raises(ValueError, match="does not hold"):
        pma_finish(sums[0][0], ids[0], torch.tensor([ids[1][0]]), torch.zeros(1, e))


def test_each_client_calibrates_its_own_epsilon():
    cfg = parse_run_config({"method": "gap", "client-epsilons": "1,8", "hops": 2, "delta": 1e-7})
    p1 = privacy_plan(cfg, cfg.client_epsilon(0), 100)
    p8 = privacy_plan(cfg, cfg.client_epsilon(1), 100)
    assert p1.noise_multiplier > p8.noise_multiplier > 0
    from fedgraph.accounting import compose_epsilon

    for p, target in ((p1, 1.0), (p8, 8.0)):
        events = [e for _, e in plan_events(p.to_dict())]
        eps = compose_epsilon(events, 1e-7, accountant="pld")  # independent of the calibration
        assert eps <= target * 1.01 and eps >= target * 0.97
    undirected = privacy_plan(
        parse_run_config({"method": "gap", "edge-unit": "undirected"}), 4.0, 10
    )
    assert undirected.sensitivity == pytest.approx(math.sqrt(2))
    assert (
        privacy_plan(parse_run_config({"method": "gap", "variant": "gap-inf"}), 4.0, 10).sigma == 0
    )


def test_node_level_bounds_out_degree_over_local_and_boundary_edges():
    cfg = parse_run_config({"method": "gap", "level": "node", "max-degree": 3})

    class C:
        pass

    c = C()
    h, c.edge_index, c.boundary_edge_index = _toy_client()
    c.num_nodes = h.shape[0]
    local, boundary = client_edges(c, cfg, torch.Generator().manual_seed(0))
    out_deg = torch.bincount(torch.cat([local[0], boundary[0]]), minlength=c.num_nodes)
    assert int(out_deg.max()) <= 3
    assert bool((boundary[1] >= 1000).all())  # remote ids survive the bounding


@pytest.mark.skipif(
    not (SHARED / "facebook100" / "Caltech36.mat").exists(), reason="needs ../shared/data"
)
def test_gap_flower_run_two_clients(tmp_path):
    """Two clients with their own epsilon targets, through Flower, with an adaptive server
    optimizer (Flower's FedAdam, kept strict) and secure aggregation of the remote rows (each
    client adds the larger client's sigma); the default FedAvg without secure aggregation runs
    in the other e2e tests."""
    import os
    import subprocess
    import sys

    out = tmp_path / "runs"
    env = {**os.environ, "FEDGRAPH_DATA": str(SHARED), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedgraph.simulations.cli",
            "run",
            "gap-edge-caltech",
            "--num-cpus",
            "2",
            "--set",
            "num-clients=2",
            "--set",
            "client-epsilons='2,8'",
            "--set",
            "encoder-rounds=3",
            "--set",
            "classifier-rounds=3",
            "--set",
            "server-optimizer=fedadam",
            "--set",
            "secure-aggregation=true",
            "--set",
            f"output-dir='{out}'",
            "--set",
            "run-name='gap'",
        ],
        cwd=Path(__file__).parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "gap.json").read_text())
    per = report["privacy"]["per_subject"]
    assert per["client-0"]["epsilon"] == pytest.approx(2.0, rel=0.01)
    assert per["client-1"]["epsilon"] == pytest.approx(8.0, rel=0.01)
    assert all(per[c]["cross_check"]["agrees"] for c in per)
    assert report["accuracy"]["test"] > report["ground_truth"]["majority_class"]
    assert report["config"]["server_optimizer"] == "fedadam"
    # both of Flower's client actors were the ones started while the driver imported
    assert report["host"]["prestarted_actors"] == 2  # (fedgraph.simulations.early_ray)
    assert "classifier rounds (FedAdam)" in report["timings_s"]
    clients = report["clients"]
    sigma_max = max(c["sigma"] for c in clients.values())
    assert f"{sigma_max:.4g}" in report["privacy"]["aggregation"]  # n - 1 = 1: share = sigma_max
