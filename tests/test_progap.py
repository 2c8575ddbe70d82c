"""ProGAP's mechanisms against their formulas, its calibration against an independent
accountant, its model's stages, and the centralized algorithm on a small graph (issue 33)."""

import math

import pytest
import torch
from torch_geometric.utils import erdos_renyi_graph

from fedgraph.accounting import Gaussian, SubsampledGaussian, compose_epsilon
from fedgraph.methods.progap import (
    ProgressiveModel,
    aggregation_sensitivity,
    calibrate_progap,
    noisy_aggregation,
    progap_events,
    run_progap,
    stage_input,
)
from fedgraph.methods.progap.privacy import plan_events
from fedgraph.utils import bound_out_degree


def _graph(n=120, p=0.1):
    torch.manual_seed(0)
    return erdos_renyi_graph(n, p)  # undirected: both directions of every edge


def test_noisy_aggregation_is_the_normalized_sum_plus_gaussian_noise():
    n, ei = 120, _graph()
    h = torch.randn(n, 8)
    hn = h / h.norm(dim=1, keepdim=True)
    dense = torch.zeros(n, n)
    dense[ei[0], ei[1]] = 1.0
    exact = dense.T @ hn  # A^T normalize(h), paper Eq. 4 / official NAP
    assert torch.allclose(noisy_aggregation(h, ei, n, 0.0), exact, atol=1e-5)
    big = torch.randn(20000, 8)
    noisy = noisy_aggregation(
        big, torch.zeros(2, 0, dtype=torch.long), 20000, 0.7, torch.Generator().manual_seed(1)
    )
    assert noisy.mean().abs() < 0.02 and noisy.std() == pytest.approx(0.7, rel=0.02)


def test_sensitivities_hold_on_neighbouring_graphs():
    """Removing a directed edge changes the aggregation by <= 1 (L2 over all rows), an
    undirected one by <= sqrt 2, a node of the D-bounded graph by <= sqrt D."""
    n, ei = 120, _graph()
    h = torch.randn(n, 8)
    base = noisy_aggregation(h, ei, n, 0.0)
    one = noisy_aggregation(h, ei[:, 1:], n, 0.0)
    assert (base - one).norm() <= aggregation_sensitivity("edge") + 1e-6
    u, v = ei[:, 0].tolist()
    und = ei[:, ~(((ei[0] == u) & (ei[1] == v)) | ((ei[0] == v) & (ei[1] == u)))]
    assert (base - noisy_aggregation(h, und, n, 0.0)).norm() <= aggregation_sensitivity(
        "edge", edge_unit="undirected"
    ) + 1e-6
    assert aggregation_sensitivity("edge", edge_unit="undirected") == pytest.approx(math.sqrt(2))
    d = 5
    b = bound_out_degree(ei, n, d, torch.Generator().manual_seed(0))
    w = int(b[0, 0])
    full = noisy_aggregation(h, b, n, 0.0)
    # node w removed: its out-edges go (in-edges change only w's own row, kept by its owner)
    keep = b[0] != w
    diff = full - noisy_aggregation(h, b[:, keep], n, 0.0)
    diff[w] = 0
    assert diff.norm() <= aggregation_sensitivity("node", max_degree=d) + 1e-6
    assert aggregation_sensitivity("node", max_degree=d, other_clients=3) == pytest.approx(
        math.sqrt(d + 3)
    )


def test_edge_calibration_meets_the_target_and_matches_dp_accounting_pld():
    from dp_accounting import dp_event
    from dp_accounting.pld import PLDAccountant

    for eps in (1.0, 4.0, 8.0):
        z = calibrate_progap(eps, 1e-7, depth=5, level="edge")
        events = progap_events(z, 5)
        assert len(events) == 1 and events[0] == Gaussian(z, count=5)
        assert compose_epsilon(events, 1e-7, accountant="analytic") <= eps * (1 + 1e-6)
        # independent: dp-accounting's PLD of 5 Gaussian mechanisms at multiplier z
        acc = PLDAccountant()
        acc.compose(dp_event.GaussianDpEvent(z), 5)
        assert acc.get_epsilon(1e-7) == pytest.approx(eps, rel=0.01)
        # K Gaussians at z = one at z / sqrt K (the analytic accountant is exact)
        assert compose_epsilon([Gaussian(z / math.sqrt(5))], 1e-7, "analytic") == pytest.approx(
            eps, rel=2e-3
        )
    assert calibrate_progap(math.inf, 1e-7, depth=5) == 0.0


