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

from fedgraph.procstats import PROCFS, descendants
from fedgraph.simulations.grid import InterruptibleGrid
from fedgraph.simulations.interrupt import STOP, RunInterrupted

ROOT = Path(__file__).parents[1]
#: Linux's process file system (an OS interface, not a project path)
PROC = PROCFS


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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "fedgraph.simulations.cli",
            "run",
            "ppgnn-cora",
            "--num-cpus",
            "2",
            "--set",
            "num-clients=3",
            "--set",
            f"output-dir='{tmp_path}'",
            "--set",
            "run-name='run'",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
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

    from fedgraph.simulations.interrupt import StopOnSignal

    original = ray_utils.set_sigterm_handler
    try:
        with StopOnSignal(echo=lambda line: None) as stop:
            ray_utils.set_sigterm_handler(lambda signum, frame: None)
            assert signal.getsignal(signal.SIGTERM) == stop._python_handler
    finally:
        ray_utils.set_sigterm_handler = original


def test_ray_core_worker_gets_no_c_level_sigterm_handler(monkeypatch):
    """Ray's core worker installs absl's failure-signal handler for SIGTERM at the C level,
    above Python's: a SIGTERM (``timeout``, a scheduler) then aborted the run (exit 134) before
    its report was written. Inside ``fedgraph run`` the driver's core worker is told not to."""
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    from fedgraph.simulations.interrupt import StopOnSignal

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
    from fedgraph.simulations import interrupt
    from fedgraph.simulations.interrupt import StopOnSignal

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


def test_the_interrupt_line_names_a_report_only_once_it_is_written(monkeypatch, tmp_path):
    """Ctrl-C while Ray still starts: the run's report path is known but no report is ever
    written; the last line says so instead of naming a file that does not exist."""
    from fedgraph.simulations import interrupt

    exits, lines = [], []
    monkeypatch.setattr(interrupt, "end_all_descendants", lambda *a, **k: None)
    monkeypatch.setattr(interrupt.os, "_exit", exits.append)
    report = tmp_path / "run.json"
    monkeypatch.setattr(interrupt, "REPORT_PATH", [report])
    stop = interrupt.StopOnSignal(echo=lines.append, grace=0.0, report_wait=0.0)
    stop._watchdog()
    assert exits == [130] and "no report was written" in lines[-1]
    assert str(report) not in lines[-1]
    report.write_text("{}")
    stop._watchdog()
    assert lines[-1].endswith(f"report: {report}")


def _quiet_stop(monkeypatch, lines, exits):
    """A StopOnSignal whose actions are recorded instead of done (no thread interrupted,
    nothing killed, no exit)."""
    from fedgraph.simulations import interrupt

    monkeypatch.setattr(interrupt, "_interrupt_server_thread", lambda: None)
    monkeypatch.setattr(interrupt, "kill_descendants", lambda *a, **k: None)
    monkeypatch.setattr(interrupt.os, "_exit", exits.append)
    stop = interrupt.StopOnSignal(echo=lines.append)
    monkeypatch.setattr(stop, "_watchdog", lambda: None)
    return stop


def test_a_signal_another_thread_receives_stops_the_run_while_the_main_thread_waits(monkeypatch):
    """Flower keeps the main thread in ``Thread.join`` for the whole run, and the kernel may
    deliver a Ctrl-C to any other thread (Ray's, gRPC's). Python runs its handler only in the
    main thread once that returns to Python: the interrupt used to wait for the run's end (and
    was lost when the run then hung). The wakeup-fd watcher acts on it at once."""
    import threading

    lines, exits = [], []
    stop = _quiet_stop(monkeypatch, lines, exits)
    with stop:
        parked = threading.Event()
        other = threading.Thread(target=parked.wait, args=(10,), daemon=True)
        other.start()
        blocked = threading.Lock()
        blocked.acquire()
        unblock = threading.Thread(target=lambda: STOP.wait(10) and blocked.release(), daemon=True)
        unblock.start()
        threading.Timer(0.2, signal.pthread_kill, (other.ident, signal.SIGINT)).start()
        t0 = time.monotonic()
        acquired = blocked.acquire(timeout=6)  # the main thread, blocked as in Flower's join
        waited = time.monotonic() - t0
        stopped = STOP.is_set()
        deadline = time.monotonic() + 3
        while not lines and time.monotonic() < deadline:  # the line follows STOP.set()
            time.sleep(0.01)
        parked.set()
    assert acquired and stopped and waited < 3, (acquired, stopped, waited)
    assert sum("interrupted: stopping the run" in x for x in lines) == 1 and exits == []


