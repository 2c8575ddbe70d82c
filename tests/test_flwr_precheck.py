"""``scripts/main.sh`` checks its ``flwr run --run-config`` before a SuperLink starts
(:mod:`fedgraph.simulations.flwr_precheck`): Flower refused an unknown key with only
"[code: 15] Invalid run configuration." and a bad value failed about 30 s later amid Flower's
exit messages (fresh user, 12-07)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from fedgraph.config import ConfigError
from fedgraph.simulations.flwr_precheck import check, main, option_values

ROOT = Path(__file__).resolve().parents[1]
FED = ["--federation-config", "num-supernodes=10 client-resources-num-cpus=1"]


def test_option_values_reads_both_spellings_in_order():
    argv = ["--stream", "-c", "a=1", "--run-config=b=2", "--run-config", "c='x y'"]
    assert option_values(argv, "--run-config", "-c") == ["a=1", "b=2", "c='x y'"]


def test_the_defaults_and_good_overrides_pass():
    check(FED)
    check([*FED, "--stream", "--run-config", "epochs=5 budgets='1,2'", "-c", "seed=3"])
    check([*FED, "--run-config", "method='gap' hops=3"])  # GAP's own key under method gap


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--run-config", "nosuch=1"], "--run-config: unknown key 'nosuch'"),
        (["--run-config", "num-client=3"], "did you mean 'num-clients'?"),
        (["--run-config", "budgets='0'"], "budgets: every epsilon must be finite and > 0"),
        (["-c", "budgets='1e-9'"], "budgets: every epsilon must be at least 1e-06"),
        (["--run-config", "hops=5"], "hops: a key of method 'gap'"),
        (["--run-config", "seed=abc def"], "--run-config:"),  # not TOML: Flower's parser's message
        (["--run-config", "num-clients=0"], None),  # 0: one per supernode, 10 here: fine
        (["--run-config", "num-clients=10"], None),
        # the ServerApp refuses it after the SuperLink and Ray started: named before
        (
            ["--run-config", "num-clients=3"],
            "num-clients: the run config has num-clients=3 but the federation has 10 supernodes",
        ),
    ],
)
def test_a_bad_run_config_is_named(args, expect):
    if expect is None:
        check([*FED, *args])
        return
    with pytest.raises(
        ConfigError, match=expect.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
    ):
        check([*FED, *args])


def test_num_clients_zero_counts_the_federations_supernodes():
    with pytest.raises(ConfigError, match="client-epsilons|num-clients|clients"):
        # 3 epsilons for 2 supernodes (Flower's default federation): refused for 2, not for 10
        check(
            [
                "--federation-config",
                "num-supernodes=2",
                "--run-config",
                "method='gap' client-epsilons='1,2,4'",
            ]
        )
    check([*FED, "--run-config", "method='gap' client-epsilons='1,2,4'"])


def test_main_returns_2_and_says_why(capsys):
    assert main([*FED, "--run-config", "nosuch=1"]) == 2
    assert "fedgraph: --run-config: unknown key 'nosuch'" in capsys.readouterr().err
    assert main(FED) == 0


def test_the_main_script_refuses_before_a_superlink_starts(tmp_path):
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39391",
        "FLWR_LOCAL_CONTROL_API_PORT": "39393",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    t0 = time.time()
    res = subprocess.run(
        ["bash", "scripts/main.sh", "--run-config", "nosuch=1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "unknown key 'nosuch'" in res.stderr
    assert "Invalid run configuration" not in res.stdout + res.stderr  # Flower never ran
    assert not (tmp_path / "flwr").exists()  # no SuperLink was started for it
    assert time.time() - t0 < 120
