"""Issue 60, fault 6: PrivGNN's ensemble split must let one private node change one teacher.

The ledger charges each released vote histogram as a Gaussian mechanism of L2 sensitivity
``sqrt 2`` (one teacher's vote moves). That needs a split in which adding or removing one private
node changes the training data of exactly one teacher, under a coupling of the split's
randomness (:func:`fedgraph.methods.privgnn.teacher_assignment`: each node's teacher is drawn
independently; the coupling deletes the removed node's entry). The old positional split (a
permutation cut into ``T`` consecutive blocks) fails whenever ``n mod T != 0``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from fedgraph import randomness as rng
from fedgraph.accounting.accountants import analytic_gaussian_epsilon
from fedgraph.methods import privgnn as pg
from fedgraph.methods.privgnn import teachers as teachers_module

#: the commit whose positional split fault 6 names
OLD_COMMIT = "cea4199"
SIZES = [(141, 10), (23, 5), (50, 7), (40, 40), (12, 1), (100, 10), (9, 6)]


def _generators(seed: int):
    """The client's two kinds of generator: a torch one and a CSPRNG (``noise-source``)."""
    return [torch.Generator().manual_seed(seed), rng.SecureRandom(seed.to_bytes(4, "big") * 8)]


def _groups(assign: Tensor, ids: Tensor, T: int) -> list[frozenset]:
    """Teacher ``t``'s training nodes, by node identity (not position)."""
    return [frozenset(ids[assign == t].tolist()) for t in range(T)]


def _old_positional_assignment(n: int, T: int, generator) -> Tensor:
    """The split of cea4199 (``git show cea4199:fedgraph/methods/privgnn/teachers.py``,
    ``teacher_groups``): a uniform permutation cut into ``T`` consecutive blocks, as a
    per-node assignment."""
    perm = rng.randperm(n, generator)
    assign = torch.empty(n, dtype=torch.long)
    for t, block in enumerate(torch.tensor_split(perm, T)):
        assign[block] = t
    return assign


def _balanced_sizes(n: int, T: int) -> Counter:
    """The only group sizes the positional split ever outputs for ``n`` nodes."""
    return Counter(b.numel() for b in torch.tensor_split(torch.arange(n), T))


def min_teachers_changed(assign: Tensor, v: int, T: int, support: Counter | None) -> int:
    """The fewest teachers whose training set must differ between ``D`` (split ``assign``) and
    ``D \\ {v}``, over every coupling that gives ``D \\ {v}`` a split in the split function's
    support for ``n - 1`` nodes: ``support`` is the multiset of group sizes it always produces
    (the positional split), ``None`` when every assignment has positive probability (the
    independent split: each has probability ``T^-(n-1)``). ``v``'s teacher always changes; any
    other group is kept only where its size fits a slot of the support."""
    sizes = torch.bincount(assign, minlength=T)
    others = Counter(int(sizes[t]) for t in range(T) if t != int(assign[v]))
    if support is None:
        return 1
    kept = sum(min(count, support[s]) for s, count in others.items())
    return 1 + (T - 1) - kept


def assert_one_teacher_per_node(split, n: int, T: int, seed: int, support) -> None:
    """The check both splits face: for every node ``v``, some coupling in the split's support
    changes exactly one teacher."""
    assign = split(n, T, torch.Generator().manual_seed(seed))
    worst = {v: min_teachers_changed(assign, v, T, support) for v in range(n)}
    bad = [v for v, c in worst.items() if c != 1]
    assert not bad, f"{len(bad)} of {n} nodes change {max(worst.values())} teachers"


# ------------------------------------------------------------------------ (1) the contract
@pytest.mark.parametrize("n,T", SIZES)
def test_removing_any_node_changes_the_training_set_of_exactly_one_teacher(n, T):
    """The coupling stated in ``teacher_assignment``: the same generator key gives ``D`` its
    assignment ``a``; ``D \\ {v}`` runs with ``a`` less ``v``'s entry. Every node but ``v``
    keeps its teacher, so exactly one teacher's training set changes (``v``'s), for every
    ``v``, with either kind of generator; ``teacher_groups`` is that assignment's groups."""
    ids = torch.arange(n)
    for seed in (0, 1):
        for gen, again in zip(_generators(seed), _generators(seed)):
            assign = pg.teacher_assignment(n, T, gen)
            assert assign.dtype == torch.long and assign.shape == (n,)
            assert int(assign.min()) >= 0 and int(assign.max()) < T
            groups = _groups(assign, ids, T)
            assert [frozenset(g.tolist()) for g in pg.teacher_groups(n, T, again)] == groups
            for v in range(n):
                keep = ids != v
                coupled = _groups(assign[keep], ids[keep], T)  # the stated coupling
                changed = [t for t in range(T) if coupled[t] != groups[t]]
                assert changed == [int(assign[v])]
                assert coupled[int(assign[v])] == groups[int(assign[v])] - {v}


