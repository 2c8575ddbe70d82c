"""Reports are strict JSON (issue 17, item 3): no NaN or Infinity tokens ever reach a file."""
from __future__ import annotations

import json
import math

import numpy as np
import torch

from fedgraph.report import RunReport, write_json_atomic


def _strict_load(path):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_non_finite_values_become_null_or_inf_strings(tmp_path):
    obj = {"val": float("nan"), "eps": float("inf"), "neg": -math.inf, "ok": 0.5,
           "rounds": [{"val": float("nan")}, {"val": 0.25}],
           "tensor": torch.tensor([1.0, float("nan"), float("inf")]),
           "np": np.float64("nan"), "array": np.array([np.inf, 2.0])}
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
    from fedgraph.report import format_table

    report = RunReport("gap", {}, progress=False)
    with report.phase("small"):
        pass
    with report.phase("big"):
        block = torch.ones(200 * 2 ** 20 // 4)  # 200 MiB, touched
        block += 1
    del block
    data = report.to_dict()
    peaks = data["peak_rss_mib"]
    assert set(peaks) == {"small", "big"} == set(data["timings_s"]) - {"total"}
    assert peaks["big"] >= peaks["small"] + 150, peaks
    assert "peak memory (MiB, process tree)" in format_table(data)
