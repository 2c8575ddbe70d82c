"""Extension API (docs/extending.md): the three examples run, and extensions that break the
contract are caught with a clear message. In-process (fedgraph.simulations.local.run_local: same
strategy, handlers and ledger); the custom-dataset example's real Flower run is in
tests/test_ray_cluster.py."""

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.data import (
    DATASETS,
    PARTITIONERS,
    check_graph,
    load_dataset,
    partition,
    read_graph_files,
    register_dataset,
    register_partitioner,
)
from fedgraph.mechanisms import (
    FEATURE_MECHANISMS,
    FeatureMechanism,
    check_mechanism,
    make_mechanism,
    register_mechanism,
)
from fedgraph.registry import ContractError, Registry, import_object
from fedgraph.simulations.local import LocalGrid, run_local
from fedgraph.simulations.run_files import load_run_config
from fedgraph.strategies import PrivateStrategy, register_strategy, resolve_strategy

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
FAST = ["epochs=5", "steps='2'"]  # PPGNN examples: fewer epochs and propagation steps


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the tests name example files relative to the repository
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def example_config(name, tmp_path, *overrides):
    return load_run_config(
        str(EXAMPLES / name / "run.toml"), [f"output-dir='{tmp_path / 'runs'}'", *overrides]
    )


def write_module(tmp_path, name, code) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(code))
    return str(path)


# ------------------------------------------------------------------------------ examples
def test_custom_dataset_files_and_partitioner():
    """The example loader, the no-code 'files' dataset and the example partitioner."""
    loader = import_object("examples/custom_dataset/loader.py:load")
    data = load_dataset("examples/custom_dataset/loader.py:load")
    files = load_dataset("files", str(EXAMPLES / "custom_dataset" / "graph"))
    assert data.num_nodes == files.num_nodes == 400 and data.x.shape == (400, 32)
    assert torch.equal(data.edge_index, files.edge_index)
    assert data.name == "sbm-400" and data.feature_domain == (0.0, 1.0)
    assert data.edge_index.shape[1] == 2 * loader(None).edge_index.shape[1]  # made undirected
    clients = partition(data, 3, "examples/custom_dataset/loader.py:by_blocks", seed=0)
    assert [c.num_nodes for c in clients] == [134, 133, 133]
    cfg = parse_run_config({"method": "gap", "dataset": "examples/custom_dataset/loader.py:load"})
    assert cfg.dataset == f"{EXAMPLES / 'custom_dataset' / 'loader.py'}:load"  # absolute


def test_custom_mechanism_example(tmp_path):
    mech_cls = import_object("examples/custom_mechanism/mechanism.py:PiecewiseMechanism")
    mech = mech_cls(budgets=[1.0, 2.0])
    check_mechanism(mech, num_features=8, num_levels=2)
    # unbiased: the mean estimate of n users with the same x is x (CLT bound per column)
    n, x = 40_000, torch.tensor([[-0.9, -0.2, 0.3, 1.0]])
    est, level_hat = mech.estimate(
        mech.perturb(
            x.expand(n, 4), torch.ones(n, dtype=torch.long), torch.Generator().manual_seed(1)
        ),
        4,
    )
    assert level_hat is None
    assert bool(((est.mean(0) - x[0]).abs() <= 4 * est.std(0) / math.sqrt(n)).all())
    report = run_local(example_config("custom_mechanism", tmp_path, *FAST))
    assert report["status"] == "ok"
    assert report["accuracy"]["test"] > report["ground_truth"]["majority_class"]
    for row in report["privacy"]["per_subject"].values():
        assert row["epsilon"] == pytest.approx(1.0)
        assert [r["release"] for r in row["releases"]] == ["piecewise"]


