"""Authenticated secure aggregation (issue 60, fault 4) and the client's own count of
contributors (fault 3, its secure-aggregation half).

Fault 4: a client took the X25519 public keys the server relayed on trust; a server that
substituted its own could unmask the client's rows (noise share 1.53 against the plan's 2.16).
Now each client signs its fresh public key under an Ed25519 identity key provisioned outside the
server (``fedgraph.identity``), and every client verifies every peer's signature against its own
directory before it masks (``fedgraph.secure_aggregation.verify_key_list``): a list it cannot
verify is refused by every client of every method (GAP, ProGAP, PrivGNN's ensemble), and no
row, masked or not, is released.

Fault 3: a PMA request with ``remote-sigma = sigma / 1000`` and ``remote-contributors = 10**6``
without secure aggregation was accepted. Now the client counts the contributors itself (its
verified peers under secure aggregation, else 1) and only cross-checks the server's figure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgraph import identity as idn
from fedgraph import secure_aggregation as sa
from fedgraph.config import parse_run_config

ROOT = Path(__file__).resolve().parents[1]
SECRET = "authenticated-secagg-test-secret-7c2e"
RUN = 7


@pytest.fixture(autouse=True)
def _provisioned(monkeypatch):
    monkeypatch.setenv(idn.IDENTITY_ENV, SECRET)


# ------------------------------------------------------------------ a key exchange, in plain data
def _exchange(n: int, method: str = "gap", run_id: int = RUN):
    """``n`` clients' key exchange as the clients make it: ``(private keys, identities, relayed
    record without index)``."""
    privs, pubs, sigs, idents = [], [], [], []
    for i in range(n):
        ident = idn.client_identity({}, i, n)
        sk, pk = sa.generate_key_pair()
        privs.append(sk)
        pubs.append(pk)
        sigs.append(ident.sign(idn.key_statement(run_id, method, i, pk, idn.key_label(method))))
        idents.append(ident)
    return privs, idents, {"public-keys": pubs, "partition-ids": list(range(n)), "signatures": sigs}


def _verify(record, i, privs, idents, n=None, method="gap", run_id=RUN):
    return sa.verify_key_list(
        {**record, "index": i},
        privs[i],
        idents[i],
        run_id=run_id,
        method=method,
        required=len(privs) if n is None else n,
    )


def test_a_signed_list_is_accepted_and_the_masks_still_cancel():
    n = 4
    privs, idents, record = _exchange(n)
    keys = [_verify(record, i, privs, idents) for i in range(n)]
    assert all(
        k.index == i and k.public_keys == tuple(record["public-keys"]) for i, k in enumerate(keys)
    )
    assert keys[0].contributors(owned=True) == n - 1 and keys[0].contributors(owned=False) == n
    owner = np.arange(12) % n
    rows = np.random.default_rng(0).normal(size=(n, 12, 3))
    contrib = {}
    for c in range(n):
        ids = np.flatnonzero(owner != c)
        contrib[c] = (
            ids,
            sa.mask_rows(rows[c][ids], ids, owner, c, privs[c], list(keys[c].public_keys), "ctx"),
        )
    ids, sums = sa.unmask_sum(contrib, owner, n)
    want = np.stack([rows[[c for c in range(n) if c != owner[w]], w].sum(0) for w in ids])
    assert np.abs(sums - want).max() <= sa.quantization_error_bound(n - 1)


def _substitute(record, which, resign=True):
    """The server's attack: its own X25519 key pairs at indices ``which`` (it knows their
    private keys, so it could unmask); ``resign``: signed under an Ed25519 key of its own."""
    server_id = Ed25519PrivateKey.generate()
    out = {k: list(v) for k, v in record.items()}
    for j in which:
        _, pk = sa.generate_key_pair()
        out["public-keys"][j] = pk
        if resign:
            out["signatures"][j] = server_id.sign(
                idn.key_statement(RUN, "gap", out["partition-ids"][j], pk, idn.key_label("gap"))
            )
    return out


@pytest.mark.parametrize("which", [[1], [0, 1, 2]], ids=["one", "all"])
@pytest.mark.parametrize("resign", [True, False])
def test_every_client_refuses_substituted_keys(which, resign):
    privs, idents, record = _exchange(3)
    bad = _substitute(record, which, resign)
    for i in range(3):
        with pytest.raises(ValueError, match="cannot be verified.*refusing to release"):
            _verify(bad, i, privs, idents)


def test_every_malformed_list_is_refused():
    n = 3
    privs, idents, rec = _exchange(n)

    def variant(**change):
        return {**{k: list(v) for k, v in rec.items()}, **change}

    pks, _pids, sigs = rec["public-keys"], rec["partition-ids"], rec["signatures"]
    cases = {
        # a partition's signed key claimed for another partition (keys and ids shuffled apart)
        "wrong partition": (variant(**{"partition-ids": [0, 2, 1]}), 0, "signature"),
        # client 0's own signed entry again at index 1: one identity, two indices
        "own identity twice": (
            variant(
                **{
                    "public-keys": [pks[0], pks[0], pks[2]],
                    "partition-ids": [0, 0, 2],
                    "signatures": [sigs[0], sigs[0], sigs[2]],
                }
            ),
            2,
            "partition id appears twice",
        ),
        "duplicated key": (variant(**{"public-keys": [pks[0], pks[1], pks[1]]}), 0, "distinct"),
        "too few keys": ({k: v[:2] for k, v in rec.items()}, 0, "the protocol needs"),
        "bad signature": (variant(signatures=[sigs[0], bytes(64), sigs[2]]), 0, "signature"),
        "signature of another key": (
            variant(signatures=[sigs[0], sigs[2], sigs[1]]),
            0,
            "signature",
        ),
        "not my key at my index": (
            variant(
                **{
                    "public-keys": [pks[1], pks[0], pks[2]],
                    "signatures": [sigs[1], sigs[0], sigs[2]],
                }
            ),
            0,
            "own key",
        ),
        "partition outside directory": (
            variant(**{"partition-ids": [0, 1, 9]}),
            0,
            "not in this client's directory",
        ),
        "lengths differ": (variant(signatures=sigs[:2]), 0, "2 signatures"),
        "no signatures": ({k: v for k, v in rec.items() if k != "signatures"}, 0, "missing"),
    }
    for name, (record, i, why) in cases.items():
        with pytest.raises(ValueError, match="refusing to release") as err:
            _verify(record, i, privs, idents)
        assert why in str(err.value), (name, str(err.value))
    with pytest.raises(ValueError, match="no key exchange"):
        sa.verify_key_list(
            {**rec, "index": 0}, None, idents[0], run_id=RUN, method="gap", required=n
        )


def test_a_key_signed_for_another_run_or_method_is_refused():
    privs, idents, rec = _exchange(3, method="gap", run_id=RUN)
    with pytest.raises(ValueError, match="signature"):
        _verify(rec, 0, privs, idents, run_id=RUN + 1)
    with pytest.raises(ValueError, match="signature"):
        _verify(rec, 0, privs, idents, method="progap")


# ------------------------------------------------------------------ provisioning
def test_identity_from_the_simulation_secret_and_from_node_config(tmp_path, monkeypatch):
    a, b = idn.client_identity({}, 1, 3), idn.client_identity(None, 1, 3)
    assert a.private_key == b.private_key and set(a.directory) == {0, 1, 2}
    assert a.directory[1] == a.public_key != a.directory[0]
    monkeypatch.setenv(idn.IDENTITY_ENV, SECRET + "-other")
    assert idn.client_identity({}, 1, 3).public_key != a.public_key  # the secret decides
    # a deployment: the key (PEM file, or hex seed) and the directory, from the node config
    keys = [Ed25519PrivateKey.generate() for _ in range(3)]
    pem = tmp_path / "id.pem"
    pem.write_bytes(
        keys[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    directory = tmp_path / "directory.json"
    directory.write_text(
        json.dumps({str(i): k.public_key().public_bytes_raw().hex() for i, k in enumerate(keys)})
    )
    monkeypatch.delenv(idn.IDENTITY_ENV)
    nc = {"partition-id": 1, "identity-key": str(pem), "identity-directory": str(directory)}
    ident = idn.client_identity(nc, 1, 3)
    assert ident.public_key == keys[1].public_key().public_bytes_raw()
    seed = {**nc, "identity-key": keys[1].private_bytes_raw().hex()}
    assert idn.client_identity(seed, 1, 3).public_key == ident.public_key
    with pytest.raises(idn.IdentityError, match="own public key"):
        idn.client_identity(nc, 0, 3)  # the key file is client 1's
    with pytest.raises(idn.IdentityError, match="only one of"):
        idn.client_identity({"identity-key": str(pem)}, 1, 3)
    with pytest.raises(idn.IdentityError, match=idn.IDENTITY_ENV):
        idn.client_identity({}, 0, 3)  # nothing provisioned


def test_the_launcher_creates_the_secret_once():
    env = {}
    first = idn.ensure_simulation_secret(env)
    assert len(first) == 64 and env[idn.IDENTITY_ENV] == first
    assert idn.ensure_simulation_secret(env) == first  # kept, not replaced
    assert idn.ensure_simulation_secret({}) != first  # os.urandom


def test_the_server_code_never_reads_the_provisioning():
    """No module of the server (``strategies/``) names the provisioning secret, the identity
    module or the client's identity: the server only relays the signed keys."""
    names = (
        "FEDGRAPH_IDENTITY_SECRET",
        "IDENTITY_ENV",
        "fedgraph.identity",
        "client_identity",
        "derive_identity_key",
        "identity-key",
        "identity-directory",
    )
    files = sorted((ROOT / "strategies").rglob("*.py"))
    assert files
    for f in files:
        text = f.read_text()
        assert not [n for n in names if n in text], f"{f.name} reads the clients' provisioning"


