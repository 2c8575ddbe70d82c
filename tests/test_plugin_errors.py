"""A user's plug-in that misbehaves is refused with the key named (found by a fresh user's
session of 2026-12-06): a mechanism whose estimate is NaN (the run used to end ``ok`` at chance
accuracy), and a plug-in file that does not parse (it was ``FAILED`` with exit 1, the key
unnamed, where ``docs/extending.md`` promises a config error), and a partitioner that raises,
lacks ``**options`` or returns a bad assignment (``FAILED``, exit 1, the key unnamed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedgraph.data import PartitionerError, partition
from fedgraph.mechanisms.feature import check_mechanism
from fedgraph.registry import ContractError, import_object
from fedgraph.simulations.user_code import user_traceback

ROOT = Path(__file__).parents[1]

MECHANISM = textwrap.dedent("""
    import math
    import torch
    from fedgraph import randomness as rng
    from fedgraph.mechanisms import FeatureMechanism

    class SampledSign(FeatureMechanism):
        name = "sampled-sign"

        def __init__(self, budgets, epsilon=None, **_):
            self.epsilon = float(epsilon if epsilon is not None else min(budgets))

        def perturb(self, x, levels, generator=None):
            n, d = x.shape
            col = rng.randint(0, d, (n,), generator)
            p = (1 + x[torch.arange(n), col] * math.tanh(self.epsilon / 2)) / 2
            return {"col": col,
                    "sign": torch.where(rng.rand(n, generator) < p, 1, -1).to(torch.int8)}

        def estimate(self, report, num_features):
            n = report["col"].numel()
            x_hat = torch.zeros(n, num_features)
            x_hat[torch.arange(n), report["col"]] = (
                num_features * report["sign"].float() / math.tanh(self.epsilon / 2))
            return x_hat, None

        def privacy_spent(self, level):
            return {"sampled-sign": self.epsilon}

    class NaNOnlyBig(SampledSign):  # passes a 32-user dry run, NaN on the real clients
        def estimate(self, report, num_features):
            x, level = super().estimate(report, num_features)
            return (x * float("nan") if x.size(0) > 64 else x), level
