"""Ctrl-C on ``fedgraph run`` (issue 17, item 1): the run stops, its report says
``interrupted``, and no process it started outlives the command; a second Ctrl-C quits at once.
Real runs (Ray backend) in a subprocess; every process of the run carries a marker in its
environment, so leftovers are found whoever their parent is by then."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from simulations.grid import InterruptibleGrid
from fedgraph.procstats import descendants
from simulations.interrupt import RunInterrupted, STOP

ROOT = Path(__file__).parents[1]
#: Linux's process file system (an OS interface, not a project path)
PROC = Path("/proc")


def _marked(marker: str) -> list[int]:
    pids = []
    for env in PROC.glob("[0-9]*/environ"):
        try:
            if f"FEDGRAPH_TEST_MARKER={marker}".encode() in env.read_bytes():
                pids.append(int(env.parent.name))
        except OSError:
            pass
    return pids


def _start(tmp_path, marker):
    env = {**os.environ, "FEDGRAPH_TEST_MARKER": marker, "XDG_CACHE_HOME": str(tmp_path / "c")}
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "simulations.cli", "run", "ppgnn-cora",
                             "--num-cpus", "2", "--set", "num-clients=3",
                             "--set", f"output-dir='{tmp_path}'", "--set", "run-name='run'"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while "connect done" not in (tmp_path / "log.txt").read_text():
        assert proc.poll() is None, (tmp_path / "log.txt").read_text()[-3000:]
        assert time.time() < deadline, "the run never connected"
        time.sleep(0.5)
    return proc


def _gone(marker: str, within: float) -> list[int]:
    end = time.time() + within
    while _marked(marker) and time.time() < end:
        time.sleep(0.5)
    return _marked(marker)


@pytest.mark.skipif(not (PROC / "self" / "environ").exists(), reason="needs /proc")
def test_ctrl_c_stops_the_run_writes_an_interrupted_report_and_leaves_no_process(tmp_path):
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker)
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    rc = proc.wait(timeout=120)  # seconds on a quiet machine; generous for a loaded CI
    log = (tmp_path / "log.txt").read_text()
    assert rc == 130, log[-3000:]
    assert "interrupted" in log and "Ctrl-C again" in log
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["status"] == "interrupted" and "Ctrl-C" in report["error"]
    assert not _gone(marker, within=10), f"processes left {time.time() - t0:.0f} s after Ctrl-C"


@pytest.mark.skipif(not (PROC / "self" / "environ").exists(), reason="needs /proc")
def test_second_ctrl_c_quits_at_once(tmp_path):
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    assert proc.wait(timeout=30) == 130
    assert time.time() - t0 < 15
    assert not _gone(marker, within=10)


class _SlowGrid:
    """A grid whose replies never come."""

    def push_messages(self, messages):
        return ["m1"]

    def pull_messages(self, ids):
        return []

    def get_node_ids(self):
        return [1]


def test_interruptible_grid_gives_up_waiting_when_stopped():
    import threading

    grid = InterruptibleGrid(_SlowGrid(), poll=0.05)
    threading.Timer(0.3, STOP.set).start()
    t0 = time.time()
    try:
        with pytest.raises(RunInterrupted):
            grid.send_and_receive([], timeout=60)
    finally:
        STOP.clear()
    assert time.time() - t0 < 5
    assert grid.send_and_receive([], timeout=0.2) == []  # not stopped: waits out the timeout


def test_descendants_finds_grandchildren():
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        time.sleep(0.5)
        found = descendants()
        assert child.pid in found and len(found & set(descendants(child.pid))) >= 1
    finally:
        for p in descendants(child.pid) | {child.pid}:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_ray_init_cannot_take_sigterm_away():
    """``ray.init`` sets ``sys.exit`` as the main thread's SIGTERM handler, which crashed a run
    without its report: inside ``fedgraph run`` Ray's setter leaves our handler in place."""
    import ray._private.utils as ray_utils

    from simulations.interrupt import StopOnSignal

    original = ray_utils.set_sigterm_handler
    try:
        with StopOnSignal(echo=lambda line: None) as stop:
            ray_utils.set_sigterm_handler(lambda signum, frame: None)
            assert signal.getsignal(signal.SIGTERM) == stop._handler
    finally:
        ray_utils.set_sigterm_handler = original