# ------------------------------------------------------------------ whole runs, hostile server
SBM = "synthetic-sbm:300:6"
RUNS = {
    "gap": (
        {
            "method": "gap",
            "dataset": SBM,
            "num-clients": 3,
            "encoder-rounds": 1,
            "classifier-rounds": 1,
            "local-epochs": 1,
            "hops": 1,
            "client-epsilons": "4",
            "schedule": "fedavg",
            "secure-aggregation": True,
        },
        "query.gap_pma",
    ),
    "progap": (
        {
            "method": "progap",
            "dataset": SBM,
            "num-clients": 3,
            "depth": 1,
            "epochs": 1,
            "hidden": 8,
            "client-epsilons": "4",
            "device": "cpu",
            "secure-aggregation": True,
        },
        "query.progap_aggregate",
    ),
    "privgnn-ensemble": (
        {
            "method": "privgnn",
            "dataset": SBM,
            "num-clients": 3,
            "num-queries": 4,
            "delta": 1e-4,
            "num-neighbours": 20,
            "teacher-epochs": 2,
            "teacher-hidden": 8,
            "teacher-batch-size": 8,
            "projection-dim": 16,
            "epochs": 5,
            "hidden": 8,
            "neighbourhood-size": 10,
            "answer-mode": "ensemble",
            "num-teachers": 4,
            "sigma-votes": 3.0,
            "secure-aggregation": True,
        },
        "query.privgnn",
    ),
}
RELEASES = ("partial_sums", "answers")


