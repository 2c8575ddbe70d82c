"""The command line's help and bad-root messages (issue 17, item 4) and the plot's plurals."""

from __future__ import annotations

from typer.testing import CliRunner

from fedgraph.simulations.cli import cli
from fedgraph.simulations.run_files import PRESETS


def _help(*args: str) -> str:
    res = CliRunner().invoke(cli, [*args, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_run_help_describes_preset_and_lists_every_preset():
    text = _help("run")
    assert "PRESET: a preset's name" in text and "TOML" in text
    assert "[tool.flwr.app.config]" in text  # not swallowed as rich markup
    for f in PRESETS.glob("*.toml"):
        assert f.stem in text


def test_report_help_keeps_its_brackets():
    assert "[[published]]" in _help("report")


def test_every_command_has_help_and_every_option_a_description():
    import click
    import typer.main

    group = typer.main.get_command(cli)
    for name, cmd in group.commands.items():
        assert cmd.help, f"command {name} has no help"
        for p in cmd.params:
            if isinstance(p, click.Option) and p.name != "help":
                assert p.help, f"{name} {p.opts} has no help"


def test_version_names_fedgraph_and_the_libraries_it_runs_on():
    from importlib.metadata import version

    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(
        f"fedgraph {version('fedgraph')} (flwr {version('flwr')}, torch {version('torch')}, "
    )
    assert f"ray {version('ray')}" in res.output and res.output.count("\n") == 1


def test_datasets_with_a_missing_root_fails_naming_it(tmp_path):
    missing = tmp_path / "nope"
    res = CliRunner().invoke(cli, ["datasets", "--root", str(missing)])
    assert res.exit_code == 2
    assert "--root" in res.output and str(missing) in res.output
    res = CliRunner().invoke(cli, ["datasets"], env={"FEDGRAPH_DATA": str(missing)})
    assert res.exit_code == 2  # as with --root: not a listing of an empty root
    assert "$FEDGRAPH_DATA" in res.output and str(missing) in res.output


def test_plot_footer_plurals():
    from fedgraph.simulations.results import seeds_footer

    assert seeds_footer([1]).endswith("over 1 seed")
    assert seeds_footer([3]).endswith("over 3 seeds")
    assert seeds_footer([1, 3]).endswith("over 1/3 seeds")


def test_gpu_request_without_a_gpu_is_refused_before_ray_starts(monkeypatch):
    import time

    import torch

    if torch.cuda.device_count():
        import pytest

        pytest.skip("this machine has a GPU")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    t0 = time.time()
    res = CliRunner().invoke(
        cli, ["run", "--gpus-per-client", "0.5", "--num-cpus", "2", "--set", "num-clients=1"]
    )
    assert res.exit_code == 2, res.output
    assert "--gpus-per-client" in res.output and "no GPU" in res.output
    assert time.time() - t0 < 20


def test_impossible_cpu_requests_are_refused(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for args, key in (
        (["--cpus-per-client", "0"], "--cpus-per-client"),
        (["--num-cpus", "1", "--cpus-per-client", "2"], "--cpus-per-client"),
        (["--num-cpus", "0"], "--num-cpus"),
        (["--gpus-per-client", "-1"], "--gpus-per-client"),
    ):
        res = CliRunner().invoke(cli, ["run", *args, "--set", "num-clients=1"])
        assert res.exit_code == 2 and key in res.output, (args, res.output)


def test_an_empty_set_value_is_refused_naming_the_key():
    """``--set delta=`` (a forgotten value) used to run silently with the method's default;
    it is refused before anything starts, naming the key, and ``key=""`` still means the
    default (the run config's empty string)."""
    from fedgraph.simulations.run_files import load_run_config

    res = CliRunner().invoke(cli, ["run", "--set", "delta="])
    assert res.exit_code == 2, res.output
    assert "--set delta=: no value" in " ".join(res.output.split())
    assert load_run_config(None, ['delta=""']) == {"delta": ""}


def test_flowers_run_simulation_deprecation_is_not_shown_to_fedgraph_run_users():
    """fedgraph run calls Flower's run_simulation itself; its "use `flwr run`" warning told a
    fresh user to change what they had not written. Only that record is dropped."""
    import logging

    from fedgraph.simulations.simulate import _NotOurDeprecation

    def record(text):
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, text, None, None)

    quiet = _NotOurDeprecation()
    assert not quiet.filter(
        record(
            "DEPRECATED FEATURE: The `run_simulation` function is "
            "deprecated and will be removed in a future version"
        )
    )
    assert quiet.filter(record("Manually terminating ClientAppActor"))


def test_one_cpu_is_not_plural(monkeypatch):
    """``--num-cpus 1 --cpus-per-client 2`` said "more than the 1 CPUs" (fresh user, 12-07)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    res = CliRunner().invoke(cli, ["run", "--num-cpus", "1", "--cpus-per-client", "2"])
    assert res.exit_code == 2, res.output
    assert "--cpus-per-client: 2 is more than the 1 CPU Ray may use here" in res.output
    res = CliRunner().invoke(cli, ["run", "--num-cpus", "2", "--cpus-per-client", "3"])
    assert "3 is more than the 2 CPUs" in res.output


def test_an_output_dir_that_is_a_file_is_refused_naming_it(tmp_path):
    """``output-dir`` naming an existing file failed with "[Errno 17] File exists" (fresh
    user, 12-07): it is refused before anything starts, saying what is wrong."""
    a_file = tmp_path / "reports"
    a_file.write_text("not a folder")
    res = CliRunner().invoke(cli, ["run", "--set", f"output-dir='{a_file}'"])
    assert res.exit_code == 2, res.output
    assert f"output-dir: {a_file} is a file, not a folder" in " ".join(res.output.split())
    assert "Errno" not in res.output and a_file.read_text() == "not a folder"


def test_a_commands_help_keeps_no_line_break_of_its_docstring():
    """The docstrings are hard-wrapped; a rich help kept their breaks, mid-sentence ("2 for" /
    "an invalid sweep file", fresh user 12-07)."""
    import typer.main

    for name, cmd in typer.main.get_command(cli).commands.items():
        for paragraph in cmd.help.split("\n\n"):
            assert "\n" not in paragraph, (name, paragraph)
    res = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "200"})
    assert "resumable: cells whose report is ok are skipped" in res.output
