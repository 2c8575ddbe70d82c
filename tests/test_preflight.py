"""Preflight refuses runs whose splits or clients are empty, naming what to change (issue 17,
item 3): before, a 3-node graph ran every phase and failed on a NaN test accuracy (PPGNN) or
ended ``ok`` with a NaN validation accuracy (GAP)."""

from __future__ import annotations

import textwrap

import pytest

from fedgraph.config import ConfigError
from fedgraph.simulations.local import run_local

TINY = """
import torch
from torch_geometric.data import Data

def load(root):
    n = {n}
    src = torch.arange(n - 1)
    edges = torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])])
    return Data(x=torch.rand(n, 4), y=torch.arange(n) % 2, edge_index=edges,
                feature_domain=(0.0, 1.0))
"""


@pytest.fixture
def graph_module(tmp_path, monkeypatch):
    def make(n: int) -> str:
        name = f"tinygraph{n}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(TINY.format(n=n)))
        monkeypatch.syspath_prepend(str(tmp_path))
        return f"{name}:load"

    return make


@pytest.mark.parametrize("method", ["ppgnn", "gap"])
def test_three_node_graph_is_refused_naming_the_empty_split(graph_module, tmp_path, method):
    with pytest.raises(ConfigError, match=r"^split: the (val|test) split .* is empty"):
        run_local(
            {
                "method": method,
                "dataset": graph_module(3),
                "num-clients": 3,
                "output-dir": str(tmp_path / "out"),
            }
        )
    assert not list((tmp_path / "out").glob("*.json"))  # refused before any run


def test_gap_client_without_training_nodes_is_named(graph_module, tmp_path):
    with pytest.raises(ConfigError, match=r"num-clients: client \d+ holds no train node"):
        run_local(
            {
                "method": "gap",
                "dataset": graph_module(40),
                "num-clients": 30,
                "partitioner": "random",
                "output-dir": str(tmp_path),
            }
        )


def test_ppgnn_clients_need_no_training_nodes_of_their_own(graph_module, tmp_path):
    # PPGNN trains on the server: a client with users of one split only is fine.
    from fedgraph.config import parse_run_config
    from fedgraph.federation import check_nonempty

    check_nonempty(
        parse_run_config(
            {
                "method": "ppgnn",
                "dataset": graph_module(40),
                "num-clients": 30,
                "output-dir": str(tmp_path),
            }
        )
    )


def test_a_data_root_that_is_not_a_folder_is_refused(tmp_path):
    """Before, a missing data-root was ignored and the bundled Cora trained instead."""
    missing = tmp_path / "nonexistent"
    with pytest.raises(ConfigError, match=rf"^data-root: {missing} is not a folder"):
        run_local(
            {
                "method": "ppgnn",
                "dataset": "cora",
                "data-root": str(missing),
                "output-dir": str(tmp_path / "out"),
            }
        )
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_ppgnn_on_a_graph_without_feature_domain_is_refused_before_clients(
    graph_module, tmp_path, monkeypatch
):
    """Before, every PPGNN client failed on it after the run had started (exit 1)."""
    import importlib
    import sys

    spec = graph_module(40)
    module = importlib.import_module(spec.split(":")[0])
    load = module.load
    monkeypatch.setattr(module, "load", lambda root: _without_domain(load(root)))
    with pytest.raises(ConfigError, match=r"^dataset: .* has no public feature domain"):
        run_local(
            {"method": "ppgnn", "dataset": spec, "num-clients": 2, "output-dir": str(tmp_path)}
        )
    assert not list(tmp_path.glob("*.json"))
    sys.modules.pop(module.__name__, None)


def _without_domain(data):
    del data.feature_domain
    return data


