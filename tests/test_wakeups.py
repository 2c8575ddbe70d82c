"""Message latency (issue 16): Flower's simulation threads wake up on a push or a stored reply
instead of after their 100 ms polls (fedgraph.simulations.wakeups). Each test lengthens the idle wait to
seconds, so a wake-up that does not happen fails the test instead of passing slowly."""

from __future__ import annotations

import queue
import sys
import threading
import time
import types

import pytest

from fedgraph.simulations import wakeups
from fedgraph.simulations.grid import InterruptibleGrid


class _State:
    """The two link-state calls the threads make."""

    def __init__(self):
        self.ins: dict[int, list] = {1: [], 2: []}
        self.res: list = []

    def get_message_ins(self, node_id, limit):
        out, self.ins[node_id] = self.ins[node_id][:limit], self.ins[node_id][limit:]
        return out

    def store_message_res(self, msg):
        self.res.append(msg)


@pytest.fixture
def slow_idle(monkeypatch):
    monkeypatch.setattr(wakeups, "IDLE_WAIT_S", 5.0)
    wakeups.PUSHED.clear()
    wakeups.REPLIED.clear()


def _thread(target, *args):
    th = threading.Thread(target=target, args=args, daemon=True)
    th.start()
    return th


def test_sweeping_thread_moves_a_pushed_message_at_once(slow_idle):
    state, q, stop = _State(), queue.Queue(), threading.Event()
    th = _thread(wakeups.add_messages_to_queue, state, q, {1: 0, 2: 1}, stop)
    time.sleep(0.2)  # the thread is now in its (5 s) idle wait
    state.ins[2].append("m")
    t0 = time.monotonic()
    wakeups.PUSHED.set()
    assert q.get(timeout=3.0) == "m"
    assert time.monotonic() - t0 < 2.0  # woke up, did not wait out the idle 5 s
    stop.set()
    wakeups.PUSHED.set()
    th.join(3.0)
    assert not th.is_alive()


def test_sweeping_thread_takes_at_most_one_message_per_node_per_sweep(slow_idle):
    state, q, stop = _State(), queue.Queue(), threading.Event()
    state.ins[1] += ["a", "b"]
    th = _thread(wakeups.add_messages_to_queue, state, q, {1: 0, 2: 1}, stop)
    assert q.get(timeout=3.0) == "a"
    time.sleep(0.2)
    assert q.empty()  # "b" waits for the next sweep, as in Flower
    wakeups.PUSHED.set()
    assert q.get(timeout=3.0) == "b"
    stop.set()
    wakeups.PUSHED.set()
    th.join(3.0)


def test_storing_thread_signals_each_reply(slow_idle):
    state, q, stop = _State(), queue.Queue(), threading.Event()
    th = _thread(wakeups.put_message_into_state, state, q, stop)
    q.put("r")
    assert wakeups.REPLIED.wait(3.0)
    assert state.res == ["r"]
    stop.set()
    th.join(wakeups.IDLE_WAIT_S + 3)


class _ReplyLaterGrid:
    """A grid whose one reply is stored by another thread 0.3 s after the push."""

    def __init__(self):
        self.stored = []

    def push_messages(self, messages):
        def store():
            self.stored.append(
                types.SimpleNamespace(metadata=types.SimpleNamespace(reply_to_message_id="id-1"))
            )
            wakeups.REPLIED.set()

        threading.Timer(0.3, store).start()
        return ["id-1"]

    def pull_messages(self, ids):
        out, self.stored = self.stored, []
        return out


def test_grid_wakes_on_a_stored_reply_and_signals_its_push(slow_idle):
    grid = InterruptibleGrid(_ReplyLaterGrid(), poll=10.0)
    t0 = time.monotonic()
    replies = grid.send_and_receive([object()], timeout=30)
    assert len(replies) == 1
    assert time.monotonic() - t0 < 5.0  # not the 10 s poll
    assert wakeups.PUSHED.is_set()  # the push woke Flower's sweeping thread


def test_install_replaces_flowers_functions_and_only_matching_ones(monkeypatch):
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(wakeups, "_STATE", {"installed": False})
    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)
    monkeypatch.setattr(vce_api, "put_message_into_state", vce_api.put_message_into_state)
    monkeypatch.setattr(vce_api, "Queue", queue.Queue)
    fake = types.ModuleType(wakeups._VCE_API)
    fake.add_messages_to_queue = lambda state, queue, f_stop: None  # another signature
    fake.put_message_into_state = vce_api.put_message_into_state
    with monkeypatch.context() as m:
        m.setitem(sys.modules, wakeups._VCE_API, fake)
        pkg = sys.modules["flwr.server.superlink.fleet.vce"]
        m.setattr(pkg, "vce_api", fake)
        assert wakeups.install() is False
        assert not wakeups.installed()
    assert wakeups.install() is True
    assert vce_api.add_messages_to_queue is wakeups.add_messages_to_queue
    assert vce_api.put_message_into_state is wakeups.put_message_into_state
    assert vce_api.Queue is wakeups.PromptQueue
    assert wakeups.install() is True  # a second call


def test_prompt_queue_waits_at_most_the_idle_wait():
    q = wakeups.PromptQueue()
    t = time.perf_counter()
    with pytest.raises(queue.Empty):
        q.get(timeout=5.0)  # Flower's workers: timeout=1.0, then test their stop event
    assert time.perf_counter() - t < 1.0
    q.put("m")
    assert q.get(timeout=5.0) == "m"
    with pytest.raises(queue.Empty):
        q.get(block=False)
    threading.Timer(0.05, q.put, args=("late",)).start()
    assert q.get() == "late"  # no timeout: waits as long as it takes


def test_install_if_imported_leaves_a_process_without_flowers_runtime(monkeypatch):
    monkeypatch.setattr(wakeups, "_STATE", {"installed": False})
    monkeypatch.delitem(sys.modules, wakeups._VCE_API, raising=False)
    assert wakeups.install(if_imported=True) is False
    assert wakeups._VCE_API not in sys.modules  # nothing imported for a Ray worker