def test_custom_strategy_example(tmp_path):
    report = run_local(example_config("custom_strategy", tmp_path, *FAST))
    assert report["status"] == "ok" and report["method"] == "ppgnnwithappnp"
    assert report["accuracy"]["test"] > report["ground_truth"]["majority_class"]
    eps = {s: r["epsilon"] for s, r in report["privacy"]["per_subject"].items()}
    # features per level, and what the whole report reveals about the level (features fixed)
    assert eps == pytest.approx(
        {
            "level-1": 1.0,
            "level-2": 2.0,
            "level-3": 4.0,
            "level-1 (level)": 2.6832,
            "level-2 (level)": 2.0078,
            "level-3 (level)": 2.6832,
        },
        abs=1e-4,
    )
    assert (tmp_path / "runs" / "example-custom-strategy.json").is_file()


# ------------------------------------------------------------------------------ strategies
class _NoLedger(PrivateStrategy):
    def run(self, grid):
        self.connect(grid)
        self.report.accuracy["test"] = 0.5


class _NoAccuracy(PrivateStrategy):
    def run(self, grid):
        from fedgraph.accounting import PureDP

        self.ledger.record("client-0", "features", PureDP(1.0))


class _Overspends(PrivateStrategy):
    def run(self, grid):
        from fedgraph.accounting import PureDP

        self.ledger.set_budget("client-0", 1.0)
        self.ledger.record("client-0", "features", PureDP(0.75))
        self.ledger.record("client-0", "labels", PureDP(0.5))
        self.report.accuracy["test"] = 0.5


def test_strategy_that_spends_past_a_budget_fails_the_run(tmp_path):
    """The report is written with the subject flagged, but the run is failed, not ok."""
    cfg = parse_run_config({"num-clients": 2, "output-dir": str(tmp_path), "run-name": "over"})
    with pytest.raises(
        ContractError,
        match=r"spent more than a privacy budget \(client-0: "
        r"epsilon 1\.25 > budget 1\)",
    ):
        _Overspends(cfg).start(LocalGrid(2))
    report = json.loads((tmp_path / "over.json").read_text())
    assert report["status"] == "failed" and "privacy budget" in report["error"]
    row = report["privacy"]["per_subject"]["client-0"]
    assert row["over_budget"] is True and row["epsilon"] == pytest.approx(1.25)


@pytest.mark.parametrize(
    "cls,message", [(_NoLedger, "empty privacy ledger"), (_NoAccuracy, "without a test accuracy")]
)
def test_strategy_that_breaks_the_contract_fails_the_run(tmp_path, cls, message):
    cfg = parse_run_config({"num-clients": 2, "output-dir": str(tmp_path), "run-name": "bad"})
    with pytest.raises(ContractError, match=message):
        cls(cfg).start(LocalGrid(2))
    report = json.loads((tmp_path / "bad.json").read_text())
    assert report["status"] == "failed" and message in report["error"]


def test_strategy_needs_its_method(tmp_path):
    cls = resolve_strategy("examples/custom_strategy/strategy.py:PPGNNWithAPPNP")
    cfg = parse_run_config({"method": "gap", "output-dir": str(tmp_path), "run-name": "m"})
    with pytest.raises(ConfigError, match="needs method = 'ppgnn'"):
        cls(cfg).start(LocalGrid(1))
    from fedgraph.simulations.server_app import validate_run_config

    with pytest.raises(ConfigError, match="needs method = 'ppgnn'"):  # before anything starts
        validate_run_config(
            {"method": "gap", "strategy": "examples/custom_strategy/strategy.py:PPGNNWithAPPNP"}
        )


def test_strategy_resolution_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown 'nope'.*'gap'.*'ppgnn'"):
        resolve_strategy("nope")
    with pytest.raises(ValueError, match="cannot import"):
        resolve_strategy("no.such.module:Strategy")
    with pytest.raises(
        ContractError, match="not a subclass of fedgraph.strategies.PrivateStrategy"
    ):
        resolve_strategy("fedgraph.config:PPGNNConfig")
    with pytest.raises(ContractError, match="does not implement run"):
        register_strategy("abstract-one")(type("Abstract", (PrivateStrategy,), {}))
    with pytest.raises(ConfigError, match="strategy"):  # through the run config
        run_local({"strategy": "no.such.module:Strategy", "output-dir": str(tmp_path)})


