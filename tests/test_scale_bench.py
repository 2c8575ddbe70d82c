"""bench/scale.py's new cells on tiny graphs: PrivGNN's client answers (real and plain loop),
a plain whole run, the process-tree measurement and the ratios (no Ray: the ``run:`` cells
start a Ray cluster and take half a minute each; bench/results/scale_runs.json has them)."""

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def scale(load_script):
    return load_script("bench/scale.py")


@pytest.mark.parametrize("phase", ["privgnn-answer", "privgnn-answer-plain"])
def test_privgnn_answer_cells(scale, phase, monkeypatch):
    from fedgraph.methods.privgnn import client as pf

    monkeypatch.setattr(pf, "client_graph", pf.client_graph)  # the cell patches it: restore
    row = scale.run_one(phase, 400, 8.0, 2, 2, 16, 2, 1.0, "cpu", queries=3)
    assert row["phase"] == phase and row["queries"] == 3 and row["clients"] == 2
    assert row["edges"] == 3200 and row["phase_s"] >= 0 and 0 < row["client_nodes"] < 400


def test_plain_gap_run(scale):
    out = scale._plain_run("gap", scale._settings("gap", 300, 6.0, 2, "cpu"))
    assert out["edges"] == 1800 and 0.0 <= out["test_acc"] <= 1.0
    assert out["timings"]["total"] > 0


def test_set_overrides_both_sides_of_the_ratio(scale, monkeypatch):
    """``--set`` (e.g. the default budgets) changes the federated run's config and the plain
    run's alike: the plain child gets the same ``--set`` on its command line."""
    monkeypatch.setattr(scale, "RUN_OVERRIDES", {"encoder-rounds": "3", "local-epochs": "4"})
    cfg = scale._settings("gap", 300, 6.0, 2, "cpu")
    assert cfg["encoder-rounds"] == "3" and cfg["local-epochs"] == "4"
    assert cfg["classifier-rounds"] == scale.RUN_SETTINGS["gap"]["classifier-rounds"]
    seen = {}

    def fake_measure(cmd, env, timeout, mem_limit, stdout, stderr, **kwargs):
        seen["cmd"] = cmd
        Path(stderr).write_text("not run\n")
        return {"status": "killed", "rc": 1}

    monkeypatch.setattr(scale, "_measure", fake_measure)
    with pytest.raises(RuntimeError):
        scale._whole_run("run-plain:gap", 300, 6.0, 2, "cpu", 3, 1, 18.0, 60.0)
    cmd = seen["cmd"]
    i = cmd.index("--set")
    assert cmd[i + 1 : i + 3] == ["encoder-rounds=3", "local-epochs=4"]


def test_measure_samples_the_tree_and_kills_past_the_limit(scale, tmp_path):
    # A parent holding ~100 MB and a child holding ~100 MB: the tree's sum sees both.
    code = (
        "import subprocess, sys, time; b = bytearray(100_000_000); "
        "p = subprocess.Popen([sys.executable, '-c', "
        "'import time; b = bytearray(100_000_000); time.sleep(2)']); time.sleep(2); p.wait()"
    )
    st = scale._measure([sys.executable, "-c", code], {}, 60, 10.0, tmp_path / "o", tmp_path / "e")
    assert st["status"] == "ok" and st["rc"] == 0 and st["samples"] >= 2
    assert st["tree_rss_gib"] >= 0.18 and st["ru_maxrss_gib"] >= 0.09
    st = scale._measure([sys.executable, "-c", code], {}, 60, 0.05, tmp_path / "o", tmp_path / "e")
    assert st["status"].startswith("aborted") and st["rc"] != 0


def test_ratios_pair_each_phase_with_its_plain(scale):
    rows = [
        {"phase": "run-plain:gap", "nodes": 10, "phase_s": 2.0, "tree_pss_gib": 1.0},
        {"phase": "run:gap", "nodes": 10, "phase_s": 6.0, "tree_pss_gib": 3.0},
        {"phase": "privgnn-answer-plain", "nodes": 10, "phase_s": 4.0},
        {"phase": "privgnn-answer", "nodes": 10, "phase_s": 1.0},
        {"phase": "run:ppgnn", "nodes": 10, "phase_s": 1.0},
    ]
    scale._ratios(rows)
    assert rows[1]["ratio"] == 3.0 and rows[1]["mem_ratio"] == 3.0
    assert rows[3]["ratio"] == 0.25 and "ratio" not in rows[4]


