"""PrivGNN (fedgraph.methods.privgnn) and the membership audit (fedgraph.audit)."""

import math

import pytest
import torch
from torch_geometric.nn.models import GraphSAGE
from torch_geometric.utils import subgraph

from fedgraph.audit import auroc, membership_auroc, node_sample_graph
from fedgraph.data import load_dataset, partition
from fedgraph.methods import privgnn as pg
from fedgraph.methods.privgnn import teachers as pg_teachers

try:
    from fedgraph.accounting import compose_epsilon  # noqa: F401

    HAVE_COMPOSE = True
except ImportError:
    HAVE_COMPOSE = False


@pytest.fixture(scope="module")
def cora_split():
    return pg.privgnn_split(
        load_dataset("cora"), public_fraction=0.5, public_test_fraction=0.5, seed=0
    )


def test_split_disjoint_and_proportions(cora_split):
    private, public = cora_split
    assert private.num_nodes + public.num_nodes == 2708
    assert not set(private.node_ids.tolist()) & set(public.node_ids.tolist())
    assert abs(int(public.test_mask.sum()) - public.num_nodes / 2) <= 1
    assert not bool((public.test_mask & public.train_mask).any())
    assert bool(private.train_mask.all())
    clients = partition(private, 3, "random", seed=0)  # ready for the federation
    assert sum(c.num_nodes for c in clients) == private.num_nodes


def test_poisson_inclusion_rate_and_independence():
    gen = torch.Generator().manual_seed(0)
    rate, n, trials = 0.3, 50, 4000  # 2e5 node draws
    draws = torch.stack([pg.poisson_subsample(n, rate, gen) for _ in range(trials)]).double()
    total = draws.numel()
    sd = math.sqrt(rate * (1 - rate) / total)
    assert abs(draws.mean().item() - rate) < 5 * sd
    # pairwise inclusion frequency of distinct nodes = rate^2 (independence)
    pair = (draws.T @ draws) / trials
    off = pair[~torch.eye(n, dtype=torch.bool)]
    sd_pair = math.sqrt(rate**2 * (1 - rate**2) / (trials * off.numel() / 2))
    assert abs(off.mean().item() - rate**2) < 6 * sd_pair
    # and every single pair within a per-pair bound (Bonferroni over the pairs)
    assert (off - rate**2).abs().max().item() < 5 * math.sqrt(rate**2 * (1 - rate**2) / trials)
    # sample sizes vary (Binomial), not fixed
    assert draws.sum(1).std().item() > 1.0


def test_laplace_noise_scale():
    gen = torch.Generator().manual_seed(1)
    lam = 0.4
    post = torch.full((50_000, 4), 0.25)
    noisy = pg.noisy_answers(post, lam, "posterior", gen)
    noise = (noisy - post).double().view(-1)
    scale = pg.SENSITIVITY / lam  # 5.0
    # E|X| = scale and sd|X| = scale for Laplace(scale)
    assert abs(noise.abs().mean().item() - scale) < 5 * scale / math.sqrt(noise.numel())
    assert abs(noise.mean().item()) < 5 * math.sqrt(2) * scale / math.sqrt(noise.numel())
    votes = pg.noisy_answers(torch.tensor([[0.1, 0.7, 0.2]]), 1e9, "vote", gen)
    assert torch.allclose(votes, torch.tensor([[0.0, 1.0, 0.0]]), atol=1e-6)


@pytest.mark.skipif(not HAVE_COMPOSE, reason="fedgraph.accounting.compose_epsilon missing")
@pytest.mark.parametrize("lam,paper", [(0.1, 4.45), (0.2, 9.7), (0.4, 22.1)])
def test_epsilon_against_paper_curve(lam, paper):
    rdp = pg.privgnn_epsilon(1000, 0.3, lam, 1e-4, "rdp")
    pld = pg.privgnn_epsilon(1000, 0.3, lam, 1e-4, "pld")
    # our RDP (finer orders) sits at or somewhat below the paper's autodp reading
    assert 0.8 * paper <= rdp <= 1.02 * paper
    assert pld <= rdp + 1e-9


def test_budget_refuses_beyond_limit(cora_split):
    private, public = cora_split
    budget = pg.QueryBudget(limit=3)
    kw = dict(
        rate=0.3,
        k=10,
        lam=1.0,
        num_classes=7,
        budget=budget,
        teacher=pg.TeacherConfig(epochs=2, hidden=8),
        generator=torch.Generator().manual_seed(0),
    )
    out = pg.answer_queries(private, public.x[:2], **kw)
    assert out.shape == (2, 7) and budget.remaining == 1
    with pytest.raises(pg.BudgetExceededError, match="budget"):
        pg.answer_queries(private, public.x[:2], **kw)
    assert budget.answered == 2  # a refused request spends nothing
    pg.answer_queries(private, public.x[:1], **kw)
    assert budget.remaining == 0