# ------------------------------------------------------------------------------ mechanisms
SILENT = """
from fedgraph.mechanisms import FeatureMechanism

class Silent(FeatureMechanism):  # releases noisy features but declares no privacy loss
    name = "silent"
    def __init__(self, budgets, **_):
        pass
    def perturb(self, x, levels, generator=None):
        return {"x": x + 1.0}
    def estimate(self, report, num_features):
        return report["x"] - 1.0, None
    def privacy_spent(self, level):
        return {}
"""


def test_mechanism_without_ledger_event_is_caught_before_clients_start(tmp_path):
    spec = write_module(tmp_path, "silent", SILENT) + ":Silent"
    with pytest.raises(ContractError, match="no event in the privacy ledger"):
        make_mechanism(spec, budgets=[1.0])
    with pytest.raises(ConfigError, match="mechanism: .*privacy_spent\\(level=1\\)"):
        run_local({"mechanism": spec, "num-clients": 2, "output-dir": str(tmp_path)})


class _Identity(FeatureMechanism):
    name = "identity"

    def perturb(self, x, levels, generator=None):
        return {"x": x}

    def estimate(self, report, num_features):
        return report["x"], None

    def privacy_spent(self, level):
        return {"identity": 1.0}


class _WrongShape(_Identity):
    def perturb(self, x, levels, generator=None):
        return {"x": x + 0.5}

    def estimate(self, report, num_features):
        return report["x"][:, :1], None


class _NegativeEpsilon(_Identity):
    def privacy_spent(self, level):
        return {"identity": -1.0 if level == 2 else 1.0}


@pytest.mark.parametrize(
    "mech,message",
    [
        (_Identity(), "raw feature matrix"),
        (_WrongShape(), r"x_hat of shape \(32, 1\), expected \[32, 8\]"),
        (_NegativeEpsilon(), r"privacy_spent\(level=2\).*finite number > 0"),
    ],
)
def test_check_mechanism_catches(mech, message):
    with pytest.raises(ContractError, match=message):
        check_mechanism(mech, num_features=8, num_levels=3)


def test_preflight_refuses_a_mechanism_that_leaks_raw_features(tmp_path):
    """The dry run happens before any client perturbs real data: the run never starts."""
    spec = (
        write_module(
            tmp_path,
            "leaky",
            """
        from fedgraph.mechanisms import FeatureMechanism

        class Leaky(FeatureMechanism):
            name = "leaky"

            def __init__(self, **_):
                pass

            def privacy_spent(self, level):
                return {"features": 1.0}

            def perturb(self, x, levels, generator=None):
                return {"x": x}

            def estimate(self, report, num_features):
                return report["x"], None
        """,
        )
        + ":Leaky"
    )
    with pytest.raises(ConfigError, match=r"mechanism: .*raw feature matrix"):
        run_local(
            {"mechanism": spec, "num-clients": 2, "output-dir": str(tmp_path), "run-name": "leak"}
        )
    assert not (tmp_path / "leak.json").exists()


def test_strategy_runs_are_seeded(tmp_path):
    """PrivateStrategy.start seeds torch with the run's seed: a strategy that draws server-side
    randomness without seeding it itself is still reproducible."""

    class _Draws(_NoAccuracy):
        def run(self, grid):
            super().run(grid)
            self.report.accuracy["test"] = float(torch.rand(()))

    tests = []
    for seed in (3, 3, 4):
        cfg = parse_run_config(
            {"num-clients": 1, "seed": seed, "output-dir": str(tmp_path), "run-name": f"s{seed}"}
        )
        tests.append(_Draws(cfg).start(LocalGrid(1))["accuracy"]["test"])
    assert tests[0] == tests[1] != tests[2]


