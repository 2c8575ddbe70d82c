"""A local Ray cluster of one's own, started and stopped without touching another one
(``fedgraph cluster start`` / ``fedgraph cluster stop``; issue 61).

``ray start --head`` is the documented way to start a cluster, and ``ray stop`` stops every
Ray of the machine (another user's, another job's); SIGTERM to the processes one sees left
gcs_server, the raylet, the monitor, two agents and the client server alive after 10 s.
:func:`start` runs ``ray start --head`` with a temporary folder of its own (``--temp-dir``)
and a free port, and records both in ``<folder>/fedgraph-cluster.json``; every process of that
cluster names the folder on its command line (Ray passes it to each as its session and log
folder), and its workers are their children. :func:`stop` signals exactly those processes and
their descendants (SIGTERM, then SIGKILL after ``grace_s``) and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["RECORD", "cluster_pids", "start", "stop"]

#: the file in the cluster's folder that records its address
RECORD = "fedgraph-cluster.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line with NULs as spaces) of every process."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(proc.name)] = (ppid, cmd)
    return out


def cluster_pids(folder: str | Path) -> list[int]:
    """The processes of the cluster whose temporary folder is ``folder``: Ray's processes that
    name it (the folder itself or a path inside it, not a folder whose name only starts the
    same), and all their descendants (the workers); never this process."""
    folder = str(Path(folder).resolve())
    names = re.compile(re.escape(folder) + r"(?=/|\s|$)")
    procs = _processes()
    roots = {
        pid
        for pid, (_, cmd) in procs.items()
        if "ray" in cmd and names.search(cmd) and pid != os.getpid()
    }
    found, todo = set(roots), list(roots)
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in found and pid != os.getpid():
                found.add(pid)
                todo.append(pid)
    return sorted(found)


def start(
    folder: str | Path | None = None,
    port: int | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    timeout: float = 300.0,
) -> dict:
    """Start a Ray head on 127.0.0.1 with its own temporary ``folder`` (default: a new one
    under /tmp, short: Ray's unix sockets live in it, 107 bytes at most) and ``port``
    (default: a free one). Returns the record ``{"address", "folder"}``, also written to
    ``<folder>/fedgraph-cluster.json``.

    Raises:
        RuntimeError: ``ray start`` failed (its output in the message).
    """
    folder = Path(folder or tempfile.mkdtemp(prefix="fgray-", dir="/tmp")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    # Ray's other fixed ports (client server 10001, dashboard 8265, its agent 52365, ...)
    # would meet a second cluster's on the same machine: free ones too.
    extra = {
        flag: _free_port()
        for flag in (
            "--ray-client-server-port",
            "--dashboard-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
        )
    }
    ray = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray if ray.exists() else "ray"),
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={folder}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        *(f"{flag}={p}" for flag, p in extra.items()),
    ]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if res.returncode != 0:
        stop(folder)
        raise RuntimeError(
            f"ray start failed (exit {res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}"
        )
    record = {"address": f"127.0.0.1:{port}", "folder": str(folder)}
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def _start_time(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def stop(folder: str | Path, grace_s: float = 10.0) -> list[int]:
    """Stop the cluster whose temporary folder is ``folder`` (:func:`cluster_pids`): SIGTERM,
    then SIGKILL to any left after ``grace_s``. Returns the pids still alive (``[]``: all
    stopped); processes of other clusters are never signalled. The processes are taken once,
    before the first signal, and followed by pid and start time: an agent whose raylet ended
    first is no longer the raylet's child (it outlived SIGTERM that way)."""
    ours = {pid: _start_time(pid) for pid in cluster_pids(folder)}

    def alive() -> list[int]:
        for pid in cluster_pids(folder):  # started meanwhile (a worker)
            ours.setdefault(pid, _start_time(pid))
        return sorted(
            pid
            for pid, started in ours.items()
            if started is not None
            and _start_time(pid) == started
            and (Path("/proc") / str(pid) / "cmdline").read_bytes() != b""
        )

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not alive():
            return []
    return alive()
