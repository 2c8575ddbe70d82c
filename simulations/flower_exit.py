"""``flwr stop <run-id>`` (and SIGINT/SIGTERM to the simulation) under ``flwr run``: the report
is written, with status ``interrupted`` and every release made so far.

Flower's simulation process learns of a stop from its heartbeat, which raises SIGINT; the
signal's handler (``flwr.supercore.exit.flwr_exit``) runs the registered exit handlers and
ends the process, the ServerApp's thread with it. :func:`write_report_on_flower_exit`
registers a handler that first stops the ServerApp as a Ctrl-C of ``fedgraph run`` does
(:data:`fedgraph.simulations.interrupt.STOP`: the grid gives up waiting; the server thread's own
computation is interrupted at its next Python step), then waits until the strategy has
written its report (:meth:`fedgraph.strategies.base.PrivateStrategy.start`).
"""

from __future__ import annotations

import threading
import time

from fedgraph.simulations import interrupt

__all__ = ["REPORT_WAIT_S", "stop_and_wait", "write_report_on_flower_exit"]

#: seconds Flower's exit waits for the strategy to write its report
REPORT_WAIT_S = 60.0
_REGISTERED: list[bool] = []


def _server_alive() -> bool:
    return any(t.ident in interrupt._SERVER_THREAD and t.is_alive() for t in threading.enumerate())


def stop_and_wait(wait: float = REPORT_WAIT_S) -> bool:
    """Stop the running ServerApp (:data:`~fedgraph.simulations.interrupt.STOP`, its thread
    interrupted) and wait up to ``wait`` seconds for its thread to end. Returns whether it
    ended (True at once when no ServerApp is running in this process)."""
    if not _server_alive() or threading.get_ident() in interrupt._SERVER_THREAD:
        return not _server_alive()
    interrupt.STOP.set()
    interrupt._interrupt_server_thread()
    end = time.monotonic() + wait
    while _server_alive() and time.monotonic() < end:
        time.sleep(0.1)
    return not _server_alive()


def write_report_on_flower_exit() -> None:
    """Register :func:`stop_and_wait` with Flower's exit handlers (once per process; run
    before Flower's force-exit timer starts). Harmless where Flower never exits through
    ``flwr_exit`` (``fedgraph run``, whose own signal handlers do the same)."""
    if _REGISTERED:
        return
    from flwr.supercore.exit import add_exit_handler

    add_exit_handler(stop_and_wait, run_before_force_exit=True)
    _REGISTERED.append(True)
