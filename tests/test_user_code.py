"""Fast, complete errors for a user's code and for cluster resources (issue 30, item 6): a
user's loader, partitioner, mechanism or strategy runs (the preflight) before Ray starts, its
exception comes with its traceback, and GPUs asked of a cluster that has none are refused up
front (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedgraph.config import ConfigError
from fedgraph.simulations import cli, resources, simulate, user_code


def test_a_run_naming_user_code_starts_no_ray_before_its_preflight():
    assert user_code.user_code(
        {
            "dataset": "examples/custom_dataset/loader.py:load",
            "mechanism": "mypkg.mech:M",
            "partitioner": "louvain",
        }
    ) == ["dataset", "mechanism"]
    assert user_code.user_code({"dataset": "facebook100:Caltech36"}) == []
    assert user_code.user_code({"dataset": "synthetic-sbm:n=500"}) == []
    assert simulate._early_ray_method({"strategy": "x/strategy.py:S"}) is None
    assert simulate._early_ray_method({"method": "ppgnn"}) == "ppgnn"


def test_the_users_traceback_is_shown_without_fedgraphs_frames(tmp_path):
    from fedgraph.registry import import_object

    (tmp_path / "loader.py").write_text(
        "def helper():\n    return 1 / 0\n\ndef load(root=None):\n    return helper()\n"
    )
    load = import_object(f"{tmp_path / 'loader.py'}:load")
    try:
        try:
            load()
        except ZeroDivisionError as err:  # as fedgraph.federation.preflight wraps it
            raise ConfigError("dataset: loading failed: ZeroDivisionError") from err
    except ConfigError as err:
        text = user_code.user_traceback(err)
    assert text.startswith("Traceback (the user's code):")
    assert 'loader.py", line 5, in load' in text and "line 2, in helper" in text
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    # not fedgraph's frames: none from the package's real folders (the checkout's own folder may
    # be named fedgraph, as git names a clone, so a path's text alone proves nothing)
    import fedgraph
    import fedgraph.simulations
    import fedgraph.strategies

    ours = [
        str(Path(m.__file__).resolve().parent)
        for m in (fedgraph, fedgraph.simulations, fedgraph.strategies)
    ]
    assert "registry.py" not in text
    files = [
        str(Path(line.split('"')[1]).resolve())
        for line in text.splitlines()
        if line.lstrip().startswith('File "')
    ]
    assert sum(f.endswith("loader.py") for f in files) == 2, text  # the user's two frames
    for file in files:
        assert not any(file.startswith(d + "/") for d in ours), file
    assert user_code.user_traceback(ConfigError("budgets: must be > 0")) == ""


def test_gpus_asked_of_a_ray_cluster_without_gpus_exit_2(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(resources, "check_ray_address", lambda address: None)
    monkeypatch.setattr(resources, "cluster_gpus", lambda address: 0.0)
    with pytest.raises(
        ConfigError,
        match=r"--gpus-per-client: 1.0 asked but the Ray cluster at "
        r"RAY_ADDRESS='10.0.0.1:6379' has 0 GPU",
    ):
        resources.check_resources(None, 1.0, 1.0)
    resources.check_resources(None, 1.0, 0.0)  # CPU clients: fine
    res = CliRunner().invoke(cli.cli, ["run", "--gpus-per-client", "1"])
    assert res.exit_code == 2 and "--gpus-per-client" in res.output
    monkeypatch.setattr(resources, "cluster_gpus", lambda address: 2.0)
    resources.check_resources(None, 1.0, 1.0)
