"""Out-of-band timing of the ClientApp's handlers, for benchmarks: with the environment
variable ``FEDGRAPH_HANDLER_TIMES`` naming a file, every message a client handles appends one
JSON line to it: ``{"type": <message type>, "start": <epoch s>, "seconds": <handler wall s>,
"pid": <worker process>}``. ``bench/scale.py`` reads it to split a whole run's time into
setup / communication / compute (with the report's per-phase ``exchange_s``: the server's
waits on its clients).

Off (no cost) unless the variable is set; nothing is added to any message: how long a handler
takes depends on the client's private data (PMA's time on its edge count, which edge-level DP
protects), so it must not leave the client through the federation. A Flower mod (``ClientApp(
mods=[handler_times])``): it wraps every handler the ClientApp registers.
"""

from __future__ import annotations

import json
import os
import time

from flwr.app import Context, Message

#: the environment variable naming the file (unset: off)
ENV = "FEDGRAPH_HANDLER_TIMES"


def handler_times(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: time ``call_next`` and append its line (module docs)."""
    path = os.environ.get(ENV)
    if not path:
        return call_next(msg, context)
    start, t0 = time.time(), time.perf_counter()
    try:
        return call_next(msg, context)
    finally:
        line = json.dumps(
            {
                "type": msg.metadata.message_type,
                "start": round(start, 4),
                "seconds": round(time.perf_counter() - t0, 6),
                "pid": os.getpid(),
            }
        )
        # one write per line, O_APPEND: lines of concurrent workers do not interleave
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read(path: str | os.PathLike) -> list[dict]:
    """The lines of a ``FEDGRAPH_HANDLER_TIMES`` file (none if it does not exist)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
