"""Progress of long phases (fedgraph.report.progress): clients done / total, rounds, queries
answered; on a terminal in the phase's spinner, in a log at most one line per interval."""

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from fedgraph import report
from fedgraph.report import RunReport, progress
from fedgraph.simulations.grid import InterruptibleGrid


def _console(monkeypatch, terminal: bool) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(
        report, "_CONSOLE", Console(file=out, force_terminal=terminal, width=200, highlight=False)
    )
    return out


class FakeGrid:
    """Replies arrive one per pull."""

    def __init__(self):
        self.pushed = []

    def push_messages(self, messages):
        ids = [f"m{len(self.pushed) + i}" for i in range(len(messages))]
        self.pushed += ids
        self.waiting = list(ids)
        return ids

    def pull_messages(self, ids):
        if not self.waiting:
            return []
        mid = self.waiting.pop(0)
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid))]


def _messages(kind, n):
    return [SimpleNamespace(metadata=SimpleNamespace(message_type=kind)) for _ in range(n)]


def test_a_log_gets_throttled_lines_with_clients_and_rounds(monkeypatch):
    out = _console(monkeypatch, terminal=False)
    monkeypatch.setattr(report, "PROGRESS_EVERY_S", 0.0)
    grid = InterruptibleGrid(FakeGrid(), poll=0.0)
    r = RunReport("gap", {})
    with r.phase("classifier rounds (FedAvg)", rounds=3):
        for _ in range(2):
            assert len(grid.send_and_receive(_messages("train", 4))) == 4
            grid.send_and_receive(_messages("evaluate", 4))
    lines = out.getvalue().splitlines()
    assert "gap: classifier rounds (FedAvg) ... round 1/3, 1/4 clients (0 s)" in lines
    assert any(
        ln.startswith("gap: classifier rounds (FedAvg) ... round 2/3, 4/4 clients") for ln in lines
    )
    assert lines[-1].startswith("gap: classifier rounds (FedAvg) done in")
    assert report._PHASE == []  # the phase is gone once it ended


def test_a_log_is_quiet_within_the_interval(monkeypatch):
    out = _console(monkeypatch, terminal=False)
    r = RunReport("ppgnn", {})
    with r.phase("perturb (clients)"):
        for k in range(1, 11):
            progress("clients", k, 10)
        progress("queries answered", 640, 1000)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppgnn: perturb (clients) done in")


def test_a_phase_cut_short_says_interrupted_or_failed(monkeypatch):
    from fedgraph.errors import RunInterrupted

    out = _console(monkeypatch, terminal=False)
    r = RunReport("gap", {})
    for err, word in (
        (RunInterrupted(), "interrupted"),
        (KeyboardInterrupt(), "interrupted"),
        (ValueError("boom"), "failed"),
    ):
        with pytest.raises(type(err)):
            with r.phase("encoder rounds"):
                raise err
        assert out.getvalue().splitlines()[-1].startswith(f"gap: encoder rounds {word} in")
    assert str(RunInterrupted()) == "interrupted (Ctrl-C or SIGTERM)"


def test_a_terminal_shows_it_in_the_spinner(monkeypatch):
    _console(monkeypatch, terminal=True)
    updates = []
    r = RunReport("privgnn", {})
    with r.phase("answer queries round 1 (clients)"):
        status = report._PHASE[-1].status
        monkeypatch.setattr(status, "update", lambda text: updates.append(text))
        progress("clients", 1, 4)
        progress("queries answered", 250, 4000)
    assert updates == [
        "privgnn: answer queries round 1 (clients) ... 1/4 clients",
        "privgnn: answer queries round 1 (clients) ... 1/4 clients, 250/4000 queries answered",
    ]


@pytest.mark.parametrize("terminal", [True, False])
def test_no_phase_or_progress_off_prints_nothing(monkeypatch, terminal):
    out = _console(monkeypatch, terminal)
    monkeypatch.setattr(report, "PROGRESS_EVERY_S", 0.0)
    progress("clients", 1, 2)  # no phase running
    r = RunReport("gap", {}, progress=False)
    with r.phase("PMA (clients, via server)"):
        progress("clients", 1, 2)
    assert out.getvalue() == ""


def test_a_long_phase_without_clients_shows_life_in_a_log(monkeypatch):
    """Issue 30: a server phase (PPGNN's calibrate+train) calls no progress(); a log still gets
    a line every PROGRESS_EVERY_S seconds (a background heartbeat), a terminal none."""
    import time

    out = _console(monkeypatch, terminal=False)
    monkeypatch.setattr(report, "PROGRESS_EVERY_S", 0.5)
    r = RunReport("ppgnn", {})
    with r.phase("calibrate+train (server)"):
        time.sleep(1.6)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("ppgnn: calibrate+train (server) ... (1 s)"), lines
    assert lines[-1].startswith("ppgnn: calibrate+train (server) done in")
    assert not any(t.name == "fedgraph-progress" for t in __import__("threading").enumerate())
