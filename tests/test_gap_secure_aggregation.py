"""Federated GAP with secure aggregation (``secure-aggregation = true``): every client adds a
share sigma_max / sqrt(n - 1) of the noise to its remote rows; the summed row that the server
and the owner see has std sigma_max, at least every client's own sigma."""

import math

import numpy as np
import pytest
import torch

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods.gap.client_pma import pma_partial_sums
from fedgraph.methods.gap.privacy import check_remote_sigma, remote_noise, secure_remote_sigma
from fedgraph.nn.gap import normalize_rows


def test_share_is_sigma_max_over_sqrt_n_minus_1():
    assert secure_remote_sigma([1.0, 3.0, 2.0], 10) == pytest.approx(3.0 / 3.0)
    assert secure_remote_sigma([2.0], 1) == 2.0  # one client: no remote rows
    assert secure_remote_sigma([0.0, 0.0], 2) == 0.0  # nobody adds noise (epsilon inf)
    with pytest.raises(ValueError):
        secure_remote_sigma([], 3)


def test_the_summed_row_is_at_least_as_noisy_as_every_clients_plan():
    """n - 1 clients with zero signal release a node's row; the sum's std is sigma_max."""
    sigmas, n = [0.7, 1.9, 1.2, 0.4, 1.9, 1.0], 6
    share = secure_remote_sigma(sigmas, n)
    rows, dim = 4000, 16
    total = torch.zeros(rows, dim)
    for c in range(n - 1):
        h = torch.zeros(1, dim)  # no edge to these nodes: pure noise
        _, _, remote = pma_partial_sums(
            h,
            torch.zeros(2, 0, dtype=torch.long),
            torch.zeros(2, 0, dtype=torch.long),
            sigmas[c],
            torch.Generator().manual_seed(c),
            remote_ids=torch.arange(rows),
            remote_sigma=share,
        )
        total += remote
    # std of 64,000 draws: relative standard error ~0.3 %; 2 % is > 6 standard errors
    assert float(total.std()) == pytest.approx(max(sigmas), rel=0.02)
    assert float(total.std()) >= max(sigmas) * 0.98


