"""``scripts/main.sh`` (the README's main command, ``flwr run .``) when interrupted: Ctrl-C ended
only ``flwr run``'s log stream, the run went on in the SuperLink and wrote an ``ok`` report
after the script had said there was none (fresh user, 12-07). It now stops the run, says so and
exits 130 (SIGTERM: 143, 128 + the signal's number, as ``fedgraph run``). A SIGTERM sent to
the script alone (not its process group) waited for the whole run, then claimed to have stopped
it (fresh user, 12-07, afternoon)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fedgraph import procstats

ROOT = Path(__file__).resolve().parents[1]


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = [int(x) for x in out.split()]
    return kids + [d for k in kids for d in _descendants(k)]


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_on_the_main_script_stops_the_run_and_says_so(tmp_path, free_port, signum, code):
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr"),  # a SuperLink of its own
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    proc = subprocess.Popen(
        ["bash", "scripts/main.sh", "--run-config", "epochs=400"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # a terminal's Ctrl-C: SIGINT as the default action, even where
        # this test runs with it ignored (a background job of a script)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines, started = [], None
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Successfully started run" in line:
                started = time.time()
                break
        assert started, "".join(lines)[-3000:]
        time.sleep(3)  # the run is on
        tree = _descendants(proc.pid)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C in the terminal: the whole group
        else:
            os.kill(proc.pid, signum)  # `kill`, a scheduler, `timeout`: the script alone
        signalled = time.time()
        rest, _ = proc.communicate(timeout=120)
        # at once, not after the run (epochs=400: minutes; bash ran its trap only then)
        assert time.time() - signalled < 60, "".join(lines)[-3000:] + rest[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines) + rest
    assert proc.returncode == code, out[-3000:]
    said = re.search(
        r"interrupted: the run was stopped \(run \d+\); no complete report "
        r"at (\S+\.json)",
        out,
    )
    assert said, out[-3000:]
    report = Path(said.group(1))

    def alive():
        return [p for p in tree if procstats.alive(p)]

    # the SuperLink, its SuperExec, the simulation and its Ray end (a run left going wrote an
    # ok report some seconds later; with them gone, nothing is left to write one)
    deadline = time.time() + 30
    while alive() and time.time() < deadline:
        time.sleep(0.5)
    assert not alive(), alive()
    # none, or the stopped run's own (status interrupted, as `fedgraph run` writes on Ctrl-C)
    assert not report.exists() or json.loads(report.read_text())["status"] == "interrupted"


def test_main_script_checks_the_report_the_run_wrote_under_the_users_name(tmp_path, free_port):
    """The README's main command to the end, with the user's own ``output-dir`` and
    ``run-name`` (the script's header invites extra ``--run-config``): it checked its own
    default path and said FAILED for a run that wrote an ``ok`` report (fresh user, 12-07)."""
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr"),  # a SuperLink of its own
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    out = tmp_path / "mine"
    res = subprocess.run(
        [
            "bash",
            "scripts/main.sh",
            "--run-config",
            f"output-dir='{out}' run-name='users' epochs=5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    report = out / "users.json"
    assert json.loads(report.read_text())["status"] == "ok"
    assert f"; report {report}" in res.stdout, log[-3000:]