def test_ratios_pair_rows_of_the_same_seed_and_the_summary_spans_the_seeds(scale):
    rows = [
        {"phase": "run-plain:privgnn", "nodes": 10, "phase_s": 2.0, "seed": 0, "test_acc": 0.5},
        {"phase": "run:privgnn", "nodes": 10, "phase_s": 3.0, "seed": 0, "test_acc": 0.7},
        {"phase": "run-plain:privgnn", "nodes": 10, "phase_s": 4.0, "seed": 1, "test_acc": 0.7},
        {"phase": "run:privgnn", "nodes": 10, "phase_s": 5.0, "seed": 1, "test_acc": 0.9},
        {"phase": "run:privgnn", "nodes": 10, "status": "aborted", "seed": 2},
    ]
    scale._ratios(rows)
    assert rows[1]["ratio"] == 1.5 and rows[3]["ratio"] == 1.25  # seed 1 against seed 1
    lines = scale.seed_summary(rows)
    assert len(lines) == 2 and lines[0].startswith("run-plain:privgnn")
    assert "time 3 +- 1.4 (2) s" in lines[0] and "test 0.6 +- 0.14 (2)" in lines[0]
    assert "ratio 1.375 +- 0.18 (2)" in lines[1]  # the aborted seed is left out


def test_the_pma_phase_is_compared_with_the_plain_aggregation_both_ways(scale):
    pma, agg = scale.PMA_PHASE, scale.PLAIN_AGGREGATION
    rows = [
        {
            "phase": "run-plain:gap",
            "nodes": 10,
            "phase_s": 9.0,
            "seed": 0,
            "timings": {agg: 2.0, scale.PLAIN_EMBED: 1.0},
        },
        {"phase": "gap-release-noise", "nodes": 10, "phase_s": 9.9, "seed": 1},
        {"phase": "gap-release-noise", "nodes": 10, "phase_s": 1.0, "seed": 0},
        {
            "phase": "run:gap",
            "nodes": 10,
            "phase_s": 12.0,
            "seed": 0,
            "timings": {pma: 6.0},
            "edges": 40,
            "device": "cpu",
        },
        {"phase": "run:gap", "nodes": 10, "phase_s": 12.0, "seed": 1, "timings": {pma: 6.0}},
    ]
    scale._ratios(rows)
    assert rows[3]["pma_ratio"] == 3.0 and rows[3]["pma_ratio_releases"] == 2.0  # seed 0's cell
    assert rows[3]["pma_ratio_same_work"] == 1.5  # 6 / (1 embed + 2 aggregation + 1 noise)
    assert "pma_ratio" not in rows[4]  # no plain run of seed 1
    assert (
        "PMA/aggregation 3.0 (2.0 with the releases' noise, 1.5 with the encoder's output too)"
    ) in scale._fmt(rows[3])
    summary = scale.seed_summary(rows)[-1]
    assert "PMA/(aggregation + releases' noise) 2 +- 0 (1)" in summary
    assert "PMA/(embed + aggregation + releases' noise) 1.5 +- 0 (1)" in summary


def test_the_plain_gap_run_times_its_encoders_output_apart():
    """``run-plain:gap``'s ``embed``: the trained encoder's forward pass on every node (PMA's
    input, which the federated clients compute inside their PMA phase), not in ``encoder``."""
    from fedgraph.data import gap_split, load_dataset
    from fedgraph.methods.gap import run_gap

    data = gap_split(load_dataset("synthetic-sbm:300:6"), 0)
    res = run_gap(data, epsilon=4.0, num_hops=1, encoder_epochs=2, classifier_epochs=2, seed=0)
    assert {"encoder", "embed", "aggregation"} <= set(res["timings"])
    assert 0 < res["timings"]["embed"] < res["timings"]["total"]
    mlp = run_gap(data, method="mlp", epsilon=4.0, num_hops=0, classifier_epochs=2, seed=0)
    assert "embed" not in mlp["timings"]  # no encoder: nothing to embed


def test_the_release_noise_cell_draws_the_rows_the_clients_release(scale, monkeypatch):
    from fedgraph import randomness

    drawn = []
    real = randomness.add_gaussian_
    monkeypatch.setattr(
        randomness,
        "add_gaussian_",
        lambda x, sigma, g: (
            drawn.append((tuple(x.shape), sigma, type(g).__name__)),
            real(x, sigma, g),
        )[1],
    )
    row = scale.run_one("gap-release-noise", 300, 6.0, 3, 2, 4, 2, 0.5, "cpu")
    assert row["phase_s"] >= 0 and len(drawn) == 2 * 3  # hops x clients (seconds: rounded)
    assert {d[1:] for d in drawn} == {(0.5, "SecureRandom")}
    assert sum(d[0][0] for d in drawn) == 2 * (3 - 1) * 300  # (C - 1) N rows per hop
    assert {d[0][1] for d in drawn} == {4}


