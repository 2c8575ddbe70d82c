"""The house's rules (issue 29): layers point down only, no import circle, the ClientApp only
routes, and a method's client half runs without Flower."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
FOLDERS = ("fedgraph", "strategies", "simulations")  # installed: fedgraph, fedgraph.strategies, ...


def _installed_layout(dest: Path) -> Path:
    """A copy of the tree laid out as installed (strategies/ and simulations/ inside fedgraph/,
    as ``[tool.setuptools.package-dir]`` maps them), with pyproject.toml: what import-linter and
    grimp read (they walk one package folder)."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "fedgraph", dest / "fedgraph", ignore=ignore)
    for name in FOLDERS[1:]:
        shutil.copytree(ROOT / name, dest / "fedgraph" / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(where: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), "--no-cache", "--config", "pyproject.toml"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layer_contract_holds(tmp_path):
    """import-linter's layers contract in pyproject.toml ([tool.importlinter]): an arrow back
    up (e.g. fedgraph.report importing fedgraph.federation) fails here, naming the chain."""
    res = _lint(_installed_layout(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_no_import_circle(tmp_path):
    """No module imports, directly or through others, a module that imports it back (lazy
    imports inside functions included)."""
    import networkx as nx

    code = (
        "import grimp, pickle, sys\n"
        "g = grimp.build_graph('fedgraph', include_external_packages=False, cache_dir=None)\n"
        "edges = [(m, i) for m in g.modules for i in g.find_modules_directly_imported_by(m)]\n"
        "sys.stdout.buffer.write(pickle.dumps(edges))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=_installed_layout(tmp_path),
        capture_output=True,
        timeout=300,
    )  # a stale cache would hide an import
    assert res.returncode == 0, res.stderr[-3000:]
    import pickle

    pairs = pickle.loads(res.stdout)
    assert any(a.startswith("fedgraph.simulations.") for a, _ in pairs)
    edges = nx.DiGraph(pairs)
    circles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not circles, circles


def test_the_layer_test_can_fail(tmp_path):
    """The contract is not vacuous: a copy of the tree where fedgraph.report imports the
    federation breaks it."""
    report = _installed_layout(tmp_path) / "fedgraph" / "report.py"
    report.write_text(report.read_text() + "\n\ndef _up():\n    from . import federation\n")
    res = _lint(tmp_path)
    assert res.returncode != 0 and "fedgraph.report -> fedgraph.federation" in res.stdout, (
        res.stdout[-2000:]
    )


def test_nothing_imports_bench():
    for package in FOLDERS:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                assert not any(n == "bench" or n.startswith("bench.") for n in names), path


def test_the_client_app_only_routes():
    """simulations/client_app.py routes each message type to a handler; the handlers
    (simulations/routes/) decode, call one method function, encode: no torch, no draw."""
    app = ROOT / "simulations" / "client_app.py"
    assert len(app.read_text().splitlines()) < 120
    for path in [app, *sorted((ROOT / "simulations" / "routes").glob("*.py"))]:
        source = path.read_text()
        tree = ast.parse(source)
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m == "torch" or str(m).startswith("torch.") for m in imported), path
        for draw in ("randn", "rand(", "randint", "randperm", "manual_seed", "normal_("):
            assert draw not in source, (path, draw)
        assert len(source.splitlines()) < 200, path  # formatted by ruff (was 150 before it)


def test_gap_client_runs_without_flower():
    """GAP's PMA client step, its state in and out, runs in a process where Flower cannot be
    imported (every draw from a seeded generator)."""
    code = """
import sys
sys.modules["flwr"] = None  # any import of Flower fails
import torch
from fedgraph.config import parse_run_config
from fedgraph.federation import ClientView
from fedgraph.data import partition
from fedgraph.data.synthetic import sbm_graph
from fedgraph.methods.gap.client import PMARequest, pma_hop, setup

cfg = parse_run_config({"method": "gap", "num-clients": 2, "hops": 2, "encoder-dim": 4,
                        "partitioner": "random"})
data = sbm_graph(200, 6.0, num_classes=3, num_features=8, seed=0)
data.train_mask = torch.rand(200) < 0.5
data.val_mask = data.test_mask = ~data.train_mask
client = partition(data, 2, "random", 0)[0]
stats = {"name": "sbm", "num_nodes": 200, "num_features": 8, "num_classes": 3}
view = ClientView(client, (0.0, 1.0), stats, 2, None)
ids, plan = setup(cfg, 0, view)
gen = lambda purpose: torch.Generator().manual_seed(len(purpose))
state, out = pma_hop(cfg, 0, view, PMARequest(1), None, gen)
assert out["ids"].numel() == 200 - client.num_nodes and out["sums"].shape[1] == 4
inc = {"ids": client.node_ids[:3], "sums": torch.ones(3, 4)}
state, out = pma_hop(cfg, 0, view, PMARequest(2, incoming=inc), state, gen)
assert "hop1" in state.tensors and "local_sums" in state.tensors
print("ok", plan["sigma"] > 0)
"""
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and "ok True" in res.stdout, res.stderr[-3000:]


def test_the_install_names_are_under_fedgraph():
    """pyproject.toml lists every package of the tree, strategies/ and simulations/ as
    fedgraph.strategies and fedgraph.simulations (package-dir), and no other top-level name."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == {
        "fedgraph.strategies": "strategies",
        "fedgraph.simulations": "simulations",
    }
    tree = set()
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            tree.add(".".join(parts if folder == "fedgraph" else ("fedgraph", *parts)))
    data = {p for p in setup["packages"] if p not in tree}  # folders of data files only
    assert set(setup["packages"]) - data == tree
    for package in data:  # a listed data folder exists, holds files, and ships them
        parts = package.split(".")[1:]
        folder = ROOT / (parts[0] if parts[0] in ("strategies", "simulations") else "fedgraph")
        folder = folder.joinpath(
            *(parts[1:] if parts[0] in ("strategies", "simulations") else parts)
        )
        assert folder.is_dir() and not (folder / "__init__.py").exists(), package
        assert any(f.is_file() for f in folder.iterdir()), package
        assert setup["package-data"].get(package), package
    assert {p.split(".")[0] for p in setup["packages"]} == {"fedgraph"}


def test_a_built_wheel_installs_one_top_level_package(tmp_path):
    """The wheel pip builds from the checkout holds only ``fedgraph/`` (the Flower layers inside
    it, presets included), and, installed alone, its console entry and Flower apps import from
    there with no checkout on the path."""
    import zipfile

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fedgraph"}, tops
    assert "fedgraph/simulations/presets/gap-edge-cora.toml" in names
    assert "fedgraph/strategies/gap.py" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import fedgraph, fedgraph.simulations.server_app as s, fedgraph.strategies.gap as g\n"
        "print(len(fedgraph.__path__), s.__file__, g.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count, server, strategy = out.stdout.split()
    assert count == "1" and server.startswith(str(site)) and strategy.startswith(str(site))
