import math

import pytest

from fedgraph.config import ConfigError, PPGNNConfig, keys_of_other_methods, parse_run_config


def test_defaults_and_flat_keys():
    cfg = parse_run_config({"budgets": "1,2,4", "num-clients": 4, "level-shares": "0.5,0.25,0.25"})
    assert isinstance(cfg, PPGNNConfig)
    assert cfg.budgets == [1.0, 2.0, 4.0] and cfg.num_clients == 4
    assert cfg.shares == [0.5, 0.25, 0.25]
    assert parse_run_config({}).shares == pytest.approx([1 / 3] * 3)
    assert parse_run_config({"epsilon": ""}).epsilon is None


@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("budgets", "0,1", "budgets"),
        ("budgets", "1,nan", "budgets"),
        ("budgets", "2,1", "strictly increasing"),
        ("epsilon", -1.0, "epsilon"),
        ("epsilon", math.nan, "epsilon"),
        ("epsilon", 0.0, "epsilon"),
        ("gamma", 1.5, "gamma"),
        ("dataset", "nope", "allowed: cora"),
        ("partitioner", "nope", "partitioner"),
        ("num-clients", 0, "num-clients"),
        ("mechanism", "nope", "allowed:"),
        ("backbone", "mlp", "backbone"),
        ("level-shares", "0.5,0.5", "one share per level"),
        ("level-shares", "0.5,0.4,0.4", "sum to 1"),
        ("method", "nope", "method"),
        ("no-such-key", 1, "unknown key"),
        ("num-client", 5, "unknown key (did you mean 'num-clients'?)"),
        ("client-epsilons", "nan", "must be numbers > 0 or inf (no noise), not nan (got 'nan')"),
    ],
)
def test_bad_values_name_the_key(key, value, expect):
    with pytest.raises(ConfigError) as err:
        parse_run_config({key: value})
    assert key in str(err.value) or key.replace("-", "_") in str(err.value)
    assert expect in str(err.value)


@pytest.mark.parametrize(
    "key,value", [("budgets", "1e-30,1"), ("budgets", "1e-300"), ("epsilon", 1e-9)]
)
def test_a_feature_epsilon_below_the_float32_floor_is_refused_naming_it(key, value):
    """budgets=1e-30 trained on overflowed estimates and reported majority-class accuracy
    as a result (fresh user, 12-07); 1e-300 failed after Ray started, naming no key."""
    with pytest.raises(
        ConfigError,
        match=rf"{key}: .*must be at least 1e-06 \(allowed: "
        rf"\[1e-06, inf\).*got 1e-",
    ):
        parse_run_config({key: value})
    assert parse_run_config({"budgets": "1e-6,1"}).budgets == [1e-6, 1.0]


@pytest.mark.parametrize(
    "config,expect",
    [
        (
            {"method": "gap", "num-clients": 0},
            "num-clients: Input should be greater than or equal to 1 (got 0); allowed: [1, 100000]",
        ),
        (
            {"method": "privgnn", "public-fraction": 1.5},
            "public-fraction: Input should be less than 1 (got 1.5); allowed: (0, 1)",
        ),
        ({"method": "privgnn", "gamma": 0}, "allowed: (0, 1]"),
    ],
)
def test_a_value_out_of_its_bounds_names_the_allowed_interval(config, expect):
    with pytest.raises(ConfigError) as err:
        parse_run_config(config)
    assert expect in str(err.value)


def test_pyproject_declares_every_key():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    from fedgraph.config import METHOD_CONFIGS

    keys = set(declared["tool"]["flwr"]["app"]["config"]) - {"strategy"}
    fields = {k.replace("_", "-") for m in METHOD_CONFIGS.values() for k in m.model_fields}
    assert keys == fields
    parse_run_config(
        {k: v for k, v in declared["tool"]["flwr"]["app"]["config"].items() if k != "strategy"}
        | {"num-clients": 10}
    )  # 0: set from the grid


