"""The documentation cannot drift from the code (issue 32).

The generated reference (docs/_gen/refs.py, run by `mkdocs build --strict` in scripts/docs.sh)
must list every run-config key and every report field with an explanation; the README stays
short and names only commands, presets and pages that exist. The site build itself runs in
.ci/run (scripts/docs.sh), not here.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _refs():
    spec = importlib.util.spec_from_file_location("docs_refs", ROOT / "docs" / "_gen" / "refs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_refs", mod)
    spec.loader.exec_module(mod)
    return mod


refs = _refs()


def _headings(page: str) -> set[str]:
    return set(re.findall(r"^## `([^`]+)`$", page, flags=re.M))


def test_every_run_config_key_is_in_the_generated_reference():
    from fedgraph.config import METHOD_CONFIGS

    keys = set(refs.pyproject_config())
    for model in METHOD_CONFIGS.values():
        keys |= {name.replace("_", "-") for name in model.model_fields}
    page = refs.config_page()
    missing = keys - _headings(page)
    assert not missing, f"run-config keys missing from docs/reference/config.md: {sorted(missing)}"
    assert not refs.undocumented_keys(), (
        "keys with neither a pydantic description nor a note in docs/_gen/config_notes.toml: "
        f"{refs.undocumented_keys()}"
    )


def test_reference_gives_each_key_its_default_per_method_and_allowed_values():
    page = refs.config_page()
    section = page.split("## `noise-source`", 1)[1].split("\n## ", 1)[0]
    assert "`secure`, `secret`, `mt19937`" in section and '`"secure"`' in section
    delta = page.split("## `delta`", 1)[1].split("\n## ", 1)[0]
    assert "ppgnn `1e-05`" in delta and "gap `1e-07`" in delta and "privgnn `0.0001`" in delta


def test_every_report_field_of_a_real_run_is_explained(tmp_path):
    from fedgraph.config import METHOD_CONFIGS

    reports = refs.sample_reports(tmp_path)
    assert set(reports) == set(METHOD_CONFIGS)
    assert all(r["status"] == "ok" for r in reports.values())
    assert not refs.unexplained_fields(reports), (
        "report fields without an entry in docs/_gen/report_fields.toml: "
        f"{refs.unexplained_fields(reports)}"
    )
    page = refs.report_page(reports)
    for field in refs.report_fields(reports):
        assert f"| `{field}` |" in page


def test_cli_reference_has_every_command():
    import typer.main

    from fedgraph.simulations.cli import cli

    page = refs.cli_page()
    for name in typer.main.get_command(cli).commands:
        assert f"## `fedgraph {name}`" in page


def test_protocol_reference_has_every_message_type_and_key():
    from fedgraph.protocol import MESSAGES

    page = refs.protocol_page()
    for m in MESSAGES.values():
        section = page.split(f"### `{m.type}`\n", 1)[1].split("\n### ", 1)[0]
        for content in (m.sends, m.replies):
            for r in content.records:
                assert f"| `{r.name}` | {r.kind} |" in section, (m.type, r.name)
                for f in r.fields:
                    assert f"| `{f.name}` | {f.type} |" in section, (m.type, r.name, f.name)


def test_api_reference_walks_the_packages():
    mods = refs.modules()
    for must in (
        "fedgraph",
        "fedgraph.config",
        "fedgraph.accounting.ledger",
        "fedgraph.strategies.base",
        "fedgraph.simulations.local",
    ):
        assert must in mods
    on_disk = {
        p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        for p in (ROOT / "fedgraph").rglob("*.py")
        if not any(part.startswith("_") for part in p.relative_to(ROOT).parts)
    }
    assert on_disk <= set(mods)


def test_readme_is_short():
    n = len(README.splitlines())
    assert n <= 250, f"README.md has {n} lines: move detail into docs/"


def test_readme_commands_exist():
    import typer.main

    from fedgraph.simulations.cli import cli

    commands = set(typer.main.get_command(cli).commands)
    presets = {p.stem for p in (ROOT / "simulations" / "presets").glob("*.toml")}
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))
    shell += "\n" + "\n".join(re.findall(r"`([^`\n]+)`", README))
    named = re.findall(
        r"(?:^|[\s=])fedgraph ([a-z][a-z-]*)(?: ([a-z0-9][\w./-]*))?", shell, flags=re.M
    )
    assert named
    for cmd, arg in named:
        assert cmd in commands, f"README names `fedgraph {cmd}`, which does not exist"
        if cmd == "run" and arg and not arg.startswith("-"):
            assert arg in presets or (ROOT / arg).exists(), f"README runs unknown preset {arg!r}"
    for script in set(re.findall(r"bash (scripts/[\w.-]+\.sh)", README)):
        assert (ROOT / script).exists(), script
    for sweep in set(re.findall(r"(simulations/sweeps/[\w.-]+\.toml)", README)):
        assert (ROOT / sweep).exists(), sweep


GENERATED = {
    "reference/config.md",
    "reference/presets.md",
    "reference/report.md",
    "reference/cli.md",
    "reference/protocol.md",
    "reference/api/index.md",
}


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md"])
def test_links_to_docs_pages_exist(page):
    """Every relative link of the README and the CHANGELOG resolves in a checkout, where the
    generated reference pages (:data:`GENERATED`, written only when the site is built) are
    not: a reader following one there found nothing (a fresh user's session, 2026-12-06)."""
    text = (ROOT / page).read_text() if (ROOT / page).exists() else ""
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        path = (ROOT / target).resolve()
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else target
        assert rel.removeprefix("docs/") not in GENERATED, (
            f"{page} links to {target}, generated only when the site is built"
        )
        assert path.exists(), f"{page} links to {target}, which does not exist"


def test_readme_run_commands_are_valid_configs():
    """Every `fedgraph run PRESET [--set key=value ...]` of the README is a config that
    `fedgraph run` accepts (checked as it checks one, before anything starts); the runs
    themselves are the suite's preset tests and the README's five-minute tour."""
    import shlex

    from fedgraph.simulations.run_files import load_run_config
    from fedgraph.simulations.simulate import check_run_config

    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))
    runs = [
        line.split("#")[0]
        for line in shell.splitlines()
        if line.strip().startswith("fedgraph run ")
    ]
    assert len(runs) >= 5
    for line in runs:
        args = shlex.split(line)[2:]
        preset = args[0] if args and not args[0].startswith("-") else None
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        check_run_config(load_run_config(preset, sets))


def test_fedgraph_datasets_runs():
    """The README's `fedgraph datasets` lists the known datasets (bundled Cora available)."""
    from typer.testing import CliRunner

    from fedgraph.simulations.cli import cli

    res = CliRunner().invoke(cli, ["datasets"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "cora" in res.output
    # the user's own graph is described, not shown as a loader error cut at 100 characters
    files = next(line for line in res.output.splitlines() if line.startswith("files "))
    assert "your own graph" in files and "edges.csv, features.csv, labels.csv" in files
    assert "not loadable" not in files
