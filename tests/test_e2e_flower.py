"""Real Flower simulations (Ray backend) through ``fedgraph run``: a success and the failures."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def fedgraph(*args, tmp_path, timeout=400, env_extra=None):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "fedgraph.simulations.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_ppgnn_cora_three_clients_well_above_majority(tmp_path):
    """Also: ``noise-source = secret`` with the secret in the environment of ``fedgraph run``
    reaches the clients' Ray workers (prestarted while the driver imports) (a client without it would fail the run), and the secret
    shows up nowhere in the output or the report."""
    out = tmp_path / "runs"
    secret = "e2e-secret-9b2f61"
    (tmp_path / "empty").mkdir()  # a root without Cora's files (a missing one is refused)
    res = fedgraph(
        "run",
        "ppgnn-cora",
        "--num-cpus",
        "2",
        "--set",
        "num-clients=3",
        "--set",
        "epochs=60",
        "--set",
        f"output-dir='{out}'",
        "--set",
        "run-name='e2e'",
        "--set",
        "noise-source='secret'",
        tmp_path=tmp_path,
        env_extra={"FEDGRAPH_DATA": str(tmp_path / "empty"), "FEDGRAPH_NOISE_SECRET": secret},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "e2e.json").read_text())
    assert report["status"] == "ok"
    assert report["privacy"]["noise_source"] == "secret"
    assert secret not in (out / "e2e.json").read_text() + res.stdout + res.stderr
    assert report["dataset"]["num_nodes"] == 2708  # bundled Cora, no data folder needed
    assert (
        report["host"]["flower_wakeups"] is True
    )  # fedgraph.simulations.wakeups in the simulation
    # the clients ran in the actors prestarted during the imports (fedgraph.simulations.early_ray),
    # which got the secret too
    assert report["host"]["prestarted_actors"] == 2
    assert report["host"]["client_state"] == "object store"  # two actors: any may serve a node
    acc = report["accuracy"]
    assert acc["test"] > report["ground_truth"]["majority_class"] + 0.3, acc
    per_level = report["privacy"]["per_subject"]
    assert [per_level[f"level-{i}"]["epsilon"] for i in (1, 2, 3)] == pytest.approx([1, 2, 4])
    # what the whole report reveals about the level (issue 13), and Cora's exact figure
    assert [per_level[f"level-{i} (level)"]["epsilon"] for i in (1, 2, 3)] == pytest.approx(
        [2.6832, 2.0078, 2.6832], abs=1e-4
    )
    assert report["levels"]["level-1"]["level_epsilon"] == pytest.approx(2.6832, abs=1e-4)
    assert all(per_level[s]["cross_check"]["agrees"] for s in per_level)
    assert "epsilon" in res.stdout and "test" in res.stdout  # the printed table


def test_gap_with_one_client_actor_keeps_the_client_state_in_its_memory(tmp_path):
    """--num-cpus 1: Flower's pool holds one actor, which keeps every client's PMA state and
    hops in its memory (fedgraph.simulations.client_state.keep_in_this_process) instead of
    Ray's object store; the classifier still reads each client's own hops."""
    out = tmp_path / "runs"
    res = fedgraph(
        "run",
        "gap-edge-cora",
        "--num-cpus",
        "1",
        "--set",
        "num-clients=3",
        "--set",
        "encoder-rounds=20",
        "--set",
        "classifier-rounds=20",
        "--set",
        f"output-dir='{out}'",
        "--set",
        "run-name='sole'",
        tmp_path=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "sole.json").read_text())
    assert report["status"] == "ok"
    assert report["host"]["prestarted_actors"] == 1
    assert report["host"]["client_state"] == "actor memory"
    assert report["accuracy"]["test"] > report["ground_truth"]["majority_class"] + 0.2, report[
        "accuracy"
    ]


def test_invalid_config_exits_2_and_names_key(tmp_path):
    res = fedgraph("run", "--set", "budgets='0,1'", tmp_path=tmp_path)
    assert res.returncode == 2
    assert "budgets" in res.stderr and "> 0" in res.stderr
    res = fedgraph(
        "run",
        "--set",
        "noise-source='secret'",
        tmp_path=tmp_path,
        env_extra={"FEDGRAPH_NOISE_SECRET": ""},
    )
    assert res.returncode == 2 and "noise-source" in res.stderr
    assert "FEDGRAPH_NOISE_SECRET" in res.stderr and "noise-secret" in res.stderr
    res = fedgraph("run", "no-such-preset", tmp_path=tmp_path)
    assert res.returncode == 2 and "known presets" in res.stderr
    missing = tmp_path / "no-such-file.toml"
    res = fedgraph("run", str(missing), tmp_path=tmp_path)
    assert res.returncode == 2 and "preset file" in res.stderr and str(missing) in res.stderr


def test_failed_run_exits_1_and_report_says_failed(tmp_path):
    """A client that fails fails the run loudly: exit 1, the cause printed once, the report
    says failed. The mechanism passes preflight's dry run (32 random users) and raises on the
    clients' real data."""
    mech = tmp_path / "flaky_mechanism.py"
    mech.write_text(
        textwrap.dedent("""
        from fedgraph.mechanisms.feature import MultiBitMechanism

        class Flaky(MultiBitMechanism):
            name = "flaky"

            def perturb(self, x, levels, generator=None):
                if x.shape[0] > 64:
                    raise RuntimeError("flaky mechanism gave up on real data")
                return super().perturb(x, levels, generator)
        """)
    )
    out = tmp_path / "runs"
    res = fedgraph(
        "run",
        "--num-cpus",
        "2",
        "--set",
        "num-clients=2",
        "--set",
        f"mechanism='{mech}:Flaky'",
        "--set",
        "epsilon=1.0",
        "--set",
        f"output-dir='{out}'",
        "--set",
        "run-name='bad'",
        "--set",
        "timeout=120.0",
        tmp_path=tmp_path,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "FAILED" in res.stderr and "flaky mechanism gave up on real data" in res.stderr
    report = json.loads((out / "bad.json").read_text())
    assert report["status"] == "failed" and "2 client(s)" in report["error"]
    assert len(report["error"]) < 500  # one line per distinct cause, not the tracebacks


@pytest.mark.parametrize(
    "args,key",
    [
        (["--set", "num-clients=5000"], "num-clients"),
        (["--set", "dataset='citeseer'", "--set", "data-root='/nonexistent'"], "data-root"),
        (["--set", "strategy='no.such:Strategy'"], "strategy"),
        (["--set", "budgets='1,2,,4'"], "budgets"),
        # a uniform epsilon above the smallest level's budget would overspend level-1 users
        (
            ["lpgnn-cora", "--set", "epsilon=2.0"],
            "epsilon: 2 is above the smallest level's budget 1",
        ),
    ],
)
def test_preflight_errors_exit_2_before_any_client_starts(tmp_path, args, key):
    res = fedgraph("run", *args, tmp_path=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert key in res.stderr and "ClientAppActor" not in res.stderr


def test_bundled_cora_loads_from_a_fab_like_copy(tmp_path):
    """`flwr run` runs a copy of the app holding only .py/.toml/.md files, which shadows the
    installed package: Cora must still load from the installed distribution, offline."""
    import shutil

    app = tmp_path / "app"
    shutil.copytree(
        ROOT / "fedgraph",
        app / "fedgraph",
        ignore=lambda d, names: [
            n for n in names if not (n.endswith(".py") or (Path(d) / n).is_dir())
        ],
    )
    assert not (
        app / "fedgraph" / "data" / "_bundled" / "planetoid" / "Cora" / "raw" / "ind.cora.x"
    ).exists()
    code = (
        "import fedgraph, sys; assert fedgraph.__file__.startswith(sys.argv[1]), fedgraph.__file__;"
        "from fedgraph.data import load_dataset; print(load_dataset('cora').num_nodes)"
    )
    env = {
        **os.environ,
        "FEDGRAPH_DATA": str(tmp_path / "empty"),
        "XDG_CACHE_HOME": str(tmp_path / "c"),
    }
    res = subprocess.run(
        [sys.executable, "-c", code, str(app)],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().endswith("2708")