def test_every_preset_validates():
    import tomllib
    from pathlib import Path

    from fedgraph.simulations.server_app import validate_run_config

    presets = sorted((Path(__file__).parents[1] / "simulations" / "presets").glob("*.toml"))
    assert len(presets) >= 8
    for path in presets:
        preset = tomllib.loads(path.read_text())
        strategy, cfg = validate_run_config(preset)
        assert strategy.method == cfg.method, path.name
        assert not keys_of_other_methods(preset), path.name


def test_keys_of_other_methods_are_found_and_rejected_by_fedgraph_run(tmp_path):
    from typer.testing import CliRunner

    from fedgraph.simulations.cli import cli

    assert keys_of_other_methods({"method": "gap", "budgets": "1,2", "hops": 2, "seed": 1}) == {
        "budgets": ["ppgnn"]
    }
    assert keys_of_other_methods({"strategy": "privgnn", "server-optimizer": "fedadam"}) == {
        "server-optimizer": ["gap"]
    }
    assert keys_of_other_methods({"gamma": 0.2, "denoiser": "kprop"}) == {}  # ppgnn's own
    # flwr run passes every declared key: parse_run_config still ignores them
    assert parse_run_config({"method": "gap", "budgets": "1,2"}).method == "gap"
    res = CliRunner().invoke(
        cli, ["run", "gap-edge-cora", "-s", "budgets=1,2", "-s", f"output-dir={tmp_path}"]
    )
    assert res.exit_code == 2
    assert "budgets: a key of method 'ppgnn', not of this run's method 'gap'" in res.output
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_default_run_name_does_not_repeat_the_dataset():
    from fedgraph.report import default_run_name

    t = 1796083200.0  # a fixed instant; the name carries the local time of day
    stamp = __import__("time").strftime("%Y%m%d-%H%M%S", __import__("time").localtime(t))
    assert default_run_name("gap-edge-cora", "cora", 0, t, 7) == f"gap-edge-cora-seed0-{stamp}-7"
    assert default_run_name("ppgnn", "cora", 3, t, 7) == f"ppgnn-cora-seed3-{stamp}-7"
    assert (
        default_run_name("gap-edge-cora", "citeseer", 0, t, 7)
        == f"gap-edge-cora-citeseer-seed0-{stamp}-7"
    )
    assert default_run_name("mycora", "cora", 0, t, 7) == f"mycora-cora-seed0-{stamp}-7"


def test_flwr_run_reports_are_named_like_fedgraph_run_reports(tmp_path):
    """One naming scheme (issue 17, item 5): a strategy without run-name (what flwr run
    writes) names its report as fedgraph run does, process id included."""
    import os
    import re

    from fedgraph.config import parse_run_config
    from fedgraph.strategies.base import PrivateStrategy

    class Named(PrivateStrategy):
        def run(self, grid):
            pass

    cfg = parse_run_config({"output-dir": str(tmp_path)})
    stem = Named(cfg).report_path().stem
    assert re.fullmatch(rf"named-cora-seed0-\d{{8}}-\d{{6}}-{os.getpid()}", stem), stem


@pytest.mark.parametrize("method", ["ppgnn", "gap", "privgnn"])
@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "a\\b"])
def test_run_name_is_a_file_name_not_a_path_out_of_output_dir(method, name):
    with pytest.raises(ConfigError, match="run-name: must be a plain file name"):
        parse_run_config({"method": method, "run-name": name})
    assert (
        parse_run_config({"method": method, "run-name": "seed-0_ok.v2"}).run_name == "seed-0_ok.v2"
    )


@pytest.mark.parametrize("value,name", [(123, "123"), (float("inf"), "inf"), (2.5, "2.5")])
def test_an_unquoted_number_for_a_text_key_is_its_text(value, name):
    """``--set run-name=123`` (TOML: an integer) names the report ``123``, as the user meant;
    ``run-name=inf`` was refused as "must be a finite number" on a text key."""
    assert parse_run_config({"method": "gap", "run-name": value}).run_name == name


