"""What a computation costs and the processes it starts: wall seconds of its phases, peak
resident memory (this process, its reaped children, a whole process tree sampled while it
runs), and ending a process tree or group.

The one home of these helpers for ``bench/``, the sweep (:mod:`fedgraph.simulations.sweep_runner`),
``fedgraph run``'s interrupt (:mod:`fedgraph.simulations.interrupt`) and the methods' result rows.
Neither torch nor Flower; ``psutil`` (installed with Ray) is imported only by the functions
over a sampled tree (:func:`tree`, :func:`tree_rss`, :class:`TreeSampler`); the ``/proc``
helpers (:func:`descendants`, :func:`kill_descendants`) need none.

Units: bytes unless a name says otherwise (``_mib``: 2**20 bytes, ``_gib``: 2**30 bytes);
seconds of wall time (``time.perf_counter``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: where Linux mounts procfs and sysfs (kernel interfaces, not project paths)
PROCFS = Path("/proc")
SYSFS = Path("/sys")

__all__ = [
    "MIB",
    "GIB",
    "PhaseTimer",
    "TreeSampler",
    "alive",
    "become_subreaper",
    "descendants",
    "die_with_parent",
    "have_psutil",
    "kill_descendants",
    "kill_tree",
    "end_group",
    "peak_rss_bytes",
    "peak_rss_gib",
    "peak_rss_mib",
    "signal_group",
    "terminate_leftovers",
    "tree",
    "tree_rss",
]

MIB, GIB = 2**20, 2**30


# ------------------------------------------------------------------- this process's memory


def peak_rss_bytes(children: bool = False) -> int:
    """Peak resident set size in bytes of this process (``getrusage(RUSAGE_SELF)``) or, with
    ``children``, of the **largest single** descendant this process has waited for
    (``RUSAGE_CHILDREN``: not their sum; a grandchild counts only if its parent waited for it).
    ``ru_maxrss`` is in KiB on Linux, in bytes on macOS."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024


def peak_rss_mib(children: bool = False) -> float:
    """:func:`peak_rss_bytes` in MiB."""
    return peak_rss_bytes(children) / MIB


def peak_rss_gib(children: bool = False) -> float:
    """:func:`peak_rss_bytes` in GiB."""
    return peak_rss_bytes(children) / GIB


# ------------------------------------------------------------------- phases' wall time