def test_mechanism_registration_and_unknown_name():
    with pytest.raises(ContractError, match="not a subclass"):
        register_mechanism("not-a-mechanism", dict)
    with pytest.raises(ContractError, match="does not implement"):
        register_mechanism("abstract", FeatureMechanism)
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism("ppm", _Identity)
    with pytest.raises(ConfigError) as err:
        parse_run_config({"mechanism": "nope"})
    assert all(repr(name) in str(err.value) for name in FEATURE_MECHANISMS)


# ------------------------------------------------------------------------------ datasets
def _graph(**changes):
    data = Data(
        x=torch.rand(6, 3),
        y=torch.tensor([0, 1, 2, 0, 1, 2]),
        edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]),
        feature_domain=(0.0, 1.0),
    )
    for key, value in changes.items():
        data[key] = value
    return data


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"x": None}, "x must be a float tensor .*None"),
        ({"x": torch.ones(6, 3, dtype=torch.long)}, "x must be a float tensor"),
        ({"y": torch.tensor([0, 1, 2, 0, 1])}, r"y must be an integer tensor \[6\]"),
        (
            {"y": torch.tensor([0, 1, 2, 0, 1, -1])},
            r"labels must lie in \[0, 3\).*the first "
            r"outside is -1 at node 5",
        ),
        ({"y": torch.tensor([0, 1, 2, 0, 1, 3]), "num_classes": 3}, r"labels must lie in \[0, 3\)"),
        ({"y": torch.tensor([1, 2, 3, 1, 2, 3])}, r"classes \[0\] have no node \(1-based"),
        (
            {"y": torch.tensor([0, 1, 2, 0, 1, 99])},
            r"the labels take the values \[0, 1, 2, 99\], so "
            r"classes \[3, 4, .*12, \.\.\.\] \(96 in all\) have no node \(the largest label, 99, "
            r"is at node\(s\) \[5\]",
        ),
        (
            {"edge_index": torch.tensor([[0, 1, 2]])},
            r"edge_index must be an integer tensor \[2, num_edges\]",
        ),
        ({"edge_index": torch.tensor([[0, 6], [1, 2]])}, r"node ids in \[0, 6\], outside \[0, 6\)"),
        ({"x": torch.full((6, 3), 2.0)}, "outside the declared feature_domain"),
        ({"feature_domain": (1.0, 0.0)}, "low < high"),
        (
            {"train_mask": torch.ones(5, dtype=torch.bool)},
            r"train_mask must be a bool tensor \[6\]",
        ),
    ],
)
def test_check_graph_catches(changes, message):
    with pytest.raises(ContractError, match=f"dataset 'mine': .*{message}"):
        check_graph(_graph(**changes), "mine")


def test_bad_loader_fails_preflight_naming_the_field(tmp_path):
    spec = (
        write_module(
            tmp_path,
            "badgraph",
            """
        import torch
        from torch_geometric.data import Data

        def load(root):
            return Data(x=torch.rand(10, 4), y=torch.arange(10) % 3 + 1,  # 1-based
                        edge_index=torch.tensor([[0], [1]]), feature_domain=(0.0, 1.0))
        """,
        )
        + ":load"
    )
    with pytest.raises(ConfigError, match=r"dataset/data-root: .*classes \[0\] have no node"):
        run_local({"method": "gap", "dataset": spec, "num-clients": 2, "output-dir": str(tmp_path)})


def test_dataset_registration_and_unknown_name():
    with pytest.raises(ContractError, match="accept one argument"):
        register_dataset("two-args", lambda root, other: None)
    with pytest.raises(ValueError, match="built in"):
        register_dataset("Cora", lambda root: None)
    register_dataset("tiny-test-graph", lambda root: _graph())
    try:
        cfg = parse_run_config({"method": "gap", "dataset": "tiny-test-graph"})
        assert load_dataset(cfg.dataset).num_nodes == 6
    finally:
        DATASETS.pop("tiny-test-graph")
    with pytest.raises(ConfigError) as err:
        parse_run_config({"dataset": "nope"})
    assert "cora" in str(err.value) and "'files'" in str(err.value)
    with pytest.raises(FileNotFoundError, match="edges.csv"):
        read_graph_files(ROOT / "docs")