def test_node_calibration_composes_aggregations_and_every_stages_dpsgd():
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    sched = (256 / 4000, 5 * (4000 // 256))
    z = calibrate_progap(8.0, 1e-4, depth=3, level="node", stage_schedule=sched, accountant="prv")
    events = progap_events(z, 3, sched)
    assert events == [Gaussian(z, count=3), SubsampledGaussian(sched[0], z, sched[1] * 4)]
    assert compose_epsilon(events, 1e-4, accountant="prv") <= 8.0 * (1 + 1e-6)
    rdp = RdpAccountant()  # independent (and looser): dp-accounting's RDP
    rdp.compose(dp_event.GaussianDpEvent(z), 3)
    rdp.compose(dp_event.PoissonSampledDpEvent(sched[0], dp_event.GaussianDpEvent(z)), sched[1] * 4)
    assert 8.0 * 0.9 <= rdp.get_epsilon(1e-4) <= 8.0 * 1.25
    plan = {"noise_multiplier": z, "depth": 3, "stage_schedule": sched}
    assert [e for _, e in plan_events(plan)] == events
    with pytest.raises(ValueError, match="schedule"):
        calibrate_progap(8.0, 1e-4, depth=3, level="node")


def test_model_stages_train_their_own_parameters_and_jumping_knowledge_widths():
    m = ProgressiveModel(10, 3, depth=2, hidden=4, batch_norm=True)
    xs = [torch.randn(7, 10), torch.randn(7, 4), torch.randn(7, 4)]
    for stage in range(3):
        m.set_stage(stage)
        out = m(stage_input(xs[: stage + 1]))
        assert out.shape == (7, 3) and m.embed(stage_input(xs[: stage + 1])).shape == (7, 4)
        trained = {n for n, p in m.named_parameters() if p.requires_grad}
        assert trained == set(m.stage_parameter_names())
        assert any(n.startswith(f"head.{stage}.") for n in trained)
        assert all(not n.startswith(f"base.{stage + 1}") for n in trained)
        assert m.head[stage].layers[0].in_features == 4 * (stage + 1)  # cat
    with pytest.raises(ValueError, match="width"):
        m(torch.randn(7, 10))


@pytest.fixture(scope="module")
def sbm():
    from fedgraph.data import gap_split, load_dataset

    torch.set_num_threads(1)
    return gap_split(load_dataset("synthetic-sbm:600:6"), 0)


def test_centralized_progap_learns_and_spends_at_most_its_target(sbm):
    free = run_progap(sbm, epsilon=math.inf, depth=2, epochs=20, lr=0.05)
    assert free["test_acc"] > 0.5 and free["epsilon_spent"] == math.inf
    assert free["sigma"] == 0 and len(free["stage_val_acc"]) == 3
    again = run_progap(sbm, epsilon=math.inf, depth=2, epochs=20, lr=0.05)
    assert again["test_acc"] == free["test_acc"]  # seeded
    priv = run_progap(sbm, epsilon=2.0, depth=2, epochs=20, edge_unit="undirected")
    assert priv["epsilon_spent"] <= 2.0 * (1 + 1e-6)
    assert priv["sigma"] == pytest.approx(priv["noise_multiplier"] * math.sqrt(2))
    node = run_progap(
        sbm,
        level="node",
        epsilon=8.0,
        delta=1e-4,
        depth=1,
        epochs=2,
        batch_size=64,
        max_degree=5,
        accountant="rdp",
    )
    assert node["epsilon_spent"] <= 8.0 * (1 + 1e-6) and node["config"]["batch_norm"] is True


def test_node_level_norm_is_per_example_and_dpsgd_clips_it():
    """Node level, ``batch-norm``: GroupNorm(1, C) (the official code's replacement under
    DP-SGD): a node's output does not depend on the other nodes of its batch (training mode),
    and Opacus computes its per-example gradients."""
    from opacus import GradSampleModule

    from fedgraph.methods.progap.model import ProgressiveModel

    torch.manual_seed(0)
    model = ProgressiveModel(8, 3, depth=1, hidden=16, base_layers=2, group_norm=True).train()
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())
    x = torch.randn(5, 8)
    other = x.clone()
    other[1:] = torch.randn(4, 8)
    torch.testing.assert_close(model(x)[0], model(other)[0])
    gsm = GradSampleModule(model, loss_reduction="sum", strict=True)
    torch.nn.functional.cross_entropy(
        gsm(x), torch.tensor([0, 1, 2, 0, 1]), reduction="sum"
    ).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad_sample.shape[0] == 5 for p in trained)
    gsm._close()
    with pytest.raises(ValueError, match="not both"):
        ProgressiveModel(8, 3, depth=1, batch_norm=True, group_norm=True)