class PhaseTimer:
    """Wall seconds of named phases of one computation (``seconds[name]``, summed when a
    phase runs again) and of the whole since the timer was made (:meth:`elapsed`)::

        timer = PhaseTimer()
        with timer.phase("load"):
            ...
        timer.seconds["total"] = timer.elapsed()
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall seconds of the ``with`` block to ``seconds[name]`` (also when it
        raises)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def elapsed(self) -> float:
        """Wall seconds since the timer was made."""
        return time.perf_counter() - self.started


# ------------------------------------------------------------------- a sampled process tree


def have_psutil() -> bool:
    """Whether ``psutil`` can be imported (the tree functions below need it)."""
    import importlib.util

    return importlib.util.find_spec("psutil") is not None


def tree(root, seen: dict | None = None) -> list:
    """``root`` (a ``psutil.Process``) and all its descendants (``children(recursive=True)``),
    root first; ``[]`` when ``root`` is gone. With ``seen`` (pid -> ``psutil.Process``), each
    pid keeps one ``Process`` object across calls (psutil checks its start time before it
    signals it, so a reused pid is never hit) and ``seen`` records every process the tree
    ever had."""
    import psutil

    try:
        kids = root.children(recursive=True)
    except psutil.Error:
        return []
    if seen is None:
        return [root, *kids]
    return [seen.setdefault(root.pid, root)] + [seen.setdefault(k.pid, k) for k in kids]


def tree_rss(root) -> tuple[int, int]:
    """``(sum, max)`` of the resident set sizes in bytes of ``root`` (a ``psutil.Process``)
    and all its descendants at this moment; processes gone or not readable count 0. The sum
    counts pages shared between processes (shared libraries, Ray's object store) once per
    process: an upper bound of what the tree needs."""
    import psutil

    total = biggest = 0
    for p in tree(root):
        try:
            rss = p.memory_info().rss
        except psutil.Error:
            continue
        total += rss
        biggest = max(biggest, rss)
    return total, biggest


def kill_tree(procs: list) -> None:
    """SIGKILL every ``psutil.Process`` of ``procs`` (as :func:`tree` lists them), the last
    first (descendants before their parents); those already gone are skipped."""
    import psutil

    for p in reversed(procs):
        try:
            p.kill()
        except psutil.Error:
            pass


def terminate_leftovers(seen: dict, root_pid: int, timeout: float = 10.0) -> int:
    """Wait up to ``timeout`` s for the processes of ``seen`` (pid -> ``psutil.Process``, from
    :func:`tree`) other than ``root_pid`` still running, then SIGTERM those still alive;
    returns how many were terminated."""
    import psutil

    left = [p for pid, p in seen.items() if pid != root_pid and p.is_running()]
    if left:
        _, left = psutil.wait_procs(left, timeout=timeout)
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    return len(left)


class TreeSampler:
    """Samples the process tree of ``pid`` every ``interval`` s in a daemon thread, from
    :meth:`start` to :meth:`stop` (or as a context manager).

    Figures, in bytes, over all samples: ``peak_rss`` (the largest summed RSS of the tree at
    one sample), ``peak_pss`` (the same of the summed PSS, shared pages divided among their
    users: the tree's own footprint; with ``pss=False``, or where PSS is not readable, the
    RSS), ``largest_rss`` (the largest RSS of one process) and ``largest_cmd`` (that process's
    command line, 80 characters, or its name). ``samples`` counts the samples; reading PSS
    (``smaps``) costs some milliseconds per process.

    After each sample, ``abort(summed_rss)`` (if given) may return a reason: the tree is then
    killed (:func:`kill_tree`), the reason kept in ``aborted`` and sampling ends.
    :meth:`kill` does the same from outside. ``seen`` holds every process the tree had
    (:func:`terminate_leftovers`)."""

    def __init__(
        self,
        pid: int,
        interval: float = 0.5,
        pss: bool = False,
        abort: Callable[[int], str | None] | None = None,
    ) -> None:
        import psutil

        self.pid, self.interval, self.pss, self.abort = pid, interval, pss, abort
        self.peak_rss = self.peak_pss = self.largest_rss = self.samples = 0
        self.largest_cmd: str | None = None
        self.aborted: str | None = None
        self.seen: dict = {}
        self._psutil = psutil
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def processes(self) -> list:
        """The tree now (:func:`tree`), every process recorded in ``seen``."""
        try:
            root = self.seen.get(self.pid) or self._psutil.Process(self.pid)
        except self._psutil.Error:
            return []
        return tree(root, self.seen)

    def kill(self, why: str) -> None:
        """Kill the whole tree now (descendants first); ``aborted = why``."""
        self.aborted = why
        kill_tree(self.processes())

    def sample(self) -> int:
        """One sample: update the figures; returns the tree's summed RSS."""
        rss = pss = 0
        for p in self.processes():
            try:
                m = p.memory_full_info() if self.pss else p.memory_info()
            except self._psutil.Error:
                continue
            rss, pss = rss + m.rss, pss + getattr(m, "pss", m.rss)
            if m.rss > self.largest_rss:
                self.largest_rss = m.rss
                try:
                    self.largest_cmd = " ".join(p.cmdline()).strip()[:80] or p.name()
                except self._psutil.Error:
                    pass
        self.samples += 1
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        return rss

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self.sample()
            why = self.abort(rss) if self.abort else None
            if why:
                self.kill(why)
                return
            self._stop.wait(self.interval)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End sampling (waits for the sample in progress)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> TreeSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------- processes by pid (/proc)


def descendants(pid: int | None = None) -> set[int]:
    """Process ids of every descendant of ``pid`` (default: this process), read from /proc;
    empty where /proc is not there."""
    pid = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(PROCFS)
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(PROCFS / entry / "stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (read from /proc)."""
    try:
        with open(PROCFS / str(pid) / "stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_descendants(pids: set[int] | None = None, grace: float = 3.0) -> None:
    """SIGTERM ``pids`` (default: every :func:`descendants` of this process), then SIGKILL
    those still :func:`alive` after ``grace`` seconds; returns once all are dead or after the
    SIGKILL."""
    pids = descendants() if pids is None else set(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        living = set()
        for p in pids:
            try:
                os.kill(p, sig)
                living.add(p)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGKILL or not living:
            return
        end = time.monotonic() + grace
        while living and time.monotonic() < end:
            living = {p for p in living if alive(p)}
            time.sleep(0.1)
        pids = living


def _prctl(option: int, arg: int) -> bool:
    """Linux ``prctl(option, arg)``; False where libc or the call is not there. Safe in a
    ``preexec_fn`` (imports nothing)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make this process the Linux "child subreaper" of its descendants (``prctl
    PR_SET_CHILD_SUBREAPER``): a process whose parent dies (Ray's agents when the raylet ends)
    is re-parented here instead of to init, so :func:`descendants` still finds it. Returns
    False where the call is not available (not Linux)."""
    return _prctl(36, 1)


def die_with_parent() -> None:
    """``preexec_fn`` of a child process (runs between fork and exec): the kernel SIGKILLs the
    child when its parent thread ends (``prctl PR_SET_PDEATHSIG``); nothing where not
    available."""
    _prctl(1, signal.SIGKILL)


# ------------------------------------------------------------------- process groups


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group led by ``proc`` (started with
    ``start_new_session=True``); nothing if the group is gone or not ours."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(proc: subprocess.Popen, grace: float = 10.0) -> int:
    """SIGTERM the process group led by ``proc``; SIGKILL it if ``proc`` has not exited
    within ``grace`` seconds; returns ``proc``'s exit code."""
    signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        return proc.wait()