@pytest.mark.skipif(not HAVE_COMPOSE, reason="fedgraph.accounting.compose_epsilon missing")
def test_max_queries_matches_epsilon():
    q = pg.max_queries(5.0, 1e-4, 0.3, 0.2, accountant="rdp")
    assert pg.privgnn_epsilon(q, 0.3, 0.2, 1e-4, "rdp") <= 5.0
    assert pg.privgnn_epsilon(q + 1, 0.3, 0.2, 1e-4, "rdp") > 5.0
    events = pg.privgnn_events(q, 0.3, 0.2)
    assert events[0].count == q and events[0].sample_rate == 0.3
    assert events[0].noise_multiplier == pytest.approx(5.0)


def test_batched_teacher_equals_pyg_sage(cora_split):
    private, _ = cora_split
    idx = torch.arange(40)
    ei, _ = subgraph(idx, private.edge_index, relabel_nodes=True, num_nodes=private.num_nodes)
    x = private.x[idx]
    model = pg.BatchedSAGE(3, x.shape[1], 16, 7, 2, 0.0, torch.Generator().manual_seed(0))
    ref = GraphSAGE(x.shape[1], 16, 2, 7, dropout=0.0, act="relu")
    b = 1
    with torch.no_grad():
        for layer, conv in enumerate(ref.convs):
            w = model.weight[layer][b]
            d = w.shape[1] // 2
            conv.lin_l.weight.copy_(w[:, :d].T)
            conv.lin_l.bias.copy_(model.bias[layer][b, 0])
            conv.lin_r.weight.copy_(w[:, d:].T)
        xs = torch.zeros(3, 40, x.shape[1])
        xs[b] = x
        adj = torch.zeros(3, 40, 40)
        adj[b] = pg_teachers._mean_adjacency(ei, 40)
        model.eval()
        expected = ref(x, ei)
        assert torch.allclose(model(xs, adj)[b], expected, atol=1e-5)
        assert torch.allclose(model(pg_teachers._block_features(xs), adj)[b], expected, atol=1e-5)
        assert torch.allclose(model.single(b, x, ei), expected, atol=1e-5)


def test_batched_training_is_per_teacher():
    """Training teacher 0 alone or next to others gives the same parameters."""
    torch.manual_seed(0)
    xs = torch.randn(2, 12, 5)
    adj = torch.rand(2, 12, 12)
    adj = adj / adj.sum(-1, keepdim=True)
    ys = torch.randint(3, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    cfg = pg.TeacherConfig(hidden=4, epochs=15, dropout=0.0)
    both = pg.train_teachers(xs, adj, ys, mask, 3, cfg, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    alone = pg.BatchedSAGE(2, 5, 4, 3, 2, 0.0, g)  # same initial draws
    opt = torch.optim.Adam(alone.parameters(), lr=cfg.lr)
    for _ in range(cfg.epochs):  # only teacher 0's loss
        opt.zero_grad()
        out = alone(xs, adj)[0]
        torch.nn.functional.cross_entropy(out, ys[0]).backward()
        opt.step()
    assert torch.allclose(both.weight[0][0], alone.weight[0][0], atol=1e-5)


def test_auroc_and_audit_smoke(cora_split):
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    private, public = cora_split
    gen = torch.Generator().manual_seed(0)
    g = [node_sample_graph(public, 100, gen) for _ in range(2)]

    def trainer(graph):
        torch.manual_seed(0)
        m = pg.make_sage(graph.x.shape[1], 7, 16)
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(40):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(graph.x, graph.edge_index), graph.y).backward()
            opt.step()
        m.eval()
        return lambda h: m(h.x, h.edge_index).softmax(-1).detach()

    members = node_sample_graph(private, 100, gen)
    target = trainer(members)
    auc, shadow = membership_auroc(
        target,
        members,
        node_sample_graph(private, 100, gen),
        shadow_train=trainer,
        shadow_members=g[0],
        shadow_nonmembers=g[1],
        return_shadow=True,
    )
    assert auc > 0.6 and shadow > 0.6  # an overfit non-private model leaks membership


def test_end_to_end_cora_beats_majority(cora_split):
    private, public = cora_split
    # raw features (the paper's teachers); a projection is faster but labels worse here
    run = pg.run_centralized(
        private,
        public,
        num_queries=40,
        rate=0.3,
        k=100,
        lam=1000.0,
        teacher=pg.TeacherConfig(epochs=30, hidden=16, batch_size=40, lr=0.02),
        student_epochs=120,
        seed=0,
        accountant=None,
    )
    assert run.pseudo_labels.shape == (40,)
    assert run.label_accuracy > 0.5
    assert run.student.test_accuracy > pg.majority_accuracy(public) + 0.05