def test_a_run_name_given_with_the_json_suffix_names_that_report(tmp_path):
    cfg = parse_run_config({"method": "gap", "run-name": "mine.json", "output-dir": str(tmp_path)})
    assert cfg.run_name == "mine"  # the report is mine.json, not mine.json.json
    with pytest.raises(ConfigError, match="run-name: must name the report"):
        parse_run_config({"method": "gap", "run-name": ".json"})


def test_a_key_that_fedsgd_would_ignore_is_rejected_naming_it():
    from fedgraph.config import reject_keys_of_other_methods

    with pytest.raises(ConfigError, match="local-epochs: ignored with schedule = 'fedsgd'"):
        reject_keys_of_other_methods({"method": "gap", "schedule": "fedsgd", "local-epochs": 5})
    reject_keys_of_other_methods({"method": "gap", "schedule": "fedsgd", "local-epochs": 1})
    reject_keys_of_other_methods({"method": "gap", "schedule": "fedavg", "local-epochs": 5})


def test_pyproject_values_are_the_ppgnn_defaults():
    """One place for PPGNN's defaults: ``flwr run .`` (pyproject), ``fedgraph run`` presets and
    the benches (``parse_run_config``) get the same values for every PPGNN key."""
    import tomllib
    from pathlib import Path

    from fedgraph.config import PPGNNConfig

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = declared["tool"]["flwr"]["app"]["config"]
    assert declared["method"] == "ppgnn"
    # num-clients = 0: one client per supernode (the ServerApp sets it from the grid first)
    assert declared["num-clients"] == 0
    declared["num-clients"] = PPGNNConfig().num_clients
    from_pyproject = parse_run_config({k: v for k, v in declared.items() if k != "strategy"})
    defaults = PPGNNConfig()
    for field in PPGNNConfig.model_fields:
        if field in ("data_root", "epsilon"):
            continue  # resolved at parse time (data folder, smallest level)
        assert getattr(from_pyproject, field) == getattr(defaults, field), field


@pytest.mark.parametrize(
    "given,schedule,rounds",
    [
        ({}, "fedsgd", (100, 100, 1)),  # edge level: FedSGD
        ({"level": "node"}, "fedavg", (10, 10, 10)),  # DP-SGD on the clients
        ({"local-epochs": 5}, "fedavg", (10, 10, 5)),  # a FedAvg key
        ({"batch-size": 64}, "fedavg", (10, 10, 10)),
        ({"server-optimizer": "fedadam"}, "fedavg", (10, 10, 10)),
        ({"local-epochs": 1}, "fedsgd", (100, 100, 1)),
        ({"schedule": "fedavg"}, "fedavg", (10, 10, 10)),
        ({"encoder-rounds": 3}, "fedsgd", (3, 100, 1)),  # only the unset follow
        (
            {"schedule": "auto", "encoder-rounds": "", "classifier-rounds": "", "local-epochs": ""},
            "fedsgd",
            (100, 100, 1),
        ),  # what flwr run passes
    ],
)
def test_gap_schedule_auto_and_the_rounds_it_implies(given, schedule, rounds):
    """Issue 14: FedSGD (the measured best for clients holding communities) is GAP's default
    at edge level; the report's config holds the resolved schedule and rounds."""
    cfg = parse_run_config({"method": "gap", "dataset": "cora", **given})
    assert cfg.schedule == schedule
    assert (cfg.encoder_rounds, cfg.classifier_rounds, cfg.local_epochs) == rounds
    assert cfg.model_dump()["schedule"] == schedule


