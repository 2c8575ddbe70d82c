"""``fedgraph report``'s figures (issue 30): the formats asked for, a combined figure, and a
warning for every ``[[published]]`` point no plot shows."""

from __future__ import annotations

import re

from test_sweep import fake_cell, write
from typer.testing import CliRunner

from fedgraph.simulations.cli import cli

PUBLISHED = (
    '[[published]]\nmethod = "lpgnn"\ndataset = "cora"\nepsilon = 1\ntest = 83.9\n'
    'source = "LPGNN paper"\n'
    '[[published]]\nmethod = "gap"\ndataset = "cora"\nepsilon = 4\ntest = 80.0\n'
    'source = "GAP paper"\n'
    '[[published]]\nmethod = "lpgnn"\ndataset = "citeseer"\nepsilon = 1\ntest = 70.0\n'
    'source = "LPGNN paper"\n'
)


def test_formats_and_a_warning_for_every_unplaced_published_point(tmp_path):
    runs = tmp_path / "runs"
    for eps, test in ((0.5, 0.7), (1.0, 0.8)):
        fake_cell(runs, "lpgnn", "cora", eps, 0, test=test, label="LPGNN")
        fake_cell(runs, "gap-edge", "cora", eps, 0, test=test - 0.1, level="edge", label="GAP edge")
    write(runs / "sweep.toml", PUBLISHED)
    plots = tmp_path / "plots"
    res = CliRunner().invoke(
        cli, ["report", str(runs), "--plots", str(plots), "--format", "png,pdf,svg", "--combined"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in plots.iterdir()) == [
        f"{stem}.{fmt}"
        for stem in ("combined", "cora-edge", "cora-user")
        for fmt in ("pdf", "png", "svg")
    ]
    from test_sweep import png_size

    assert png_size(plots / "combined.png")[0] > png_size(plots / "cora-user.png")[0]
    assert (plots / "cora-user.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (plots / "cora-user.svg").read_bytes()[:2000]
    warnings = [ln for ln in res.output.splitlines() if "warning: published" in ln]
    assert len(warnings) == 2, res.output  # the LPGNN point on Cora is drawn
    assert any(
        "gap on cora at epsilon 4" in w and "no plotted curve of method 'gap'" in w
        for w in warnings
    )  # (the curve is gap-edge's)
    assert any("lpgnn on citeseer" in w for w in warnings)
    res = CliRunner().invoke(cli, ["report", str(runs), "--plots", str(plots), "--format", "jpg"])
    assert res.exit_code == 2 and "allowed: png, pdf, svg" in res.output


def test_bad_output_and_published_paths_name_the_option_not_a_traceback(tmp_path):
    """Each ended in a traceback with exit 1 (fresh user, 12-07): exit 2 naming the option."""
    runs = tmp_path / "runs"
    fake_cell(runs, "lpgnn", "cora", 1.0, 0, test=0.8, label="LPGNN")
    a_file = write(tmp_path / "a-file.txt", "keep me")
    bad_toml = write(tmp_path / "bad.toml", "[[published]\n")
    bad_entry = write(
        tmp_path / "entry.toml",
        '[[published]]\nmethod = "lpgnn"\ndataset = "cora"\ntest = "high"\nsource = "x"\n',
    )
    no_list = write(tmp_path / "nolist.toml", "published = 3\n")
    cases = [
        (["--published", str(tmp_path / "none.toml")], "--published"),
        (["--published", str(bad_toml)], "--published"),
        (["--published", str(bad_entry)], "--published: .*published\\[0\\]: test: "),
        (["--published", str(no_list)], "--published: .*must be a list of tables"),
        (["--plots", str(a_file / "sub")], f"--plots: {a_file} is a file, not a folder"),
        (["--csv", str(a_file / "x.csv")], f"--csv: {a_file} is a file, not a folder"),
        (["--csv", str(tmp_path)], "--csv"),
        (["--csv", str(a_file / "x.csv")], "--csv"),
        (["--plots", str(a_file)], "--plots"),
        (["--markdown", str(tmp_path)], "--markdown"),
        (["--markdown", str(a_file / "x.md")], "--markdown"),
    ]
    for args, option in cases:
        res = CliRunner().invoke(cli, ["report", str(runs), *args])
        assert res.exit_code == 2, (args, res.output, res.exception)
        assert re.search(f"fedgraph: {option}", " ".join(res.output.split())), (args, res.output)
        assert not (runs / "results.csv").exists()  # refused before anything was written
    assert a_file.read_text() == "keep me"
    res = CliRunner().invoke(cli, ["report", str(a_file)])
    assert res.exit_code == 2 and "is a file, not a folder" in res.output


def test_a_folder_named_twice_counts_once(tmp_path):
    runs = tmp_path / "runs"
    fake_cell(runs, "lpgnn", "cora", 1.0, 0, test=0.8, label="LPGNN")
    res = CliRunner().invoke(cli, ["report", str(runs), str(runs)])
    assert res.exit_code == 0 and "seeds 1 " in res.output, res.output
