"""``fedgraph run`` validates the run config before importing torch, PyG, Flower or Ray
(fedgraph.catalog): checked by what a fresh process has imported, not by a wall clock."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedgraph import catalog

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torch_geometric", "flwr", "ray", "opacus", "strategies")

# In a fresh process: run `fedgraph run` on bad configs, and validate every bundled preset;
# print the exit codes, messages and which heavy modules got imported.
SCRIPT = r"""
import json, sys
from pathlib import Path
from typer.testing import CliRunner
from fedgraph.config import parse_run_config
from fedgraph.simulations.cli import cli
from fedgraph.simulations.run_files import PRESETS, load_run_config

out = {"runs": []}
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(cli, ["run", *args])
    out["runs"].append([r.exit_code, r.output])
for p in sorted(PRESETS.glob("*.toml")):
    parse_run_config(load_run_config(p.stem, []))
out["heavy"] = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
print(json.dumps(out))
"""

BAD = [  # (args, words the message must hold)
    (["gap-edge-cora", "--set", "budgets=-1"], ["budgets", "not of this run's method 'gap'"]),
    (["ppgnn-cora", "--set", "budgets=-1"], ["budgets", "finite and > 0"]),
    (["no-such-preset"], ["preset 'no-such-preset' not found"]),
    (["gap-edge-cor"], ["preset 'gap-edge-cor' not found (did you mean 'gap-edge-cora'?)"]),
    (["--set", "epsilon=nan"], ["epsilon: must be a finite number"]),
    (
        ["ppgnn-cora", "--set", "budgets=nan"],
        ["budgets: must be a finite number", "allowed: comma-separated epsilons in (0, inf)"],
    ),
    (
        ["gap-edge-cora", "--set", "delta=nan"],
        ["delta: must be a finite number", "allowed: [1e-12, 1)"],
    ),
    (["gap-edge-cora", "--set", "hops=inf"], ["hops: must be a finite number", "allowed: [0, "]),
    (
        ["gap-edge-cora", "--set", "hops=two"],
        ["hops: Input should be a valid integer", "allowed: [0, 10]"],
    ),
    (["gap-edge-cora", "--set", "client-epsilons=4,nan"], ["client-epsilons: an epsilon is NaN"]),
    (
        ["--set", "method=gap", "--set", "dataset=files"],
        ["data-root: dataset 'files' reads the folder", "set data-root"],
    ),
    (["--set", "dataset=no-such-graph"], ["dataset: unknown 'no-such-graph'; allowed: cora"]),
    (["--set", "partitioner=nope"], ["partitioner: unknown 'nope'", "'louvain'"]),
    (["--set", "mechanism=nope"], ["mechanism: unknown 'nope'", "'ppm'"]),
    (["--set", "strategy=nope"], ["strategy: unknown 'nope'", "'privgnn'"]),
    (
        ["gap-edge-cora", "--cpus-per-client", "0"],
        ["--cpus-per-client: must be a finite number > 0"],
    ),
    (["--set", "data-root=/no/such/folder"], ["data-root: /no/such/folder is not a folder"]),
    # a folder without the dataset's files (docs/ has none): named before Ray, without torch
    (
        ["--set", "dataset=citeseer", "--set", "data-root=docs"],
        [
            "dataset/data-root: Raw files of dataset 'citeseer' not found (looked for: "
            "docs/planetoid/CiteSeer/raw/ind.citeseer.x"
        ],
    ),
    (["--set", "self-loops=maybe"], ["self-loops: must be true or false (got 'maybe')"]),
    (["--set", "patience=-1"], ["patience", "greater than or equal to 0"]),
    # under a file (README.md): no folder can be made there
    (
        ["--set", "output-dir=README.md/runs"],
        ["output-dir: cannot write reports to README.md/runs"],
    ),
    (
        ["--set", "strategy=no_such_pkg.mod:Cls"],
        ["strategy: cannot import 'no_such_pkg.mod:Cls'", "No module named 'no_such_pkg'"],
    ),
    (["--set", "strategy=examples/nope.py:X"], ["strategy: cannot import", "no file"]),
    (["lpgnn-cora", "--set", "epsilon=2"], ["epsilon: 2 is above the smallest level's budget 1"]),
    (["ppgnn-cora", "--set", "epsilon=0.5"], ["epsilon: has no effect with mechanism 'ppm'"]),
    (["--set", "num-clients=5000"], ["num-clients: must lie in [1, 2708] for dataset 'cora'"]),
    (["gap-edge-cora", "--set", "hops=0"], ["hops: must be >= 1", "variant = 'mlp'"]),
    (
        ["gap-edge-cora", "--set", "num-clients=2", "--set", "client-epsilons=1,2,3"],
        ["client-epsilons: 3 values for 2 client(s)"],
    ),
    (
        ["--set", "dataset=synthetic-sbm:40:3", "--set", "num-clients=41"],
        ["num-clients: must lie in [1, 40] for dataset 'synthetic-sbm:40:3:0'"],
    ),
]


def test_known_node_counts_are_the_loaders(monkeypatch):
    """catalog.NUM_NODES (the fast num-clients check) against the loaded graphs, where the files
    are here (CI has the bundled Cora; the rest with ../shared/data), and the SBM's count."""
    from fedgraph.data import load_dataset

    shared = ROOT.parent / "shared" / "data"
    checked = 0
    for name, n in catalog.NUM_NODES.items():
        for root in (None, shared):
            try:
                data = load_dataset(name, root=root) if root else load_dataset(name)
            except FileNotFoundError:
                continue
            assert data.num_nodes == n, name
            checked += 1
            break
    assert checked >= 1  # the bundled Cora at least
    assert (
        load_dataset("synthetic-sbm:40:3").num_nodes
        == catalog.known_num_nodes("synthetic-sbm:40:3:0")
        == 40
    )
    assert catalog.known_num_nodes("facebook100:Caltech36") is None  # depends on the config


