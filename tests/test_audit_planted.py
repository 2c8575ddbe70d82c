"""The auditor catches planted bugs (issue 63): each fault is a patched copy of the code under
test, the audit runs the clients' real handlers (:mod:`fedgraph.simulations.auditor`), and
the audited lower bound must rise above the epsilon the ledger charges; the honest code's
bound stays below it. Small Cora runs, a few seconds each."""

from __future__ import annotations

import json

import pytest

from fedgraph.simulations.auditor import audit_run

#: one PMA hop at epsilon 2 (delta 1e-4), directed edges (sensitivity 1): a one-hop Gaussian
#: whose bound the audit can reach with 20000 trials once its noise is halved
GAP = {
    "method": "gap",
    "dataset": "cora",
    "num-clients": 2,
    "partitioner": "random",
    "client-epsilons": "2",
    "hops": 1,
    "delta": 1e-4,
    "edge-unit": "directed",
    "encoder-rounds": 1,
    "classifier-rounds": 1,
}
TRIALS = 20000


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _client0(out):
    return out["subjects"]["client-0"]


def test_the_honest_gap_release_is_below_its_claim(one_thread, tmp_path):
    out = audit_run(
        {**GAP, "output-dir": str(tmp_path)}, TRIALS // 2, subjects=["client-0"], seed=1
    )
    s = _client0(out)
    assert not out["above"] and s["epsilon_lower_bound"] <= s["epsilon"], s
    # the audit has power: fresh OS noise each run, so the bound varies (0.30 seen once in a
    # full-suite run, above 0.5 in earlier ones); 0 would mean the audit lost its power
    assert s["epsilon_lower_bound"] > 0.1 * s["epsilon"], s
    assert "0 repeats answered" in s["canary"], s["canary"]  # the repeat was refused


def test_halved_noise_is_caught(one_thread, monkeypatch, tmp_path):
    """The GAP client's PMA noise at half its plan's sigma (the ledger still charges the
    plan's)."""
    from fedgraph.methods.gap import client as gap

    real = gap.pma_partial_sums

    def halved(h_prev, local, boundary, sigma, generator, **kw):
        if kw.get("remote_sigma") is not None:
            kw["remote_sigma"] /= 2
        return real(h_prev, local, boundary, sigma / 2, generator, **kw)

    monkeypatch.setattr(gap, "pma_partial_sums", halved)
    out = audit_run({**GAP, "output-dir": str(tmp_path)}, TRIALS, subjects=["client-0"], seed=2)
    s = _client0(out)
    assert out["above"] == ["client-0"], s
    assert s["epsilon_lower_bound"] > s["epsilon"]


def test_a_release_repeated_under_one_purpose_is_caught(one_thread, monkeypatch, tmp_path):
    """A client without the refusal: every request under a spent purpose is answered with
    fresh noise (its transcript moved on) and charged once per purpose."""
    from fedgraph.client_authority import ClientAuthority

    monkeypatch.setattr(ClientAuthority, "admit", lambda self, purpose, request: "new")
    out = audit_run(
        {**GAP, "output-dir": str(tmp_path)}, TRIALS // 4, subjects=["client-0"], seed=3, repeats=8
    )
    s = _client0(out)
    assert "0 refused" in s["canary"], s["canary"]
    assert out["above"] == ["client-0"], s


