"""``fedgraph sweep`` and ``fedgraph report``: the grid, resumption after an interrupt, a failing
cell that does not stop the others, the CSV's means and standard deviations, the plots."""

import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedgraph.procstats import PROCFS
from fedgraph.simulations import results
from fedgraph.simulations.cli import cli
from fedgraph.simulations.sweep import SweepError, load_sweep

ROOT = Path(__file__).parents[1]
#: Linux's process file system (an OS interface, not a project path)
PROC = PROCFS


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_grid_names_precedence_and_epsilon_mapping(tmp_path):
    f = write(
        tmp_path / "s.toml",
        """
[sweep]
datasets = ["cora", "facebook100:Caltech36"]
epsilons = [0.5, 2]
num-clients = [1, 3]
seeds = [0, 1]
[set]
epochs = 7
steps = "4"
[dataset-set."facebook100:Caltech36"]
min-class-size = 50
[methods.ppgnn]
preset = "ppgnn-cora"
epsilon-key = "budgets"
epsilon-levels = [1, 2, 4]
set = { steps = "8" }
[methods.gap-node]
preset = "gap-node-cora"
epsilon-key = "client-epsilons"
epsilons = [8]
[methods.mine]
strategy = "mypkg.mod:Mine"
""",
    )
    sweep = load_sweep(f, str(tmp_path / "out"))
    cells = sweep.cells()
    # 2 datasets x 2 client counts x 2 seeds x (2 epsilons + 1 own epsilon + no epsilon axis)
    assert len(cells) == 2 * 2 * 2 * (2 + 1 + 1)
    assert len({c.name for c in cells}) == len(cells)
    c = next(
        c
        for c in cells
        if c.method == "ppgnn"
        and c.dataset.startswith("facebook100")
        and c.epsilon == 0.5
        and c.num_clients == 3
        and c.seed == 1
    )
    assert c.name == "ppgnn__facebook100-Caltech36__eps0.5__clients3__seed1"
    assert sweep.cell_dir(c) == tmp_path / "out" / "cells" / c.name
    cfg = c.run_config
    assert cfg["budgets"] == "0.5,1,2"  # E = {e, 2e, 4e}
    assert cfg["steps"] == "8" and cfg["epochs"] == 7  # method set > sweep set > preset
    assert cfg["min-class-size"] == 50 and cfg["mechanism"] == "ppm"  # dataset set; preset
    assert (cfg["dataset"], cfg["num-clients"], cfg["seed"]) == ("facebook100:Caltech36", 3, 1)
    assert c.dp_level == "user"
    gap = [c for c in cells if c.method == "gap-node"]
    assert {c.epsilon for c in gap} == {8.0} and all(c.dp_level == "node" for c in gap)
    assert all(c.run_config["client-epsilons"] == 8.0 for c in gap)
    mine = [c for c in cells if c.method == "mine"]
    assert all(c.epsilon is None and c.run_config["strategy"] == "mypkg.mod:Mine" for c in mine)
    assert mine[0].name.endswith("__epsnone__clients1__seed0")


def test_progap_cells_plot_at_their_level(tmp_path):
    """ProGAP's presets give their cells the config's level (edge by default, node); an
    edge-level ProGAP of depth 0 reads no edge: level ``none``, as GAP's MLP variant."""
    f = write(
        tmp_path / "s.toml",
        """
[sweep]
datasets = ["cora"]
num-clients = [2]
seeds = [0]
epsilons = [4]
[methods.edge]
preset = "progap-edge-cora"
epsilon-key = "client-epsilons"
[methods.node]
preset = "progap-node-wisconsin"
epsilon-key = "client-epsilons"
[methods.mlp]
preset = "progap-edge-cora"
epsilon-key = "client-epsilons"
set = { depth = 0 }
""",
    )
    cells = {c.method: c for c in load_sweep(f, str(tmp_path / "out")).cells()}
    assert {m: c.dp_level for m, c in cells.items()} == {
        "edge": "edge",
        "node": "node",
        "mlp": "none",
    }