def test_the_coupling_has_the_law_of_a_fresh_draw_for_the_smaller_set():
    """Deleting one entry of an i.i.d. uniform assignment gives exactly the law of a fresh
    assignment of ``n - 1`` nodes; checked as: the same key draws a prefix (the same stream,
    either generator), and the entries are uniform and pairwise independent (chi-square)."""
    from scipy.stats import chisquare

    for gen_n, gen_m in zip(_generators(3), _generators(3)):
        assert torch.equal(
            pg.teacher_assignment(140, 10, gen_m), pg.teacher_assignment(141, 10, gen_n)[:140]
        )
    T, reps = 5, 40_000
    for gen in _generators(7):
        a = pg.teacher_assignment(2 * reps, T, gen).view(reps, 2)
        assert chisquare(torch.bincount(a[:, 0], minlength=T).numpy()).pvalue > 1e-4
        pairs = torch.bincount(a[:, 0] * T + a[:, 1], minlength=T * T).numpy()
        assert chisquare(pairs).pvalue > 1e-4


def test_the_split_is_drawn_from_the_given_generator_only():
    """``fedgraph.randomness.randint`` on the client's generator: the same key, the same split;
    the global torch RNG plays no part."""
    torch.manual_seed(0)
    a = pg.teacher_assignment(50, 7, torch.Generator().manual_seed(11))
    torch.manual_seed(1)
    assert torch.equal(a, pg.teacher_assignment(50, 7, torch.Generator().manual_seed(11)))
    with pytest.raises(ValueError, match=r"num-teachers must lie in \[1, 9\]"):
        pg.teacher_assignment(9, 10)
    with pytest.raises(ValueError, match=r"num-teachers must lie in \[1, 9\]"):
        pg.teacher_assignment(9, 0)


def _private_graph(n=40, seed=0) -> Data:
    """A client's private part: random features and labels, random edges (many across any
    split), 30 labelled nodes (``train_mask``) and 10 unlabelled."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, 160), generator=g)
    ei = torch.cat([ei, ei.flip(0)], 1)
    ei = ei[:, ei[0] != ei[1]]
    train = torch.zeros(n, dtype=torch.bool)
    train[torch.randperm(n, generator=g)[:30]] = True
    return Data(
        x=torch.rand(n, 4, generator=g),
        y=torch.randint(0, 3, (n,), generator=g),
        edge_index=ei,
        train_mask=train,
        num_nodes=n,
    )


def _without(graph: Data, v: int) -> Data:
    """``graph`` less node ``v`` and its edges, nodes renumbered in order."""
    keep = torch.arange(graph.num_nodes) != v
    ei, _ = subgraph(keep, graph.edge_index, relabel_nodes=True, num_nodes=graph.num_nodes)
    return Data(
        x=graph.x[keep],
        y=graph.y[keep],
        edge_index=ei,
        train_mask=graph.train_mask[keep],
        num_nodes=graph.num_nodes - 1,
    )


class _Captured(Exception):
    pass


def _teacher_inputs(graph: Data, assign: Tensor, T: int, monkeypatch) -> list[tuple]:
    """Every teacher's training inputs in ``ensemble_votes`` (features, labels, mean-adjacency
    of its induced subgraph, unpadded), with the split's assignment forced to ``assign``."""
    seen = {}

    def forced(num_candidates, num_teachers, generator=None):
        assert (num_candidates, num_teachers) == (assign.numel(), T)
        return assign.clone()

    def capture(xs, adjs, ys, mask, *args, **kwargs):
        seen["inputs"] = [
            (xs[t, : int(m)], ys[t, : int(m)], adjs[t, : int(m), : int(m)])
            for t, m in enumerate(mask.sum(1))
        ]
        raise _Captured

    monkeypatch.setattr(teachers_module, "teacher_assignment", forced)
    monkeypatch.setattr(teachers_module, "train_teachers", capture)
    with pytest.raises(_Captured):
        pg.ensemble_votes(graph, torch.rand(3, 4), num_teachers=T, num_classes=3)
    return seen["inputs"]


