"""The second heartbeat sender of ``flwr run``'s task process (issue 61, item 1): the SuperLink
marked a run's task failed ("No heartbeat received from the task") 60 s after it started on a
loaded machine, while the run went on. The sender reads the task's address and token from
its process's command line, heartbeats every few seconds with its own short-timeout client,
and stops when the SuperLink says the task is over; elsewhere it does nothing."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flwr.proto.runtime_pb2 import SendTaskHeartbeatResponse  # pylint: disable=E0611

from fedgraph.simulations import task_heartbeat


def test_only_a_flower_task_process_command_line_starts_it():
    argv = [
        "/x/flwr-simulation",
        "--runtime-api-address",
        "127.0.0.1:5",
        "--token",
        "tok",
        "--insecure",
        "--parent-pid",
        "7",
    ]
    assert task_heartbeat.runtime_args(argv) == ("127.0.0.1:5", "tok")
    assert task_heartbeat.runtime_args(["fedgraph", "run", "ppgnn-cora"]) is None
    assert task_heartbeat.runtime_args(argv[:5]) is None  # TLS: not ours to handle
    assert task_heartbeat.start(["python", "-m", "pytest"]) is False  # this process: nothing


def test_it_heartbeats_with_the_token_until_the_task_is_over():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen.append((self.path, self.headers.get("flwr-task-token")))
            if len(seen) == 2:  # a slow answer: past the call's timeout, counted as failed
                time.sleep(0.6)
            body = SendTaskHeartbeatResponse(success=len(seen) < 5).SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/protobuf")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    old = task_heartbeat.CALL_TIMEOUT_S
    task_heartbeat.CALL_TIMEOUT_S = 0.3
    try:
        argv = [
            "flwr-simulation",
            "--runtime-api-address",
            f"127.0.0.1:{server.server_address[1]}",
            "--token",
            "secret-token",
            "--insecure",
        ]
        assert task_heartbeat.start(argv, interval=0.05)
        deadline = time.time() + 20
        while task_heartbeat._STATE["thread"].is_alive() and time.time() < deadline:
            time.sleep(0.05)
        stats = task_heartbeat.stats()
    finally:
        task_heartbeat.stop()
        task_heartbeat.CALL_TIMEOUT_S = old
        server.shutdown()
    assert not task_heartbeat._STATE["thread"].is_alive()  # stopped: the task was over
    assert all(
        path == "/v1/runtime/send-task-heartbeat" and token == "secret-token"
        for path, token in seen
    )
    assert stats["ended"] == "task no longer running"
    assert stats["sent"] == 5 and stats["acknowledged"] == 3 and stats["failed"] == 1, stats
    assert 0 < stats["max_gap_s"] < 10
