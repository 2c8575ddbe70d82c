"""The server works on each reply as it arrives (``send_to_all``'s ``on_reply``; GAP's and
ProGAP's partial sums are added while later clients still compute): in the clients' order
whatever the arrival order, never past a failed or non-finite reply, a reply ``on_reply``
cannot use is that client's failure, and the time spent in ``on_reply`` is the server's own
work, not the exchange's."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict

from fedgraph import report
from fedgraph.errors import ClientFailure
from fedgraph.messaging import send_to_all
from fedgraph.report import RunReport
from fedgraph.simulations.grid import InterruptibleGrid

NODES = [10, 11, 12, 13]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower's ``Message`` needs a run's identity (set by its runtime; here, for the test)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("run_id", 1), ("node_id", 0), ("task_id", 0)):
        if getattr(TaskIdentity, f"_{attr}") is None:
            monkeypatch.setattr(TaskIdentity, f"_{attr}", value)


class _Grid:
    """One reply per pull, nodes replying in ``arrival`` order; ``values[node]`` its array."""

    def __init__(self, arrival, values):
        self.arrival, self.values, self.pulls = list(arrival), values, 0

    def push_messages(self, messages):
        self.ids = {m.metadata.dst_node_id: f"m{m.metadata.dst_node_id}" for m in messages}
        return list(self.ids.values())

    def pull_messages(self, ids):
        if not self.arrival:
            return []
        self.pulls += 1
        node = self.arrival.pop(0)
        content = RecordDict({"out": ArrayRecord({"x": Array(np.asarray(self.values[node]))})})
        return [
            SimpleNamespace(
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=self.ids[node]),
                has_error=lambda: False,
                content=content,
            )
        ]


def _send(inner, on_reply, streaming=True):
    grid = InterruptibleGrid(inner, poll=0.0) if streaming else inner
    return send_to_all(
        grid, "query.test", {n: RecordDict() for n in NODES}, 10.0, on_reply=on_reply
    )


def _fine():
    return {n: [float(n)] for n in NODES}


def test_replies_are_handed_on_in_the_clients_order_as_they_arrive():
    inner, calls = _Grid([10, 12, 11, 13], _fine()), []
    out = _send(inner, lambda n, r: calls.append((n, inner.pulls)))
    assert calls == [(10, 1), (11, 3), (12, 3), (13, 4)]  # 11 waited for 12's pull, not the end
    assert set(out) == set(NODES)


def test_a_grid_that_does_not_stream_hands_them_on_after_all_arrived():
    class _Plain(_Grid):  # Flower's own grid: send_and_receive without on_reply
        def send_and_receive(self, messages, *, timeout=None):
            self.push_messages(messages)
            return [r for _ in NODES for r in self.pull_messages(None)]

    inner, calls = _Plain([13, 12, 11, 10], _fine()), []
    _send(inner, lambda n, r: calls.append((n, inner.pulls)), streaming=False)
    assert calls == [(n, 4) for n in NODES]


def test_nothing_is_handed_on_past_a_non_finite_reply():
    values, calls = _fine(), []
    values[11] = [float("nan")]
    with pytest.raises(ClientFailure, match=r"node 11 replied with a non-finite value") as err:
        _send(_Grid(NODES, values), lambda n, r: calls.append(n))
    assert calls == [10] and set(err.value.replies) == set(NODES)


def test_a_reply_the_server_cannot_use_fails_that_client_after_all_replies_arrived():
    calls = []

    def use(node, reply):
        if node == 12:
            reply["missing"]
        calls.append(node)

    with pytest.raises(
        ClientFailure,
        match=r"query.test: node 12 sent a reply the server "
        r"cannot use: KeyError",
    ) as err:
        _send(_Grid(NODES, _fine()), use)
    assert calls == [10, 11] and isinstance(err.value.__cause__, KeyError)
    assert set(err.value.replies) == set(NODES)  # every release reached the ledger's record


def test_time_in_on_reply_is_the_servers_work_not_the_exchange():
    r = RunReport("gap", {})
    with r.phase("PMA (clients, via server)"):
        _send(_Grid(NODES, _fine()), lambda n, reply: time.sleep(0.1))
    exchange = r.exchange_timings["PMA (clients, via server)"]
    assert exchange < 0.1, exchange  # the 0.4 s in on_reply are not counted as exchange
    assert report._PHASE == []


def test_a_missing_reply_names_the_timeout_as_given():
    """``timeout = 0.01`` is reported as 0.01 s, not rounded to "0 s"."""
    inner = _Grid(NODES[:3], _fine())  # node 13 never replies
    grid = InterruptibleGrid(inner, poll=0.0)
    with pytest.raises(ClientFailure, match=r"1 client\(s\): no reply within 0\.01 s"):
        send_to_all(grid, "query.test", {n: RecordDict() for n in NODES}, 0.01)