def test_config_errors_are_reported_before_torch_flower_or_ray_are_imported():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps([a for a, _ in BAD]), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for (args, words), (code, text) in zip(BAD, out["runs"]):
        assert code == 2, (args, text)
        for w in words:
            assert w in text, (args, w, text)
    assert out["heavy"] == [], f"validation imported {out['heavy']}"


@pytest.mark.parametrize("kind", sorted(catalog.KINDS))
def test_catalog_names_are_what_the_registries_hold(kind):
    """The names fedgraph registers itself (a fresh import: no user registration yet; tests
    that register use names of their own) and the registry's builtin list and hint."""
    k = catalog.KINDS[kind]
    registry = getattr(importlib.import_module(k.module), k.attr)
    own = {
        n
        for n, obj in registry.items()
        if getattr(obj, "__module__", "").split(".")[0] in ("fedgraph", "strategies")
    }
    assert set(k.registered) == own
    assert registry.builtin == k.builtin and registry.hint == k.hint


@pytest.mark.parametrize(
    "kind,name",
    [
        ("dataset", "no-such-graph"),
        ("partitioner", "nope"),
        ("mechanism", "my_mod.Mech"),
        ("strategy", "nope"),
    ],
)
def test_catalog_gives_the_registrys_message_and_answers(kind, name, monkeypatch):
    """Without the registry's module imported, an unknown name gets the registry's message
    (names registered at run time aside), a built-in name passes, an import path whose module
    or file is nowhere gets the registry's message, anything else is left to the registry
    (None)."""
    k = catalog.KINDS[kind]
    registry = getattr(importlib.import_module(k.module), k.attr)
    user = [n for n in registry if n not in k.registered]
    for n in user:  # what another test registered in this process: not in a fresh one
        monkeypatch.delitem(registry, n)
    with pytest.raises(ValueError) as slow:
        registry.resolve(name)
    monkeypatch.delitem(sys.modules, k.module)
    with pytest.raises(ValueError) as fast:
        catalog.check_name(kind, name)
    assert str(fast.value) == str(slow.value)
    for n in k.registered:
        assert catalog.check_name(kind, f" {n} ") == registry.check_name(n)
    assert catalog.check_name(kind, "json:attribute") is None  # importable: the registry decides
    # a module that is nowhere: the registry's message, without importing anything
    with pytest.raises(ValueError) as slow_path:
        registry.resolve("some.module:attribute")
    with pytest.raises(ValueError) as fast_path:
        catalog.check_name(kind, "some.module:attribute")
    assert str(fast_path.value) == str(slow_path.value)
    with pytest.raises(ValueError, match="cannot import 'no/such/file.py:f': no file"):
        catalog.check_name(kind, "no/such/file.py:f")
    monkeypatch.undo()
    assert catalog.check_name(kind, name) is None  # imported: the registry decides


