"""fedgraph.randomness: where a client's randomness comes from (issue 13, fault 1).

``os`` gives fresh noise every run, ``secret`` reproduces a release from the client's own secret
(and only from it), ``secure`` is a ChaCha20 CSPRNG whose draws follow their distributions
(mean, variance, KS tests with fixed thresholds: a draw fails with probability < 1e-6 each).
The secret never appears in what the server receives or in the report.
"""
import json
import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from scipy import stats

from fedgraph import randomness as rng
from fedgraph.config import ConfigError, parse_run_config
from fedgraph.federation import tensors

SECRET = "test-secret-7c41d2"
PPGNN = {"method": "ppgnn", "dataset": "cora", "num-clients": 2, "label-epsilon": 1.0}


@pytest.fixture(autouse=True)
def _identity(monkeypatch):
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _context(pid=1, node_config=None) -> Context:
    return Context(run_id=1, node_id=pid + 1, state=RecordDict(), run_config={},
                   node_config={"partition-id": pid, **(node_config or {})})


def _ppgnn_report(cfg, context) -> dict:
    """The PPGNN report client 1 releases, through the real handler."""
    from simulations import client_app

    msg = Message(RecordDict({"config": ConfigRecord({"json": json.dumps(cfg.model_dump())})}),
                  dst_node_id=2, message_type="query.ppgnn")
    return tensors(client_app.ppgnn_query(msg, context).content["report"])


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------ the sources
def test_config_key_is_validated():
    assert parse_run_config({}).noise_source == "os"
    with pytest.raises(ConfigError, match=r"noise-source.*'os'.*'secret'.*'secure'"):
        parse_run_config({"noise-source": "seed"})
    with pytest.raises(ConfigError, match="noise-secret: unknown key"):
        parse_run_config({"noise-secret": "x"})  # never in the run config


def test_os_noise_differs_between_runs_of_the_same_config(monkeypatch):
    monkeypatch.delenv(rng.SECRET_ENV, raising=False)
    cfg = parse_run_config(PPGNN)
    ctx = _context()
    first = _ppgnn_report(cfg, ctx)
    assert _same(first, _ppgnn_report(cfg, ctx))  # a repeated request: the same release
    assert not _same(first, _ppgnn_report(cfg, _context()))  # the next run: fresh noise


@pytest.mark.parametrize("where", ["env", "node-config"])
def test_secret_reproduces_and_only_the_secret_does(where, monkeypatch):
    cfg = parse_run_config({**PPGNN, "noise-source": "secret"})

    def context(secret):
        if where == "env":
            monkeypatch.setenv(rng.SECRET_ENV, secret)
            return _context()
        monkeypatch.setenv(rng.SECRET_ENV, "a different, ignored secret")
        return _context(node_config={rng.SECRET_NODE_KEY: secret})  # takes precedence

    a, b = _ppgnn_report(cfg, context(SECRET)), _ppgnn_report(cfg, context(SECRET))
    assert _same(a, b)
    assert not _same(a, _ppgnn_report(cfg, context(SECRET + "x")))
    # another seed (or any key that changes the release) draws other noise under one secret
    other = parse_run_config({**PPGNN, "noise-source": "secret", "seed": 1})
    assert rng.run_digest(other) != rng.run_digest(cfg)
    # keys that do not change the release do not change the noise
    assert rng.run_digest(cfg) == rng.run_digest(
        parse_run_config({**PPGNN, "noise-source": "secret", "device": "cpu", "run-name": "r"}))


def test_missing_secret_names_both_places(monkeypatch):
    monkeypatch.delenv(rng.SECRET_ENV, raising=False)
    cfg = parse_run_config({**PPGNN, "noise-source": "secret"})
    with pytest.raises(ConfigError) as err:
        rng.client_generator(cfg, _context(), 1, "ppgnn")
    msg = str(err.value)
    assert msg.startswith("noise-source:") and "'noise-secret'" in msg
    assert rng.SECRET_ENV in msg


