import math

import pytest

from fedgraph.accounting import ApproxDP, PrivacyLedger, PureDP
from fedgraph.config import parse_run_config
from fedgraph.methods.ppgnn import build_mechanism, record_privacy


def test_ppgnn_ledger_epsilon_per_level_matches_budget_and_prv():
    cfg = parse_run_config({"budgets": "1,2,4", "gamma": 0.2, "label-epsilon": 0.5})
    ledger = PrivacyLedger()
    record_privacy(ledger, cfg, build_mechanism(cfg))
    for level, budget in enumerate([1.0, 2.0, 4.0], start=1):
        # the label's 0.5 comes out of the level's budget; the features get the rest
        eps, delta = ledger.epsilon(f"level-{level}")
        assert eps == pytest.approx(budget) and delta == 0
        releases = {e.release: e.event.epsilon for e in ledger.entries[f"level-{level}"]}
        assert releases["esw"] == pytest.approx(0.2 * (budget - 0.5))
        assert releases["mlr"] == pytest.approx(0.8 * (budget - 0.5))
        assert releases["labels (randomized response)"] == pytest.approx(0.5)
        lo, est, hi = ledger.cross_check(f"level-{level}")  # independent: prv-accountant
        assert lo - 1e-3 <= eps <= hi + 1e-3
        assert ledger.summary()[f"level-{level}"]["cross_check"]["agrees"]


def test_single_level_spends_everything_on_features():
    cfg = parse_run_config({"budgets": "1"})
    ledger = PrivacyLedger()
    record_privacy(ledger, cfg, build_mechanism(cfg))
    assert [e.release for e in ledger.entries["level-1"]] == ["mlr"]
    assert ledger.epsilon("level-1") == (1.0, 0)


def test_gaussian_baseline_records_delta():
    cfg = parse_run_config({"mechanism": "gaussian", "epsilon": 0.5, "delta": 1e-6})
    ledger = PrivacyLedger()
    record_privacy(ledger, cfg, build_mechanism(cfg))
    # a uniform mechanism: one subject for every user, not one row per (unused) level
    assert list(ledger.entries) == ["every-user"]
    assert ledger.epsilon("every-user") == (0.5, 1e-6)


def test_event_validation():
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="epsilon"):
            PureDP(bad)
    with pytest.raises(ValueError, match="delta"):
        ApproxDP(1.0, 1.5)
    with pytest.raises(KeyError):
        PrivacyLedger().epsilon("nobody")
    with pytest.raises(TypeError):
        PrivacyLedger().record("a", "b", 1.0)


def test_unprotected_and_unused_releases_are_listed_not_dropped():
    """A client without noise must show epsilon inf (not vanish from the report); a release that
    never reads the protected unit gives epsilon 0; accountable events still compose."""
    import math

    from fedgraph.accounting import Gaussian, PrivacyLedger

    ledger = PrivacyLedger()
    ledger.record("client-0", "pma", Gaussian(2.0, count=2))
    ledger.record_unprotected("client-1", "pma", "epsilon target inf: no noise")
    ledger.record_unused("client-2", "training", "MLP: no edge is read")
    assert ledger.subjects == ["client-0", "client-1", "client-2"]
    assert ledger.epsilon("client-1", 1e-5) == (math.inf, 0.0)
    assert ledger.epsilon("client-2", 1e-5) == (0.0, 0.0)
    eps0 = ledger.epsilon("client-0", 1e-5)[0]
    assert 0 < eps0 < math.inf
    summary = ledger.summary(1e-5)
    assert math.isinf(summary["client-1"]["epsilon"]) and summary["client-2"]["epsilon"] == 0.0
    assert summary["client-1"]["releases"][0]["event"] == "none"
    assert summary["client-0"]["epsilon"] == eps0
    # an unprotected release dominates accountable ones of the same subject
    ledger.record_unprotected("client-0", "extra", "no noise")
    assert math.isinf(ledger.epsilon("client-0", 1e-5)[0])


