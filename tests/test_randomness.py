"""fedgraph.randomness: where a client's randomness comes from (issue 13, fault 1; issue 28,
fault 4: the default is a CSPRNG).

``secure`` (the default) gives fresh noise every run, ``secret`` reproduces a release from the
client's own secret (and only from it), both from an AES-256-CTR CSPRNG whose draws follow their
distributions (mean, variance, KS tests with fixed thresholds: a draw fails with probability
< 1e-6 each); ``mt19937`` (PyTorch's generator) only when asked for, ``os`` (the old MT19937
default) refused. The secret never appears in what the server receives or in the report.
"""

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from scipy import stats

from fedgraph import randomness as rng
from fedgraph.config import ConfigError, parse_run_config
from fedgraph.messaging import tensors

SECRET = "test-secret-7c41d2"
PPGNN = {"method": "ppgnn", "dataset": "cora", "num-clients": 2, "label-epsilon": 0.5}


@pytest.fixture(autouse=True)
def _identity(monkeypatch):
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _context(pid=1, node_config=None) -> Context:
    return Context(
        run_id=1,
        node_id=pid + 1,
        state=RecordDict(),
        run_config={},
        node_config={"partition-id": pid, **(node_config or {})},
    )


def _ppgnn_report(cfg, context) -> dict:
    """The PPGNN report client 1 releases, through the real handler."""
    from fedgraph.simulations import client_app

    msg = Message(
        RecordDict({"config": ConfigRecord({"json": json.dumps(cfg.model_dump())})}),
        dst_node_id=2,
        message_type="query.ppgnn",
    )
    context.run_config = context.run_config or cfg.model_dump()  # the client's own config
    return tensors(client_app.ppgnn_query(msg, context).content["report"])


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------ the sources
def test_config_key_is_validated():
    assert parse_run_config({}).noise_source == "secure"  # a CSPRNG by default
    assert rng.NOISE_SOURCES[0] == "secure"
    with pytest.raises(ConfigError, match=r"noise-source.*'secure'.*'secret'.*'mt19937'"):
        parse_run_config({"noise-source": "seed"})
    # the old default (MT19937) is refused, saying what changed and what to use
    with pytest.raises(ConfigError) as err:
        parse_run_config({"noise-source": "os"})
    msg = str(err.value)
    assert "noise-source: 'os' is no longer accepted" in msg and "MT19937" in msg
    assert all(f"'{s}'" in msg for s in rng.NOISE_SOURCES)
    # also where a config bypassed validation
    with pytest.raises(ConfigError, match="no longer accepted"):
        rng.client_generator(
            parse_run_config({}).model_copy(update={"noise_source": "os"}), _context(), 1, "ppgnn"
        )
    with pytest.raises(ConfigError, match="noise-secret: unknown key"):
        parse_run_config({"noise-secret": "x"})  # never in the run config


@pytest.mark.parametrize("source", ["default", "mt19937"])
def test_fresh_noise_differs_between_runs_of_the_same_config(source, monkeypatch):
    monkeypatch.delenv(rng.SECRET_ENV, raising=False)
    cfg = parse_run_config(PPGNN if source == "default" else {**PPGNN, "noise-source": source})
    ctx = _context()
    first = _ppgnn_report(cfg, ctx)
    assert _same(first, _ppgnn_report(cfg, ctx))  # a repeated request: the same release
    assert not _same(first, _ppgnn_report(cfg, _context()))  # the next run: fresh noise


@pytest.mark.parametrize("secret", ["x", "fifteen-chars-x"])
def test_a_short_secret_is_refused(secret, monkeypatch):
    """A secret a server could search for is refused, naming both places and the length."""
    monkeypatch.setenv(rng.SECRET_ENV, secret)
    with pytest.raises(ConfigError, match=f"has {len(secret)} characters; use at least 16"):
        rng.check_secret({})
    monkeypatch.setenv(rng.SECRET_ENV, secret + "-" * (16 - len(secret)))
    assert rng.check_secret({}) == (secret + "-" * (16 - len(secret))).encode()


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
        parse_run_config({**PPGNN, "noise-source": "secret", "device": "cpu", "run-name": "r"})
    )


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
    draws = {
        (pid, p): rng.rand(8, rng.client_generator(cfg, _context(pid), pid, p))
        for pid in (0, 1)
        for p in ("gap:pma1", "gap:pma2")
    }
    values = list(draws.values())
    assert all(not torch.equal(x, y) for i, x in enumerate(values) for y in values[i + 1 :])


