"""GAP paper baselines (issue #3 item 4): GraphSAGE without DP and with DP-SGD at node level,
and the benchmark's config names for them and for MLP-DP."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import coalesce

from fedgraph.methods.gap import (
    mean_aggregate,
    run_gap,
    sage_dp_events,
    sage_dp_features,
    sage_dp_sensitivity,
)
from fedgraph.nn.gap import MLP
from fedgraph.utils import bound_out_degree, in_degree, out_degree


@pytest.fixture(scope="module")
def cora():
    from fedgraph.data import gap_split, load_dataset

    return gap_split(load_dataset("cora"), 0)  # bundled copy, 75/10/15 split


def _majority(data, mask):
    return float(torch.bincount(data.y[mask]).max()) / int(mask.sum())


def _gaussian_epsilon(s: float, delta: float) -> float:
    """Epsilon of the Gaussian mechanism with noise multiplier ``s`` at ``delta``, from the exact
    privacy profile (Balle & Wang 2018, Thm. 8):
    delta(eps) = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s))."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(eps):
        return (
            norm.cdf(-eps * s + 1 / (2 * s))
            - math.exp(eps + norm.logcdf(-eps * s - 1 / (2 * s)))
            - delta
        )

    return brentq(excess, 0.0, 200.0, xtol=1e-12)


def test_sage_without_dp_beats_majority_on_cora(cora):
    # seen: test 0.887 at 30 epochs (majority 0.278), about 3 s
    r = run_gap(cora, method="sage", level="edge", classifier_epochs=30, seed=0)
    assert r["method"] == "sage" and r["epsilon_spent"] == math.inf
    assert r["config"]["num_hops"] == 2 and r["config"]["batch_norm"] is True
    assert r["test_acc"] > _majority(cora, cora.test_mask) + 0.4
    assert 1 <= r["classifier_best_epoch"] <= 30


def test_sage_dp_gives_opacus_the_group_sensitivity_and_epsilon_is_exact_gaussian(
    cora, monkeypatch
):
    import opacus.optimizers

    made = []

    class Spy(opacus.optimizers.DPOptimizer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", Spy)
    d, c, eps = 5, 0.7, 8.0
    r = run_gap(
        cora,
        method="sage",
        level="node",
        epsilon=eps,
        max_degree=d,
        max_grad_norm=c,
        classifier_epochs=3,
        seed=0,
    )
    z = r["noise_multiplier"]
    assert len(made) == 1
    opt = made[0]
    # removing a node: its own clipped gradient (C) and up to D changed ones (2C each)
    assert r["dpsgd_sensitivity"] == pytest.approx((2 * d + 1) * c)
    assert opt.noise_multiplier == pytest.approx(z * (2 * d + 1))  # std = z (2D+1) C
    assert opt.max_grad_norm == pytest.approx(c)
    n_train = int(cora.train_mask.sum())
    assert opt.expected_batch_size == n_train and r["dpsgd_steps"] == 3  # full batch
    assert r["sigma"] == pytest.approx(z * math.sqrt(d))  # inference aggregation
    # T steps + 1 inference release, all Gaussian with multiplier z, no subsampling credit:
    # one Gaussian with multiplier z / sqrt(T + 1)
    expect = _gaussian_epsilon(z / math.sqrt(r["dpsgd_steps"] + 1), r["delta"])
    assert r["epsilon_spent"] == pytest.approx(expect, rel=0.01)
    assert r["epsilon_spent"] <= eps * (1 + 1e-6)
    assert r["delta"] == 1e-4  # auto: 10^-(digits of 2031 training nodes)
    assert r["max_out_degree_used"] <= d
    ev = sage_dp_events(z, 3)
    assert len(ev) == 1 and ev[0].count == 4 and ev[0].noise_multiplier == z


def test_sage_dp_removing_a_node_stays_within_the_sensitivities():
    # Degree bounding bounds what the argument needs: out-degrees (a node enters the mean
    # aggregates of its out-neighbours only); in-degrees stay unbounded. Then removing any node
    # changes only its out-neighbours' rows, each aggregate by <= 1 (inference sensitivity
    # sqrt(D)), and the sum of clipped per-example gradients by <= (2D + 1) C.
    n, f, d, c = 30, 5, 3, 0.05
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 240), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = coalesce(torch.cat([ei, ei.flip(0)], 1), num_nodes=n)  # undirected, no self-loops
    x, y = torch.randn(n, f, generator=g), torch.randint(0, 3, (n,), generator=g)
    bounded = bound_out_degree(ei, n, d, g)
    assert int(out_degree(bounded, n).max()) <= d
    assert int(in_degree(bounded, n).max()) > d  # not bounded, not needed
    torch.manual_seed(0)
    model = MLP(2 * f, 8, 3, 2)

    def clipped_sum(feats, nodes):
        total = torch.zeros(sum(p.numel() for p in model.parameters()))
        for i in nodes:
            model.zero_grad()
            F.cross_entropy(model(feats[i : i + 1]), y[i : i + 1]).backward()
            grad = torch.cat([p.grad.flatten() for p in model.parameters()])
            total += grad * min(1.0, c / float(grad.norm()))
        return total

    feats = sage_dp_features(x, bounded, n)
    full = clipped_sum(feats, range(n))
    worst = 0.0
    for v in range(n):
        without = bounded[:, (bounded[0] != v) & (bounded[1] != v)]
        feats_v = sage_dp_features(x, without, n)
        others = [i for i in range(n) if i != v]
        changed = {i for i in others if not torch.allclose(feats_v[i], feats[i])}
        assert changed <= set(bounded[1, bounded[0] == v].tolist())
        assert float((feats_v[others, f:] - feats[others, f:]).norm(dim=1).max()) <= 1 + 1e-6
        worst = max(worst, float((full - clipped_sum(feats_v, others)).norm()))
    assert worst <= sage_dp_sensitivity(d, c) + 1e-6
    assert worst > c  # neighbours' gradients do move