def _hostile_run(method, tmp_path, which):
    """A run whose server substitutes its own X25519 keys at indices ``which`` of every key
    list it relays (``None``: an honest run). Every client's handler is called; a refusal
    becomes an error reply (as through Flower). Returns ``(report or exception, grid)``."""
    from flwr.app import Error, Message

    from fedgraph.simulations.local import LocalGrid
    from fedgraph.simulations.server_app import validate_run_config

    class Substituting(LocalGrid):
        refusals, answered = {}, []

        def _answer(self, m):
            if which is not None and "secagg" in m.content and "public-keys" in m.content["secagg"]:
                rec = m.content["secagg"]
                pks = list(rec["public-keys"])
                for j in which:
                    pks[j] = sa.generate_key_pair()[1]  # the server's own key pair
                rec["public-keys"] = pks
            try:
                reply = self.client_app(m, self.contexts[m.metadata.dst_node_id])
            except Exception as err:  # noqa: BLE001 - the client's refusal
                self.refusals[m.metadata.dst_node_id] = err
                reply = Message(Error(code=1, reason=f"{type(err).__name__}: {err}"), reply_to=m)
            self.answered.append((m, reply))
            return reply

    run_config = {**RUNS[method][0], "output-dir": str(tmp_path), "run-name": method}
    strategy_cls, cfg = validate_run_config(run_config)
    grid = Substituting(cfg.num_clients)
    if hasattr(grid, "provision"):  # each client's own run config (its budget), if required
        grid.provision(run_config)
    grid.refusals, grid.answered = {}, []
    try:
        out = strategy_cls(cfg).start(grid)
    except Exception as err:  # noqa: BLE001 - the run fails: what matters is what left
        out = err
    return out, grid