def test_one_signal_is_acted_on_once_and_the_context_leaves_no_watcher(monkeypatch):
    """The watcher and the Python-level handler both see a signal; only one acts (with no
    debounce a second action would be "interrupted again" and an exit). Where something
    replaced the wakeup fd, the Python-level handler acts instead. On exit the previous wakeup
    fd is back and the watcher thread has ended."""
    import threading

    lines, exits = [], []
    stop = _quiet_stop(monkeypatch, lines, exits)
    monkeypatch.setattr(stop, "DEBOUNCE_S", 0.0)
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    with stop:
        signal.raise_signal(signal.SIGINT)
        deadline = time.monotonic() + 5
        while not STOP.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # time for a second action, were there one
        assert STOP.is_set() and exits == [], (lines, exits)
        assert sum("interrupted" in x for x in lines) == 1, lines
    watchers = [t for t in threading.enumerate() if t.name == "fedgraph-signal-watcher"]
    for t in watchers:
        t.join(2)
    assert not any(t.is_alive() for t in watchers)
    assert signal.set_wakeup_fd(before) == before

    lines.clear()
    stop = _quiet_stop(monkeypatch, lines, exits)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        with stop:
            signal.set_wakeup_fd(write_fd)  # e.g. an asyncio loop's signal handling
            signal.raise_signal(signal.SIGTERM)
            assert STOP.is_set() and sum("interrupted" in x for x in lines) == 1, lines
        assert os.read(read_fd, 8) == bytes([signal.SIGTERM])  # it reached the other fd
    finally:
        signal.set_wakeup_fd(before)
        os.close(read_fd)
        os.close(write_fd)


def test_a_simulation_that_never_returns_after_its_strategy_is_ended(monkeypatch, tmp_path):
    """Flower's runtime can wait for ever on a Ray that is gone (issue: RAY_ADDRESS where the
    cluster died): once the ServerApp's thread has ended, StopOnSignal gives it TEARDOWN_S,
    then says so, ends the run's processes and exits with the report's code."""
    import json
    import threading

    from fedgraph.simulations import interrupt

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


def test_flower_exit_stops_the_server_thread_and_waits_for_its_report():
    """``flwr stop``: Flower's exit handler (fedgraph.simulations.flower_exit.stop_and_wait) stops the
    ServerApp's thread as Ctrl-C does and returns once its report is written."""
    import threading

    from fedgraph.simulations import flower_exit, interrupt

    written = []

    def server():
        interrupt.serving()
        try:
            while True:
                time.sleep(0.01)  # server-side work, interrupted at a Python step
        except RunInterrupted:
            time.sleep(0.3)  # the strategy writes its report
            written.append("interrupted")

    thread = threading.Thread(target=server)
    thread.start()
    while not interrupt._SERVER_THREAD:
        time.sleep(0.01)
    try:
        assert flower_exit.stop_and_wait(wait=10) and written == ["interrupted"]
    finally:
        STOP.clear()
        interrupt._SERVER_THREAD.clear()
    assert flower_exit.stop_and_wait(wait=10)  # nothing running: returns at once


