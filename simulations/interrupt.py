"""Ctrl-C for ``fedgraph run``: stop the run in seconds, write its report, leave no process.

The first SIGINT (or SIGTERM) sets :data:`STOP`; the ServerApp's grid is wrapped in
:class:`fedgraph.simulations.grid.InterruptibleGrid`, whose ``send_and_receive`` polls for replies and
raises :class:`RunInterrupted` as soon as :data:`STOP` is set (Flower's own strategies call
the same method), so the strategy's ``start`` writes its report with status ``interrupted``
and what was spent so far. :func:`kill_descendants` then ends every process the run started (Ray's
GCS, raylet, workers and agents), which outlive ``ray.shutdown`` when a run is cut short. A
second SIGINT ends the command at once.

The signals are acted on by a thread of their own, woken by Python's wakeup fd
(:func:`signal.set_wakeup_fd`), not by the Python-level handler: that one runs only in the main
thread, and only once the main thread returns to Python. Flower's simulation keeps the main
thread in a ``Thread.join`` for the whole run; a signal the kernel delivers to one of the other
threads (Ray's, gRPC's; Linux picks another thread when the main one already has a signal
pending) then waited until the run ended, and, with Ray's workers hit by the same Ctrl-C, for
ever (the teardown watchdog ended it after :data:`StopOnSignal.TEARDOWN_S`, exit 0, the
interrupt lost).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from fedgraph.errors import RunInterrupted
from fedgraph.procstats import alive, become_subreaper, descendants, kill_descendants

# Neither torch nor Flower: ``fedgraph run`` imports this module before it starts Ray.
__all__ = ["STOP", "RunInterrupted", "StopOnSignal", "end_all_descendants", "signal_exit_code"]

#: set by the first Ctrl-C of ``fedgraph run``; every grid call after it raises.
STOP = threading.Event()
#: the report the running ``fedgraph run`` writes (named in the last line of an interrupt)
REPORT_PATH: list = []
#: ident of the thread running the ServerApp (set by :func:`serving`), to interrupt its
#: server-side computation (training, propagation) as well as its waits
_SERVER_THREAD: list[int] = []


def serving() -> None:
    """Called by the ServerApp's ``main``: this thread is the one a Ctrl-C interrupts."""
    _SERVER_THREAD[:] = [threading.get_ident()]


def _interrupt_server_thread() -> None:
    """Raise :class:`RunInterrupted` in the ServerApp's thread at its next Python step (CPython's
    ``PyThreadState_SetAsyncExc``: a torch call in C finishes first)."""
    import ctypes

    for ident in _SERVER_THREAD:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(RunInterrupted)
        )


