"""GAP's client state between PMA hops goes in and out of :func:`fedgraph.methods.gap.client.
pma_step` explicitly: what to keep after each hop, the stacked hops after the last, and a
refusal when a later hop finds no state."""

import pytest
import torch

from fedgraph.config import parse_run_config
from fedgraph.data import partition
from fedgraph.data.synthetic import sbm_graph
from fedgraph.federation import ClientView
from fedgraph.methods.gap.client import PMARequest, pma_hop, pma_state_key, pma_step


def _client(hops=2):
    cfg = parse_run_config(
        {"method": "gap", "num-clients": 2, "hops": hops, "encoder-dim": 4, "partitioner": "random"}
    )
    data = sbm_graph(120, 6.0, num_classes=3, num_features=8, seed=0)
    data.train_mask = torch.rand(120, generator=torch.Generator().manual_seed(0)) < 0.5
    data.val_mask = data.test_mask = ~data.train_mask
    client = partition(data, 2, "random", 0)[0]
    stats = {"name": "sbm", "num_nodes": 120, "num_features": 8, "num_classes": 3}
    return cfg, ClientView(client, (0.0, 1.0), stats, 2, None), client


def _gen(purpose):
    return torch.Generator().manual_seed(len(purpose))


def test_pma_step_keeps_the_state_then_the_stacked_hops_as_pma_hop_computes_them():
    cfg, view, client = _client()
    torch.manual_seed(0)
    step = pma_step(cfg, 0, view, PMARequest(1), None, _gen)
    torch.manual_seed(0)
    state, release = pma_hop(cfg, 0, view, PMARequest(1), None, _gen)
    assert step.hops is None and set(step.pending) == {"hop0", "local_sums"}
    assert all(torch.equal(step.pending[k], state.tensors[k]) for k in state.tensors)
    assert torch.equal(step.release["sums"], release["sums"])
    kept = step.pending
    for hop in (2, 3):
        inc = {"ids": client.node_ids[:3], "sums": torch.ones(3, 4)}
        step = pma_step(cfg, 0, view, PMARequest(hop, incoming=inc), kept, _gen)
        kept = step.pending
    assert kept is None and step.hops.shape == (client.num_nodes, cfg.hops + 1, 4)
    assert step.release["ids"].numel() == 0
    assert pma_state_key("test") != pma_state_key("all")


@pytest.mark.parametrize("level", ["edge", "node"])
def test_edge_sums_built_once_give_the_hops_built_every_hop(level):
    """pma_step with a memo (the ClientApp's client_state.derived) builds the client's sums
    over its edges once, at hop 1, and every hop's release and state are those of building
    them at every hop (node level: the same degree-bounded edges, one gap:degree draw)."""
    cfg, view, client = _client()
    cfg = cfg.model_copy(update={"level": level})
    memo, builds = {}, []

    def keep(build):
        if "sums" not in memo:
            builds.append(1)
            memo["sums"] = build()
        return memo["sums"]

    kept = {True: None, False: None}
    for hop in (1, 2, 3):
        inc = None if hop == 1 else {"ids": client.node_ids[:3], "sums": torch.ones(3, 4)}
        steps = {}
        for memoized in (True, False):
            torch.manual_seed(0)
            steps[memoized] = pma_step(
                cfg,
                0,
                view,
                PMARequest(hop, incoming=inc),
                kept[memoized],
                _gen,
                keep if memoized else None,
            )
            kept[memoized] = steps[memoized].pending
        assert torch.equal(steps[True].release["sums"], steps[False].release["sums"])
        assert torch.equal(steps[True].release["ids"], steps[False].release["ids"])
    assert torch.equal(steps[True].hops, steps[False].hops) and builds == [1]