def test_torch_generator_uses_the_whole_key():
    """manual_seed keeps 32 bits (seeds s and s + 2^32 give one stream); our keys do not."""
    same = [torch.rand(4, generator=torch.Generator().manual_seed(s)) for s in (5, 5 + 2**32)]
    assert torch.equal(*same)  # why manual_seed(os entropy) would not do
    key = bytes(range(32))
    g = rng.torch_generator(key)
    raw = g.get_state().numpy()
    import hashlib

    import numpy as np

    words = np.frombuffer(raw[24 : 24 + 624 * 8].tobytes(), dtype=np.uint64)
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
    opt = rng.dp_optimizer(
        torch.optim.SGD([p], lr=1.0),
        noise_multiplier=1.5,
        max_grad_norm=2.0,
        expected_batch_size=10,
        generator=rng.SecureRandom(),
        device=torch.device("cpu"),
    )
    p.summed_grad = torch.zeros(N)
    opt.add_noise()
    assert abs(float(p.grad.std()) - 3.0) < 3.0 * 6 * math.sqrt(0.5 / N)
    assert stats.kstest((p.grad / 3.0).double().numpy(), "norm").pvalue > 1e-6


def test_client_generators_and_their_report_lines(monkeypatch):
    """``secure`` and ``secret`` draw from the CSPRNG, ``mt19937`` from PyTorch's generator,
    whose report line says plainly what it does not protect against."""
    monkeypatch.setenv(rng.SECRET_ENV, SECRET)
    kinds = {
        s: type(
            rng.client_generator(
                parse_run_config({**PPGNN, "noise-source": s}), _context(), 1, "ppgnn"
            )
        )
        for s in rng.NOISE_SOURCES
    }
    assert kinds == {
        "secure": rng.SecureRandom,
        "secret": rng.SecureRandom,
        "mt19937": torch.Generator,
    }
    assert (
        type(rng.client_generator(parse_run_config(PPGNN), _context(), 1, "ppgnn"))
        is rng.SecureRandom
    )  # the default
    mt = rng.describe("mt19937")
    assert "NOT A CSPRNG" in mt and "opt-in" in mt and "624 consecutive outputs" in mt
    assert "removes the noise" in mt
    assert all("AES-256-CTR CSPRNG" in rng.describe(s) for s in rng.CSPRNG_SOURCES)


