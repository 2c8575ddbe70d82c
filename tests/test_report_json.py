"""Reports are strict JSON (issue 17, item 3): no NaN or Infinity tokens ever reach a file."""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from fedgraph.report import RunReport, format_table, write_json_atomic


def _strict_load(path):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_non_finite_values_become_null_or_inf_strings(tmp_path):
    obj = {
        "val": float("nan"),
        "eps": float("inf"),
        "neg": -math.inf,
        "ok": 0.5,
        "rounds": [{"val": float("nan")}, {"val": 0.25}],
        "tensor": torch.tensor([1.0, float("nan"), float("inf")]),
        "np": np.float64("nan"),
        "array": np.array([np.inf, 2.0]),
    }
    data = _strict_load(write_json_atomic(tmp_path / "r.json", obj))
    assert data["val"] is None and data["eps"] == "inf" and data["neg"] == "-inf"
    assert data["ok"] == 0.5 and data["rounds"] == [{"val": None}, {"val": 0.25}]
    assert data["tensor"] == [1.0, None, "inf"] and data["np"] is None
    assert data["array"] == ["inf", 2.0]
    assert float(data["eps"]) == math.inf  # how readers get the number back


def test_a_run_report_with_nan_accuracy_is_strict(tmp_path):
    report = RunReport("gap", {"epsilon": float("inf")})
    report.accuracy["val"] = float("nan")
    path = tmp_path / "run.json"
    report.write(tmp_path, "run")
    data = _strict_load(path)
    assert data["accuracy"]["val"] is None


def test_every_phase_reports_the_peak_memory_of_the_process_tree(tmp_path):
    """``peak_rss_mib`` (issue 31): one entry per timed phase, at least the memory a phase
    allocated (a 200 MiB tensor held at the phase's end: its last sample), and the summary
    prints it."""
    report = RunReport("gap", {}, progress=False)
    with report.phase("small"):
        pass
    with report.phase("big"):
        block = torch.ones(200 * 2**20 // 4)  # 200 MiB, touched
        block += 1
    del block
    data = report.to_dict()
    peaks = data["peak_rss_mib"]
    assert set(peaks) == {"small", "big"} == set(data["timings_s"]) - {"total"}
    assert peaks["big"] >= peaks["small"] + 150, peaks
    assert "peak memory (MiB, process tree)" in format_table(data)


def _table(**extra):
    report = {
        "method": "x",
        "dataset": {"name": "d", "num_nodes": 100},
        "status": "ok",
        "accuracy": {"test": 0.5},
        "privacy": {
            "per_subject": {
                "client-0": {"epsilon": 1.0, "delta": 1e-5, "releases": [{"release": "pma"}]}
            }
        },
        "ground_truth": {"majority_class": 0.3},
    }  # the whole graph's: not compared
    for key, value in extra.items():
        report[key] = {**report.get(key, {}), **value} if isinstance(value, dict) else value
    return format_table(report)


def test_the_table_states_what_the_rows_alone_would_hide():
    """A delta that is not below 1/n, a whole undirected edge's cost with directed edge units,
    clients that released nothing and an accuracy below the majority class each get a line;
    none of them when it does not apply."""
    plain = _table()
    assert not any(w in plain for w in ("WARNING", "edge-unit", "released nothing", "below"))
    row = {"epsilon": 1.0, "delta": 0.01, "releases": [{"release": "pma"}]}
    assert "WARNING: delta 0.01 is not below 1 / 100 (a client's average" in _table(
        privacy={"per_subject": {"client-0": row}}
    )
    row["delta"] = 0.05  # 4 clients of 25 nodes each on average
    assert "WARNING: delta 0.05 is not below 1 / 25" in _table(
        privacy={"per_subject": {"client-0": row}}, config={"num_clients": 4}
    )
    row["delta"] = 1e-3
    assert "WARNING" not in _table(
        privacy={"per_subject": {"client-0": row}}, config={"num_clients": 4}
    )
    assert "costs epsilon up to 5.89 per client" in _table(
        privacy={"undirected_edge_epsilon": {"client-0": 5.89, "client-1": 2.0}}
    )
    assert "client-0, client-3: released nothing (epsilon 0; why)" in _table(
        privacy={"released_nothing": ["client-0", "client-3"], "released_nothing_why": "why"}
    )
    # only a majority rate of the test split (PrivGNN's public test nodes) is compared: the
    # whole graph's differs from a split's (gap-node-cora guessing the largest class: 0.278)
    assert "test accuracy 0.2000 is below the majority-class rate 0.3000" in _table(
        accuracy={"test": 0.2, "majority_class": 0.3}
    )
    assert "below" not in _table(accuracy={"test": 0.2})
    assert "below" not in _table(accuracy={"test": 0.2, "majority_class": 0.15})
    # per-user guarantees (PPGNN levels): n is the users, however they are grouped
    level = {"epsilon": 1.0, "delta": 1e-3, "releases": [{"release": "gaussian"}]}
    assert "delta 0.001 is not below 1 / 2708 (the users)" in _table(
        privacy={"per_subject": {"every-user": level}},
        config={"num_clients": 50},
        dataset={"num_nodes": 2708},
    )
