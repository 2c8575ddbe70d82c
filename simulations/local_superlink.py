"""What ``scripts/main.sh`` needs around ``flwr run .`` (issue 61): ports of its own for the
SuperLink it starts, and the run's real outcome.

Ports: ``flwr run`` starts (or reuses) a local SuperLink on 127.0.0.1:39091 (HTTP/runtime API)
and 39093 (Control API) unless ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` and
``FLWR_LOCAL_CONTROL_API_PORT`` say otherwise, with its state under ``$FLWR_HOME`` (default
``~/.flwr``). Two apps on one machine then meet on one SuperLink: a run of another checkout
arrived at a new user's. :func:`free_ports` gives distinct ports free now (``ports`` on the
command line prints two).

Outcome: ``flwr run`` exits 0 whatever happened, and its log stream ends when the SuperLink
marks the run finished, even where the run's process goes on (marked failed for a missed
heartbeat, it still wrote an ``ok`` report 12 s later). :func:`verdict` reads the report the run
wrote and the SuperLink's own status of the run (``flwr ls --run-id ID --format json``), waits
for a run process that is still going, and says what really happened: ``ok`` whenever an
``ok`` report exists (with Flower's reason beside it where Flower said otherwise), else
``FAILED`` with the report's error and Flower's reason (``verdict`` on the command line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["flower_status", "free_ports", "run_processes", "verdict"]

TROUBLESHOOTING = "docs/how-to/troubleshooting.md"


def free_ports(n: int = 2, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports of ``host`` free now (all bound at once, then released: the
    kernel never hands out one twice). Another process may still take one before the
    SuperLink binds it: ``scripts/main.sh`` then tries again with new ones."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_processes(runtime_address: str) -> list[int]:
    """Pids of the task processes (``flwr-simulation``, ``flwr-serverapp``) that talk to the
    SuperLink whose runtime API is ``runtime_address``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if (
            any(Path(a).name in ("flwr-simulation", "flwr-serverapp") for a in argv[:2])
            and runtime_address in argv
        ):
            out.append(int(proc.name))
    return out


def state_db_status(run_id: str, home: str | Path | None = None) -> tuple[str, str] | None:
    """``(status, details)`` of run ``run_id`` from the local SuperLink's database
    (``$FLWR_HOME/local-superlink/state.db``, read only: the run's primary task, as ``flwr
    ls`` shows it), or ``None`` where there is none or its layout is not Flower 1.42's."""
    import sqlite3

    home = Path(home or os.environ.get("FLWR_HOME") or Path.home() / ".flwr")
    db = home / "local-superlink" / "state.db"
    if not db.is_file():
        return None
    rid = int(run_id)
    rid = rid - 2**64 if rid >= 2**63 else rid  # Flower stores uint64 ids as int64
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            row = con.execute(
                "SELECT t.pending_at, t.starting_at, t.running_at, t.finished_at, "
                "t.sub_status, t.details FROM run r JOIN task t ON t.task_id = "
                "r.primary_task_id WHERE r.run_id = ?",
                (rid,),
            ).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    _, starting, running, finished, sub_status, details = row
    status = (
        f"finished:{sub_status}"
        if finished
        else "running"
        if running
        else "starting"
        if starting
        else "pending"
    )
    return status, details or ""