def test_in_ensemble_votes_one_node_changes_one_teachers_inputs_edges_included(monkeypatch):
    """End to end, with the node really removed (its features, label and edges; the graph
    renumbered): under the coupling, every teacher but ``v``'s gets identical features, labels
    and induced-subgraph adjacency (an edge from ``v`` into another group is in no teacher's
    data). Removing an unlabelled private node changes no teacher."""
    graph, T = _private_graph(), 4
    cand = graph.train_mask.nonzero().view(-1)
    assign = pg.teacher_assignment(cand.numel(), T, torch.Generator().manual_seed(5))
    base = _teacher_inputs(graph, assign, T, monkeypatch)
    for v in range(graph.num_nodes):
        labelled = bool(graph.train_mask[v])
        coupled = assign[cand != v] if labelled else assign
        other = _teacher_inputs(_without(graph, v), coupled, T, monkeypatch)
        changed = [
            t
            for t in range(T)
            if not all(
                torch.equal(a, b) if a.shape == b.shape else False
                for a, b in zip(base[t], other[t])
            )
        ]
        assert changed == ([int(assign[(cand == v).nonzero().item()])] if labelled else [])


def test_an_empty_teacher_abstains():
    """A group may be empty (independent draws): that teacher votes nothing, so the histogram
    sums to the number of non-empty groups, and a removal moves it by at most one vote."""
    n, T = 6, 5
    seed = next(
        s
        for s in range(100)
        if any(g.numel() == 0 for g in pg.teacher_groups(n, T, torch.Generator().manual_seed(s)))
    )
    groups = pg.teacher_groups(n, T, torch.Generator().manual_seed(seed))
    graph = Data(
        x=torch.rand(n, 4, generator=torch.Generator().manual_seed(1)),
        y=torch.tensor([0, 1, 2, 0, 1, 2]),
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        num_nodes=n,
    )
    votes = pg.ensemble_votes(
        graph,
        torch.rand(4, 4),
        num_teachers=T,
        num_classes=3,
        teacher=pg.TeacherConfig(hidden=4, epochs=3),
        generator=torch.Generator().manual_seed(seed),
    )
    nonempty = sum(g.numel() > 0 for g in groups)
    assert nonempty < T
    assert torch.equal(votes.sum(-1), torch.full((4,), float(nonempty)))


# ------------------------------------------------------- (2) the old split fails the check
def test_the_old_positional_split_fails_the_same_check():
    """The same check on the split of cea4199: at n = 141, T = 10 (n mod T = 1) removing any of
    the 126 nodes of the nine 14-node blocks leaves sizes (15, 13, 14 x 8) where every split of
    140 nodes has 14 x 10, so every coupling changes a second teacher: 89 % of nodes. With
    n mod T = 0 it passes; the independent split passes everywhere."""
    old = _old_positional_assignment
    with pytest.raises(AssertionError, match=r"126 of 141 nodes change 2 teachers"):
        assert_one_teacher_per_node(old, 141, 10, 0, _balanced_sizes(140, 10))
    assert_one_teacher_per_node(old, 140, 10, 0, _balanced_sizes(139, 10))
    for n, T in SIZES:
        assert_one_teacher_per_node(pg.teacher_assignment, n, T, 0, None)
        if n % T:
            with pytest.raises(AssertionError):
                assert_one_teacher_per_node(old, n, T, 0, _balanced_sizes(n - 1, T))