@pytest.mark.parametrize("name", ["demo", "ppgnn-lpgnn-tables", "gap-table2", "privgnn-lambda"])
def test_every_cell_of_the_bundled_sweeps_validates(name):
    """The bundled sweep files expand to the grids their comments promise, and every cell's run
    config passes the same validation as `fedgraph run` (no cell fails on a typo)."""
    from fedgraph.simulations.server_app import validate_run_config

    sweep = load_sweep(name)
    cells = sweep.cells()
    assert (
        len(cells)
        == {"demo": 72, "ppgnn-lpgnn-tables": 160, "gap-table2": 54, "privgnn-lambda": 30}[name]
    )
    for c in cells:
        strategy, cfg = validate_run_config(c.run_config)
        assert (cfg.dataset, cfg.num_clients, cfg.seed) == (c.dataset, c.num_clients, c.seed)
        assert c.dp_level == (
            "user"
            if cfg.method == "ppgnn"
            else "node"
            if cfg.method == "privgnn"
            else "none"
            if c.epsilon is None
            else cfg.level
        )
        if cfg.method == "privgnn":  # the axis is lambda; epsilon comes from the report
            assert cfg.lam == c.epsilon and c.epsilon_from == "report"
        if cfg.method == "gap" and c.epsilon is not None:
            assert cfg.client_epsilons == [c.epsilon]
    if name == "demo":
        ppgnn = next(c for c in cells if c.method == "ppgnn" and c.epsilon == 0.5)
        assert validate_run_config(ppgnn.run_config)[1].budgets == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    "text,key",
    [
        ('[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\npreset="no-such"\n', "no-such"),
        ('[sweep]\ndatasets=["cora"]\nepsilon=[1]\n[methods.a]\npreset="lpgnn-cora"\n', "epsilon"),
        (
            '[sweep]\ndatasets=["cora"]\n[methods.a]\npreset="lpgnn-cora"\nepsilon-key="epsilon"\n',
            "epsilons",
        ),
        ('[sweep]\ndatasets=["cora"]\n', "methods"),
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\nstrategy="m:S"\nepsilon-key="e"\n',
            "dp-level",
        ),
        ("[sweep\n", "TOML"),
        # a typo in a cell's run config: refused at load, not in every cell (fresh user, 12-06)
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\npreset="gap-edge-cora"\n'
            'epsilon-key="client-epsilons"\n[methods.a.set]\nencoder-round=5\n',
            "encoder-round: unknown run-config key",
        ),
        # an unknown epsilon-key is named as such (fresh user, 12-07: "methods.a (or [set])")
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\npreset="gap-edge-cora"\n'
            'epsilon-key="nosuch-key"\n',
            "methods.a.epsilon-key: nosuch-key: unknown run-config key",
        ),
        # an unknown key is named with the table that set it (fresh user, 12-07: "methods.a")
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\npreset="gap-edge-cora"\n'
            'epsilon-key="client-epsilons"\n[dataset-set.cora]\nnokey=1\n',
            "[dataset-set.cora]: nokey: unknown run-config key",
        ),
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[set]\nnokey=1\n[methods.a]\n'
            'preset="gap-edge-cora"\nepsilon-key="client-epsilons"\n',
            "[set]: nokey: unknown run-config key",
        ),
        # an unknown strategy name: refused at load, not in every cell (fresh user, 12-07)
        (
            '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n[methods.a]\nstrategy="nope"\n'
            'dp-level="user"\nepsilon-key="epsilon"\n',
            "strategy: unknown 'nope'; allowed: 'ppgnn', 'gap'",
        ),
        # an unknown key of a table lists the table's keys
        (
            '[sweep]\ndatasets=["cora"]\nbogus=1\n[methods.a]\npreset="lpgnn-cora"\n',
            "allowed: cpus-per-cell, datasets, description, epsilons",
        ),
    ],
)
def test_invalid_sweep_file_exits_2_naming_the_key(tmp_path, text, key):
    f = write(tmp_path / "bad.toml", text)
    with pytest.raises(SweepError, match=re.escape(key)) as err:
        load_sweep(f)
    assert str(err.value).startswith(str(f)) or "not found" in str(err.value)  # names the file
    if "unknown run-config key" in key:  # the allowed keys listed, not a pointer to the docs
        assert "allowed: " in str(err.value) and "client-epsilons, " in str(err.value)
    res = CliRunner().invoke(cli, ["sweep", str(f), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and key in res.output
    assert not (tmp_path / "out").exists()


def test_a_sweep_file_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "latin1.toml"
    f.write_bytes(b"# caf\xe9\n[sweep]\n")
    with pytest.raises(SweepError, match=r"latin1.toml: not UTF-8 text"):
        load_sweep(f)


def test_a_value_its_method_refuses_stops_the_sweep_before_any_cell_runs(tmp_path):
    """An epsilon <= 0 on the sweep's axis: refused at load (exit 2) like a typo, naming the
    first such cell, how many more, the key and the allowed values; no cell ran (fresh user,
    12-07: every cell failed one after another, exit 1)."""
    f = write(
        tmp_path / "bad.toml",
        '[sweep]\ndatasets=["cora"]\nepsilons=[1, -2]\n'
        'seeds=[0, 1]\n[methods.a]\npreset="gap-edge-cora"\n'
        'epsilon-key="client-epsilons"\n',
    )
    expected = (
        "a__cora__eps-2__clients10__seed0 (and 1 more cells): client-epsilons: every "
        "epsilon must be > 0 (allowed: (0, inf]), got -2.0"
    )
    with pytest.raises(SweepError) as err:
        load_sweep(f)
    assert expected in str(err.value) and "eps1" not in str(err.value)
    res = CliRunner().invoke(cli, ["sweep", str(f), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and expected in res.output
    assert not (tmp_path / "out").exists()


def test_a_key_of_another_method_stops_the_sweep_before_any_cell_runs(tmp_path):
    """``epsilon-key = "budgets"`` on a GAP method: PPGNN's key, which fedgraph run refuses
    (exit 2); the sweep failed every cell one by one and --dry-run listed them "to run"
    (fresh user, 12-07)."""
    f = write(
        tmp_path / "other.toml",
        '[sweep]\ndatasets=["cora"]\nepsilons=[1]\n'
        '[methods.g]\npreset="gap-edge-cora"\nepsilon-key="budgets"\ndp-level="edge"\n',
    )
    with pytest.raises(
        SweepError,
        match=r"budgets: a key of method 'ppgnn', not of this run's "
        r"method 'gap'",
    ):
        load_sweep(f)
    res = CliRunner().invoke(cli, ["sweep", str(f), "--dry-run"])
    assert res.exit_code == 2 and "budgets: a key of method 'ppgnn'" in res.output


def test_cell_over_its_timeout_is_killed_and_reported(tmp_path):
    f = write(
        tmp_path / "slow.toml",
        """
[sweep]
datasets = ["cora"]
epsilons = [1]
num-clients = [1]
timeout = 1.5
[methods.lpgnn]
preset = "lpgnn-cora"
epsilon-key = "epsilon"
""",
    )
    t = time.time()
    res = CliRunner().invoke(cli, ["sweep", str(f), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert "FAILED lpgnn cora eps=1 clients=1 seed=0: timed out after 1.5 s" in res.output
    cell = json.loads(next((tmp_path / "out").glob("cells/*/cell.json")).read_text())
    # stopped by the sweep's SIGTERM: killed by it (< 0) before the run installed its handler,
    # or the run's own graceful stop (143, SIGTERM's code: report written) once it had
    assert cell["status"] == "failed" and (cell["returncode"] < 0 or cell["returncode"] == 143)
    assert time.time() - t < 30


# ---------------------------------------------------------------- report: CSV and plots


def fake_cell(
    base: Path,
    method,
    dataset,
    eps,
    seed,
    test=None,
    val=0.5,
    wall=10.0,
    level="user",
    label=None,
    spent=(1.0, 2.0),
    epsilon_from="axis",
):
    name = f"{method}__{dataset}__eps{eps}__clients3__seed{seed}"
    d = base / "cells" / name
    status = "ok" if test is not None else "failed"
    write(
        d / "cell.json",
        json.dumps(
            {
                "method": method,
                "label": label or method.upper(),
                "dataset": dataset,
                "epsilon": eps,
                "num_clients": 3,
                "seed": seed,
                "dp_level": level,
                "status": status,
                "epsilon_from": epsilon_from,
                "error": None if test is not None else "boom: a client failed",
                "wall_s": wall,
            }
        ),
    )
    if test is not None:
        write(
            d / "report.json",
            json.dumps(
                {
                    "status": "ok",
                    "accuracy": {"train": 0.9, "val": val, "test": test, "majority_class": 0.3},
                    "privacy": {
                        "per_subject": {f"level-{i}": {"epsilon": e} for i, e in enumerate(spent)}
                    },
                    "timings_s": {"total": wall - 5},
                }
            ),
        )


def test_csv_mean_and_std_match_a_hand_computation(tmp_path):
    tests, walls = [0.80, 0.84, 0.83], [10.0, 14.0, 12.0]
    for seed, (t, w) in enumerate(zip(tests, walls)):
        fake_cell(tmp_path, "lpgnn", "cora", 1.0, seed, test=t, val=0.7 + seed / 100, wall=w)
    fake_cell(tmp_path, "lpgnn", "cora", 1.0, 3)  # a failed seed: counted, not averaged
    fake_cell(tmp_path, "lpgnn", "cora", 2.0, 0, test=0.86)
    groups = results.aggregate(results.collect([tmp_path]))
    results.write_csv(groups, tmp_path / "r.csv")
    import csv

    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [(r["epsilon"], r["seeds"], r["failed"]) for r in rows] == [
        ("1.0", "3", "1"),
        ("2.0", "1", "0"),
    ]
    r = rows[0]
    mean = (0.80 + 0.84 + 0.83) / 3
    std = math.sqrt(((0.80 - mean) ** 2 + (0.84 - mean) ** 2 + (0.83 - mean) ** 2) / (3 - 1))
    assert float(r["test_mean"]) == pytest.approx(mean) == pytest.approx(0.823333, abs=1e-6)
    assert float(r["test_std"]) == pytest.approx(std) == pytest.approx(0.0208167, abs=1e-6)
    assert float(r["val_mean"]) == pytest.approx(0.71) and float(r["val_std"]) == pytest.approx(
        0.01
    )
    assert float(r["train_mean"]) == pytest.approx(0.9) and float(r["train_std"]) == pytest.approx(
        0
    )
    assert float(r["cell_wall_s_mean"]) == pytest.approx(12.0)
    assert float(r["cell_wall_s_std"]) == pytest.approx(2.0)
    assert float(r["run_time_s_mean"]) == pytest.approx(7.0)
    assert (r["epsilon_spent_min"], r["epsilon_spent_max"]) == ("1.0", "2.0")
    assert rows[1]["test_std"] == ""  # one seed: no standard deviation


def test_a_damaged_cell_or_report_is_named_not_a_traceback(tmp_path, capsys):
    """``fedgraph report`` over a sweep folder with a damaged ``cell.json`` (left out: the
    sweep reruns that cell) and a truncated ``report.json`` (that seed counts as failed)."""
    for seed in range(3):
        fake_cell(tmp_path, "lpgnn", "cora", 1.0, seed, test=0.8 + seed / 100)
    cells = sorted(tmp_path.glob("**/cells/*/cell.json"))
    cells[0].write_text("garbage")
    report = cells[1].parent / "report.json"
    report.write_text(report.read_text()[:20])
    groups = results.aggregate(results.collect([tmp_path]))
    err = capsys.readouterr().err
    assert f"left out {cells[0]}: not a cell record (JSONDecodeError" in err
    assert f"{report}: not a run report (JSONDecodeError" in err
    assert [(g["seeds"], g["failed"]) for g in groups] == [(1, 1)]
    assert groups[0]["test_mean"] == pytest.approx(0.82)


def test_epsilon_from_report_places_a_noise_axis_at_the_epsilon_spent(tmp_path):
    """PrivGNN's axis is lambda: each group is placed at the mean over seeds of the largest
    epsilon its runs spent; the CSV keeps lambda as axis_value."""
    for seed, top in enumerate([20.0, 22.0]):
        fake_cell(
            tmp_path,
            "privgnn",
            "cora",
            1.0,
            seed,
            test=0.5,
            level="node",
            spent=(top - 5, top),
            epsilon_from="report",
        )
    fake_cell(
        tmp_path,
        "privgnn",
        "cora",
        2.0,
        0,
        test=0.6,
        level="node",
        spent=(55.0,),
        epsilon_from="report",
    )
    groups = results.aggregate(results.collect([tmp_path]))
    assert [(g["axis_value"], g["epsilon"]) for g in groups] == [(1.0, 21.0), (2.0, 55.0)]
    results.write_csv(groups, tmp_path / "r.csv")
    import csv

    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [(r["axis_value"], r["epsilon"]) for r in rows] == [("1.0", "21.0"), ("2.0", "55.0")]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def test_report_writes_plots_csv_and_markdown(tmp_path):
    runs = tmp_path / "runs"
    for eps, accs in {0.5: [0.70, 0.72], 1.0: [0.80, 0.82], 4.0: [0.85, 0.86]}.items():
        for seed, a in enumerate(accs):
            fake_cell(runs, "lpgnn", "cora", eps, seed, test=a, label="LPGNN")
            fake_cell(
                runs, "gap-edge", "cora", eps, seed, test=a - 0.1, level="edge", label="GAP edge"
            )
    fake_cell(runs, "gap-edge", "cora", 0.0, 0, level="edge", label="GAP edge")
    fake_cell(runs, "gap-inf", "cora", None, 0, test=0.9, level="none", label="GAP no noise")
    write(
        runs / "sweep.toml",
        '[[published]]\nmethod = "lpgnn"\ndataset = "cora"\nepsilon = 1\n'
        'test = 83.9\nsource = "LPGNN paper"\n',
    )
    md = tmp_path / "docs" / "results.md"
    res = CliRunner().invoke(cli, ["report", str(runs), "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    pngs = sorted((tmp_path / "docs" / "img").glob("*.png"))
    assert [p.name for p in pngs] == ["cora-edge.png", "cora-user.png"]
    for p in pngs:
        w, h = png_size(p)
        assert w >= 800 and h >= 500
    text = md.read_text()
    assert "![Cora, user-level LDP (node features)](img/cora-user.png)" in text
    assert "| LPGNN | 3 | 71.0 ± 1.4 | 81.0 ± 1.4 | 85.5 ± 0.7 |" in text
    assert "| GAP no noise | 3 |" in text and "90.0" in text
    assert "83.9" in text and "LPGNN paper" in text
    assert "fedgraph report" in text and "failed run(s): boom: a client failed" in text
    assert (tmp_path / "docs" / "results.csv").exists()
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no such folder" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no sweep cells" in res.output


# ---------------------------------------------------------------- a real sweep, interrupted

TINY = """
[sweep]
name = "tiny"
datasets = ["cora", "citeseer"]
epsilons = [1]
num-clients = [1]
seeds = [0, 1]
timeout = 300
[set]
epochs = 5
steps = "2"
[methods.lpgnn]
label = "LPGNN"
preset = "lpgnn-cora"
epsilon-key = "epsilon"
"""


def _sessions() -> dict[int, int]:
    """pid -> session id of every process."""
    out = {}
    for p in PROC.iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[3])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _pid_running(fragment: str) -> int | None:
    for p in PROC.iterdir():
        if p.name.isdigit():
            try:
                if fragment in (p / "cmdline").read_bytes().decode(errors="replace"):
                    return int(p.name)
            except OSError:
                pass
    return None


def _wait(cond, timeout, what):
    t = time.time()
    while time.time() - t < timeout:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not (PROC / "self" / "stat").exists(), reason="reads /proc")
def test_interrupted_sweep_finishes_only_the_rest_and_failed_cells_do_not_stop_it(tmp_path):
    sweep_file = write(tmp_path / "tiny.toml", TINY)
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()  # a root without the files (a missing one is refused)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FEDGRAPH_DATA": str(tmp_path / "empty"),
    }
    cmd = [
        sys.executable,
        "-m",
        "fedgraph.simulations.cli",
        "sweep",
        str(sweep_file),
        "-o",
        str(out),
    ]
    cells = out / "cells"
    first, second = (
        cells / "lpgnn__cora__eps1__clients1__seed0",
        cells / "lpgnn__cora__eps1__clients1__seed1",
    )

    def status(d):
        try:
            return json.loads((d / "cell.json").read_text())["status"]
        except (OSError, ValueError, KeyError):
            return None

    # Run 1, one cell at a time (cells in the file's order: cora, then citeseer, whose files
    # are not in the empty data root): the first cell completes and the sweep is stopped
    # (SIGTERM) while the second runs.
    proc = subprocess.Popen(
        cmd + ["--parallel", "1"],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: status(first) == "ok", 200, "the first epsilon-1 cell")
        _wait(lambda: _pid_running(str(second / "run.toml")), 30, "the last cell's process")
        cell_pid = _pid_running(str(second / "run.toml"))
        proc.send_signal(signal.SIGTERM)
        log1, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, log1  # SIGTERM's code (Ctrl-C's is 130)
    assert "run the same command again" in log1 and "FAILED" not in log1
    assert status(second) == "interrupted" and not (second / "report.json").exists()
    _wait(
        lambda: cell_pid not in _sessions().values(), 15, "the interrupted cell's processes to end"
    )
    kept = (first / "report.json").stat().st_mtime_ns

    # Run 2: only what is left (the interrupted cell and the citeseer cells, which fail with
    # their error while the other finishes), this time
    # as Ray tasks: each cell process then starts its own Ray instance for Flower inside a
    # Ray worker's child (the nested case the executor must handle).
    res = subprocess.run(
        cmd + ["--executor", "ray"], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "4 cells, 1 already done, 3 to run" in res.stdout and "ray executor" in res.stdout
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 2 and all(  # refused before Ray, naming what is missing
        ln.startswith("FAILED lpgnn citeseer eps=1 clients=1 seed=")
        and ": dataset/data-root: Raw files of dataset 'citeseer' not found" in ln
        for ln in failed
    ), failed
    assert "1 ok, 2 failed, 1 skipped" in res.stdout
    assert (first / "report.json").stat().st_mtime_ns == kept
    reports = [json.loads((d / "report.json").read_text()) for d in (first, second)]
    assert all(r["status"] == "ok" for r in reports)

    # The report over the real cells: mean and std of two seeds, by hand.
    res = CliRunner().invoke(cli, ["report", str(out)])
    assert res.exit_code == 0, res.output
    import csv

    rows = {r["dataset"]: r for r in csv.DictReader((out / "results.csv").open())}
    a, b = (r["accuracy"]["test"] for r in reports)
    assert rows["cora"]["epsilon"] == rows["citeseer"]["epsilon"] == "1.0"
    assert float(rows["cora"]["test_mean"]) == pytest.approx((a + b) / 2)
    assert float(rows["cora"]["test_std"]) == pytest.approx(abs(a - b) / math.sqrt(2))
    assert (rows["citeseer"]["seeds"], rows["citeseer"]["failed"]) == ("0", "2")
    assert png_size(out / "plots" / "cora-user.png")[0] > 0


def lpgnn_sweep(path: Path, datasets: str, head: str = "") -> Path:
    """A sweep file of LPGNN cells (epsilon 1, 2 clients) over ``datasets`` (TOML strings);
    ``head``: more lines of its ``[sweep]``."""
    return write(
        path,
        f"""
[sweep]
{head}
datasets = [{datasets}]
epsilons = [1]
num-clients = [2]
[methods.lpgnn]
preset = "lpgnn-cora"
epsilon-key = "epsilon"
""",
    )


def dry_run(tmp_path: Path, datasets: str, root: str = "empty-root"):
    """``fedgraph sweep --dry-run`` of :func:`lpgnn_sweep` with ``$FEDGRAPH_DATA`` set to
    ``tmp_path / root`` (an empty folder, made here, when it is ``empty-root``)."""
    if root == "empty-root":
        (tmp_path / root).mkdir(exist_ok=True)
    f = lpgnn_sweep(tmp_path / "s.toml", datasets)
    return CliRunner().invoke(
        cli,
        ["sweep", str(f), "-o", str(tmp_path / "out"), "--dry-run"],
        env={"FEDGRAPH_DATA": str(tmp_path / root)},
    )


def test_dry_run_marks_the_cells_whose_data_is_missing(tmp_path):
    """``--dry-run`` says which cells would fail for want of their dataset's files (and why),
    instead of listing them as "to run"; nothing runs."""
    res = dry_run(tmp_path, '"cora", "citeseer"')
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert any(line.startswith("to run") and "__cora__" in line for line in lines)  # bundled
    assert any(line.startswith("no data") and "__citeseer__" in line for line in lines)
    assert any(
        line.startswith("no data: citeseer: Raw files of dataset 'citeseer' not found")
        for line in lines
    ), res.output
    assert lines[-1] == "2 cells: 0 done, 1 to run, 1 no data", lines[-1]
    assert not (tmp_path / "out" / "cells").exists() or not any(
        (tmp_path / "out" / "cells").glob("*/report.json")
    )


@pytest.mark.parametrize("where", ["option", "file"])
def test_an_output_dir_that_is_a_file_is_refused_before_anything_runs(tmp_path, where):
    """``--output-dir`` (or the file's ``output-dir``) naming an existing file failed with
    "[Errno 17] File exists" (fresh user, 12-07): exit 2 naming it, the file untouched."""
    a_file = tmp_path / "out"
    a_file.write_text("keep me")
    f = lpgnn_sweep(
        tmp_path / "s.toml", '"cora"', f'output-dir = "{a_file}"' if where == "file" else ""
    )
    args = ["-o", str(a_file)] if where == "option" else []
    for dry in ([], ["--dry-run"]):
        res = CliRunner().invoke(cli, ["sweep", str(f), *args, *dry])
        assert res.exit_code == 2, res.output
        said = " ".join(res.output.split())
        assert (
            f"{'--' if where == 'option' else ''}output-dir: {a_file} is a file, not a folder"
            in said
        ), said
        assert a_file.read_text() == "keep me"


def test_an_output_dir_that_cannot_be_made_is_refused_naming_it(tmp_path):
    """An output folder under a file (or a read-only mount) ended the sweep in a traceback
    (fresh user, 12-07): exit 2 naming ``output-dir``, as ``fedgraph run`` does."""
    a_file = tmp_path / "file"
    a_file.write_text("keep me")
    f = lpgnn_sweep(tmp_path / "s.toml", '"cora"', f'output-dir = "{a_file / "x"}"')
    for dry in ([], ["--dry-run"]):  # the dry run said "1 to run" (fresh user, 12-07)
        res = CliRunner().invoke(cli, ["sweep", str(f), *dry])
        assert res.exit_code == 2, res.output
        said = " ".join(res.output.split())
        assert f"output-dir: cannot write reports to {a_file / 'x'}" in said, said
        assert "Traceback" not in said and a_file.read_text() == "keep me"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_sweep_exits_with_the_signals_code(tmp_path, monkeypatch, signum, code):
    """SIGTERM on ``fedgraph sweep`` exited 130, Ctrl-C's code (fresh user, 12-07): 128 + the
    signal's number, 130 for Ctrl-C and 143 for SIGTERM, and the way to finish the rest."""
    from fedgraph.simulations import sweep_runner

    def stopped(*args, **kwargs):
        signal.raise_signal(signum)
        time.sleep(5)  # the signal's handler raises before this ends
        raise AssertionError("not interrupted")

    monkeypatch.setattr(sweep_runner, "run_sweep", stopped)
    # a terminal's Ctrl-C raises KeyboardInterrupt; where this test runs as a background job
    # (CI), Python started with SIGINT ignored: give it its default handler for the test
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        f = lpgnn_sweep(tmp_path / "s.toml", '"cora"')
        res = CliRunner().invoke(cli, ["sweep", str(f), "-o", str(tmp_path / "out")])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert res.exit_code == code, res.output
    assert "run the same command again to finish the rest" in res.output


def test_dry_run_exits_2_when_no_cell_can_run_for_want_of_data(tmp_path):
    """``--dry-run`` exited 0 when every cell lacked its dataset's files (fresh user, 12-07):
    it exits 2 and names the datasets, the cells listed as "no data" (with some cell to run,
    as in the test above, it still exits 0)."""
    res = dry_run(tmp_path, '"citeseer", "pubmed"')
    assert res.exit_code == 2, res.output
    lines = res.output.splitlines()
    assert sum(line.startswith("no data ") for line in lines) == 2, res.output
    assert "2 cells: 0 done, 0 to run, 2 no data" in lines
    assert (
        "fedgraph: no cell can run: none of the 2 cells not done has its data (citeseer, "
        "pubmed: " in res.output
    )
    res = dry_run(tmp_path, '"cora"', root="no-such-root")  # Cora too: the root is named
    assert res.exit_code == 2, res.output
    assert "1 cell: 0 done, 0 to run, 1 no data" in res.output
    assert (
        f"no data: cora: data-root: empty, and $FEDGRAPH_DATA = {tmp_path / 'no-such-root'}"
        in res.output
    )
