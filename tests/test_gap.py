"""GAP: PMA, degree bounding, sensitivities, accounting, DP-SGD training, a small end-to-end run."""

import math
from pathlib import Path

import pytest
import torch
from torch_geometric.utils import coalesce

from fedgraph.methods.gap import (
    DPSGD,
    aggregate,
    calibrate_gap,
    default_delta,
    dpsgd_schedule,
    edge_sensitivity,
    evaluate,
    gap_events,
    local_train,
    node_sensitivity,
    normalize_rows,
    perturb,
    pma,
    run_gap,
)
from fedgraph.nn.gap import GAPClassifier, GAPEncoder
from fedgraph.utils import bound_degree, bound_in_degree, bound_out_degree, in_degree, out_degree

DATA_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"


def _graph(n=200, m=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    return coalesce(torch.cat([ei, ei.flip(0)], 1), num_nodes=n)


def _accounting():
    acc = pytest.importorskip("fedgraph.accounting")
    if not all(
        hasattr(acc, k) for k in ("Gaussian", "SubsampledGaussian", "compose_epsilon", "calibrate")
    ):
        pytest.skip(
            "fedgraph.accounting has no Gaussian/SubsampledGaussian/compose_epsilon/calibrate yet"
        )
    return acc


# ---------------------------------------------------------------------------------------------
# Aggregation and PMA
# ---------------------------------------------------------------------------------------------
def test_aggregate_is_sparse_adjacency_transpose_product_and_chunking_is_exact():
    n = 60
    ei = _graph(n, 400)
    h = torch.randn(n, 5, dtype=torch.float64)
    a = torch.zeros(n, n, dtype=torch.float64)
    a[ei[0], ei[1]] = 1.0  # A[u, v] = 1 for u -> v
    expect = a.t() @ h
    assert torch.allclose(aggregate(h, ei, n), expect)
    assert torch.allclose(aggregate(h, ei, n, chunk_size=7), expect)


def test_perturb_adds_gaussian_noise_with_std_sigma():
    # 20000 x 16 = 320k draws: the std's standard error is sigma / sqrt(2 * 320k) ~ 0.13 %
    sums = torch.zeros(20000, 16)
    for sigma in (0.5, 3.0):
        noise = perturb(sums, sigma, torch.Generator().manual_seed(1))
        assert abs(float(noise.std()) / sigma - 1) < 0.01
        assert abs(float(noise.mean())) < 0.01 * sigma
    assert perturb(sums, 0.0) is sums
    with pytest.raises(ValueError):
        perturb(sums, -1.0)


def test_pma_noise_on_sums_has_std_sigma_and_rows_are_unit_norm():
    n, sigma = 3000, 1.7
    ei = _graph(n, 30000, seed=2)
    x0 = torch.randn(n, 8)
    hops = pma(x0, ei, 3, sigma, torch.Generator().manual_seed(5))
    assert len(hops) == 4
    # Replay with the same generator: pma must be normalize(perturb(aggregate(prev))) per hop.
    g = torch.Generator().manual_seed(5)
    prev = normalize_rows(x0)
    assert torch.allclose(hops[0], prev)
    for k in range(1, 4):
        clean = aggregate(prev, ei, n)
        noisy = perturb(clean, sigma, g)
        resid = noisy - clean  # noisy vs clean sums before normalization
        assert abs(float(resid.std()) / sigma - 1) < 0.02  # 24k draws: SE ~ 0.5 %
        prev = normalize_rows(noisy)
        assert torch.allclose(hops[k], prev)
    for h in hops:
        assert torch.allclose(h.norm(dim=1), torch.ones(n), atol=1e-5)


def test_pma_without_noise_is_normalized_propagation():
    n = 50
    ei = _graph(n, 200, seed=3)
    ei = ei[:, ei[1] != 0]  # node 0 has no in-neighbours
    x0 = torch.randn(n, 4, dtype=torch.float64)
    a = torch.zeros(n, n, dtype=torch.float64)
    a[ei[0], ei[1]] = 1.0
    hops = pma(x0, ei, 2, 0.0)
    expect = normalize_rows(x0)
    for k in (1, 2):
        expect = normalize_rows(a.t() @ expect)
        assert torch.allclose(hops[k], expect)
    assert float(hops[1][0].norm()) == 0.0  # zero row stays zero without noise
    assert len(pma(x0, ei, 0, 1.0)) == 1


def test_in_place_row_normalization_gives_the_same_values_and_keeps_zero_rows():
    from fedgraph.nn.gap import normalize_rows_

    for dtype in (torch.float32, torch.float64):
        x = torch.randn(300, 16, dtype=dtype) * torch.logspace(-8, 8, 300, dtype=dtype)[:, None]
        x[7] = 0.0
        expect = normalize_rows(x)
        got = x.clone()
        assert normalize_rows_(got) is got
        assert torch.equal(got, expect)  # the same division, so the same bits
        assert float(got[7].abs().sum()) == 0.0
        assert torch.allclose(got[torch.arange(300) != 7].norm(dim=1), torch.ones(299, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# Degree bounding and sensitivities
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["in", "out"])
def test_bound_degree_keeps_at_most_d_and_exactly_d_for_high_degree(direction):
    n, d = 300, 7
    ei = _graph(n, 4000, seed=4)
    kept, mask = bound_degree(
        ei, n, d, torch.Generator().manual_seed(0), direction=direction, return_mask=True
    )
    deg = in_degree if direction == "in" else out_degree
    before, after = deg(ei, n), deg(kept, n)
    assert int(after.max()) <= d
    assert torch.equal(after, before.clamp(max=d))  # exactly D when deg >= D, all otherwise
    assert torch.equal(kept, ei[:, mask])  # a subset, in the original order
    pairs = set(map(tuple, ei.t().tolist()))
    assert set(map(tuple, kept.t().tolist())) <= pairs
    # deterministic under the generator
    again = bound_degree(ei, n, d, torch.Generator().manual_seed(0), direction=direction)
    assert torch.equal(kept, again)


def test_bound_in_and_out_degree_and_uniform_choice():
    n = 11  # star: 10 sources into node 0, kept 3 at a time
    ei = torch.stack([torch.arange(1, n), torch.zeros(n - 1, dtype=torch.long)])
    assert bound_in_degree(ei, n, 3).size(1) == 3
    assert bound_out_degree(ei, n, 3).size(1) == 10  # out-degrees are 1
    assert bound_out_degree(ei.flip(0), n, 3).size(1) == 3
    counts = torch.zeros(n)
    g = torch.Generator().manual_seed(0)
    trials = 2000
    for _ in range(trials):
        counts[bound_in_degree(ei, n, 3, g)[0]] += 1
    freq = counts[1:] / trials  # each source kept with probability 3/10
    assert float((freq - 0.3).abs().max()) < 0.05  # SE ~ 0.01
    with pytest.raises(ValueError):
        bound_degree(ei, n, -1)
    with pytest.raises(ValueError):
        bound_degree(ei, n, 2, direction="both")


def test_sensitivities_and_their_empirical_bounds():
    assert edge_sensitivity("directed") == 1.0
    assert edge_sensitivity("undirected") == pytest.approx(math.sqrt(2))
    assert node_sensitivity(100) == pytest.approx(10.0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            node_sensitivity(bad)
    with pytest.raises(ValueError):
        edge_sensitivity("hyper")

    n, d = 200, 6
    x = normalize_rows(torch.randn(n, 8, dtype=torch.float64))
    ei = bound_out_degree(_graph(n, 3000, seed=6), n, d, torch.Generator().manual_seed(1))
    full = aggregate(x, ei, n)
    for u in range(0, n, 17):  # remove node u (all its edges), compare the other rows
        rest = ei[:, (ei[0] != u) & (ei[1] != u)]
        keep = torch.arange(n) != u
        diff = (aggregate(x, rest, n) - full)[keep].norm()
        assert float(diff) <= math.sqrt(d) + 1e-9
    # an undirected edge changes two rows by unit vectors: sqrt(2); a directed one: 1
    u, v = int(ei[0, 0]), int(ei[1, 0])
    both = ((ei[0] == u) & (ei[1] == v)) | ((ei[0] == v) & (ei[1] == u))
    one = torch.zeros_like(both)
    one[0] = True
    assert float((aggregate(x, ei[:, ~one], n) - full).norm()) == pytest.approx(1.0)
    if int(both.sum()) == 2:
        assert float((aggregate(x, ei[:, ~both], n) - full).norm()) <= math.sqrt(2) + 1e-9


# ---------------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------------
def test_schedule_and_delta():
    assert dpsgd_schedule(1000, 256, 10) == (0.256, 30)
    assert dpsgd_schedule(100, 256, 2) == (1.0, 2)
    assert default_delta(1_090_990) == pytest.approx(1e-7)
    assert default_delta(13_277) == pytest.approx(1e-5)


def test_gap_events_and_calibration():
    acc = _accounting()
    ev = gap_events(2.0, 3)
    assert len(ev) == 1 and isinstance(ev[0], acc.Gaussian)
    with pytest.raises(ValueError):
        gap_events(2.0, 3, node_level=True)
    ev = gap_events(
        2.0, 3, node_level=True, encoder_dpsgd=(0.02, 2.0, 100), classifier_dpsgd=(0.02, 2.0, 0)
    )
    assert [type(e).__name__ for e in ev] == ["Gaussian", "SubsampledGaussian"]

    delta = 1e-6
    z_edge = calibrate_gap(4.0, delta, num_hops=2, level="edge")
    eps = acc.compose_epsilon(gap_events(z_edge, 2), delta)
    assert eps <= 4.0 + 1e-6 and eps > 3.8
    assert acc.compose_epsilon(gap_events(z_edge, 4), delta) > eps  # more hops cost more
    assert calibrate_gap(float("inf"), delta, num_hops=2) == 0.0
    assert calibrate_gap(4.0, delta, num_hops=0) == 0.0  # no hop: no edge is touched

    sched = dpsgd_schedule(10000, 256, 5)
    z_node = calibrate_gap(
        8.0, delta, num_hops=2, level="node", encoder_schedule=sched, classifier_schedule=sched
    )
    events = gap_events(
        z_node,
        2,
        node_level=True,
        encoder_dpsgd=(sched[0], z_node, sched[1]),
        classifier_dpsgd=(sched[0], z_node, sched[1]),
    )
    eps = acc.compose_epsilon(events, delta)
    assert eps <= 8.0 + 1e-6 and eps > 7.5
    # the budget is shared: PMA alone at that multiplier spends only part of it
    assert acc.compose_epsilon(gap_events(z_node, 2), delta) < eps


# ---------------------------------------------------------------------------------------------
# Modules and training
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("combine", ["cat", "sum", "attention"])
def test_classifier_shapes_and_opacus_per_example_gradients(combine):
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = GAPClassifier(2, 8, 6, 3, combine=combine, base_layers=2, head_layers=2)
    x = torch.randn(5, 3, 8)
    y = torch.tensor([0, 1, 2, 0, 1])
    assert model(x).shape == (5, 3)
    gsm = GradSampleModule(model, loss_reduction="sum")
    torch.nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    per_example = {n: p.grad_sample.clone() for n, p in model.named_parameters()}
    gsm._close()
    for i in range(5):  # grad_sample[i] is the gradient of example i alone
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in model.named_parameters():
            assert torch.allclose(per_example[name][i], p.grad, atol=1e-5), name
    with pytest.raises(ValueError):
        GAPClassifier(2, 8, combine="max")


def test_encoder_embed_is_row_normalized():
    enc = GAPEncoder(12, 3, encoder_dim=4)
    x = torch.randn(10, 12)
    assert enc(x).shape == (10, 3)
    e = enc.embed(x)
    assert e.shape == (10, 4)
    assert torch.allclose(e.norm(dim=1), torch.ones(10), atol=1e-5)
    assert torch.allclose(enc.embed(x, batch_size=3), e)


def test_local_train_with_dpsgd_returns_a_plain_model_and_learns():
    torch.manual_seed(0)
    n = 600
    x = torch.randn(n, 10)
    y = (x[:, 0] > 0).long()
    model = GAPEncoder(10, 2, encoder_dim=4)
    keys = set(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    num, loss = local_train(model, x, y, None, 8, 64, 0.05, DPSGD(0.8, 1.0), generator=g)
    assert num == n and math.isfinite(loss)
    assert set(model.state_dict()) == keys  # no "_module." prefix, hooks removed
    assert not any(
        hasattr(p, "grad_sample") and p.grad_sample is not None for p in model.parameters()
    )
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert evaluate(model, x, y, None)["accuracy"] > 0.8
    # a tiny client: Poisson batches may be empty; the noisy step still happens
    num, _ = local_train(model, x[:3], y[:3], None, 1, 64, 0.05, DPSGD(1.0), generator=g)
    assert num == 3
    # BatchNorm mixes examples: refused under DP-SGD
    bn_model = GAPEncoder(10, 2, batch_norm=True)
    with pytest.raises(Exception):  # noqa: B017 (Opacus's own error type varies by version)
        local_train(bn_model, x, y, None, 1, 64, 0.05, DPSGD(1.0), generator=g)
    with pytest.raises(ValueError):
        local_train(model, x, y, None, 1, None, 0.05, DPSGD(1.0))


def test_local_train_without_dp_minibatch_and_mask():
    torch.manual_seed(0)
    x = torch.randn(300, 6)
    y = (x[:, 1] > 0).long()
    mask = torch.zeros(300, dtype=torch.bool)
    mask[:200] = True
    model = GAPClassifier(0, 6, 8, 2)
    num, loss = local_train(model, x.unsqueeze(1), y, mask, 20, 32, 0.01)
    assert num == 200 and math.isfinite(loss)
    assert evaluate(model, x.unsqueeze(1), y, ~mask)["accuracy"] > 0.8


# ---------------------------------------------------------------------------------------------
# End to end on Facebook100 Caltech36
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def caltech():
    if not (DATA_ROOT / "facebook100" / "Caltech36.mat").is_file():
        pytest.skip(f"Caltech36.mat not found under {DATA_ROOT}")
    from fedgraph.data import gap_split, load_dataset

    data = load_dataset("facebook100:Caltech36", root=DATA_ROOT, min_class_size=50)
    return gap_split(data, 0)


def test_gap_on_caltech_beats_mlp_and_majority(caltech):
    # Accuracy on validation + test nodes together (141 nodes; the test set alone has 85).
    # Over split seeds 0..5 we saw: GAP-inf - MLP in [0.15, 0.24], GAP(eps=16) - MLP in
    # [0.14, 0.24], GAP(eps=16) - majority in [0.21, 0.42].
    kw = dict(encoder_epochs=40, classifier_epochs=40, seed=0)
    held = caltech.val_mask | caltech.test_mask
    nv, nt = int(caltech.val_mask.sum()), int(caltech.test_mask.sum())
    majority = float(torch.bincount(caltech.y[held]).max()) / int(held.sum())

    def held_acc(r):
        return (r["val_acc"] * nv + r["test_acc"] * nt) / (nv + nt)

    mlp = run_gap(caltech, method="mlp", **kw)
    inf = run_gap(caltech, method="gap-inf", **kw)
    assert mlp["epsilon_spent"] == 0.0 and inf["epsilon_spent"] == math.inf
    assert held_acc(inf) > held_acc(mlp) + 0.08  # the graph carries the class year
    _accounting()
    gap = run_gap(caltech, method="gap", epsilon=16.0, **kw)
    assert gap["epsilon_spent"] <= 16.0 + 1e-6 and gap["sigma"] > 0
    assert held_acc(gap) > held_acc(mlp) + 0.05
    assert held_acc(gap) > majority + 0.12


def test_batch_norm_never_sits_between_the_row_normalization_and_pma():
    """PMA's sensitivity needs unit-norm rows: with every batch norm of the reference
    architecture on (hidden layers and after the normalized output), what the encoder hands to
    PMA (``embed``) is still the row-normalized encoder output, in training mode too, whatever
    the running statistics; the output batch norm only feeds the pre-training head."""
    torch.manual_seed(0)
    x = 50 * torch.randn(64, 10) + 3
    enc = GAPEncoder(10, 3, batch_norm=True, output_batch_norm=True)
    y = torch.randint(0, 3, (64,))
    local_train(enc, x, y, None, 5, None, 0.05)  # moves the running statistics
    enc.train()
    rows = enc.embed(x)
    assert enc.training  # embed restores the mode
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(64), rtol=0, atol=1e-5)
    enc.eval()
    torch.testing.assert_close(rows, normalize_rows(enc.encoder(x)))
    assert isinstance(enc.out_norm, torch.nn.BatchNorm1d)  # the output norm exists, unused here