def test_purposes_and_clients_get_independent_streams(monkeypatch):
    monkeypatch.setenv(rng.SECRET_ENV, SECRET)
    cfg = parse_run_config({**PPGNN, "noise-source": "secret"})
    draws = {(pid, p): torch.rand(8, generator=rng.client_generator(cfg, _context(pid), pid, p))
             for pid in (0, 1) for p in ("gap:pma1", "gap:pma2")}
    values = list(draws.values())
    assert all(not torch.equal(x, y) for i, x in enumerate(values) for y in values[i + 1:])


def test_torch_generator_uses_the_whole_key():
    """manual_seed keeps 32 bits (seeds s and s + 2^32 give one stream); our keys do not."""
    same = [torch.rand(4, generator=torch.Generator().manual_seed(s)) for s in (5, 5 + 2 ** 32)]
    assert torch.equal(*same)  # why manual_seed(os entropy) would not do
    key = bytes(range(32))
    g = rng.torch_generator(key)
    raw = g.get_state().numpy()
    import hashlib

    import numpy as np

    words = np.frombuffer(raw[24:24 + 624 * 8].tobytes(), dtype=np.uint64)
    want = np.frombuffer(hashlib.shake_256(key).digest(624 * 4), dtype=np.uint32)
    assert (words == want).all()  # the state layout round-trips
    a = torch.rand(1000, generator=rng.torch_generator(key))
    b = torch.rand(1000, generator=rng.torch_generator(key[:-1] + b"\x00"))
    assert torch.equal(a, torch.rand(1000, generator=rng.torch_generator(key)))
    assert not torch.equal(a, b)
    assert stats.kstest(a.numpy(), "uniform").pvalue > 1e-6


# ------------------------------------------------------------------------------ secure draws
N = 200_000