def flower_status(run_id: str, timeout: float = 90.0) -> tuple[str, str] | None:
    """``(status, details)`` of run ``run_id`` as the SuperLink has it (e.g.
    ``("finished:failed", "No heartbeat received from the task")``): from its database
    (:func:`state_db_status`, instant), else ``flwr ls --run-id ID --format json`` (a minute
    on a loaded machine), else ``None`` (no SuperLink, an old Flower)."""
    found = state_db_status(run_id)
    if found is not None:
        return found
    try:
        res = subprocess.run(
            ["flwr", "ls", "--run-id", str(run_id), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        runs = json.loads(res.stdout[res.stdout.index("{") :])["runs"]
        return str(runs[0]["status"]), str(runs[0].get("status-details") or "")
    except (OSError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired):
        return None


def _report_path(log: str, expected: str | None) -> Path | None:
    said = re.findall(r"^report: (.*\.json)$", log, flags=re.MULTILINE)
    if said:
        return Path(said[-1])
    return Path(expected) if expected else None


def verdict(
    log: str,
    expected: str | None = None,
    runtime_address: str | None = None,
    wait_s: float = 600.0,
    status=flower_status,
    processes=run_processes,
    sleep=time.sleep,
) -> tuple[int, list[str], list[str]]:
    """The run's outcome from ``flwr run``'s ``log``: ``(exit code, stdout lines, stderr
    lines)``. ``expected``: the report's path when the log names none (the script's own
    output-dir and run-name); ``runtime_address``: the SuperLink's, to wait (at most
    ``wait_s``) for a run process still going when there is no report yet."""
    ids = re.findall(r"Successfully started run (\d+)", log)
    run_id = ids[0] if ids else None
    report = _report_path(log, expected)
    flower = status(run_id) if run_id else None
    deadline = time.monotonic() + wait_s
    # The log stream ended but the run's process may go on (the SuperLink stopped waiting
    # for it): its report comes when it ends.
    while (
        runtime_address
        and (report is None or not report.exists())
        and processes(runtime_address)
        and time.monotonic() < deadline
    ):
        sleep(2.0)
        report = _report_path(log, expected)
    if flower is None and run_id:
        flower = status(run_id)
    said = (
        (f"Flower's status of run {run_id}: {flower[0]}" + (f" ({flower[1]})" if flower[1] else ""))
        if flower
        else None
    )
    failed_by_flower = bool(flower) and flower[0] != "finished:completed"
    hint = []
    if flower and "heartbeat" in flower[1].lower():
        hint = [
            f"  the SuperLink stopped waiting for the run's heartbeats (60 s without one); "
            f"see {TROUBLESHOOTING}#no-heartbeat-received-from-the-task"
        ]
    data = None
    if report is not None and report.exists():
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError) as err:
            return (
                1,
                [],
                [f"FAILED: the report {report} cannot be read ({err})"] + ([said] if said else []),
            )
    if data is None:
        where = f"no report at {report}" if report else "the run wrote no report"
        return 1, [], [f"FAILED: {where} (see the log above)"] + ([said] if said else []) + hint
    if data.get("status") != "ok":
        return (
            1,
            [],
            [f"FAILED: {data.get('error')}; report {report}"]
            + ([said] if said and failed_by_flower else [])
            + hint,
        )
    test = (data.get("accuracy") or {}).get("test")
    line = (
        f"ok: test accuracy {test:.4f}; report {report}"
        if isinstance(test, float)
        else f"ok: report {report}"
    )
    if data.get("status_note"):  # a mode chosen knowing it has no finite epsilon
        line += f" ({data['status_note'].split(':', 1)[0]})"
    err = []
    if failed_by_flower:  # the run completed: Flower's mark is about its process, not its result
        err = [f"note: {said}; the run itself completed and wrote an ok report"] + hint
    return 0, [line], err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgraph.simulations.local_superlink")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ports", help="print two free ports of 127.0.0.1")
    v = sub.add_parser("verdict", help="the outcome of a flwr run from its log")
    v.add_argument("--log", required=True, help="the file holding flwr run's output")
    v.add_argument("--expected", help="the report's path if the log names none")
    v.add_argument("--runtime-address", help="the SuperLink's runtime API (host:port)")
    v.add_argument(
        "--wait", type=float, default=600.0, help="seconds to wait for a run process still going"
    )
    args = parser.parse_args(argv)
    if args.command == "ports":
        print(*free_ports(2))
        return 0
    log = Path(args.log).read_text(errors="replace")
    code, out, err = verdict(log, args.expected, args.runtime_address, args.wait)
    for line in err:
        print(line, file=sys.stderr)
    for line in out:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
