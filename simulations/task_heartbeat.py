"""Task heartbeats that a loaded machine does not lose (issue 61, item 1).

Under ``flwr run``, the SuperLink marks a running task failed with "No heartbeat received from
the task" once ``HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL`` = 2 x 30 s = 60 s pass
without one of its heartbeats (``flwr.supercore.corestate``; both are constants, set by no
option or environment variable). Flower's own sender in the task's process
(``flwr.supercore.heartbeat.HeartbeatSender``) sends one every 17.5-22.5 s, so two or three
tries fit in the 60 s; each goes through the process's shared Runtime API client, whose calls
wait up to 30 s for an answer and whose retries wait, under one lock shared by every thread of
the process, for the backoff of any other failing call (``make_simple_http_retry_invoker``).
On a loaded machine (2 cores, load 6-7) the run's task was marked failed exactly 60.0 s after
it started, while the run went on and wrote an ``ok`` report: not one heartbeat got through
after the task's start. (Not reproduced at load 8-16 here, where Flower's heartbeats arrived
every 19-21 s: the stall of those runs is not known, only that 2-3 lost heartbeats suffice.)

:func:`start` adds a second sender to the task's process, independent of Flower's client: its
own HTTP client, a call timeout of :data:`CALL_TIMEOUT_S`, no retry lock, one heartbeat every
:data:`INTERVAL_S`, so that about a dozen tries fit in the SuperLink's 60 s instead of two or
three. It reads the task's Runtime API address and token from the process's own command line
(``flwr-simulation --runtime-api-address ADDR --token TOKEN --insecure``, as Flower's
SuperExec starts it); in any other process (``fedgraph run``, a Ray worker, a TLS deployment)
it does nothing. It stops at the first answer saying the task is over (``success = false``, or
HTTP 401/403/404: the SuperLink no longer knows the token). :func:`stats` (the report's
``host.task_heartbeats``) says how many it sent, how many failed and the longest gap between
two acknowledged ones: a gap near 60 s is what would have failed the run.
"""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["CALL_TIMEOUT_S", "INTERVAL_S", "runtime_args", "start", "stats", "stop"]

#: seconds between two heartbeats of this sender (Flower's: 17.5-22.5 s)
INTERVAL_S = 5.0
#: seconds one heartbeat may wait for its answer (Flower's shared client: 30 s)
CALL_TIMEOUT_S = 10.0

_LOCK = threading.Lock()
_STATE: dict = {
    "thread": None,
    "stop": threading.Event(),
    "sent": 0,
    "acknowledged": 0,
    "failed": 0,
    "max_gap_s": 0.0,
    "max_call_s": 0.0,
    "ended": None,
}


def runtime_args(argv: list[str]) -> tuple[str, str] | None:
    """``(runtime API address, token)`` from a Flower task process's command line
    (``--runtime-api-address ADDR --token TOKEN --insecure``), or ``None`` where the command
    line is not one (or uses TLS, whose certificates this sender does not read)."""

    def value(flag: str) -> str | None:
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None

    address, token = value("--runtime-api-address"), value("--token")
    if not address or not token or "--insecure" not in argv:
        return None
    return address, token


def _client(address: str, token: str):
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient(
        f"http://{address}",
        verify=False,
        timeout=CALL_TIMEOUT_S,
        interceptors=[
            RuntimeVersionHttpInterceptor(component_name="flwr-simulation"),
            RuntimeTokenHttpInterceptor(token=token),
        ],
    )


def _run(address: str, token: str, stop_event: threading.Event, interval: float) -> None:
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest  # pylint: disable=E0611

    client = _client(address, token)
    last_ack = time.monotonic()
    try:
        while not stop_event.is_set():
            began = time.monotonic()
            _STATE["sent"] += 1
            try:
                res = client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            except httpx.HTTPStatusError as err:
                if err.response.status_code in (401, 403, 404):  # the task is over
                    _STATE["ended"] = f"HTTP {err.response.status_code}"
                    return
                _STATE["failed"] += 1
            except Exception:  # noqa: BLE001 - a timeout, a refused connection: try again
                _STATE["failed"] += 1
            else:
                now = time.monotonic()
                if not res.success:  # the SuperLink says the task is finished or expired
                    _STATE["ended"] = "task no longer running"
                    return
                _STATE["acknowledged"] += 1
                _STATE["max_gap_s"] = max(_STATE["max_gap_s"], now - last_ack)
                last_ack = now
            _STATE["max_call_s"] = max(_STATE["max_call_s"], time.monotonic() - began)
            stop_event.wait(interval)
    finally:
        client.close()


def start(argv: list[str] | None = None, interval: float = INTERVAL_S) -> bool:
    """Start the second heartbeat sender in this process, once; ``True`` if it runs (this
    is a Flower task process), ``False`` otherwise. Never raises."""
    args = runtime_args(sys.argv if argv is None else argv)
    if args is None:
        return False
    with _LOCK:
        thread = _STATE["thread"]
        if thread is not None and thread.is_alive():
            return True
        try:
            _client(*args).close()  # Flower's client classes are there (else: Flower's only)
        except Exception:  # noqa: BLE001 - another Flower: leave its own sender alone
            return False
        _STATE["stop"] = threading.Event()
        thread = threading.Thread(
            target=_run,
            args=(*args, _STATE["stop"], interval),
            name="fedgraph-task-heartbeat",
            daemon=True,
        )
        _STATE["thread"] = thread
        thread.start()
    return True


def stop(timeout: float = 2.0) -> None:
    """Stop the sender (tests; the process's end stops it too: a daemon thread)."""
    _STATE["stop"].set()
    thread = _STATE["thread"]
    if thread is not None:
        thread.join(timeout)


def stats() -> dict | None:
    """What the sender did (``None`` where it never ran): heartbeats sent, acknowledged and
    failed, the longest gap in seconds between two acknowledged ones (counted from the
    sender's start), the slowest call, and why it ended if it did."""
    if _STATE["thread"] is None:
        return None
    return {
        k: (round(v, 2) if isinstance(v, float) else v)
        for k, v in _STATE.items()
        if k not in ("thread", "stop")
    }
