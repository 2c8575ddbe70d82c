"""The smaller items of issue 61 (a new user's first run): PrivGNN's paper-reproduction mode
runs again and says plainly that it is not DP, the LPGNN preset's table says LPGNN, an
epsilon above any meaningful value is warned about, and a ragged CSV is named without numpy's
``usecols`` hint."""

from __future__ import annotations

import pytest

from fedgraph.registry import ContractError
from fedgraph.report import epsilon_warning, format_table, method_title
from fedgraph.strategies.base import check_budgets_kept


def test_only_a_chosen_not_dp_release_is_exempt_from_the_budget_check():
    chosen = {
        "epsilon": float("inf"),
        "budget": 10.0,
        "over_budget": True,
        "claimed": {"epsilon": 3.2, "by": ["Olatunji et al. (TMLR 2023)"], "holds": False},
    }
    rows = {"client-0": dict(chosen), "client-1": dict(chosen)}
    check_budgets_kept(rows, "PrivGNNStrategy")  # runs
    assert all(r["not_dp"] for r in rows.values())
    overspent = {
        "client-0": dict(chosen),
        "client-1": {"epsilon": 11.0, "budget": 10.0, "over_budget": True},
    }
    with pytest.raises(ContractError, match=r"client-1: epsilon 11 > budget 10"):
        check_budgets_kept(overspent, "PrivGNNStrategy")
    # an infinite epsilon without a chosen not-DP mode is an overspend like any other
    with pytest.raises(ContractError, match="client-0"):
        check_budgets_kept(
            {"client-0": {"epsilon": float("inf"), "budget": 4.0, "over_budget": True}}
        )


def test_log_softmax_paper_runs_at_a_finite_budget_and_says_not_dp(tmp_path, monkeypatch):
    """The regression: with the default client-epsilons (10), the documented reproduction
    mode failed every run with "spent more than a privacy budget" (exit 1)."""
    from test_privgnn_federated import SMALL, _run_strategy

    config = {k: v for k, v in SMALL.items() if k != "client-epsilons"}
    _, _, report = _run_strategy(
        {**config, "answer-mode": "log-softmax-paper"}, tmp_path, monkeypatch
    )
    assert report["status"] == "ok", report["error"]
    assert report["status_note"].startswith(
        "NOT DP: client-0, client-1 released without a finite epsilon"
    )
    table = format_table(report)
    assert "status ok (NOT DP: see below)" in table.splitlines()[0]
    assert "NOT DP" in table and "OVER BUDGET" not in table
    for row in report["privacy"]["per_subject"].values():
        assert row["not_dp"] and row["over_budget"] and row["budget"] == 10.0


def test_the_lpgnn_preset_table_is_titled_lpgnn():
    lpgnn = {"method": "ppgnn", "config": {"mechanism": "multi-bit", "denoiser": "kprop"}}
    assert method_title(lpgnn) == "ppgnn (LPGNN: multi-bit + kprop)"
    assert (
        method_title({"method": "ppgnn", "config": {"mechanism": "ppm", "denoiser": "flexprop"}})
        == "ppgnn"
    )
    assert (
        method_title({"method": "ppgnn", "config": {"mechanism": "ppm", "denoiser": "none"}})
        == "ppgnn (BASE: ppm, no denoiser)"
    )
    table = format_table({**lpgnn, "dataset": {"name": "cora"}, "status": "ok"})
    assert table.startswith("fedgraph ppgnn (LPGNN: multi-bit + kprop) on cora: status ok")


def test_an_epsilon_above_any_meaningful_value_is_warned_about():
    assert "epsilon 1e+300 is above any meaningful value" in epsilon_warning(
        {"client-epsilons": "1e300"}
    )
    assert epsilon_warning({"client_epsilons": [1.0, 4.0, 101.0]}).startswith(
        "WARNING: epsilon 101"
    )
    assert epsilon_warning({"budgets": "1,2,4", "epsilon": 8}) is None
    assert epsilon_warning({"client-epsilons": "inf"}) is None  # no noise, said plainly
    assert epsilon_warning({"hops": 1000}) is None
    table = format_table(
        {
            "method": "gap",
            "dataset": {"name": "cora"},
            "status": "ok",
            "config": {"client_epsilons": [1e300]},
        }
    )
    assert "WARNING: epsilon 1e+300 is above any meaningful value" in table


def test_the_precheck_warns_before_a_superlink_starts(capsys):
    from fedgraph.simulations.flwr_precheck import main

    assert main(["--run-config", "method='gap' client-epsilons='1e300'"]) == 0
    assert "WARNING: epsilon 1e+300" in capsys.readouterr().err


def test_a_ragged_csv_is_named_without_numpys_usecols_hint(tmp_path):
    from fedgraph.data.user_graphs import _read_csv

    path = tmp_path / "features.csv"
    path.write_text("# a comment\n1,2,3\n\n4,5,6\n4,5\n")
    with pytest.raises(ValueError) as err:
        _read_csv(path, float, 2, "one row of features per node")
    text = str(err.value)
    assert "usecols" not in text
    assert (
        f"{path}: data line 3 (counted from 1, comments and blank lines left out) has 2 "
        "column(s) where the lines before it have 3"
    ) in text
    assert text.endswith("(expected one row of features per node)")