def test_the_reimplementation_is_the_old_function():
    """The split checked above is what cea4199's ``teacher_groups`` drew (read from git; skipped
    where that commit is not in the clone)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:fedgraph/methods/privgnn/teachers.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {OLD_COMMIT} is not in this clone")
    name = "fedgraph.methods.privgnn._teachers_at_" + OLD_COMMIT
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__package__ = "fedgraph.methods.privgnn"
    sys.modules[name] = module  # dataclasses look their module up
    try:
        exec(compile(source, f"{OLD_COMMIT}:teachers.py", "exec"), module.__dict__)
        for n, T in SIZES:
            for seed in (0, 1):
                a = _old_positional_assignment(n, T, torch.Generator().manual_seed(seed))
                groups = module.teacher_groups(n, T, torch.Generator().manual_seed(seed))
                assert [
                    torch.equal((a == t).nonzero().view(-1), g) for t, g in enumerate(groups)
                ] == [True] * T
    finally:
        del sys.modules[name]


# ------------------------------------------------ (3) the reported epsilon is the proven one
def _histogram(groups: list[frozenset], labels: Tensor, C: int) -> Tensor:
    """A stand-in teacher per group, any function of its own data: the majority label of its
    nodes (ties to the smallest), an abstention when empty."""
    h = torch.zeros(C)
    for g in groups:
        if g:
            h[int(torch.bincount(labels[list(g)], minlength=C).argmax())] += 1
    return h


@pytest.mark.parametrize("n,T", [(141, 10), (9, 6), (23, 5)])
def test_the_histograms_l2_change_is_at_most_the_ledgers_sensitivity(n, T):
    """Under the coupling, whatever each teacher computes from its own data, one removal moves
    the vote histogram by at most ``VOTE_SENSITIVITY = sqrt 2`` in L2 (a vote between classes,
    or a vote to an abstention when ``v`` was its teacher's only node)."""
    C, ids = 3, torch.arange(n)
    worst = 0.0
    for seed in range(4):
        assign = pg.teacher_assignment(n, T, torch.Generator().manual_seed(seed))
        labels = torch.randint(0, C, (n,), generator=torch.Generator().manual_seed(100 + seed))
        base = _histogram(_groups(assign, ids, T), labels, C)
        for v in range(n):
            keep = ids != v
            h = _histogram(_groups(assign[keep], ids[keep], T), labels, C)
            worst = max(worst, float((h - base).norm()))
    assert worst <= pg.VOTE_SENSITIVITY + 1e-12


def test_the_ensemble_epsilon_is_the_accountants_figure_at_sensitivity_sqrt_2():
    """Q = 100 histograms, sigma-votes = 40, delta = 1e-5 (the issue's example): the ledger's
    events are Gaussians of multiplier sigma / sqrt 2, and its epsilon (1.356) is the analytic
    Gaussian's at that sensitivity, not at the positional split's 2 sqrt 2 (2.943)."""
    Q, sigma, delta = 100, 40.0, 1e-5
    (event,) = pg.ensemble_events(Q, sigma)
    assert event.noise_multiplier == pytest.approx(sigma / math.sqrt(2))
    reported = pg.ensemble_epsilon(Q, sigma, None, delta)
    assert reported == pytest.approx(
        analytic_gaussian_epsilon(sigma / math.sqrt(2 * Q), delta), rel=1e-9
    )
    assert reported == pytest.approx(1.356, abs=1e-3)
    two_teachers = analytic_gaussian_epsilon(sigma / math.sqrt(8 * Q), delta)
    assert two_teachers == pytest.approx(2.943, abs=1e-3) and reported < two_teachers / 2


def test_a_run_reports_the_split_and_the_proven_epsilon(tmp_path, monkeypatch):
    """In-process ensemble run: each client's epsilon is the analytic Gaussian's at L2
    sensitivity sqrt 2 for its released histograms, and the report says how the split gives
    it."""
    from test_privgnn_ensemble import ENSEMBLE
    from test_privgnn_federated import _run_strategy

    cfg, _, report = _run_strategy({**ENSEMBLE, "client-epsilons": "inf"}, tmp_path, monkeypatch)
    assert report["status"] == "ok"
    assert "one node changes one teacher" in report["privacy"]["mechanism"]
    Q, s2, s1 = cfg.num_queries, cfg.sigma_votes, cfg.sigma_threshold
    expect = analytic_gaussian_epsilon(1 / math.sqrt(Q * (2 / s2**2 + 2 / s1**2)), cfg.delta)
    for p in range(cfg.num_clients):
        assert report["privacy"]["per_subject"][f"client-{p}"]["epsilon"] == pytest.approx(
            expect, rel=1e-3
        )