def _released(grid, message_type):
    """The releases the clients sent in answer to ``message_type``."""
    return [
        r
        for m, r in grid.answered
        if m.metadata.message_type == message_type
        and r.has_content()
        and any(k in r.content for k in RELEASES)
    ]


@pytest.mark.parametrize("which", [[1], [0, 1, 2]], ids=["one-key", "all-keys"])
@pytest.mark.parametrize("method", list(RUNS))
def test_a_server_that_substitutes_keys_is_refused_by_every_client(method, which, tmp_path):
    out, grid = _hostile_run(method, tmp_path, which)
    assert isinstance(out, Exception), "the run went through with substituted keys"
    message_type = RUNS[method][1]
    assert sorted(grid.refusals) == sorted(grid.contexts), (
        f"clients {sorted(set(grid.contexts) - set(grid.refusals))} accepted the keys"
    )
    for err in grid.refusals.values():
        assert isinstance(err, ValueError) and "cannot be verified" in str(err)
    assert _released(grid, message_type) == []  # no row left, masked or unmasked


@pytest.mark.parametrize("method", list(RUNS))
def test_an_honest_server_relays_signed_keys_and_the_run_completes(method, tmp_path):
    out, grid = _hostile_run(method, tmp_path, None)
    assert not isinstance(out, Exception), out
    assert out["status"] == "ok" and grid.refusals == {}
    assert _released(grid, RUNS[method][1])
    for m, r in grid.answered:
        if m.metadata.message_type.endswith("_keys"):
            rec = r.content["secagg"]
            pid = int(rec["partition-id"])
            assert pid == int(grid.contexts[m.metadata.dst_node_id].node_config["partition-id"])
            assert len(bytes(rec["signature"])) == 64


# ------------------------------------------------------------------ fault 3: the client's count
def _gap_client(num_clients: int, secure: bool):
    from fedgraph.data import partition
    from fedgraph.data.synthetic import sbm_graph
    from fedgraph.federation import ClientView

    cfg = parse_run_config(
        {
            "method": "gap",
            "num-clients": num_clients,
            "hops": 1,
            "encoder-dim": 4,
            "partitioner": "random",
            "client-epsilons": "4",
            "secure-aggregation": secure,
        }
    )
    data = sbm_graph(120, 6.0, num_classes=3, num_features=8, seed=0)
    data.train_mask = torch.rand(120, generator=torch.Generator().manual_seed(0)) < 0.5
    data.val_mask = data.test_mask = ~data.train_mask
    client = partition(data, num_clients, "random", 0)[0]
    stats = {"name": "sbm", "num_nodes": 120, "num_features": 8, "num_classes": 3}
    return cfg, ClientView(client, (0.0, 1.0), stats, num_clients, None)


def _gen(purpose):
    return torch.Generator().manual_seed(len(purpose))


