import pytest
import torch

from fedgraph.nn import flexprop_weights, weighted_propagation


def _graph():
    g = torch.Generator().manual_seed(0)
    n = 50
    ei = torch.randint(0, n, (2, 300), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    from torch_geometric.utils import coalesce

    return n, coalesce(torch.cat([ei, ei.flip(0)], 1), num_nodes=n)


def _dense_pi(n, ei, w, self_loops=False):
    """Eq. 12 as a dense matrix: a[i, j] = 1 if j -> i (and, with self loops, j = i); a row
    without any neighbour keeps the node itself."""
    a = torch.eye(n, dtype=torch.float64) if self_loops else torch.zeros(n, n, dtype=torch.float64)
    a[ei[1], ei[0]] = 1.0
    lonely = a.sum(1) == 0
    a[lonely, lonely] = 1.0
    pi = a * w.view(1, -1)
    return pi / pi.sum(1, keepdim=True)


@pytest.mark.parametrize("self_loops", [False, True])
def test_flexprop_matches_eq12_and_rows_sum_to_one(self_loops):
    n, ei = _graph()
    levels = torch.randint(1, 4, (n,), generator=torch.Generator().manual_seed(1))
    w = flexprop_weights(levels, [1.0, 2.0, 4.0], "level")
    pi = _dense_pi(n, ei, w, self_loops)
    assert torch.allclose(pi.sum(1), torch.ones(n, dtype=torch.float64))
    # Rows of the implied Pi sum to 1: propagating a constant keeps it constant.
    ones = torch.ones(n, 3, dtype=torch.float64)
    assert torch.allclose(weighted_propagation(ones, ei, 5, w, self_loops), ones)
    x = torch.randn(n, 4, dtype=torch.float64)
    expect = x
    for _ in range(3):
        expect = pi @ expect
    got = weighted_propagation(x, ei, 3, w, self_loops)
    assert torch.allclose(got, expect)


def test_default_propagation_excludes_the_node_and_keeps_isolated_nodes():
    """Eq. 12 / LPGNN's KProp: one step is the mean of the neighbours only (a self loop in the
    input is ignored); a node without neighbours keeps its own features."""
    ei = torch.tensor([[1, 2, 0, 0, 3], [0, 0, 1, 2, 3]])  # 3 has only a self loop, 4 nothing
    x = torch.tensor([[1.0], [10.0], [100.0], [7.0], [5.0]], dtype=torch.float64)
    got = weighted_propagation(x, ei, 1, None)
    assert got.view(-1).tolist() == [55.0, 1.0, 1.0, 7.0, 5.0]
    with_self = weighted_propagation(x, ei, 1, None, self_loops=True)
    assert torch.allclose(
        with_self.view(-1), torch.tensor([37.0, 5.5, 50.5, 7.0, 5.0], dtype=torch.float64)
    )


def test_kprop_is_uniform_mean_and_inverse_variance_prefers_high_budgets():
    n, ei = _graph()
    x = torch.randn(n, 2, dtype=torch.float64)
    pi = _dense_pi(n, ei, torch.ones(n, dtype=torch.float64))
    assert torch.allclose(weighted_propagation(x, ei, 1, None), pi @ x)
    assert torch.equal(weighted_propagation(x, ei, 0, None), x)
    w = flexprop_weights(torch.tensor([1, 2, 3]), [1.0, 2.0, 4.0], "inverse-variance", 100, 0.9)
    assert bool((w[1:] > w[:-1]).all())


def test_ppgnn_server_fit_with_posterior_flexprop_weights():
    """weights = "posterior" (expected inverse variance given the decoded level) runs end to
    end in the server half and learns (synthetic SBM with class-dependent features)."""
    from fedgraph.config import parse_run_config
    from fedgraph.federation import load_federated
    from fedgraph.methods import ppgnn

    cfg = parse_run_config(
        {
            "dataset": "synthetic-sbm:600:4",
            "num-clients": 1,
            "seed": 0,
            "budgets": "1,2,4",
            "mechanism": "ppm",
            "denoiser": "flexprop",
            "weights": "posterior",
            "epochs": 50,
        }
    )
    data, clients = load_federated(cfg, cfg.budgets, cfg.shares)
    num_classes = int(data.y.max()) + 1
    rep = ppgnn.client_report(
        clients[0], cfg, data.feature_domain, num_classes, torch.Generator().manual_seed(0)
    )
    fit = ppgnn.server_fit([rep], cfg, data.num_nodes, data.num_features, num_classes)
    c = clients[0]
    acc = float((fit.predictions[c.test_mask] == c.y[c.test_mask]).float().mean())
    majority = float(torch.bincount(c.y[c.test_mask]).max()) / int(c.test_mask.sum())
    assert acc > majority + 0.2, (acc, majority)