def test_remote_and_local_rows_get_their_own_noise():
    g = torch.Generator().manual_seed(0)
    n, e = 3000, 16
    h = normalize_rows(torch.randn(n, e, generator=g))
    empty = torch.zeros(2, 0, dtype=torch.long)
    local, ids, remote = pma_partial_sums(
        h,
        empty,
        empty,
        2.0,
        torch.Generator().manual_seed(1),
        remote_ids=torch.arange(10_000, 13_000),
        remote_sigma=0.5,
    )
    assert float(local.std()) == pytest.approx(2.0, rel=0.03)  # own nodes: own sigma
    assert float(remote.std()) == pytest.approx(0.5, rel=0.03)  # remote rows: the share
    # remote_sigma None (no secure aggregation) draws exactly what it drew before
    a = pma_partial_sums(
        h,
        empty,
        empty,
        2.0,
        torch.Generator().manual_seed(1),
        remote_ids=torch.arange(10_000, 13_000),
    )
    b = pma_partial_sums(
        h,
        empty,
        empty,
        2.0,
        torch.Generator().manual_seed(1),
        remote_ids=torch.arange(10_000, 13_000),
        remote_sigma=2.0,
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_client_refuses_a_share_below_its_own_sigma():
    check_remote_sigma(1.0 / math.sqrt(4), 1.0, 4)  # 4 contributors: exactly enough
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(0.49, 1.0, 4)
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(float("nan"), 1.0, 4)
    check_remote_sigma(2.0, 1.0, 1)  # sigma_max on remote rows (undirected edges)
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(0.9, 1.0, 1)


def _gap(**kw):
    return parse_run_config({"method": "gap", "num-clients": 5, **kw})


def test_remote_noise_per_mode():
    sigmas = [1.0, 2.0, 4.0, 1.0, 1.0]
    assert remote_noise(_gap(**{"edge-unit": "directed"}), sigmas) is None  # each own sigma
    assert remote_noise(_gap(**{"edge-unit": "undirected"}), [1.5] * 5) is None  # equal sigmas
    assert remote_noise(_gap(**{"edge-unit": "undirected"}), sigmas) == (4.0, 1)
    assert remote_noise(_gap(**{"secure-aggregation": True}), sigmas) == (2.0, 4)
    assert remote_noise(_gap(**{"cross-client-edges": False}), sigmas) is None
    assert remote_noise(_gap(**{"secure-aggregation": True, "num-clients": 1}), [2.0]) is None


def test_undirected_cross_client_edge_keeps_every_clients_guarantee():
    """An undirected edge {u, v} across clients c (sigma_c) and i (sigma_i) is released in c's
    row for v and i's row for u. Each client calibrated for two halves at its own sigma
    (effective noise multiplier sigma / sqrt 2 at sensitivity 1 per half). With remote_noise's
    sigma_max on both halves, the pair's effective noise, 1 / sqrt(sum 1 / s^2), is at least
    both clients' planned sigma / sqrt 2; with each client's own sigma it is not."""
    sigmas = [1.0, 3.0]

    def effective(halves):
        return 1 / math.sqrt(sum(1 / s**2 for s in halves))

    own = effective(sigmas)  # default before the fix: c's half at 1.0, i's half at 3.0
    assert own < sigmas[1] / math.sqrt(2)  # the client with sigma 3 gets less than it planned
    std, _ = remote_noise(_gap(**{"edge-unit": "undirected", "num-clients": 2}), sigmas)
    assert all(effective([std, std]) >= s / math.sqrt(2) - 1e-12 for s in sigmas)


def test_secure_aggregation_without_remote_rows_is_a_config_error():
    assert parse_run_config({"method": "gap", "secure-aggregation": True}).secure_aggregation
    for extra in ({"cross-client-edges": False}, {"variant": "mlp"}):
        with pytest.raises(ConfigError, match="secure-aggregation: has no effect"):
            parse_run_config({"method": "gap", "secure-aggregation": True, **extra})


# ------------------------------- a whole run, played by a curious server (real client handlers)
CORA = {
    "method": "gap",
    "dataset": "cora",
    "min-class-size": 1,
    "num-clients": 3,
    "partitioner": "louvain",
    "encoder-rounds": 1,
    "classifier-rounds": 2,
    "local-epochs": 2,
    "client-epsilons": "4",
    "secure-aggregation": True,
}


class _CuriousServer:
    """A :class:`fedgraph.simulations.local.LocalGrid` seen by the server: every PMA request it sends
    and reply it receives, keyed ``(node, hop, graph)``, one message at a time; and, for the
    test only, the plaintext rows each client computed (``pma_partial_sums`` spied on), which
    the server must not be able to read. ``drop``: the key of a reply that gets lost;
    ``strip_keys``: the server leaves out the public keys (asks for unmasked rows)."""

    def __init__(self, num_clients, monkeypatch, drop=None, strip_keys=False):
        import fedgraph.methods.gap.client as gf
        from fedgraph.simulations.local import LocalGrid

        self.grid, self.drop, self.strip_keys = LocalGrid(num_clients), drop, strip_keys
        self.sent, self.received, self.plain, self.other = {}, {}, {}, []
        real = gf.pma_partial_sums

        def spy(*args, **kwargs):
            out = real(*args, **kwargs)
            self.plain[self.current] = (out[1].clone(), out[2].clone())
            return out

        monkeypatch.setattr(gf, "pma_partial_sums", spy)

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for m in messages:
            key = None
            if m.metadata.message_type == "query.gap_pma":
                pma = m.content["pma"]
                key = self.current = (m.metadata.dst_node_id, int(pma["hop"]), str(pma["graph"]))
                self.sent[key] = m.content
                if self.strip_keys:
                    del m.content["secagg"]
            reply = self.grid.send_and_receive([m], timeout=timeout)
            if key is not None and key == self.drop:
                continue
            if key is not None:
                self.received[key] = reply[0].content
            else:
                self.other.append((m.content, reply[0].content))
            replies += reply
        return replies


def _secure_run(tmp_path, monkeypatch, drop=None, strip_keys=False):
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(
        {**CORA, "output-dir": str(tmp_path), "run-name": "secure"}
    )
    grid = _CuriousServer(cfg.num_clients, monkeypatch, drop, strip_keys)
    return cfg, grid, strategy_cls(cfg).start(grid)


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        yield _secure_run(tmp_path_factory.mktemp("secure"), mp)
    finally:
        mp.undo()


def _uniform_high_bits(words) -> float:
    from scipy import stats

    counts = np.bincount((words.ravel() >> np.uint64(56)).astype(np.int64), minlength=256)
    return stats.chisquare(counts).pvalue


def test_a_curious_server_cannot_read_a_clients_rows(secure_run):
    """Everything the server receives from a client in PMA, against the rows the client
    computed: no array is those rows, and the masked rows are uniform on Z / 2^64 and
    uncorrelated with them. (Before: the reply carried the rows in the clear, ``sums``.)"""
    from fedgraph.messaging import tensors

    cfg, grid, report = secure_run
    assert report["status"] == "ok"
    checked = 0
    for key, reply in grid.received.items():
        if key[1] > cfg.hops:  # the finishing message releases nothing
            continue
        ids, rows = grid.plain[key]
        arrays = tensors(reply["partial_sums"])
        for name, a in arrays.items():
            if a.shape == rows.shape:
                assert not torch.allclose(a.double(), rows.double(), atol=1e-2), (
                    f"the server reads client {key[0]}'s rows in the clear ({name!r})"
                )
        assert set(arrays) == {"ids", "masked"} and arrays["masked"].dtype == torch.int64
        assert torch.equal(arrays["ids"], ids)  # the ids are public (every node held elsewhere)
        from fedgraph.secure_aggregation import dequantize

        masked = arrays["masked"].numpy().view(np.uint64)
        assert _uniform_high_bits(masked) > 1e-6
        corr = np.corrcoef(dequantize(masked).ravel(), rows.double().numpy().ravel())[0, 1]
        assert abs(corr) < 0.05
        checked += 1
    assert checked == cfg.num_clients * cfg.hops


def test_the_sums_the_owners_get_are_the_plaintext_sums(secure_run):
    """What the server routes at hop k + 1 (one row per node, to its owner) is the sum of the
    other clients' plaintext rows at hop k, up to the quantization bound and float32."""
    from fedgraph.messaging import tensors
    from fedgraph.secure_aggregation import quantization_error_bound

    cfg, grid, _ = secure_run
    n = cfg.num_clients
    for k in range(1, cfg.hops + 1):
        exact = {}
        for (_node, hop, _graph), (ids, rows) in grid.plain.items():
            if hop == k:
                for i, r in zip(ids.tolist(), rows.double()):
                    exact[i] = exact.get(i, 0) + r
        routed = 0
        for (_node, hop, _graph), content in grid.sent.items():
            if hop != k + 1:
                continue
            inc = tensors(content["incoming"])
            assert inc["ids"].unique().numel() == inc["ids"].numel()  # one row per node
            want = torch.stack([exact[i] for i in inc["ids"].tolist()])
            tol = quantization_error_bound(n - 1) + 1e-6 * want.abs().clamp_min(1)
            assert bool(((inc["sums"].double() - want).abs() <= tol).all())
            routed += inc["ids"].numel()
        assert routed == len(exact)  # every node's sum reaches its owner


def test_the_server_holds_only_public_keys(secure_run):
    """The key exchange: each client keeps its X25519 private key; no message the server sends
    or receives carries one; each PMA request carries all public keys and the client's index."""
    cfg, grid, report = secure_run
    private = [bytes(c.state["gap.secagg"]["private-key"]) for c in grid.contexts.values()]
    assert len(set(private)) == cfg.num_clients and all(len(p) == 32 for p in private)

    def blobs(content):
        for rec in content.config_records.values():
            for v in rec.values():
                yield from (v if isinstance(v, list) else [v])

    every = (
        [c for pair in grid.other for c in pair]
        + list(grid.sent.values())
        + list(grid.received.values())
    )
    seen = {b for c in every for b in blobs(c) if isinstance(b, bytes)}
    assert not seen & set(private)
    from fedgraph.identity import client_identity  # nor any client's identity key

    assert not seen & {
        client_identity({}, i, cfg.num_clients).private_key for i in range(cfg.num_clients)
    }
    public = {bytes(rep["secagg"]["public-key"]) for _, rep in grid.other if "secagg" in rep}
    assert len(public) == cfg.num_clients
    for (_node, _, _), content in grid.sent.items():
        assert set(content["secagg"]["public-keys"]) == public
    note = report["privacy"]["aggregation"]
    for phrase in (
        "X25519",
        "only masked rows",
        "provisioned outside the server",
        "no collusion",
        "no dropout tolerance",
    ):
        assert phrase in note
    assert "secure aggregation: key exchange (clients)" in report["timings_s"]


def test_a_dropped_client_fails_the_round_and_says_why(tmp_path, monkeypatch):
    """Client 3's reply at hop 2 is lost: the masks of its pairs would stay in the sums; the
    run fails, the error names the missing reply and the lack of dropout recovery."""
    import json

    from fedgraph.errors import ClientFailure

    with pytest.raises(ClientFailure, match="no reply.*no dropout recovery"):
        _secure_run(tmp_path, monkeypatch, drop=(3, 2, "all"))
    assert json.loads((tmp_path / "secure.json").read_text())["status"] == "failed"


def test_a_client_refuses_to_send_unmasked_rows(tmp_path, monkeypatch):
    """A server that leaves out the public keys gets no row: each client added only a share
    of the noise, so its row in the clear would be under-noised. (In process the client's
    error propagates; through Flower it is an error reply, a ClientFailure.)"""
    from fedgraph.errors import ClientFailure

    with pytest.raises((ClientFailure, ValueError), match="refusing to release unmasked rows"):
        _secure_run(tmp_path, monkeypatch, strip_keys=True)