def test_the_cli_exits_3_on_a_planted_bug(one_thread, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from fedgraph.methods.gap import client as gap
    from fedgraph.simulations.cli import cli

    real = gap.pma_partial_sums
    monkeypatch.setattr(
        gap,
        "pma_partial_sums",
        lambda h, lo, bo, sigma, g, **kw: real(
            h, lo, bo, sigma / 2, g, **{**kw, "remote_sigma": None}
        ),
    )
    sets = [a for k, v in GAP.items() if k != "method" for a in ("--set", f"{k}={v}")]
    toml = tmp_path / "gap-planted.toml"
    toml.write_text('method = "gap"\n')
    res = CliRunner().invoke(
        cli,
        [
            "audit",
            str(toml),
            *sets,
            "--set",
            f"output-dir={tmp_path}",
            "--trials",
            str(TRIALS),
            "--subject",
            "client-0",
            "--seed",
            "4",
        ],
    )
    assert res.exit_code == 3, res.output
    assert "ABOVE" in res.output
    written = json.loads((tmp_path / "gap-planted-audit.audit.json").read_text())
    row = written["subjects"]["client-0"]
    assert row["confidence"] == 0.95 and row["epsilon_lower_bound"] > row["epsilon"]
    assert {"epsilon", "trials", "canary", "test"} <= set(row)


def test_a_shipped_preset_is_below_its_claim(one_thread, tmp_path):
    """gap-edge-cora (10 clients, epsilon 4, K = 2, delta 1e-7) with few trials: client 0's
    first PMA hop, both halves of undirected canary edges."""
    from fedgraph.simulations.run_files import load_run_config

    cfg = load_run_config("gap-edge-cora", [f"output-dir={tmp_path}"])
    out = audit_run(cfg, 2000, subjects=["client-0"], seed=5)
    s = _client0(out)
    assert not out["above"] and 0 <= s["epsilon_lower_bound"] <= s["epsilon"], s
    assert "both halves" in s["canary"] and s["release"] == "pma (hop 1)"


def _float32_laplace_class():
    """The Laplace mechanism of cea4199 as a user's plug-in: float64 noise rounded to float32,
    times a float32 scale, added in float32 (issue 60, fault 5)."""
    import torch

    from fedgraph import randomness as rng
    from fedgraph.mechanisms import FeatureMechanism

    class Laplace32(FeatureMechanism):
        name = "audit-laplace32"

        def __init__(self, epsilon: float = 1.0, **_):
            self.epsilon = float(epsilon)

        def perturb(self, x, levels, generator=None):
            n, d = x.shape
            scale = torch.full((n, 1), 2.0 * d / self.epsilon, dtype=torch.float64).to(x.dtype)
            u = rng.rand(x.shape, generator, torch.float64) - 0.5
            noise = -torch.sign(u) * torch.log1p(-2.0 * u.abs())
            return {"x": x + scale * noise.to(x.dtype)}

        def estimate(self, report, num_features):
            return report["x"].float(), None

        def privacy_spent(self, level):
            return {self.name: self.epsilon}

    return Laplace32


def float32_lattice_score(mech, report, num_features):
    """Mironov's floating-point attack: per user, how many coordinates are reachable from the
    upper corner less how many from the lower (a float32 output y is reachable from x0 iff
    some float32 p = fl32(s z) with z float32 gives fl32(x0 + p) = y)"""
    import numpy as np

    y = report["x"].numpy().astype(np.float32)
    s = np.float32(2.0 * num_features / mech.epsilon)
    inf = np.float32(np.inf)

    def reachable(x0):
        x0 = np.float32(x0)
        p0 = (y - x0).astype(np.float32)
        cands, up, down = [p0], p0, p0
        for _ in range(2):
            up, down = np.nextafter(up, inf), np.nextafter(down, -inf)
            cands += [up, down]
        ok = np.zeros(y.shape, dtype=bool)
        for p in cands:
            z = (p / s).astype(np.float32)
            image = np.zeros(y.shape, dtype=bool)
            for zc in (np.nextafter(z, -inf), z, np.nextafter(z, inf)):
                image |= (s * zc).astype(np.float32) == p
            ok |= image & ((x0 + p).astype(np.float32) == y)
        return ok

    return reachable(1.0).sum(1).astype(float) - reachable(-1.0).sum(1).astype(float)


def test_the_old_float32_laplace_plug_in_is_caught(one_thread, monkeypatch, tmp_path):
    """A user's mechanism registered through fedgraph's extension point
    (``FEATURE_MECHANISMS``, docs/extending.md) with the float32 Laplace of cea4199: every
    report is reachable from one corner only in ~12 % of coordinates, which Mironov's test
    reads; the default score (the estimate's sum) is left to the honest runs."""
    from fedgraph.mechanisms import FEATURE_MECHANISMS

    cls = _float32_laplace_class()
    monkeypatch.setitem(FEATURE_MECHANISMS, cls.name, cls)
    config = {
        "method": "ppgnn",
        "dataset": "cora",
        "num-clients": 2,
        "partitioner": "users",
        "budgets": "1",
        "mechanism": cls.name,
        "epsilon": 1.0,
        "output-dir": str(tmp_path),
    }
    out = audit_run(config, 300, seed=6, score=float32_lattice_score)
    ((name, s),) = out["subjects"].items()
    assert out["above"] == [name], s
    assert s["epsilon_lower_bound"] > s["epsilon"] == 1.0
    # the shipped Laplace (float64 sum, rounded once) gives the same attack nothing
    out = audit_run({**config, "mechanism": "laplace"}, 300, seed=7, score=float32_lattice_score)
    ((name, s),) = out["subjects"].items()
    assert not out["above"] and s["epsilon_lower_bound"] < 0.5, s