def test_a_malformed_graph_file_is_named_with_its_layout(tmp_path):
    """The ``files`` dataset: a header line without ``#``, a ragged feature row and a broken
    graph.toml each name the file and what it should hold (numpy's and tomllib's own words
    alone named neither)."""

    def folder(edges="0,1\n1,2\n", features="1,0\n0,1\n1,1\n", labels="0\n1\n0\n", toml=None):
        d = tmp_path / f"g{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for name, text in (
            ("edges.csv", edges),
            ("features.csv", features),
            ("labels.csv", labels),
            ("graph.toml", toml),
        ):
            if text is not None:
                (d / name).write_text(text)
        return d

    assert read_graph_files(folder()).num_nodes == 3
    bad = folder(edges="source,target\n0,1\n")
    with pytest.raises(
        ValueError,
        match=r"edges.csv: .*'source'.*a header line must start "
        r"with '#'",
    ):
        read_graph_files(bad)
    with pytest.raises(ValueError, match=r"features.csv: data line 2 .*column\(s\).*same number"):
        read_graph_files(folder(features="1,0\n0,1,1\n1,1\n"))
    with pytest.raises(ValueError, match=r"graph.toml: not valid TOML"):
        read_graph_files(folder(toml="feature_domain = [0, 1"))
    with pytest.raises(
        ValueError,
        match=r"features.csv: data line 2, column 2 is nan "
        r"\(counting data lines and columns from 1",
    ):
        read_graph_files(folder(features="1,0\n0,nan\n1,1\n"))
    with pytest.raises(
        ValueError,
        match=r"labels.csv has 2 data lines but .*features.csv "
        r"has 3: one label per node",
    ):
        read_graph_files(folder(labels="0\n1\n"))
    with pytest.raises(
        ValueError,
        match=r"edges.csv: data line 2 \(counted from 1\) has the "
        r"edge 1,3; node ids must lie in \[0, 3\)",
    ):
        read_graph_files(folder(edges="# source,target\n0,1\n1,3\n"))
    for name in ("edges", "features", "labels"):  # (numpy only warned for an empty file)
        with pytest.raises(ValueError, match=rf"{name}.csv: no data line \(expected"):
            read_graph_files(folder(**{name: "# only a comment\n"}))


# ------------------------------------------------------------------------------ partitioners
def test_a_partitioner_leaving_clients_empty_is_warned_about():
    """Empty clients get one node each (fix_empty_clients), not silently: a warning names them."""
    register_partitioner("all-zero")(
        lambda data, num_clients, seed, **o: torch.zeros(data.num_nodes, dtype=torch.long)
    )
    try:
        with pytest.warns(UserWarning, match=r"left client\(s\) 1, 2 of 3 empty"):
            parts = partition(_graph(), 3, "all-zero", seed=0)
        assert [p.num_nodes for p in parts] == [4, 1, 1]
    finally:
        PARTITIONERS.pop("all-zero")


def test_partitioner_contract():
    data = _graph()
    with pytest.raises(ContractError, match="expected a function"):
        partition(data, 2, "examples/custom_dataset/loader.py:GRAPH", seed=0)  # a Path
    register_partitioner("floats")(lambda data, num_clients, seed, **o: torch.zeros(6))
    register_partitioner("short")(lambda data, num_clients, seed, **o: torch.zeros(3).long())
    try:
        with pytest.raises(ContractError, match="expected integers"):
            partition(data, 2, "floats", seed=0)
        with pytest.raises(ContractError, match="3 client ids for 6 nodes"):
            partition(data, 2, "short", seed=0)
    finally:
        PARTITIONERS.pop("floats"), PARTITIONERS.pop("short")
    with pytest.raises(ConfigError, match="unknown 'nope'; allowed: .*'louvain'"):
        parse_run_config({"partitioner": "nope"})