def test_whole_run_time_split_adds_up_and_keeps_setup_apart(scale):
    """run_split: setup phases whole, the clients' handlers outside setup as their compute,
    the server's waits minus those as communication, the rest of the phases as the server's
    compute, and what is outside the phases as other; the five add up to the wall time."""
    report = {
        "timings_s": {
            "connect": 0.1,
            "setup + calibration (clients)": 2.0,
            "encoder rounds": 5.0,
            "evaluate (clients)": 0.5,
            "total": 8.0,
        },
        "exchange_s": {
            "connect": 0.0,
            "setup + calibration (clients)": 1.9,
            "encoder rounds": 4.0,
            "evaluate (clients)": 0.4,
        },
    }
    handlers = [
        {"type": "query.gap_setup", "seconds": 1.0},
        {"type": "train", "seconds": 3.0},
        {"type": "evaluate", "seconds": 0.2},
    ]
    split = scale.run_split(10.0, report, handlers)
    assert split == {
        "setup": 2.0,
        "communication": 1.2,
        "compute_clients": 3.2,
        "compute_server": 1.2,
        "other": 2.4,
    }
    assert sum(split.values()) == pytest.approx(10.0)
    plain = scale.plain_split(
        5.0, {"load + split": 1.0, "calibration": 0.5, "encoder": 2.0, "total": 3.5}
    )
    assert plain == {
        "setup": 1.5,
        "communication": 0.0,
        "compute_clients": 0.0,
        "compute_server": 2.0,
        "other": 1.5,
    }


def test_the_report_times_the_servers_waits_on_clients_per_phase(tmp_path):
    """exchange_s (fedgraph.report.exchanged, from the grid's send_and_receive) is part of each
    phase's wall time; the clients' handler times go to FEDGRAPH_HANDLER_TIMES's file only, one
    line per message (fedgraph.simulations.handler_times), and nothing of them to the messages."""
    import os

    from fedgraph.simulations import handler_times
    from fedgraph.simulations.local import LocalGrid, run_local

    log = tmp_path / "handlers.jsonl"
    grid = LocalGrid(2, record=True)
    os.environ[handler_times.ENV] = str(log)
    try:
        rep = run_local(
            {
                "method": "gap",
                "dataset": "synthetic-sbm:300:6",
                "num-clients": 2,
                "partitioner": "random",
                "encoder-rounds": 2,
                "classifier-rounds": 2,
                "output-dir": str(tmp_path),
                "run-name": "t",
            },
            grid=grid,
        )
    finally:
        del os.environ[handler_times.ENV]
    assert rep["status"] == "ok"
    timings, waits = rep["timings_s"], rep["exchange_s"]
    assert set(waits) == set(timings) - {"total"}
    assert all(0.0 <= waits[k] <= timings[k] + 1e-3 for k in waits)
    assert waits["setup + calibration (clients)"] > 0
    lines = handler_times.read(log)
    assert len(lines) == len(grid.log) and {ln["type"] for ln in lines} >= {
        "query.gap_setup",
        "train",
    }
    assert all(ln["seconds"] >= 0 and ln["pid"] == os.getpid() for ln in lines)
    for _, reply in grid.log:  # no timing field in what left the clients
        text = str(reply.content) if reply.has_content() else ""
        assert "seconds" not in text and "handler" not in text
    before = len(lines)
    run_local(
        {
            "method": "gap",
            "dataset": "synthetic-sbm:300:6",
            "num-clients": 2,
            "partitioner": "random",
            "encoder-rounds": 1,
            "classifier-rounds": 1,
            "output-dir": str(tmp_path),
            "run-name": "t2",
        }
    )
    assert len(handler_times.read(log)) == before  # off without the variable


@pytest.mark.parametrize("keep", [False, True])
def test_keep_work_keeps_a_whole_runs_folder_and_records_it(scale, monkeypatch, keep):
    import shutil

    monkeypatch.setattr(scale, "KEEP_WORK", keep)
    row = scale._whole_run("run-plain:gap", 300, 6.0, 2, "cpu", 0, 1, 8.0, 300.0, min_avail=0.1)
    assert row["edges"] == 1800
    if not keep:
        assert "work_dir" not in row
        return
    work = Path(row["work_dir"])
    try:
        assert (work / "stdout.log").read_text().strip()  # the child's row: what was measured
    finally:
        shutil.rmtree(work, ignore_errors=True)