@pytest.mark.slow
@pytest.mark.skipif(not (PROC / "self" / "environ").exists(), reason="needs /proc")
def test_flwr_stop_leaves_an_interrupted_report_with_the_releases_so_far(tmp_path, free_port):
    """``flwr stop <run-id>`` on a GAP run under ``flwr run .`` (Flower's default federation,
    its own SuperLink, Flower home and ports): the report says ``interrupted`` and holds the
    PMA releases made before the stop."""
    marker = uuid.uuid4().hex
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "FEDGRAPH_TEST_MARKER": marker,
        "XDG_CACHE_HOME": str(tmp_path / "c"),
        "FLWR_HOME": str(tmp_path / "flwr"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    log_path = tmp_path / "log.txt"
    config = f"method='gap' classifier-rounds=100000 output-dir='{tmp_path}' run-name='stopped'"
    # The SuperLink `flwr run` would start (its command), started here: on a loaded machine
    # it takes longer than the 15 s `flwr run` waits for it.
    http_port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    superlink = subprocess.Popen(
        [
            str(bin_dir / "flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            f"127.0.0.1:{env['FLWR_LOCAL_CONTROL_API_PORT']}",
            "--host",
            "127.0.0.1",
            "--port",
            http_port,
            "--database",
            str(tmp_path / "state.db"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import urllib.request

        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2)
                break
            except OSError:
                assert superlink.poll() is None and time.time() < deadline, "no SuperLink"
                time.sleep(1)
        proc = subprocess.Popen(
            [str(bin_dir / "flwr"), "run", ".", "--stream", "--run-config", config],
            cwd=ROOT,
            env=env,
            stdout=open(log_path, "w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 400
        while "PMA (clients, via server) done" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline, log_path.read_text()[-3000:]
            time.sleep(1)
        run_id = log_path.read_text().split("Successfully started run ")[1].split()[0]
        subprocess.run(
            [str(bin_dir / "flwr"), "stop", run_id],
            cwd=tmp_path,
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        report = tmp_path / "stopped.json"
        deadline = time.time() + 120  # Flower's heartbeat brings the stop within ~30 s
        while not report.exists():
            assert time.time() < deadline, log_path.read_text()[-3000:]
            time.sleep(1)
        got = json.loads(report.read_text())
        assert got["status"] == "interrupted", got["error"]
        for client in ("client-0", "client-1"):
            releases = got["privacy"]["per_subject"][client]["releases"]
            assert [r["release"] for r in releases] == ["pma"], releases
            assert 0 < got["privacy"]["per_subject"][client]["epsilon"] <= 4 + 1e-9
    finally:
        superlink.kill()
        for pid in _marked(marker):  # the SuperLink this test started, and its children
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_fedgraph_run_exits_with_the_signals_code(monkeypatch, tmp_path, signum, code):
    """SIGTERM on ``fedgraph run`` exited 130, Ctrl-C's code (fresh user, 12-07): the code is
    128 + the signal's number, 130 for Ctrl-C (SIGINT) and 143 for SIGTERM."""
    from typer.testing import CliRunner

    from fedgraph.simulations import cli as cli_module
    from fedgraph.simulations import interrupt

    monkeypatch.setattr(interrupt, "end_all_descendants", lambda *a, **k: None)
    monkeypatch.setattr(interrupt, "kill_descendants", lambda *a, **k: None)
    monkeypatch.setattr(interrupt, "_interrupt_server_thread", lambda: None)
    monkeypatch.setattr(interrupt.StopOnSignal, "_watchdog", lambda self: None)

    def interrupted_run(*args, **kwargs):  # the run, stopped by the signal: its report says so
        signal.raise_signal(signum)
        assert STOP.wait(5)
        raise RunInterrupted("run interrupted; its report, with what was spent: x.json")

    monkeypatch.setattr(cli_module, "run_simulation", interrupted_run)
    try:
        res = CliRunner().invoke(cli_module.cli, ["run", "--set", f"output-dir='{tmp_path}'"])
    finally:
        # The signal watcher acts in its own thread and may still be starting the (patched)
        # watchdog after STOP was set: wait for it, or the real watchdog would end this
        # process's descendants and os._exit(130) it once the patches are undone (it killed
        # the suite at a later test).
        import threading

        for t in threading.enumerate():
            if t.name == "fedgraph-signal-watcher":
                t.join(10)
        STOP.clear()
    assert res.exit_code == code, res.output
    assert "run interrupted" in res.output


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_watchdog_and_a_second_signal_exit_with_the_signals_code(monkeypatch, signum, code):
    """The other two ways an interrupted ``fedgraph run`` ends (its watchdog once the report is
    written, a second signal at once) exit with the same code as the first: 128 + the
    signal's number."""
    from fedgraph.simulations import interrupt

    lines, exits = [], []
    monkeypatch.setattr(interrupt, "end_all_descendants", lambda *a, **k: None)
    stop = _quiet_stop(monkeypatch, lines, exits)
    try:
        stop._handler(signum, None)
        assert stop.exit_code == code and exits == []
        stop.grace = stop.report_wait = 0.0
        interrupt.StopOnSignal._watchdog(stop)  # the report written: the run's processes end
        stop.first -= interrupt.StopOnSignal.DEBOUNCE_S + 0.1
        stop._handler(signum, None)  # "interrupted again"
        assert exits == [code, code], exits
    finally:
        STOP.clear()