def test_ray_core_worker_gets_no_c_level_sigterm_handler(monkeypatch):
    """Ray's core worker installs absl's failure-signal handler for SIGTERM at the C level,
    above Python's: a SIGTERM (``timeout``, a scheduler) then aborted the run (exit 134) before
    its report was written. Inside ``fedgraph run`` the driver's core worker is told not to."""
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    from simulations.interrupt import StopOnSignal

    monkeypatch.delenv("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", raising=False)
    monkeypatch.setattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", False)
    monkeypatch.setattr(ray_utils, "set_sigterm_handler", ray_utils.set_sigterm_handler)
    with StopOnSignal(echo=lambda line: None):
        assert os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] == "1"
        assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True


def test_one_interrupt_delivered_twice_is_one_graceful_stop(monkeypatch):
    """GNU ``timeout -s INT`` signals the command and then its process group: the second
    copy, a moment after the first, used to count as "Ctrl-C again" and killed the run before
    its report was written. Within the debounce window it is ignored; a later one quits."""
    from simulations import interrupt
    from simulations.interrupt import StopOnSignal

    exits, lines = [], []
    monkeypatch.setattr(interrupt, "_interrupt_server_thread", lambda: None)
    monkeypatch.setattr(interrupt, "kill_descendants", lambda *a, **k: None)
    monkeypatch.setattr(interrupt.os, "_exit", exits.append)
    stop = StopOnSignal(echo=lines.append)
    monkeypatch.setattr(stop, "_watchdog", lambda: None)
    try:
        stop._handler(signal.SIGINT, None)
        stop._handler(signal.SIGINT, None)  # the process-group copy
        assert STOP.is_set() and exits == [] and not any("interrupted again" in x for x in lines)
        stop.first -= StopOnSignal.DEBOUNCE_S + 0.1  # a real second Ctrl-C, later
        stop._handler(signal.SIGINT, None)
        assert exits == [130] and any("interrupted again" in x for x in lines)
    finally:
        STOP.clear()


def test_a_simulation_that_never_returns_after_its_strategy_is_ended(monkeypatch, tmp_path):
    """Flower's runtime can wait for ever on a Ray that is gone (issue: RAY_ADDRESS where the
    cluster died): once the ServerApp's thread has ended, StopOnSignal gives it TEARDOWN_S,
    then says so, ends the run's processes and exits with the report's code."""
    import json
    import threading

    from simulations import interrupt

    report = tmp_path / "r.json"
    report.write_text(json.dumps({"status": "failed"}))
    ended, exits, lines = [], [], []
    monkeypatch.setattr(interrupt, "end_all_descendants", lambda *a, **k: ended.append(1))
    monkeypatch.setattr(interrupt.StopOnSignal, "TEARDOWN_S", 0.3)
    monkeypatch.setattr(interrupt.StopOnSignal, "_exit", staticmethod(exits.append))
    monkeypatch.setattr(interrupt, "REPORT_PATH", [report])
    with interrupt.StopOnSignal(lines.append):
        server = threading.Thread(target=interrupt.serving)
        server.start()
        server.join()  # the strategy ended; the simulation "hangs" here
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exits == [1] and ended == [1]
    assert "did not end within 0.3 s" in lines[0] and "failed" in lines[0]

    exits.clear()
    with interrupt.StopOnSignal(lines.append):  # a simulation that returns: nothing happens
        server = threading.Thread(target=interrupt.serving)
        server.start()
        server.join()
    time.sleep(0.6)
    assert exits == []