def test_a_lowered_remote_sigma_is_refused_without_secure_aggregation():
    """Fault 3's request: remote-sigma = sigma / 1000, remote-contributors = 10**6, no secure
    aggregation. The client counts 1 contributor (the server reads its row alone)."""
    from fedgraph.methods.gap.client import PMARequest, client_plan, pma_hop

    cfg, view = _gap_client(2, secure=False)
    sigma = client_plan(cfg, 0, view).sigma
    assert sigma > 0
    for remote, claimed, why in (
        (sigma / 1000, 10**6, "says 1000000"),
        (sigma / 1000, None, "below this client's sigma"),
        (sigma / 1000, 1, "below this client's sigma"),
        (sigma, 10**6, "this client counts 1"),
    ):
        with pytest.raises(ValueError, match="refusing to release") as err:
            pma_hop(
                cfg,
                0,
                view,
                PMARequest(1, remote_sigma=remote, remote_contributors=claimed),
                None,
                _gen,
            )
        assert why in str(err.value)
    _, out = pma_hop(
        cfg, 0, view, PMARequest(1, remote_sigma=sigma, remote_contributors=1), None, _gen
    )  # the honest request (sigma_max on remote rows) goes through
    assert out["sums"].shape[0] > 0


def test_with_secure_aggregation_the_share_assumes_only_verified_contributors():
    """Three clients with verified keys: the share sigma / sqrt(2) over the 2 contributors of
    a remote row is accepted (masked); a lower share, or a claimed count other than 2, is
    refused; without keys the share is refused too (unmasked)."""
    from fedgraph.methods.gap.client import PMARequest, client_plan, pma_hop

    cfg, view = _gap_client(3, secure=True)
    privs, idents, rec = _exchange(3)
    keys = sa.verify_key_list(
        {**rec, "index": 0}, privs[0], idents[0], run_id=RUN, method="gap", required=3
    )
    owner = torch.zeros(120, dtype=torch.long)
    owner[view.graph.node_ids] = 0
    others = torch.ones(120, dtype=torch.bool)
    others[view.graph.node_ids] = False
    owner[others] = 1 + (torch.arange(int(others.sum())) % 2)
    secagg = (privs[0], keys, owner, "ctx")
    sigma = client_plan(cfg, 0, view).sigma
    share = sigma / math.sqrt(2)
    _, out = pma_hop(
        cfg,
        0,
        view,
        PMARequest(1, remote_sigma=share, remote_contributors=2, secagg=secagg),
        None,
        _gen,
    )
    assert set(out) == {"ids", "masked"}
    for remote, claimed in ((share * 0.99, 2), (share, 3), (share, 10**6), (sigma / 1000, 10**6)):
        with pytest.raises(ValueError, match="refusing to release"):
            pma_hop(
                cfg,
                0,
                view,
                PMARequest(1, remote_sigma=remote, remote_contributors=claimed, secagg=secagg),
                None,
                _gen,
            )
    with pytest.raises(ValueError, match="refusing to release unmasked rows"):
        pma_hop(cfg, 0, view, PMARequest(1, remote_sigma=share, remote_contributors=2), None, _gen)


def test_progap_refuses_a_lowered_remote_sigma_too():
    from fedgraph.federation import client_view
    from fedgraph.methods.progap.client import build_model, client_plan, release, stage_model

    cfg = parse_run_config(
        {
            "method": "progap",
            "dataset": SBM,
            "num-clients": 2,
            "depth": 1,
            "hidden": 8,
            "client-epsilons": "4",
            "device": "cpu",
        }
    )
    view = client_view(cfg, 0)
    torch.manual_seed(0)
    weights = build_model(cfg, view.schema["num_features"], view.schema["num_classes"]).state_dict()
    model, x = stage_model(cfg, view, 0, weights, [])
    sigma = client_plan(cfg, 0, view).sigma
    for remote, claimed in ((sigma / 1000, 10**6), (sigma, 10**6), (sigma / 1000, None)):
        with pytest.raises(ValueError, match="refusing to release"):
            release(
                cfg,
                0,
                view,
                model,
                x,
                remote_sigma=remote,
                contributors=claimed,
                secagg=None,
                generator=_gen,
            )
    _, out = release(
        cfg, 0, view, model, x, remote_sigma=sigma, contributors=1, secagg=None, generator=_gen
    )
    assert out["sums"].shape[0] > 0