@pytest.mark.parametrize(
    "name", ["Cora", "pubmed", "facebook100:Caltech36", "FILES", "synthetic-sbm:2000:10", "nope"]
)
def test_catalog_dataset_spec_matches_dataset_spec(name, monkeypatch):
    from fedgraph.data import dataset_spec

    try:
        slow = dataset_spec(name)
    except ValueError as err:
        slow = str(err)
    monkeypatch.delitem(sys.modules, "fedgraph.data.datasets")
    try:
        fast = catalog.dataset_spec(name)
    except ValueError as err:
        fast = str(err)
    assert fast == slow or (fast is None and name.startswith("synthetic-sbm:"))


def test_a_preset_that_is_not_toml_fails_with_one_line(tmp_path):
    """A preset file that is not TOML is bad input: exit 2 naming the file and the parser's
    reason (as ``fedgraph sweep`` does), no traceback."""
    from typer.testing import CliRunner

    from fedgraph.simulations.cli import cli

    bad = tmp_path / "bad.toml"
    bad.write_text('method = "gap"\nbad = [\n')
    r = CliRunner().invoke(cli, ["run", str(bad)])
    assert r.exit_code == 2, r.output
    assert f"{bad}: not valid TOML" in " ".join(r.output.split()), r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)


LIGHT_CLIENT = r"""
import json, sys
from fedgraph.config import parse_run_config
cfg = parse_run_config({"method": "gap", "dataset": "synthetic-sbm:300:6:1"})
assert cfg.dataset == "synthetic-sbm:300:6:1", cfg.dataset
before = [m for m in ("torch", "torch_geometric") if m in sys.modules]
import fedgraph.simulations.client_app, fedgraph.methods.gap.client, fedgraph.methods.gap
from fedgraph import partition_cache as pc
from fedgraph.data import ClientGraph, partition
pc.code_digest(); pc.source_key("facebook-pagepage", "", 1); pc.cache_dir()
print(json.dumps({"config": before, "client": [m for m in ("torch_geometric", "torch._dynamo")
                                               if m in sys.modules],
                  "partition": callable(partition)}))
"""


def test_a_synthetic_dataset_validates_without_torch_and_gaps_client_path_without_pyg():
    """Parsing ``synthetic-sbm:...`` imports no torch; a GAP client (its app, GAP's client
    functions, its part of the partition cache's key) imports no PyG (about 2 s a process)."""
    proc = subprocess.run(
        [sys.executable, "-c", LIGHT_CLIENT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"config": [], "client": [], "partition": True}


def test_a_ray_address_where_no_cluster_answers_is_refused_before_anything_starts(monkeypatch):
    """RAY_ADDRESS=host:port with nothing listening: exit 2 naming RAY_ADDRESS (Ray would
    retry for ever and the run wait on clients that never start)."""
    import socket

    from typer.testing import CliRunner

    from fedgraph.config import ConfigError
    from fedgraph.simulations.cli import cli
    from fedgraph.simulations.resources import check_ray_address

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        monkeypatch.setenv("RAY_ADDRESS", address)
        r = CliRunner().invoke(cli, ["run", "ppgnn-cora"])
        assert r.exit_code == 2, r.output
        assert "RAY_ADDRESS" in r.output and "nothing answers there" in r.output
    with socket.socket() as listening:  # something answers, but not Ray's GCS (Ray maps
        listening.bind(("0.0.0.0", 0))  # 127.0.0.1 to the node's address: listen on all)
        listening.listen()
        with pytest.raises(ConfigError, match="but not Ray's GCS within 0.5 s"):
            check_ray_address(f"127.0.0.1:{listening.getsockname()[1]}", timeout=0.5)
    for bad, words in (
        ("http://127.0.0.1:80", "unknown scheme 'http://'"),
        ("127.0.0.1", "RAY_ADDRESS='127.0.0.1'"),
    ):
        with pytest.raises(ConfigError, match=words):
            check_ray_address(bad)
    # a real cluster passes: tests/test_ray_cluster.py (marked slow) runs on one


@pytest.mark.parametrize(
    "budgets,words",
    [
        ("1e308", "with one level: budgets below 22002.2)"),  # the level analysis's scan
        ("1,1e308", "gamma = 0.1: budgets below 7000"),  # ESW's exp(0.1 x budget) overflows
        ("1,7100", "ESW epsilon of gamma x 7100 = 710"),
    ],
)
def test_ppm_budgets_past_what_its_analysis_evaluates_are_config_errors(budgets, words):
    """Refused by the config (well under a second), not by the preflight's contract check
    after Ray started (which saw level_epsilon = nan there)."""
    from fedgraph.config import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match="budgets: ") as err:
        parse_run_config({"budgets": budgets})
    assert words in str(err.value)
    parse_run_config({"budgets": "1,6999"})  # below both limits: accepted
