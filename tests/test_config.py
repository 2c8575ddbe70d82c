import math

import pytest

from fedgraph.config import ConfigError, PPGNNConfig, parse_run_config


def test_defaults_and_flat_keys():
    cfg = parse_run_config({"budgets": "1,2,4", "num-clients": 4, "level-shares": "0.5,0.25,0.25"})
    assert isinstance(cfg, PPGNNConfig)
    assert cfg.budgets == [1.0, 2.0, 4.0] and cfg.num_clients == 4
    assert cfg.shares == [0.5, 0.25, 0.25]
    assert parse_run_config({}).shares == pytest.approx([1 / 3] * 3)
    assert parse_run_config({"epsilon": ""}).epsilon is None


@pytest.mark.parametrize("key,value,expect", [
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
])
def test_bad_values_name_the_key(key, value, expect):
    with pytest.raises(ConfigError) as err:
        parse_run_config({key: value})
    assert key in str(err.value) or key.replace("-", "_") in str(err.value)
    assert expect in str(err.value)


def test_pyproject_declares_every_key():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    from fedgraph.config import METHOD_CONFIGS

    keys = set(declared["tool"]["flwr"]["app"]["config"]) - {"strategy"}
    fields = {k.replace("_", "-") for m in METHOD_CONFIGS.values() for k in m.model_fields}
    assert keys == fields
    parse_run_config({k: v for k, v in declared["tool"]["flwr"]["app"]["config"].items()
                      if k != "strategy"})


def test_every_preset_validates():
    import tomllib
    from pathlib import Path

    from simulations.server_app import validate_run_config

    presets = sorted((Path(__file__).parents[1] / "simulations" / "presets").glob("*.toml"))
    assert len(presets) >= 8
    for path in presets:
        strategy, cfg = validate_run_config(tomllib.loads(path.read_text()))
        assert strategy.method == cfg.method, path.name
