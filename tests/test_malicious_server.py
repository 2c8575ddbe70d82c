"""The malicious server (issue 60): a server that deviates from the protocol within the
message schema (repeats, crafted weights and rows, a run config asking for more privacy loss,
requests out of order, downgraded noise parameters) never makes a client release more than its
own budget, and no release leaves a client unledgered.

Each method runs honestly on :class:`~fedgraph.simulations.local.LocalGrid` (every request and
reply logged); the hostile server then sends protocol-shaped variants of every logged request
to the same clients, whose state holds the honest run's releases. Every client's own ledger
(:class:`fedgraph.client_authority.ClientAuthority`) must be the same after the attacks as
before: nothing new was released, whatever was answered.
"""

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedgraph.client_authority import ClientAuthority, ReleaseRefused, check_asks_no_more
from fedgraph.config import parse_run_config
from fedgraph.protocol import MESSAGES
from fedgraph.simulations.local import LocalGrid, run_local
from fedgraph.simulations.routes.common import AUTHORITY_STATE

GAP = {
    "method": "gap",
    "dataset": "cora",
    "num-clients": 3,
    "encoder-rounds": 1,
    "classifier-rounds": 2,
    "local-epochs": 1,
    "schedule": "fedavg",
    "hops": 2,
    "client-epsilons": "4,2,1",
    "delta": 1e-5,
    "partitioner": "louvain",
    "secure-aggregation": True,
    "accountant": "rdp",
}
GAP_NODE = {
    "method": "gap",
    "dataset": "cora",
    "num-clients": 2,
    "encoder-rounds": 1,
    "classifier-rounds": 1,
    "local-epochs": 1,
    "schedule": "fedavg",
    "hops": 1,
    "client-epsilons": "8",
    "delta": 1e-5,
    "level": "node",
    "max-degree": 5,
    "batch-size": 256,
    "accountant": "rdp",
    "inference": "inductive",
}
GAP_FEDSGD = {**GAP, "secure-aggregation": False, "schedule": "fedsgd", "client-epsilons": "4,4,2"}
PROGAP = {
    "method": "progap",
    "dataset": "cora",
    "num-clients": 3,
    "depth": 1,
    "epochs": 2,
    "hidden": 8,
    "client-epsilons": "4,2,8",
    "delta": 1e-5,
    "accountant": "rdp",
    "secure-aggregation": True,
}
PPGNN = {"method": "ppgnn", "dataset": "cora", "num-clients": 2, "epochs": 5}
PRIVGNN = {
    "method": "privgnn",
    "dataset": "cora",
    "num-clients": 2,
    "num-queries": 6,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 20,
    "teacher-epochs": 3,
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
}
RUNS = {
    "gap": GAP,
    "gap-node": GAP_NODE,
    "gap-fedsgd": GAP_FEDSGD,
    "progap": PROGAP,
    "ppgnn": PPGNN,
    "privgnn": PRIVGNN,
}


def _honest(name, tmp_path):
    grid = LocalGrid(RUNS[name]["num-clients"], record=True)
    run_local({**RUNS[name], "output-dir": str(tmp_path)}, grid)
    return grid


def _ledgers(grid) -> dict:
    return {
        n: (
            json.loads(str(c.state[AUTHORITY_STATE]["json"]))["spent"]
            if AUTHORITY_STATE in c.state
            else {}
        )
        for n, c in grid.contexts.items()
    }


def _send(grid, m: Message, content: RecordDict) -> Message:
    fresh = Message(
        content=content, dst_node_id=m.metadata.dst_node_id, message_type=m.metadata.message_type
    )
    grid.record = False
    try:  # LocalGrid raises the handler's exception (Flower: an error reply)
        return grid.send_and_receive([fresh])[0]
    except Exception as err:  # noqa: BLE001 - the refusal, as Flower would carry it
        from flwr.app import Error

        grid._queue.clear()
        return Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=fresh)


def _copy(content: RecordDict) -> RecordDict:
    return RecordDict({k: content[k] for k in content.keys()})


def _more_loss(content: RecordDict) -> RecordDict:
    """The run config asking a thousand times the privacy loss."""
    out = _copy(content)
    cfg = json.loads(str(content["config"]["json"]))
    for key in ("client_epsilons", "budgets"):
        if key in cfg:
            cfg[key] = [float(e) * 1000 for e in cfg[key]]
    out["config"] = ConfigRecord({**dict(content["config"]), "json": json.dumps(cfg)})
    return out


def _crafted(content: RecordDict) -> RecordDict | None:
    """The same request with every float tensor it carries scaled by 1.01 (crafted weights or
    rows), or None if it carries none."""
    out, changed = _copy(content), False
    for name in content.keys():
        rec = content[name]
        if isinstance(rec, ArrayRecord) and len(rec):
            t = {
                k: (v * 1.01 if v.is_floating_point() else v)
                for k, v in rec.to_torch_state_dict().items()
            }
            if any(v.is_floating_point() and v.numel() for v in t.values()):
                out[name], changed = ArrayRecord(t), True
    return out if changed else None