def test_secure_uniform_normal_integers_permutations():
    g = rng.SecureRandom()
    for dtype in (torch.float64, torch.float32):
        u = rng.rand(N, g, dtype)
        assert u.dtype == dtype and float(u.min()) >= 0 and float(u.max()) < 1
        assert stats.kstest(u.double().numpy(), "uniform").pvalue > 1e-6
    z = rng.randn((N // 100, 100), g, torch.float64).flatten()
    # mean: std error 1/sqrt(N) = 0.0022; variance: std error sqrt(2/N) = 0.0032 (6 s.e.)
    assert abs(float(z.mean())) < 0.014 and abs(float(z.var()) - 1) < 0.02
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-6
    k = rng.randint(3, 10, (N,), g)
    assert k.dtype == torch.long and int(k.min()) == 3 and int(k.max()) == 9
    counts = torch.bincount(k - 3, minlength=7).numpy()
    assert stats.chisquare(counts).pvalue > 1e-6
    perms = torch.stack([rng.randperm(3, g) for _ in range(6000)])
    codes = (perms * torch.tensor([9, 3, 1])).sum(1)
    assert stats.chisquare(torch.unique(codes, return_counts=True)[1].numpy()).pvalue > 1e-6
    assert len(torch.unique(codes)) == 6
    assert not torch.equal(rng.rand(16, rng.SecureRandom()), rng.rand(16, rng.SecureRandom()))
    key = bytes(32)  # a given key: one stream
    assert torch.equal(rng.rand(8, rng.SecureRandom(key)), rng.rand(8, rng.SecureRandom(key)))


def test_secure_mechanisms_keep_their_distributions():
    """Laplace and Gaussian mechanisms, randomized response and PrivGNN's Poisson sampling
    fed by a SecureRandom: the noise has the mechanism's law."""
    from fedgraph.mechanisms.additive import gaussian, laplace
    from fedgraph.mechanisms.randomized_response import randomized_response
    from fedgraph.methods.privgnn import laplace_noise, poisson_subsample

    g = rng.SecureRandom()
    x = torch.zeros(N // 10, 10)
    lap = laplace(x, 10.0, g)  # per row epsilon 10 over 10 features in [-1, 1]: scale 2
    assert stats.kstest(lap.flatten().double().numpy(), "laplace", args=(0, 2.0)).pvalue > 1e-6
    noise = laplace_noise((N,), 0.5, g)
    assert stats.kstest(noise.double().numpy(), "laplace", args=(0, 0.5)).pvalue > 1e-6
    gau = gaussian(x, 1.0, 1e-5, g).flatten().double()
    assert stats.kstest((gau / gau.std()).numpy(), "norm").pvalue > 1e-6
    keep = poisson_subsample(N, 0.3, g).double().mean()
    assert abs(float(keep) - 0.3) < 6 * math.sqrt(0.3 * 0.7 / N)
    y = torch.zeros(N, dtype=torch.long)
    rr = randomized_response(y, 4, 1.0, g)
    p_keep = math.e / (math.e + 3)
    assert abs(float((rr == 0).double().mean()) - p_keep) < 6 * math.sqrt(p_keep / N)


def test_secure_dp_sgd_noise_has_std_sigma_c():
    """DP-SGD under ``secure``: Opacus's optimizer with our CSPRNG noise, std = z * C."""
    p = torch.nn.Parameter(torch.zeros(N))
    opt = rng.dp_optimizer(torch.optim.SGD([p], lr=1.0), noise_multiplier=1.5,
                           max_grad_norm=2.0, expected_batch_size=10,
                           generator=rng.SecureRandom(), device=torch.device("cpu"))
    p.summed_grad = torch.zeros(N)
    opt.add_noise()
    assert abs(float(p.grad.std()) - 3.0) < 3.0 * 6 * math.sqrt(0.5 / N)
    assert stats.kstest((p.grad / 3.0).double().numpy(), "norm").pvalue > 1e-6


@pytest.mark.parametrize("method", ["ppgnn", "gap-node"])
def test_secure_source_runs_every_client_path(method, monkeypatch, tmp_path):
    """A whole run on the LocalGrid with ``noise-source = secure`` (GAP node level: degree
    sampling, DP-SGD and its Poisson sampling, PMA noise) finishes and reports the source."""
    from simulations.local import run_local

    cfg = {"ppgnn": {**PPGNN, "epochs": 5},
           "gap-node": {"method": "gap", "dataset": "cora", "num-clients": 2, "level": "node",
                        "hops": 1, "encoder-rounds": 1, "classifier-rounds": 1,
                        "local-epochs": 1, "encoder-dim": 8, "hidden": 8,
                        "client-epsilons": "8",
                        # calibration by RDP: seconds, not a minute (prv's node-level
                        # calibration is not what this test is about)
                        "accountant": "rdp"}}[method]
    report = run_local({**cfg, "noise-source": "secure", "output-dir": str(tmp_path),
                        "run-name": method})
    assert report["status"] == "ok" and report["privacy"]["noise_source"] == "secure"
    assert "ChaCha20" in report["privacy"]["noise_source_detail"]


# ------------------------------------------------------------------------------ no leak
def _bytes_of(message) -> bytes:
    out = []
    if message.has_error():
        return str(message.error).encode()
    for record in message.content.values():
        if isinstance(record, ArrayRecord):
            out += [arr.data for arr in record.values()]
        else:
            out += [repr(v).encode() for v in record.values()]
    return b"".join(out)


def test_secret_appears_nowhere_the_server_or_a_reader_looks(monkeypatch, tmp_path):
    from fedgraph.federation import preflight
    from simulations.local import LocalGrid
    from simulations.server_app import validate_run_config

    monkeypatch.setenv(rng.SECRET_ENV, SECRET)
    strategy_cls, cfg = validate_run_config({**PPGNN, "noise-source": "secret", "epochs": 5,
                                             "output-dir": str(tmp_path), "run-name": "s"})
    preflight(cfg)
    grid = LocalGrid(cfg.num_clients, record=True)
    report = strategy_cls(cfg).start(grid)
    assert report["status"] == "ok" and report["privacy"]["noise_source"] == "secret"
    seen = [m for pair in grid.log for m in pair]  # every request and reply: the server's view
    assert len(seen) >= 2 * 2 * cfg.num_clients  # query and evaluate, both ways
    secret = SECRET.encode()
    assert all(secret not in _bytes_of(m) for m in seen)
    assert secret not in (tmp_path / "s.json").read_bytes()
    assert SECRET not in json.dumps(report)
    assert SECRET not in repr(rng.SecureRandom(secret.ljust(32, b"0")[:32]))
