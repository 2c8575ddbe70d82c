"""``scripts/main.sh`` around ``flwr run .`` (issue 61): ports and a Flower home of its own, so
that two runs on one machine do not meet on one SuperLink, and a verdict from the report and
the SuperLink's own status of the run: the SuperLink marked a run failed ("No heartbeat
received from the task") that went on to write an ``ok`` report, and the script said FAILED."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedgraph.simulations import local_superlink as ls

ROOT = Path(__file__).resolve().parents[1]


def test_two_launches_at_once_get_different_free_ports():
    cmd = [sys.executable, "-m", "fedgraph.simulations.local_superlink", "ports"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    ports = [int(p) for proc in procs for p in proc.communicate(timeout=120)[0].split()]
    assert len(ports) == 4 and len(set(ports)) == 4, ports
    import socket

    for port in ports:  # free now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_script_takes_its_own_ports_and_home_unless_given():
    text = (ROOT / "scripts" / "main.sh").read_text()
    # the user's ports are kept; otherwise free ones are picked and exported for flwr run
    assert "python -m fedgraph.simulations.local_superlink ports" in text
    assert "export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=" in text
    assert re.search(r'if \[ -z "\$\{FLWR_HOME:-\}" \]; then\n\s+own_home=\$\(mktemp -d', text)


LOG = "INFO : Successfully started run 42\nreport: {path}\n"


def _report(tmp_path, status="ok", test=0.8375, error=None) -> Path:
    path = tmp_path / "main.json"
    path.write_text(json.dumps({"status": status, "error": error, "accuracy": {"test": test}}))
    return path


def test_an_ok_report_is_an_ok_run_even_where_flower_marked_it_failed(tmp_path):
    path = _report(tmp_path)
    failed = ("finished:failed", "No heartbeat received from the task")
    code, out, err = ls.verdict(
        LOG.format(path=path), status=lambda run_id: failed, processes=lambda addr: []
    )
    assert code == 0 and out == [f"ok: test accuracy 0.8375; report {path}"]
    assert "finished:failed (No heartbeat received from the task)" in err[0]
    assert "troubleshooting" in err[1]
    code, out, err = ls.verdict(
        LOG.format(path=path),
        status=lambda run_id: ("finished:completed", ""),
        processes=lambda addr: [],
    )
    assert (code, err) == (0, [])


def test_no_report_yet_waits_for_the_run_process_then_says_flowers_reason(tmp_path):
    path = tmp_path / "late.json"
    log = "Successfully started run 7\n"  # the stream ended before the report line
    alive = [3]

    def processes(addr):
        assert addr == "127.0.0.1:5"
        return list(alive)

    def sleep(s):  # the run goes on and writes its report, then ends
        _report(tmp_path).rename(path)
        alive.clear()

    code, out, err = ls.verdict(
        log,
        expected=str(path),
        runtime_address="127.0.0.1:5",
        status=lambda run_id: ("finished:failed", "No heartbeat received from the task"),
        processes=processes,
        sleep=sleep,
    )
    assert code == 0 and out[0].startswith("ok: test accuracy"), (out, err)
    # no report at all: FAILED with Flower's reason, not only "wrote no report"
    code, out, err = ls.verdict(
        log,
        expected=str(tmp_path / "none.json"),
        status=lambda run_id: ("finished:failed", "No heartbeat received from the task"),
        processes=lambda addr: [],
    )
    assert code == 1 and out == []
    assert err[0].startswith("FAILED: no report at") and "run 7: finished:failed" in err[1]


def test_a_failed_report_fails_with_its_error(tmp_path):
    path = _report(tmp_path, status="failed", error="ClientFailure: boom")
    code, out, err = ls.verdict(
        LOG.format(path=path),
        status=lambda run_id: ("finished:completed", ""),
        processes=lambda addr: [],
    )
    assert code == 1 and err == [f"FAILED: ClientFailure: boom; report {path}"]


@pytest.mark.slow
def test_two_main_scripts_at_once_both_end_ok_each_with_its_own_report(tmp_path):
    """Two ``bash scripts/main.sh`` at once, neither given ports nor a Flower home: each
    starts a SuperLink of its own and ends ok with its own report (they met on 39091)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")
    }
    results = {}

    def run(name):
        out = tmp_path / name
        results[name] = subprocess.run(
            [
                "bash",
                "scripts/main.sh",
                "--run-config",
                f"output-dir='{out}' run-name='{name}' epochs=5 num-clients=10",
            ],
            cwd=ROOT,
            env={**env, "XDG_CACHE_HOME": str(tmp_path / f"cache-{name}")},
            capture_output=True,
            text=True,
            timeout=900,
        )

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    links = set()
    for name, res in results.items():
        log = res.stdout + res.stderr
        assert res.returncode == 0, log[-3000:]
        report = tmp_path / name / f"{name}.json"
        assert f"; report {report}" in res.stdout, log[-3000:]
        assert json.loads(report.read_text())["status"] == "ok"
        links.add(re.search(r"SuperLink: (127\.0\.0\.1:\d+)", res.stdout).group(1))
    assert len(links) == 2, links


def test_flowers_status_is_read_from_the_superlinks_database(tmp_path):
    """``state.db`` as Flower 1.42 lays it out (the run's primary task): instant, where ``flwr
    ls`` took a minute on a loaded machine; run ids above 2**63 are stored as int64."""
    import sqlite3

    db = tmp_path / "local-superlink" / "state.db"
    db.parent.mkdir()
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE run (run_id INTEGER, primary_task_id INTEGER)")
    con.execute(
        "CREATE TABLE task (task_id INTEGER, pending_at TEXT, starting_at TEXT, "
        "running_at TEXT, finished_at TEXT, sub_status TEXT, details TEXT)"
    )
    big = 2**63 + 5
    con.execute("INSERT INTO run VALUES (?, 11)", (big - 2**64,))
    con.execute(
        "INSERT INTO task VALUES (11, 'a', 'b', 'c', 'd', 'failed', "
        "'No heartbeat received from the task')"
    )
    con.execute("INSERT INTO run VALUES (7, 12)")
    con.execute("INSERT INTO task VALUES (12, 'a', 'b', 'c', NULL, '', '')")
    con.commit()
    con.close()
    assert ls.state_db_status(str(big), tmp_path) == (
        "finished:failed",
        "No heartbeat received from the task",
    )
    assert ls.state_db_status("7", tmp_path) == ("running", "")
    assert ls.state_db_status("8", tmp_path) is None
    assert ls.state_db_status("7", tmp_path / "nowhere") is None