def _same(a: Message, b: Message) -> bool:
    if a.has_error() or b.has_error():
        return False
    for name in a.content.keys():
        ra, rb = a.content[name], b.content[name]
        if isinstance(ra, ArrayRecord):
            ta, tb = ra.to_torch_state_dict(), rb.to_torch_state_dict()
            if ta.keys() != tb.keys() or any(not torch.equal(ta[k], tb[k]) for k in ta):
                return False
        elif dict(ra) != dict(rb):
            return False
    return True


#: the message types that release something a ledger charges (the others release public
#: facts or evaluation counts, outside the guarantee)
RELEASES = {
    "train",
    "query.gap_pma",
    "query.progap_aggregate",
    "train.progap_stage",
    "query.ppgnn",
    "query.privgnn",
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_deviating_server_gets_no_release_beyond_the_honest_run(name, tmp_path):
    grid = _honest(name, tmp_path)
    log = list(grid.log)
    before = _ledgers(grid)
    assert any(before.values()), "the honest run charged nothing"
    new_rounds = {n: 0 for n in grid.contexts}  # PrivGNN: every request is a round of its own
    for m, r in log:
        kind, node = m.metadata.message_type, m.metadata.dst_node_id
        # 1. a run config asking for more privacy loss: refused, whatever the message
        assert _send(grid, m, _more_loss(m.content)).has_error(), kind
        if kind not in RELEASES or r.has_error():
            continue
        # 2. the identical request again: the same release back, or a refusal; never fresh
        #    noise on the same purpose (PrivGNN: a new round, charged as one)
        again = _send(grid, m, _copy(m.content))
        if kind == "query.privgnn":
            new_rounds[node] += not again.has_error()
        else:
            assert again.has_error() or _same(again, r), kind
        # 3. crafted inputs under a spent purpose: refused (a step that releases nothing, such
        #    as ProGAP's finish, may fail for its own reasons)
        crafted = _crafted(m.content)
        if crafted is not None:
            reply = _send(grid, m, crafted)
            if kind == "query.privgnn":
                new_rounds[node] += not reply.has_error()
            else:
                assert reply.has_error(), kind
    after = _ledgers(grid)
    for n in grid.contexts:  # nothing was released beyond the honest run but new rounds,
        assert {p: v for p, v in after[n].items() if p in before[n]} == before[n]  # charged
        assert len(after[n]) == len(before[n]) + new_rounds[n], (n, sorted(after[n]))
    for n, ctx in grid.contexts.items():
        if AUTHORITY_STATE not in ctx.state:
            continue
        auth = ClientAuthority.from_json(str(ctx.state[AUTHORITY_STATE]["json"]))
        for subject, row in auth.summary().items():
            assert row["epsilon"] <= row["budget"] * 1.001, (n, subject, row)


def test_the_attacks_cover_every_message_type(tmp_path):
    """Every message type of the protocol appears in the honest runs the hostile server
    replays (so every type was attacked with a config asking more loss)."""
    seen = set()
    for name in ("gap", "progap", "ppgnn", "privgnn"):
        seen |= {m.metadata.message_type for m, _ in _honest(name, tmp_path).log}
    assert set(MESSAGES) <= seen, sorted(set(MESSAGES) - seen)


def test_a_client_never_lowers_its_noise_at_the_servers_word(tmp_path):
    """Fault 3: a first PMA request with remote-sigma = sigma / 1000 and remote-contributors =
    10^6, without secure aggregation, is refused: nothing leaves."""
    cfg = {**GAP_FEDSGD, "client-epsilons": "4,2,1"}  # different sigmas: remote rows get one
    grid = _honest("gap-fedsgd", tmp_path)  # a run to copy the requests from
    fresh = LocalGrid(cfg["num-clients"], record=True)
    fresh.provision({**GAP_FEDSGD, "output-dir": str(tmp_path)})
    pma = [m for m, _ in grid.log if m.metadata.message_type == "query.gap_pma"]
    setup = [m for m, _ in grid.log if m.metadata.message_type == "query.gap_setup"]
    for m in setup:
        assert not _send(fresh, m, _copy(m.content)).has_error()
    first = pma[0]
    content = _copy(first.content)
    pma_rec = dict(first.content["pma"])
    pma_rec.update({"remote-sigma": 1e-6, "remote-contributors": 10**6})
    content["pma"] = ConfigRecord(pma_rec)
    reply = _send(fresh, first, content)
    assert reply.has_error() and (
        "remote noise" in reply.error.reason or "this client counts 1" in reply.error.reason
    ), reply.error.reason
    ctx = fresh.contexts[first.metadata.dst_node_id]
    spent = (
        json.loads(str(ctx.state[AUTHORITY_STATE]["json"]))["spent"]
        if AUTHORITY_STATE in ctx.state
        else {}
    )
    assert "gap:pma1" not in spent or reply.has_error()


class _Tampering(LocalGrid):
    """A server that changes one float input of one request to one client (the rows routed to
    it, the weights sent to it), as another client's data changing would; the rest honest."""

    def __init__(self, *args, node: int, target, **kwargs):
        super().__init__(*args, **kwargs)
        self.node, self.target = node, target

    def _answer(self, m):
        if m.metadata.dst_node_id == self.node and self.target(m):
            for name in ("incoming", "arrays"):
                if name in m.content and len(m.content[name]):
                    t = m.content[name].to_torch_state_dict()
                    key = next(k for k, v in t.items() if v.is_floating_point() and v.numel())
                    t[key] = t[key].clone()
                    t[key].view(-1)[0] += 1.0
                    m.content[name] = ArrayRecord(t)
                    break
        return super()._answer(m)


def _gap_hop2(m) -> bool:
    return m.metadata.message_type == "query.gap_pma" and int(m.content["pma"]["hop"]) == 2


def _progap_stage2(m) -> bool:
    return (
        m.metadata.message_type == "query.progap_aggregate"
        and str(m.content["agg"]["step"]) == "release"
        and int(m.content["agg"]["stage"]) == 2
    )


FRESH = {
    "gap": ({**GAP_FEDSGD, "client-epsilons": "4"}, _gap_hop2),
    "progap": (
        {**PROGAP, "depth": 2, "secure-aggregation": False, "client-epsilons": "4"},
        _progap_stage2,
    ),
}


@pytest.mark.parametrize("method", list(FRESH))
def test_secret_noise_is_fresh_when_another_clients_input_changes(method, monkeypatch, tmp_path):
    """Fault 1: with noise-source secret, a client whose own data are unchanged but whose input
    changed (a routed row at GAP's hop 2, the weights at ProGAP's stage 2) draws fresh noise for
    that release: no row of the two releases is equal (before: every row without an edge into
    it was, 1,223 true positives of 1,814 on Cora); identical runs still reproduce."""
    monkeypatch.setenv("FEDGRAPH_NOISE_SECRET", "malicious-server-test-secret-0123456789")
    base, target = FRESH[method]
    cfg = {**base, "noise-source": "secret"}

    def release(grid_cls, **kw):
        grid = grid_cls(cfg["num-clients"], record=True, **kw)
        run_local({**cfg, "output-dir": str(tmp_path)}, grid)
        reply = [r for m, r in grid.log if m.metadata.dst_node_id == 2 and target(m)][0]
        return reply.content["partial_sums"].to_torch_state_dict()["sums"]

    honest, again = release(LocalGrid), release(LocalGrid)
    tampered = release(_Tampering, node=2, target=target)
    assert torch.allclose(honest, again, atol=1e-4)  # identical runs reproduce
    assert honest.shape[0] > 0 and not bool((honest == tampered).all(dim=1).any())


def test_check_asks_no_more_allows_less_loss_only():
    own = parse_run_config({**GAP, "client-epsilons": "4,2,1"})
    check_asks_no_more(parse_run_config({**GAP, "client-epsilons": "1,2,1"}), own, 0)
    check_asks_no_more(parse_run_config({**GAP, "client-epsilons": "4,2,1", "delta": 1e-6}), own, 0)
    for bad in (
        {"client-epsilons": "5,2,1"},
        {"delta": 1e-4},
        {"hops": 3},
        {"level": "node", "max-degree": 5},
        {"noise-source": "mt19937"},
    ):
        with pytest.raises(ReleaseRefused, match=next(iter(bad)).split("-")[0]):
            check_asks_no_more(parse_run_config({**GAP, "client-epsilons": "4,2,1", **bad}), own, 0)


def test_client_authority_refuses_past_its_budget_and_repeats():
    from fedgraph.accounting import Gaussian

    auth = ClientAuthority({"client-0": 1.0}, delta=1e-5, accountant="rdp")
    auth.charge("a", "r1", [("client-0", "pma", Gaussian(5.0))])
    assert auth.admit("a", "r1") == "repeat"
    with pytest.raises(ReleaseRefused, match="already made"):
        auth.admit("a", "r2")
    with pytest.raises(ReleaseRefused, match="past this client's own budget"):
        auth.charge("b", "r3", [("client-0", "pma", Gaussian(0.5))])
    with pytest.raises(ReleaseRefused):  # a subject the client has no budget for
        auth.charge("c", "r4", [("client-9", "pma", Gaussian(5.0))])
    back = ClientAuthority.from_json(auth.to_json())
    assert back.spent.keys() == {"a"} and back.epsilon("client-0") == auth.epsilon("client-0")