def test_pyproject_values_are_the_gap_defaults():
    """flwr run passes pyproject's GAP keys ("" for rounds that follow the schedule): the same
    config as GAP's defaults."""
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = declared["tool"]["flwr"]["app"]["config"]
    given = {k: v for k, v in declared.items() if k != "strategy"}
    given["num-clients"] = 10  # 0 in pyproject: the ServerApp sets it from the grid first
    for method in ("gap", "privgnn"):  # every key, the shared ones included (delta, split, ...)
        from_pyproject = parse_run_config({**given, "method": method})
        defaults = parse_run_config({"method": method})
        for field in type(defaults).model_fields:
            assert getattr(from_pyproject, field) == getattr(defaults, field), (method, field)


def test_an_empty_method_dependent_key_is_the_methods_default():
    """flwr run passes every pyproject key to every method: a shared key whose default differs
    by method (delta: PPGNN 1e-5, GAP 1e-7, PrivGNN 1e-4) is declared "" there."""
    from fedgraph.config import METHOD_DEPENDENT

    assert {"delta", "split", "partitioner", "gamma", "client_epsilons"} <= METHOD_DEPENDENT
    assert parse_run_config({"method": "gap", "delta": ""}).delta == 1e-7
    assert parse_run_config({"method": "privgnn", "delta": ""}).delta == 1e-4
    assert parse_run_config({"method": "ppgnn", "delta": ""}).delta == 1e-5
    assert parse_run_config({"method": "gap", "delta": 1e-6}).delta == 1e-6
    with pytest.raises(ConfigError, match="run-name"):  # "" elsewhere is still a value
        parse_run_config({"method": "gap", "run-name": "../x"})


def test_fedgraph_run_preset_and_flwr_run_name_the_report_alike(tmp_path):
    """Issue 30: ``fedgraph run gap-edge-cora`` wrote gap-edge-cora-seed0-..., ``flwr run
    --run-config gap-edge-cora.toml`` gap-cora-seed0-...: one rule now, the strategy's."""
    import json
    import re
    import tomllib
    from pathlib import Path

    from fedgraph.registry import spec_label
    from fedgraph.report import default_run_name
    from fedgraph.simulations.run_files import PRESETS
    from fedgraph.simulations.server_app import validate_run_config
    from fedgraph.simulations.simulate import _run

    preset = tomllib.loads((Path(PRESETS) / "gap-edge-cora.toml").read_text())
    run_config = {**preset, "output-dir": str(tmp_path)}
    strategy_cls, cfg = validate_run_config(run_config)
    names = []

    def simulate(server_app, client_app, num_supernodes, backend_config):
        from fedgraph.simulations.interrupt import REPORT_PATH

        names.append(REPORT_PATH[0].stem)
        REPORT_PATH[0].write_text(json.dumps({"status": "ok"}))

    _run(run_config, cfg, None, {}, simulate, lambda rc: None, None, default_run_name, spec_label)
    under_flwr_run = strategy_cls(cfg).report_path().stem
    pattern = r"-\d{8}-\d{6}-\d+$"
    assert re.sub(pattern, "", names[0]) == re.sub(pattern, "", under_flwr_run) == "gap-cora-seed0"


def test_one_key_in_both_spellings_is_refused_unless_the_values_agree():
    """``encoder-rounds=1`` and ``encoder_rounds=2`` in one run config: which one won depended
    on their order (a fresh-user trial found the underscore silently winning); refused, naming
    the key. A ``--set`` replaces the preset's key whatever its spelling."""
    import pytest

    from fedgraph.config import ConfigError, parse_run_config
    from fedgraph.simulations.run_files import load_run_config

    with pytest.raises(
        ConfigError,
        match="encoder-rounds: given twice, as encoder-rounds = 1 and encoder_rounds = 2",
    ):
        parse_run_config({"method": "gap", "encoder-rounds": 1, "encoder_rounds": 2})
    assert (
        parse_run_config({"method": "gap", "encoder-rounds": 2, "encoder_rounds": 2}).encoder_rounds
        == 2
    )
    assert load_run_config(None, ["encoder-rounds=1", "encoder_rounds=3"]) == {"encoder_rounds": 3}