def test_secure_stream_is_one_stream_per_key_whatever_the_calls():
    key = bytes(range(32))
    n = 3 * rng.CHUNK + 17  # across keystream chunks
    whole = rng.SecureRandom(key).words(n)
    g = rng.SecureRandom(key)
    parts = np.concatenate(
        [g.words(k) for k in (5, rng.CHUNK - 5, rng.CHUNK + 3, n - 2 * rng.CHUNK - 3)]
    )
    assert (whole == parts).all()
    assert not (rng.SecureRandom(key[:-1] + b"\x01").words(64) == whole[:64]).any()
    g._used = rng._MAX_STREAM_BYTES - 8  # past 2^48 AES blocks: refused
    with pytest.raises(RuntimeError, match="2\\^48 AES blocks"):
        g.words(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_gaussians(dtype):
    """One key, one draw; another key, independent draws; N(0, 1) (moments, KS), the two
    outputs of every Box-Muller pair independent (``z[:m]`` and ``z[m:]`` of a chunk share
    their radius: their squares would correlate if the transform were wrong)."""
    key = bytes(range(32))
    shape = (N // 16, 16)
    z = rng.randn(shape, rng.SecureRandom(key), dtype)
    assert z.dtype == dtype and z.shape == shape
    assert torch.equal(z, rng.randn(shape, rng.SecureRandom(key), dtype))
    z = z.flatten().double()
    assert abs(float(z.mean())) < 6 / math.sqrt(N)
    assert abs(float(z.var()) - 1) < 6 * math.sqrt(2 / N)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-6
    other = rng.randn(shape, rng.SecureRandom(key[:-1] + b"\x01"), dtype).flatten().double()
    assert abs(float(torch.corrcoef(torch.stack([z, other]))[0, 1])) < 6 / math.sqrt(N)
    m = rng.CHUNK // 2
    a, b = z[:m], z[m : 2 * m]  # cosines and sines of the first chunk's pairs
    assert abs(float(torch.corrcoef(torch.stack([a * a, b * b]))[0, 1])) < 6 / math.sqrt(m)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 6 / math.sqrt(m)
    # the tail: Box-Muller on 52-bit uniforms is bounded by sqrt(2 * 52 ln 2) = 8.49 (x2 for
    # the sum of four, float64)
    assert float(z.abs().max()) <= math.sqrt(2 * 52 * math.log(2)) * (
        2 if dtype == torch.float64 else 1
    )


def test_secure_uniforms_integers_permutations_exactly():
    g = rng.SecureRandom()
    for dtype, bits in ((torch.float64, 53), (torch.float32, 24)):
        u = rng.rand(N, g, dtype).double() * 2.0**bits  # on the grid k 2^-bits of [0, 1)
        assert bool((u == u.floor()).all()) and float(u.min()) >= 0 and float(u.max()) < 2**bits
    # a span that does not divide 2^64: reduction modulo would favour the low residues
    # (3/8, 3/8, 2/8 for these thirds); rejection keeps them 1/3 each
    span = 3 * 2**61
    k = rng.randint(-5, span - 5, (N,), g) + 5
    assert int(k.min()) >= 0 and int(k.max()) < span
    counts = torch.bincount(torch.div(k, 2**61, rounding_mode="floor"), minlength=3).numpy()
    assert len(counts) == 3 and stats.chisquare(counts).pvalue > 1e-6
    n = 100_003
    assert torch.equal(torch.sort(rng.randperm(n, g)).values, torch.arange(n))


def test_add_gaussian_adds_in_float64_and_rounds_once():
    """The defence against floating-point attacks on float32 releases (module docs): the
    release is ``fl32(x + sigma * z)`` computed in float64. A float32 addition of float32 noise
    (PyTorch's ``x + sigma * torch.randn(...)``) reveals the low bits of ``x``: where the sum
    cancels below the noise's binade, ``y - x`` is exactly the noise, a multiple of its ulp."""
    key = bytes(range(32))
    x = torch.full((N,), 0.75)
    sigma = 1.0
    y = rng.add_gaussian(x, sigma, rng.SecureRandom(key))
    assert y.dtype == torch.float32
    z = rng.randn(N, rng.SecureRandom(key), torch.float32)  # the same draws, rounded first
    ref = torch.empty(N, dtype=torch.float64)
    for s, chunk in rng._gaussian_chunks(rng.SecureRandom(key), N, False):
        ref[s : s + chunk.numel()] = chunk
    assert torch.equal(y, (x.double() + sigma * ref).float())  # rounded once
    assert torch.equal(z, ref.float())

    def on_noise_grid(out):
        # outputs in [1/16, 1/8) came from noise in [-0.6875, -0.625]: its ulp is 2^-24
        sel = (out.abs() < 0.125) & (out.abs() >= 0.0625)
        d = (out[sel].double() - 0.75) * 2.0**24
        return int(sel.sum()), float((d == d.round()).double().mean())

    count, frac = on_noise_grid(x + sigma * z)  # float32 noise added in float32
    assert count > 1000 and frac == 1.0  # every such output reveals x modulo 2^-24
    count, frac = on_noise_grid(y)
    assert count > 1000 and frac < 0.25  # about 1/8: y - x is not on the noise's grid
    # per-row sigma (PPGNN's Gaussian mechanism), float64 (the sum of four) and the torch path
    rows = torch.zeros(N // 10, 10)
    per_row = torch.linspace(1, 2, N // 10)[:, None]
    out = rng.add_gaussian(rows, per_row, rng.SecureRandom(), torch.float64)
    assert stats.kstest((out / per_row).flatten().double().numpy(), "norm").pvalue > 1e-6
    out64 = rng.add_gaussian(rows.double(), 3.0, rng.SecureRandom())
    assert out64.dtype == torch.float64
    assert stats.kstest((out64 / 3.0).flatten().numpy(), "norm").pvalue > 1e-6
    g = torch.Generator().manual_seed(4)
    want = rows + 2.0 * torch.randn(rows.shape, generator=torch.Generator().manual_seed(4))
    assert torch.equal(rng.add_gaussian(rows, 2.0, g), want)  # as before


@pytest.mark.parametrize("method", ["ppgnn", "gap-node"])
def test_secure_source_runs_every_client_path(method, monkeypatch, tmp_path):
    """A whole run on the LocalGrid with ``noise-source = secure`` (GAP node level: degree
    sampling, DP-SGD and its Poisson sampling, PMA noise) finishes and reports the source."""
    from fedgraph.simulations.local import run_local

    cfg = {
        "ppgnn": {**PPGNN, "epochs": 5},
        "gap-node": {
            "method": "gap",
            "dataset": "cora",
            "num-clients": 2,
            "level": "node",
            "hops": 1,
            "encoder-rounds": 1,
            "classifier-rounds": 1,
            "local-epochs": 1,
            "encoder-dim": 8,
            "hidden": 8,
            "client-epsilons": "8",
            # calibration by RDP: seconds, not a minute (prv's node-level
            # calibration is not what this test is about)
            "accountant": "rdp",
        },
    }[method]
    report = run_local(
        {**cfg, "noise-source": "secure", "output-dir": str(tmp_path), "run-name": method}
    )
    assert report["status"] == "ok" and report["privacy"]["noise_source"] == "secure"
    assert "AES-256-CTR CSPRNG" in report["privacy"]["noise_source_detail"]


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
    from fedgraph.simulations.local import LocalGrid
    from fedgraph.simulations.server_app import validate_run_config

    monkeypatch.setenv(rng.SECRET_ENV, SECRET)
    strategy_cls, cfg = validate_run_config(
        {
            **PPGNN,
            "noise-source": "secret",
            "epochs": 5,
            "output-dir": str(tmp_path),
            "run-name": "s",
        }
    )
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