def test_mean_aggregate_is_in_neighbour_mean():
    ei = torch.tensor([[0, 1, 2, 0], [2, 2, 1, 1]])  # 0->2, 1->2, 2->1, 0->1
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]])
    out = mean_aggregate(h, ei, 3)
    assert torch.allclose(out, torch.tensor([[0.0, 0.0], [2.5, 2.0], [0.5, 1.0]]))


def test_sage_bad_combinations_raise(cora):
    with pytest.raises(ValueError, match=r"method='sage'.*level='edge'.*allowed"):
        run_gap(cora, method="sage", level="edge", epsilon=4.0)
    with pytest.raises(ValueError, match=r"method='sage'.*level='node'.*allowed"):
        run_gap(cora, method="sage", level="node")  # epsilon inf
    with pytest.raises(ValueError, match="select_on_val"):
        run_gap(cora, method="sage", level="node", epsilon=8.0, select_on_val=True)
    with pytest.raises(ValueError, match="encoder"):
        run_gap(cora, method="sage", encoder_output=cora.x)
    with pytest.raises(ValueError, match="method"):
        run_gap(cora, method="gcn")
    with pytest.raises(ValueError, match="level"):
        run_gap(cora, method="sage", level="graph")
    with pytest.raises(ValueError, match="max_degree"):
        sage_dp_sensitivity(0)


def test_bench_configs_parse(load_script):
    bench = load_script("bench/gap_centralized.py")
    assert bench.parse("sage") == {"method": "sage", "level": "edge"}
    assert bench.parse("sage-node:8") == {"method": "sage", "level": "node", "epsilon": 8.0}
    assert bench.parse("mlp-node:4") == {"method": "mlp", "level": "node", "epsilon": 4.0}
    assert bench.parse("node:16") == {"method": "gap", "level": "node", "epsilon": 16.0}
    for config in bench.CONFIGS:
        bench.parse(config)
    for bad in ("sage-edge:4", "mlp-node", "gcn"):
        with pytest.raises(ValueError, match="unknown config"):
            bench.parse(bad)