@pytest.mark.parametrize("level", ["edge", "node"])
def test_the_release_block_is_reused_across_hops_with_the_same_rows(monkeypatch, level):
    """Issue 31: with a memo, a client's remote rows are written into one block kept across
    the run's hops (client_pma.release_buffer; blocked products, ROW_BLOCK_ELEMENTS small
    here): hop 2 overwrites hop 1's release in place (the ClientApp encodes a release before
    the next hop), and every hop's rows are those of a new tensor per hop."""
    from fedgraph.utils import sparse

    monkeypatch.setattr(sparse, "ROW_BLOCK_ELEMENTS", 8)
    cfg, view, client = _client()
    cfg = cfg.model_copy(update={"level": level})
    memo = {}

    def keep(build):
        if "sums" not in memo:
            memo["sums"] = build()
        return memo["sums"]

    kept, released = {True: None, False: None}, {True: [], False: []}
    for hop in (1, 2):
        inc = None if hop == 1 else {"ids": client.node_ids[:3], "sums": torch.ones(3, 4)}
        for memoized in (True, False):
            torch.manual_seed(0)
            step = pma_step(
                cfg,
                0,
                view,
                PMARequest(hop, incoming=inc),
                kept[memoized],
                _gen,
                keep if memoized else None,
            )
            kept[memoized] = step.pending
            released[memoized].append((step.release["sums"], step.release["sums"].clone()))
        assert torch.equal(released[True][-1][1], released[False][-1][1])
    (first, first_copy), (second, _) = released[True]
    assert first.data_ptr() == second.data_ptr() and torch.equal(first, second)
    assert not torch.equal(first_copy, second)  # hop 1's rows were overwritten by hop 2's
    assert released[False][0][0].data_ptr() != released[False][1][0].data_ptr()


def test_a_later_hop_without_state_is_refused():
    cfg, view, client = _client()
    inc = {"ids": client.node_ids[:1], "sums": torch.ones(1, 4)}
    with pytest.raises(ValueError, match="kept no state of hop 1"):
        pma_step(cfg, 0, view, PMARequest(2, incoming=inc), None, _gen)


def test_the_clientapp_keeps_the_pma_state_through_client_state(monkeypatch):
    """The handler keeps the state between hops with :mod:`fedgraph.simulations.client_state`
    (under Ray a reference in the Context, not the tensors Flower would ship with every
    message), and drops it after the last hop, leaving the classifier's inputs."""
    import json

    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedgraph.federation import client_view
    from fedgraph.messaging import tensors
    from fedgraph.methods.gap.client import hops_key
    from fedgraph.methods.gap.models import build_encoder
    from fedgraph.simulations import client_app, client_state

    for attr in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)
    monkeypatch.setenv("FEDGRAPH_NOISE_SECRET", "client-state-test-secret-0123")
    cfg = parse_run_config(
        {
            "method": "gap",
            "dataset": "cora",
            "num-clients": 2,
            "hops": 2,
            "encoder-dim": 8,
            "noise-source": "secret",
        }
    )
    view = client_view(cfg, 0)
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config=cfg.model_dump(),
    )  # the client's own config
    enc = build_encoder(cfg, view.statistics["num_features"], view.statistics["num_classes"])
    key, n = pma_state_key("all"), view.graph.num_nodes
    incoming = {"ids": view.graph.node_ids[:2], "sums": torch.ones(2, 8)}
    for hop in (1, 2, 3):
        records = {
            "config": ConfigRecord({"json": json.dumps(cfg.model_dump())}),
            "pma": ConfigRecord({"hop": hop, "graph": "all"}),
            "encoder": ArrayRecord(enc.state_dict()),
            "incoming": ArrayRecord(incoming),
        }
        reply = client_app.gap_pma(
            Message(content=RecordDict(records), dst_node_id=1, message_type="query.gap_pma"), ctx
        )
        released = tensors(reply.content["partial_sums"])
        if hop <= 2:
            assert released["sums"].shape == (2708 - n, 8)
            kept = client_state.get_tensors(ctx, key)
            assert key + ".token" in ctx.state  # client_state's, not a bare ArrayRecord
            assert set(kept) == {f"hop{j}" for j in range(hop)} | {"local_sums"}
            assert client_state.get_tensors(ctx, key) is kept  # memoized: no second decode
        if hop == 1:
            sums = client_state.derived(ctx, key, lambda: None)  # the edge sums of hop 1
            assert sums is not None and sums[1].row_ids.numel() == 2708 - n
        if hop == 2:  # not rebuilt at hop 2
            assert client_state.derived(ctx, key, lambda: None) is sums
    assert key not in ctx.state and key + ".token" not in ctx.state
    assert key + ".derived" not in ctx.state  # dropped with the state
    assert client_state.get_tensors(ctx, hops_key("all"))["hops"].shape == (n, 3, 8)