def _keep_our_sigterm_handler() -> None:
    """``ray.init`` replaces the main thread's SIGTERM handler with ``sys.exit`` (which crashes
    Flower's simulation without a report): make Ray's setter leave ours in place. Its core
    worker also installs absl's failure-signal handler for SIGTERM at the C level, above
    Python's (a SIGTERM then dumps a stack and aborts, exit 134, before the report is written):
    ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` keeps it out of this driver (read when Ray's
    constants are imported, so set here and on the module if Ray is already imported)."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] == "1":
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return
    if hasattr(ray_utils, "set_sigterm_handler"):
        ray_utils.set_sigterm_handler = lambda handler: None


def end_all_descendants(known: set[int] | None = None, within: float = 10.0) -> None:
    """Kill ``known`` and every descendant of this process, again and again until none is
    left or ``within`` seconds passed: processes orphaned while Ray shuts down are re-parented
    to this process (:func:`become_subreaper`) after a first pass."""
    end = time.monotonic() + within
    pids = {p for p in set(known or ()) | descendants() if alive(p)}
    while pids and time.monotonic() < end:
        kill_descendants(pids, grace=1.0)  # returns once they are dead (or after the grace):
        time.sleep(0.02)  # their children are this process's by then; a moment for stragglers
        pids = {p for p in descendants() if alive(p)}


def signal_exit_code(signum: int) -> int:
    """The shell's exit code of a command ended by signal ``signum``: 128 + its number (130
    for SIGINT, Ctrl-C; 143 for SIGTERM)."""
    return 128 + int(signum)


class StopOnSignal:
    """Context manager of ``fedgraph run``: the first SIGINT/SIGTERM sets :data:`STOP` and
    prints one line; a second one kills the run's processes and exits at once. Either way the
    exit code is the signal's (:func:`signal_exit_code`: 130 for Ctrl-C, 143 for SIGTERM;
    :attr:`exit_code`).
    Ray's processes started meanwhile are remembered so that :func:`kill_descendants` finds
    them even after their parent died. A simulation that does not return within
    :data:`TEARDOWN_S` of its ServerApp's end is ended too (:meth:`_teardown_watchdog`)."""

    #: seconds after the first signal in which another is the same interrupt: GNU ``timeout``
    #: signals the command and then its whole process group, and a terminal's Ctrl-C reaches
    #: every process of the group, so one interrupt can arrive twice (the second one killed
    #: the run before its report was written)
    DEBOUNCE_S = 1.5

    #: seconds the simulation may take to end after its ServerApp's thread ended before
    #: :meth:`_teardown_watchdog` ends it (Flower's own teardown takes 0.5-4 s)
    TEARDOWN_S = 60.0

    #: the signals this context stops the run on
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo, grace: float = 3.0, report_wait: float = 30.0) -> None:
        self.echo, self.grace, self.report_wait = echo, grace, report_wait
        self.previous: dict = {}
        self.seen: set[int] = set()
        self.first = None  # monotonic time of the first signal
        self.signum = signal.SIGINT  # the first signal (a KeyboardInterrupt without one: Ctrl-C)
        self._left = threading.Event()  # the run's context exited
        self._lock = threading.Lock()  # one signal acted on at a time (watcher or main thread)
        self._wakeup: tuple[int, int] | None = None  # (read, write) ends of the wakeup pipe
        self._previous_wakeup = -1

    def _python_handler(self, signum, frame) -> None:
        """The Python-level handler (main thread): nothing to do while the wakeup fd is ours
        (:meth:`_watch_signals` has acted on this signal already); if something replaced it,
        the signal reached that fd instead, so act here."""
        ours = self._wakeup[1] if self._wakeup else -1
        current = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if current != ours or ours == -1:
            signal.set_wakeup_fd(current)
            self._handler(signum, frame)

    def _watch_signals(self, read_fd: int) -> None:
        """Thread: act on every SIGINT/SIGTERM as the C-level handler writes its number to the
        wakeup pipe, whichever thread the kernel delivered it to and whatever the main thread
        is blocked in. A 0 byte (no signal has number 0) ends the thread."""
        try:
            while True:
                try:
                    data = os.read(read_fd, 64)
                except InterruptedError:
                    continue
                for signum in data:
                    if signum == 0:
                        return
                    if signum in self.SIGNALS:
                        self._handler(signum, None)
        finally:
            os.close(read_fd)

    def _handler(self, signum, frame) -> None:
        with self._lock:
            self._act(signum)

    def _act(self, signum) -> None:
        if STOP.is_set():
            if self.first is not None and time.monotonic() - self.first < self.DEBOUNCE_S:
                return  # the same interrupt delivered twice (timeout, process group)
            self.echo("fedgraph: interrupted again: stopping now")
            kill_descendants(self.remember(), grace=0.5)
            os._exit(signal_exit_code(signum))
        STOP.set()
        self.first, self.signum = time.monotonic(), signum
        _interrupt_server_thread()
        self.remember()
        self.echo(
            "fedgraph: interrupted: stopping the run and writing its report "
            "(Ctrl-C again to quit at once)"
        )
        threading.Thread(target=self._watchdog, daemon=True).start()

    def _watchdog(self) -> None:
        """Once the ServerApp's thread has ended (its report written), give the simulation
        ``grace`` seconds to wind down (Flower may still be starting Ray in the main thread),
        then end the run's processes and exit with the signal's code (:attr:`exit_code`)."""
        end = time.monotonic() + self.report_wait
        while time.monotonic() < end and any(
            t.ident in _SERVER_THREAD and t.is_alive() for t in threading.enumerate()
        ):
            time.sleep(0.1)
        time.sleep(self.grace)
        written = bool(REPORT_PATH) and Path(REPORT_PATH[0]).is_file()
        self.echo(
            f"fedgraph: interrupted (Ctrl-C or SIGTERM); report: {REPORT_PATH[0]}"
            if written
            else "fedgraph: interrupted (Ctrl-C or SIGTERM) before the run "
            "started (Ray was starting, or the dataset was being loaded or generated and "
            "partitioned): no report was written"
        )
        end_all_descendants(self.remember(), within=5.0)
        os._exit(self.exit_code)

    def _teardown_watchdog(self) -> None:
        """Once the ServerApp's thread has ended (its report written), give the simulation
        :data:`TEARDOWN_S` seconds to return; if it has not (Flower's runtime waits on a Ray
        that is gone, e.g. a cluster that became unreachable), say so, end the run's
        processes and exit with the report's code (ok 0, interrupted :attr:`exit_code`, else
        1)."""
        while not self._left.is_set() and not (
            _SERVER_THREAD
            and not any(t.ident in _SERVER_THREAD and t.is_alive() for t in threading.enumerate())
        ):
            self._left.wait(0.2)
        if self._left.wait(self.TEARDOWN_S) or STOP.is_set():
            return  # ended, or an interrupt's own watchdog ends it
        status = _report_status()
        self.echo(
            f"fedgraph: {'FAILED: ' if status != 'ok' else ''}the simulation did not end "
            f"within {self.TEARDOWN_S:g} s of its strategy (report status: {status}"
            + (f", {REPORT_PATH[0]}" if REPORT_PATH else "")
            + "); ending its processes"
        )
        end_all_descendants(self.remember(), within=5.0)
        self._exit({"ok": 0, "interrupted": self.exit_code}.get(status, 1))

    _exit = staticmethod(os._exit)

    @property
    def exit_code(self) -> int:
        """The code ``fedgraph run`` exits with once interrupted: 130 after Ctrl-C (SIGINT),
        143 after SIGTERM (the first signal's, :func:`signal_exit_code`)."""
        return signal_exit_code(self.signum)

    def remember(self) -> set[int]:
        self.seen |= descendants()
        return self.seen

    def __enter__(self):
        become_subreaper()
        _keep_our_sigterm_handler()
        STOP.clear()
        _SERVER_THREAD.clear()
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._python_handler)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
        self._wakeup = (read_fd, write_fd)
        self._previous_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(
            target=self._watch_signals, args=(read_fd,), daemon=True, name="fedgraph-signal-watcher"
        ).start()
        self._left.clear()
        threading.Thread(
            target=self._teardown_watchdog, daemon=True, name="fedgraph-teardown-watchdog"
        ).start()
        return self

    def __exit__(self, *exc) -> None:
        self._left.set()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            read_fd, write_fd = self._wakeup
            self._wakeup = None
            os.write(write_fd, b"\0")  # ends the watcher, which closes the read end
            os.close(write_fd)
        STOP.clear()
        _SERVER_THREAD.clear()


def _report_status() -> str:
    """The status in the running ``fedgraph run``'s report (:data:`REPORT_PATH`), or
    ``"missing"``."""
    import json

    try:
        return str(json.loads(REPORT_PATH[0].read_text())["status"])
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return "missing"
