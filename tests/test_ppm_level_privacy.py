"""What a PPM report reveals about its user's privacy level (issue 13, fault 3).

PPM (PPGNN paper Alg. 3) spends gamma * eps_tau on the level (ESW, Eq. 6), but MLR's signs are
drawn with the user's own budget (1 - gamma) eps_tau / m' (Eq. 4), so the whole report's
distribution depends on the level through the signs too: gamma * eps_tau is not what hides the
level. These tests check

* :func:`fedgraph.mechanisms.ppm.level_leakage` against a brute-force enumeration of every
  report value and a grid of features (d = 1, 2), with probabilities written here from Eq. 6
  and Eq. 4, not from the package;
* that a run's ledger states, per level, the level-inference epsilon of the whole report, and
  that it matches the log ratio measured on reports made by the real client code path
  (:func:`fedgraph.methods.ppgnn.client_report`) for one user with one feature x = -1.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fedgraph.accounting import PrivacyLedger
from fedgraph.config import parse_run_config
from fedgraph.data.partition import ClientGraph
from fedgraph.mechanisms import FeatureMechanism, MultiBitMechanism, PPMParams
from fedgraph.mechanisms.feature import check_privacy_declaration
from fedgraph.mechanisms.ppm import level_epsilon, level_leakage
from fedgraph.methods import ppgnn
from fedgraph.registry import ContractError

# --- brute force from the paper's formulas ---------------------------------------------------


def esw_pmf(g: int, eps: float, f: int, b: int) -> list[float]:
    """Eq. 6 over the outputs 1..f+2b (window of g shifted by b: g..g+2b)."""
    e = math.exp(eps)
    p, q = e / ((2 * b + 1) * e + f - 1), 1.0 / ((2 * b + 1) * e + f - 1)
    return [p if abs(g + b - r) <= b else q for r in range(1, f + 2 * b + 1)]


def report_probabilities(x: tuple[float, ...], tau: int, budgets, gamma: float, b: int):
    """{report value: probability} of one PPM report: (released level, ordered indices, signs).
    m' = max(1, min(d, floor((1 - gamma) eps_g / 2.2))) at the decoded released level
    g = clip(g' - b, 1, f) (Theorem 1); each sign by Eq. 4 at (1 - gamma) eps_tau / m'."""
    f, d = len(budgets), len(x)
    out = {}
    for r, p_r in enumerate(esw_pmf(tau, gamma * budgets[tau - 1], f, b), start=1):
        g = min(max(r - b, 1), f)
        m = max(1, min(d, math.floor((1 - gamma) * budgets[g - 1] / 2.2)))
        e = (1 - gamma) * budgets[tau - 1] / m
        perms = list(itertools.permutations(range(d), m))
        for idx in perms:
            for signs in itertools.product((-1, 1), repeat=m):
                p = p_r / len(perms)
                for j, s in zip(idx, signs):
                    p *= 0.5 + 0.5 * s * x[j] * math.tanh(e / 2)
                out[(r, idx, signs)] = p
    assert abs(sum(out.values()) - 1) < 1e-12
    return out


def brute_force(budgets, gamma: float, d: int, relation: str) -> torch.Tensor:
    h, params = len(budgets), PPMParams(tuple(budgets), gamma)
    grid = list(itertools.product((-1.0, -0.5, 0.0, 0.5, 1.0), repeat=d))
    probs = {
        (x, tau): report_probabilities(x, tau, budgets, gamma, params.window)
        for x in grid
        for tau in range(1, h + 1)
    }
    out = torch.zeros(h, h, dtype=torch.float64)
    for t, u in itertools.product(range(1, h + 1), repeat=2):
        for x, y in itertools.product(grid, repeat=2):
            if relation == "level" and x != y:
                continue
            pa, pb = probs[(x, t)], probs[(y, u)]
            worst = max(abs(math.log(pa[r]) - math.log(pb[r])) for r in pa)
            out[t - 1, u - 1] = max(out[t - 1, u - 1], worst)
    return out


CASES = [
    ((1.0, 2.0, 4.0), 0.1),
    ((1.0, 8.0), 0.1),
    ((1.0, 6.0), 0.3),
    ((0.5, 3.0, 7.0, 12.0), 0.2),
    ((2.0, 9.0, 11.0), 0.1),
]


@pytest.mark.parametrize("budgets,gamma", CASES)
@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("relation", ["level", "level+features"])
def test_level_leakage_equals_brute_force(budgets, gamma, d, relation):
    exact = level_leakage(PPMParams(budgets, gamma), d, relation)
    expect = brute_force(budgets, gamma, d, relation)
    assert torch.allclose(exact, expect, rtol=0, atol=1e-9), (exact, expect)


def test_cases_cover_several_sampled_dimensions_and_windows():
    """The brute-force cases reach m' = 2 at d = 2 (signs at eps / 2) and ESW windows b > 0."""
    params = [PPMParams(b, g) for b, g in CASES]
    assert any(math.floor((1 - p.gamma) * max(p.budgets) / 2.2) >= 2 for p in params)
    assert {p.window for p in params} >= {0, 1}


def test_issue_figures_and_esw_alone():
    """Issue 13: E = {1, 2, 4}, gamma 0.1, levels 1 vs 3: 2.683 (the issue rounds up to 2.69;
    ESW's own output 0.297 plus 2.386 from one sign at 0.9 vs 3.6); E = {1, 8}: 6.486."""
    leak = level_leakage(PPMParams((1.0, 2.0, 4.0), 0.1), 1)
    sign = math.log((math.exp(3.6) + 1) / (math.exp(0.9) + 1))
    esw_alone = max(
        abs(math.log(a) - math.log(c)) for a, c in zip(esw_pmf(1, 0.1, 3, 1), esw_pmf(3, 0.4, 3, 1))
    )
    assert esw_alone == pytest.approx(0.2974, abs=1e-4)
    assert float(leak[0, 2]) == pytest.approx(esw_alone + sign, abs=1e-12)
    assert float(leak[0, 2]) == pytest.approx(2.683, abs=1e-3)
    assert float(level_leakage(PPMParams((1.0, 8.0), 0.1), 1)[0, 1]) == pytest.approx(
        6.486, abs=1e-3
    )
    # per level: the worst other level; the bound over every d equals d = 1433 (Cora) here
    params = PPMParams((1.0, 2.0, 4.0), 0.1)
    assert level_epsilon(params, None).tolist() == pytest.approx([2.6832, 2.0078, 2.6832], abs=1e-4)
    assert torch.equal(level_epsilon(params, None), level_epsilon(params, 1433))
    # the features' epsilon at a fixed level is the diagonal of the level+features relation
    free = level_leakage(params, 5, "level+features")
    assert torch.allclose(free.diagonal(), torch.tensor([0.9, 1.8, 3.6], dtype=torch.float64))


def test_num_features_none_is_the_max_over_d():
    params = PPMParams((10.0, 20.0), 0.1)  # m' up to floor(18 / 2.2) = 8
    per_d = torch.stack([level_epsilon(params, d) for d in range(1, 12)])
    assert torch.equal(level_epsilon(params, None), per_d.amax(0))
    assert not torch.equal(per_d[0], per_d[-1])  # d matters below m'
    with pytest.raises(ValueError, match="relation"):
        level_leakage(params, 3, "features")
    with pytest.raises(ValueError, match="num_features"):
        level_leakage(params, 0)


# --- the run's report against reports from the real client path ------------------------------


def one_feature_client(n: int, tau: int) -> ClientGraph:
    """n users, one binary feature 0 (x = -1 after the public domain (0, 1)), all at level tau,
    no labelled users, no edges."""
    none = torch.zeros(n, dtype=torch.bool)
    empty = torch.zeros(2, 0, dtype=torch.long)
    return ClientGraph(
        0,
        torch.arange(n),
        torch.zeros(n, 1),
        torch.zeros(n, dtype=torch.long),
        none,
        none,
        ~none,
        empty,
        empty,
        torch.full((n,), tau, dtype=torch.long),
    )


@pytest.mark.parametrize("budgets,n", [("1,2,4", 300_000), ("1,8", 1_000_000)])
def test_reported_level_epsilon_matches_measured(budgets, n):
    cfg = parse_run_config({"budgets": budgets, "gamma": 0.1})
    h = len(cfg.budgets)
    ledger = PrivacyLedger()
    ppgnn.record_privacy(ledger, cfg, ppgnn.build_mechanism(cfg))  # what the run reports
    counts = {}
    for tau in range(1, h + 1):
        rep = ppgnn.client_report(
            one_feature_client(n, tau), cfg, (0.0, 1.0), 2, torch.Generator().manual_seed(tau)
        )
        assert torch.equal(rep["mech.row"], torch.arange(n))  # one sign per user (m' = 1)
        cell = (rep["mech.released_level"] - 1) * 2 + (rep["mech.sign"].long() + 1) // 2
        counts[tau] = torch.bincount(cell, minlength=2 * (h + 2 * 1)).double()
    for tau in range(1, h + 1):
        best, se = 0.0, 0.0
        for other in range(1, h + 1):
            a, c = counts[tau], counts[other]
            ok = (a > 0) & (c > 0)
            ratio = (a[ok].log() - c[ok].log()).abs()  # same n at every level
            i = int(ratio.argmax())
            if other != tau and float(ratio[i]) > best:
                best, se = float(ratio[i]), math.sqrt(1 / float(a[ok][i]) + 1 / float(c[ok][i]))
        reported = ledger.epsilon(ppgnn.level_subject(tau))[0]
        assert abs(best - reported) <= 5 * se + 1e-3, (tau, best, reported, se)
        # the old claim: ESW's gamma * eps_tau hides the level; the measured leak is far above
        esw_eps = {e.release: e.event.epsilon for e in ledger.entries[f"level-{tau}"]}["esw"]
        assert best > esw_eps + 10 * se, (tau, best, esw_eps)
    if budgets == "1,8":
        assert ledger.epsilon(ppgnn.level_subject(1))[0] == pytest.approx(6.486, abs=1e-3)


def test_ledger_level_subjects_only_for_level_hiding_mechanisms():
    cfg = parse_run_config({"budgets": "1,2,4"})
    ledger = PrivacyLedger()
    ppgnn.record_privacy(ledger, cfg, ppgnn.build_mechanism(cfg))
    assert ledger.subjects == [
        "level-1",
        "level-1 (level)",
        "level-2",
        "level-2 (level)",
        "level-3",
        "level-3 (level)",
    ]
    assert [ledger.epsilon(f"level-{t}")[0] for t in (1, 2, 3)] == pytest.approx([1, 2, 4])
    uniform = PrivacyLedger()  # LPGNN: the report does not depend on the level at all
    ppgnn.record_privacy(
        uniform,
        parse_run_config({"budgets": "1,2,4", "mechanism": "multi-bit"}),
        MultiBitMechanism(1.0),
    )
    assert uniform.subjects == ["every-user"]
    single = PrivacyLedger()  # one level: the level is public, nothing to hide
    ppgnn.record_privacy(
        single,
        parse_run_config({"budgets": "1"}),
        ppgnn.build_mechanism(parse_run_config({"budgets": "1"})),
    )
    assert single.subjects == ["level-1"]


class _ClaimsToHideLevel(MultiBitMechanism):
    name = "claims-to-hide"
    hides_level = True


def test_hides_level_requires_a_level_epsilon():
    with pytest.raises(ContractError, match=r"level_epsilon\(level=1\)"):
        check_privacy_declaration(_ClaimsToHideLevel(1.0), 2)
    assert FeatureMechanism.level_epsilon(MultiBitMechanism(1.0), 1) == math.inf


def test_a_budget_beyond_the_any_feature_count_analysis_names_budgets_and_the_limit():
    """Without the dataset's feature count the bound scans every d MLR could sample; past
    10,000 the error says which key and up to what it is allowed (was an internal message)."""
    from fedgraph.mechanisms.ppm import PPMParams, level_leakage

    params = PPMParams(budgets=(1.0, 1e308))
    with pytest.raises(
        ValueError, match=r"budgets: 1e\+308 is too large .* allowed: budgets below 24446\.9"
    ):
        level_leakage(params)
    level_leakage(params, num_features=50)  # with the feature count: fine