""")


def _nan_everywhere(module_globals):
    class NaNEstimate(module_globals["SampledSign"]):
        def estimate(self, report, num_features):
            x, level = super().estimate(report, num_features)
            return torch.full_like(x, float("nan")), level

    return NaNEstimate


def test_check_mechanism_refuses_a_non_finite_estimate():
    space: dict = {}
    exec(MECHANISM, space)
    with pytest.raises(ContractError, match="non-finite x_hat"):
        check_mechanism(_nan_everywhere(space)(budgets=[1.0]), num_features=8)
    check_mechanism(space["SampledSign"](budgets=[1.0]), num_features=8)  # the sound one passes


def _torch_rand(module_globals):
    class TorchRand(module_globals["SampledSign"]):  # torch's draws: a torch.Generator only
        def perturb(self, x, levels, generator=None):
            col = torch.randint(0, x.size(1), (x.size(0),), generator=generator)
            return {"col": col, "sign": torch.ones(x.size(0), dtype=torch.int8)}

    return TorchRand


def _secure_only(module_globals):
    class SecureOnly(module_globals["SampledSign"]):  # SecureRandom's own method
        def perturb(self, x, levels, generator=None):
            report = super().perturb(x, levels, generator)
            report["noise"] = generator.gaussians(x.size(0))
            return report

    return SecureOnly


def test_check_mechanism_dry_runs_with_every_kind_of_client_generator():
    """Found by a fresh user: ``torch.rand(..., generator=generator)`` passed the dry run (a
    torch.Generator) and failed on every client (the default noise source's SecureRandom)."""
    space: dict = {}
    exec(MECHANISM, space)
    with pytest.raises(
        ContractError,
        match=r"mechanism 'sampled-sign': perturb raised "
        r"TypeError with a fedgraph.randomness.SecureRandom "
        r"\(noise-source \"secure\".*fedgraph.randomness's "
        r"rand/randn/randint.*: randint\(\) received an "
        r"invalid combination of arguments[^\n]*$",
    ) as err:
        check_mechanism(_torch_rand(space)(budgets=[1.0]), num_features=8)
    assert isinstance(err.value.__cause__, TypeError)
    with pytest.raises(
        ContractError,
        match=r"perturb raised AttributeError with a "
        r"torch.Generator \(noise-source \"mt19937\"\)",
    ):
        check_mechanism(_secure_only(space)(budgets=[1.0]), num_features=8)


def test_the_preflight_names_the_mechanism_and_keeps_its_traceback(tmp_path):
    from fedgraph.config import ConfigError, parse_run_config
    from fedgraph.federation import preflight

    (tmp_path / "mech.py").write_text(
        MECHANISM
        + textwrap.dedent("""
        class TorchRand(SampledSign):
            def perturb(self, x, levels, generator=None):
                n = x.size(0)
                return {"col": rng.randint(0, x.size(1), (n,), generator),
                        "sign": (torch.rand(n, generator=generator) < 0.5).to(torch.int8)}
    """)
    )
    cfg = parse_run_config(
        {
            "method": "ppgnn",
            "mechanism": f"{tmp_path / 'mech.py'}:TorchRand",
            "output-dir": str(tmp_path / "o"),
        }
    )
    with pytest.raises(
        ConfigError,
        match="^mechanism: mechanism 'sampled-sign': perturb "
        "raised TypeError with a fedgraph.randomness",
    ) as err:
        preflight(cfg)
    assert 'mech.py", line ' in user_traceback(err.value), user_traceback(err.value)


def test_a_mechanism_nan_only_on_the_clients_fails_the_run_naming_the_mechanism(tmp_path):
    (tmp_path / "nan_mech.py").write_text(MECHANISM)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedgraph.simulations.cli",
            "run",
            "--set",
            f"mechanism={tmp_path / 'nan_mech.py'}:NaNOnlyBig",
            "--set",
            "num-clients=2",
            "--set",
            "epochs=2",
            "--set",
            "epsilon=1.0",
            "--set",
            f"output-dir='{tmp_path / 'o'}'",
            "--set",
            "run-name='nan'",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "mechanism: NaNOnlyBig.estimate returned a non-finite x_hat" in out, out[-3000:]


@pytest.mark.parametrize("kind", ["dataset", "mechanism", "strategy"])
def test_a_plugin_file_that_does_not_parse_is_a_config_error_naming_the_key(tmp_path, kind):
    bad = tmp_path / "syntax_err.py"
    bad.write_text("def load(:\n    pass\n")
    with pytest.raises(
        ValueError,
        match=rf"^{kind}: cannot import '.*syntax_err.py:load': "
        r"SyntaxError",
    ):
        import_object(f"{bad}:load", kind)


PARTITIONERS = textwrap.dedent("""
    import torch

    def raises(data, num_clients, seed, **options):
        raise RuntimeError("my partitioner exploded")

    def no_options(data, num_clients, seed):
        return torch.arange(data.num_nodes) % num_clients

    def short(data, num_clients, seed, **options):
        return torch.zeros(data.num_nodes - 3, dtype=torch.long)
""")


def _graph():
    from torch_geometric.data import Data

    return Data(
        x=torch.rand(6, 2),
        y=torch.tensor([0, 1] * 3),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
    )


def test_a_partitioner_that_raises_is_named_with_its_traceback(tmp_path):
    (tmp_path / "split.py").write_text(PARTITIONERS)
    with pytest.raises(
        PartitionerError,
        match=r"partitioner '.*split.py:raises' raised "
        r"RuntimeError: my partitioner exploded",
    ) as err:
        partition(_graph(), 2, f"{tmp_path / 'split.py'}:raises", seed=0)
    trace = user_traceback(err.value)
    assert 'split.py", line 5, in raises' in trace and "RuntimeError" in trace, trace


def test_a_partitioner_without_options_is_told_the_signature(tmp_path):
    (tmp_path / "split.py").write_text(PARTITIONERS)
    with pytest.raises(
        PartitionerError,
        match=r"must accept fn\(data, num_clients, seed, "
        r"\*\*options\) \(options passed: alpha, "
        r"users_per_client",
    ) as err:
        partition(_graph(), 2, f"{tmp_path / 'split.py'}:no_options", seed=0)
    assert user_traceback(err.value) == ""  # not inspect's frames: the message says it all


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "raises",
            r"partitioner: partitioner '.*split.py:raises' raised RuntimeError: my "
            r"partitioner exploded\nTraceback \(the user's code\):\n.*line 5, in raises",
        ),
        (
            "short",
            r"partitioner: partitioner '.*split.py:short' returned an invalid assignment: "
            r"2705 client ids for 2708 nodes \(smallest 0\)",
        ),
    ],
)
def test_a_bad_partitioner_is_a_config_error_before_the_run(tmp_path, name, message):
    """``fedgraph run``: exit 2 from the preflight, the key named (was ``FAILED``, exit 1)."""
    import re

    (tmp_path / "split.py").write_text(PARTITIONERS)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedgraph.simulations.cli",
            "run",
            "gap-edge-cora",
            "--set",
            f"partitioner={tmp_path / 'split.py'}:{name}",
            "--set",
            f"output-dir='{tmp_path / 'o'}'",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert re.search(message, res.stderr, re.S), res.stderr[-3000:]