def test_a_user_loader_that_raises_is_a_dataset_error_before_any_client(tmp_path, monkeypatch):
    """Exit 2 naming the key (fedgraph run) instead of 'FAILED: boom' with exit 1."""
    (tmp_path / "boomgraph.py").write_text("def load(root):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"^dataset: loading 'boomgraph:load' failed: "
        r"RuntimeError: boom",
    ):
        run_local(
            {
                "method": "gap",
                "dataset": "boomgraph:load",
                "num-clients": 2,
                "output-dir": str(tmp_path / "out"),
            }
        )
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize("dataset", ["citeseer", "cora"])
def test_a_missing_fedgraph_data_folder_is_named_before_anything_starts(
    tmp_path, monkeypatch, dataset
):
    """An empty data-root with $FEDGRAPH_DATA naming no folder: refused by the cheap check
    (before Ray), naming both, even for the bundled Cora, which used to run without a word
    (fresh user, 12-07: a mistyped folder went unnoticed); an existing folder passes, and a
    synthetic graph reads no folder."""
    from fedgraph.config import parse_run_config
    from fedgraph.config.checks import check_data_root

    cfg = parse_run_config({"method": "ppgnn", "dataset": dataset})
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path / "nope"))
    with pytest.raises(
        ConfigError,
        match=r"data-root: empty, and \$FEDGRAPH_DATA = .*nope is "
        r"not a folder",
    ):
        check_data_root(cfg)
    check_data_root(
        parse_run_config({"method": "gap", "dataset": "synthetic-sbm:40:3", "num-clients": 2})
    )
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path))
    check_data_root(cfg)


def test_fedgraph_run_names_a_missing_fedgraph_data_folder_before_ray_starts(tmp_path, monkeypatch):
    """``FEDGRAPH_DATA=/nonexistent fedgraph run`` (the bundled Cora) ran as if it were unset
    (fresh user, 12-07): exit 2 naming the variable and the folder, before Ray starts."""
    from typer.testing import CliRunner

    from fedgraph.simulations import cli as cli_module

    def ray_would_start(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(cli_module, "run_simulation", ray_would_start)
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path / "nonexistent"))
    res = CliRunner().invoke(cli_module.cli, ["run", "--set", f"output-dir='{tmp_path}'"])
    assert res.exit_code == 2, res.output
    assert f"$FEDGRAPH_DATA = {tmp_path / 'nonexistent'} is not a folder" in " ".join(
        res.output.split()
    )


MISSING = [
    "citeseer",
    "pubmed",
    "lastfm-asia",
    "reddit",
    "ogbn-products",
    "facebook100:Nowhere99",
    "files",
]


@pytest.mark.parametrize("dataset", MISSING)
def test_a_missing_dataset_is_refused_before_ray_with_the_preflights_message(
    tmp_path, monkeypatch, dataset
):
    """A dataset whose files are not under the data root was found only by the preflight's
    load, after Ray had started (13-19 s; fresh user, 12-07). The cheap check that
    ``fedgraph run`` makes first (no torch) refuses it with the preflight's own message."""
    from fedgraph.config import check_dataset_files, parse_run_config
    from fedgraph.federation import preflight

    root = tmp_path / "empty-root"
    root.mkdir()
    monkeypatch.setenv("FEDGRAPH_DATA", str(root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = parse_run_config(
        {
            "method": "gap",
            "dataset": dataset,
            "num-clients": 2,
            "data-root": str(root) if dataset == "files" else "",
            "output-dir": str(tmp_path / "out"),
        }
    )
    with pytest.raises(ConfigError) as cheap:
        check_dataset_files(cfg)
    with pytest.raises(ConfigError) as late:  # the load's own error
        preflight(cfg)
    assert str(cheap.value) == str(late.value)
    assert str(cheap.value).startswith("dataset/data-root: ") and str(root) in str(cheap.value)


@pytest.mark.parametrize("dataset", ["cora", "synthetic-sbm:40:3", "files"])
def test_bundled_generated_and_present_datasets_need_no_file_check(tmp_path, monkeypatch, dataset):
    """Cora is bundled, a synthetic graph generated, and a ``files`` folder (or ``.pt``) that
    holds the graph is there: the cheap check lets them through."""
    from fedgraph.config import check_dataset_files, parse_run_config

    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path))
    graph = tmp_path / "graph"
    graph.mkdir()
    for name in ("edges.csv", "features.csv", "labels.csv"):
        (graph / name).write_text("0,1\n")
    check_dataset_files(
        parse_run_config(
            {
                "method": "gap",
                "dataset": dataset,
                "num-clients": 2,
                "data-root": str(graph) if dataset == "files" else "",
            }
        )
    )
