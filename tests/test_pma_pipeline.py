"""GAP's PMA pipelined across hops (``GAPStrategy._pma``): once the last client of a hop has
replied and its rows are summed, its next message goes out at once, ahead of the others'; the
next hop's order starts with it. What leaves the clients and what the server records do not
change, only when the server sends, and the order in which it adds the rows (fixed by the
protocol, never by arrival times)."""

from __future__ import annotations

import pytest
import torch

from fedgraph.errors import ClientFailure
from fedgraph.federation import preflight
from fedgraph.messaging import send_to_all
from fedgraph.simulations import client_state
from fedgraph.simulations.local import LocalGrid
from fedgraph.simulations.server_app import validate_run_config

CONFIG = {
    "method": "gap",
    "dataset": "synthetic-sbm:400:6",
    "num-clients": 3,
    "hops": 2,
    "encoder-rounds": 1,
    "classifier-rounds": 1,
    "client-epsilons": "4",
    "noise-source": "secret",
    "device": "cpu",
    "seed": 0,
}


class _Unpipelined(LocalGrid):
    """The same clients, on a grid that does not stream its replies (Flower's own): one
    message per client and hop, all sent after the hop's last reply."""

    streams_replies = False

    def send_and_receive(self, messages, *, timeout=None):
        return super().send_and_receive(messages, timeout=timeout)


def _run(tmp_path, grid_cls, **extra):
    cls, cfg = validate_run_config({**CONFIG, "output-dir": str(tmp_path), **extra})
    grid = grid_cls(cfg.num_clients, record=True)
    report = cls(cfg).start(grid, ground_truth=preflight(cfg))
    assert report["status"] == "ok", report.get("error")
    return report, grid


def _pma_log(grid):
    """``(hop, destination node)`` of every PMA request, in the order the clients answered."""
    return [
        (int(m.content["pma"]["hop"]), m.metadata.dst_node_id)
        for m, _ in grid.log
        if m.metadata.message_type == "query.gap_pma"
    ]


@pytest.fixture(autouse=True, scope="module")
def _secret():
    """Each client's noise from a secret of the test's (the same draws in both runs)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDGRAPH_NOISE_SECRET", "pma-pipeline-test-secret-0123")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    return (
        _run(tmp_path_factory.mktemp("pipelined"), LocalGrid),
        _run(tmp_path_factory.mktemp("unpipelined"), _Unpipelined),
    )


def test_the_last_client_of_a_hop_starts_the_next_one(runs):
    (_, grid), (_, plain) = runs
    assert _pma_log(plain) == [(k, n) for k in (1, 2, 3) for n in (1, 2, 3)]
    # hop 1 in the nodes' order; then each hop starts with the previous hop's last client
    assert _pma_log(grid) == [
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 3),
        (2, 1),
        (2, 2),
        (3, 2),
        (3, 3),
        (3, 1),
    ]


def test_pipelining_changes_neither_the_releases_nor_the_ledger(runs):
    (report, grid), (plain_report, plain) = runs
    assert report["privacy"]["per_subject"] == plain_report["privacy"]["per_subject"]

    def released(g):  # (hop, node) -> the rows it released (secret noise source: the same)
        out = {}
        for m, r in g.log:
            if m.metadata.message_type == "query.gap_pma":
                rows = dict(r.content["partial_sums"].to_torch_state_dict())
                out[(int(m.content["pma"]["hop"]), m.metadata.dst_node_id)] = rows
        return out

    mine, theirs = released(grid), released(plain)
    assert mine.keys() == theirs.keys()
    hop1 = [key for key in mine if key[0] == 1]
    for key in hop1:  # hop 1 reads only the client's own data: bit-identical
        assert torch.equal(mine[key]["sums"], theirs[key]["sums"])
    for key in set(mine) - set(hop1):  # later hops: the server's sums in another order
        assert torch.equal(mine[key]["ids"], theirs[key]["ids"])
        torch.testing.assert_close(mine[key]["sums"], theirs[key]["sums"], atol=1e-4, rtol=1e-4)
    for node in grid.contexts:  # the classifier's inputs on every client
        a = client_state.get_tensors(grid.contexts[node], "gap.hops")["hops"]
        b = client_state.get_tensors(plain.contexts[node], "gap.hops")["hops"]
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_failed_hop_sends_nothing_ahead(tmp_path):
    """A client failing in hop 1: the exchange stops at the failure; no next-hop message
    goes to anyone (the last client's reply is never summed)."""
    cls, cfg = validate_run_config({**CONFIG, "output-dir": str(tmp_path)})
    grid = LocalGrid(
        cfg.num_clients,
        record=True,
        fail=lambda m: m.metadata.message_type == "query.gap_pma" and m.metadata.dst_node_id == 2,
    )
    with pytest.raises(ClientFailure, match="query.gap_pma failed on 1 of 3 clients"):
        cls(cfg).start(grid, ground_truth=preflight(cfg))
    assert [hop for hop, _ in _pma_log(grid)] == [1, 1, 1]  # hop 1 only, no hop 2 pushed
    assert not grid._queue  # nothing left waiting either


def test_messages_pushed_ahead_are_collected_first_in_order():
    """send_to_all's ``pushed``: their replies are part of the exchange, first in order."""
    from flwr.app import RecordDict

    seen = []
    grid = LocalGrid(3)
    from fedgraph.messaging import push_message

    def echo(message, context):  # a ClientApp that answers every message with an empty reply
        from flwr.app import Message

        return Message(RecordDict(), reply_to=message)

    grid.client_app = echo
    early = push_message(grid, "query.test", 3, RecordDict())
    out = send_to_all(
        grid,
        "query.test",
        {1: RecordDict(), 2: RecordDict()},
        10.0,
        on_reply=lambda n, r: seen.append(n),
        pushed={3: early},
    )
    assert seen == [3, 1, 2] and set(out) == {1, 2, 3}
    with pytest.raises(ValueError, match="both pushed and in contents"):
        send_to_all(grid, "query.test", {3: RecordDict()}, 10.0, pushed={3: early})
    with pytest.raises(ValueError, match="streams its replies"):
        send_to_all(_Unpipelined(1), "query.test", {}, 10.0, pushed={1: "x"})