# ------------------------------------------------------------------------------ registry
def test_entry_point_names_resolve(tmp_path, monkeypatch):
    """An installed package can publish a mechanism under group 'fedgraph.mechanisms'."""
    (tmp_path / "mypkg_ep.py").write_text(
        "from fedgraph.mechanisms import LaplaceMechanism\n"
        "def make(budgets, **_):\n    return LaplaceMechanism(min(budgets))\n"
    )
    info = tmp_path / "mypkg_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedgraph.mechanisms]\nmy-laplace = mypkg_ep:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mech = make_mechanism("my-laplace", budgets=[2.0])
    assert mech.name == "laplace" and mech.privacy_spent(1) == {"laplace": 2.0}
    with pytest.raises(ValueError, match="unknown 'my-other'"):
        Registry("mechanism").resolve("my-other")


def test_paths_in_a_toml_are_relative_to_that_file(tmp_path, monkeypatch):
    """Issue 30: a run-config TOML's paths (a spec's .py file, data-root, output-dir) resolve
    against the TOML's folder, not the working directory; a spec written for the repository
    root (no such file next to the TOML) is left to the working directory."""
    monkeypatch.chdir(tmp_path)  # anywhere but the repository
    cfg = load_run_config(str(EXAMPLES / "custom_dataset" / "run.toml"), [])
    assert cfg["dataset"] == f"{EXAMPLES / 'custom_dataset' / 'loader.py'}:load"
    assert cfg["partitioner"] == f"{EXAMPLES / 'custom_dataset' / 'loader.py'}:by_blocks"
    toml = tmp_path / "sub" / "run.toml"
    toml.parent.mkdir()
    toml.write_text(
        'data-root = "data"\noutput-dir = "runs"\n'
        'mechanism = "examples/custom_mechanism/mechanism.py:PiecewiseMechanism"\n'
    )
    cfg = load_run_config(str(toml), ["run-name='x'"])
    assert cfg["data-root"] == str(toml.parent / "data")
    assert cfg["output-dir"] == str(toml.parent / "runs")
    assert cfg["mechanism"] == "examples/custom_mechanism/mechanism.py:PiecewiseMechanism"


def test_a_pt_file_as_data_root_of_the_files_dataset_passes_the_config_check(tmp_path):
    """``data-root`` a ``.pt`` file (torch.save of a graph) is what the docs and the loader
    accept for dataset ``files``; the config check refused every such path as "not a folder"
    (fresh user, 12-07). A missing one is named as a missing file."""
    from fedgraph.config import ConfigError, check_data_root, parse_run_config

    graph = read_graph_files(EXAMPLES / "custom_dataset" / "graph")
    torch.save(graph, tmp_path / "graph.pt")
    cfg = parse_run_config(
        {"method": "gap", "dataset": "files", "data-root": str(tmp_path / "graph.pt")}
    )
    check_data_root(cfg)
    assert load_dataset("files", str(tmp_path / "graph.pt")).num_nodes == graph.num_nodes
    missing = parse_run_config(
        {"method": "gap", "dataset": "files", "data-root": str(tmp_path / "none.pt")}
    )
    with pytest.raises(
        ConfigError,
        match=r"data-root: .*none\.pt is not a file \(dataset "
        r"'files' reads a \.pt file",
    ):
        check_data_root(missing)
    other = parse_run_config(
        {"method": "gap", "dataset": "cora", "data-root": str(tmp_path / "graph.pt")}
    )
    with pytest.raises(ConfigError, match=r"graph\.pt is not a folder"):
        check_data_root(other)  # only the files dataset reads a .pt