def test_a_claimed_figure_never_becomes_the_epsilon_of_a_release_that_is_not_dp():
    """record_unprotected(..., claimed=...) (PrivGNN's log-softmax-paper mode): epsilon inf,
    the claim composed beside it with holds False; strict JSON writes "inf", no Infinity."""
    import json

    from fedgraph.accounting import Laplace, PrivacyLedger
    from fedgraph.report import strict_json

    led = PrivacyLedger()
    for _ in range(2):  # two rounds merge into one claimed event
        led.record_unprotected(
            "client-0",
            "answers",
            "unbounded sensitivity",
            claimed=[Laplace(1.0, count=3)],
            claimed_by="a paper",
        )
    row = led.summary(1e-5, "pld")["client-0"]
    assert row["epsilon"] == float("inf") and row["accountant"] == "none"
    assert row["claimed"]["holds"] is False and row["claimed"]["by"] == ["a paper"]
    assert row["claimed"]["epsilon"] == pytest.approx(6.0, rel=1e-3)  # 6 Laplace(1), PLD
    assert led.claims["client-0"][0][2].count == 6
    text = json.dumps(strict_json(row), allow_nan=False)
    assert '"epsilon": "inf"' in text


def test_summary_composes_each_distinct_event_list_once(monkeypatch):
    """Subjects with the same events get the figures a ledger of that subject alone gives,
    computed once; a subject with other events gets its own."""
    from fedgraph.accounting import Gaussian

    ledger = PrivacyLedger()
    for s in ("client-0", "client-1", "client-2"):
        ledger.record(s, "pma", Gaussian(1.5, count=2))
    ledger.record("client-3", "pma", Gaussian(3.0, count=2))
    calls = []
    figures = PrivacyLedger._summary_figures
    monkeypatch.setattr(
        PrivacyLedger, "_summary_figures", lambda self, *a: calls.append(a) or figures(self, *a)
    )
    rows = ledger.summary(1e-5, "prv")
    assert len(calls) == 2
    alone = PrivacyLedger()
    alone.record("client-1", "pma", Gaussian(1.5, count=2))
    want = alone.summary(1e-5, "prv")["client-1"]
    for s in ("client-0", "client-1", "client-2"):
        assert rows[s] == want
    assert rows["client-3"]["epsilon"] < rows["client-0"]["epsilon"]
    rows["client-0"]["cross_check"]["agrees"] = "changed"  # rows do not share objects
    assert rows["client-1"]["cross_check"]["agrees"] is True


@pytest.mark.parametrize("accountant", ["prv", "pld", "analytic", "rdp"])
def test_the_cross_check_is_another_accountant_than_the_one_it_checks(accountant):
    """With ``accountant = "pld"`` the cross-check, labelled prv-accountant, recomputed the
    default composition (PRV, itself then checked by PLD) and returned PLD's figures: PLD
    checked by itself, agreeing by construction (fresh user, 12-07). The check's figures are
    now those of the accountant its label names, computed independently."""
    from fedgraph.accounting import Gaussian, PldAccountant, PrvAccountant

    ledger = PrivacyLedger()
    ledger.record("client-0", "pma", Gaussian(1.8356, count=2))
    delta = 1e-7
    row = ledger.summary(delta, accountant)["client-0"]
    check = row["cross_check"]
    events = ledger.events("client-0")
    assert check["accountant"] != row["accountant"]
    if check["accountant"] == "prv-accountant":
        expected = PrvAccountant().compose(events, delta).bounds
    else:
        assert check["accountant"] == "pld"
        expected = (
            PldAccountant(pessimistic=False).compose(events, delta).epsilon,
            *[PldAccountant().compose(events, delta).epsilon] * 2,
        )
    got = (check["epsilon_lower"], check["epsilon_estimate"], check["epsilon_upper"])
    assert got == pytest.approx(expected, rel=1e-9)
    assert check["agrees"]
