"""fedgraph.procstats: peak RSS, phase timer, process trees (real child processes, a second or
two each) and process groups."""

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from fedgraph import procstats as ps

psutil = pytest.importorskip("psutil")

#: a parent holding ~100 MB that starts a child holding ~100 MB; both sleep ``S`` seconds
HOLD = (
    "import subprocess, sys, time; b = bytearray(100_000_000); "
    "p = subprocess.Popen([sys.executable, '-c', "
    "'import time; b = bytearray(100_000_000); time.sleep({s})']); time.sleep({s}); p.wait()"
)


def test_peak_rss_units():
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert ps.peak_rss_bytes() >= kib * 1024  # monotone: only grows between the two reads
    assert ps.peak_rss_mib() * ps.MIB == pytest.approx(ps.peak_rss_bytes(), rel=1e-3)
    assert ps.peak_rss_gib() * ps.GIB == pytest.approx(ps.peak_rss_bytes(), rel=1e-3)
    # the figure the bench tables had: ru_maxrss (KiB) / 1024, exactly
    assert ps.peak_rss_mib() == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    subprocess.run([sys.executable, "-c", "b = bytearray(60_000_000)"], check=True)
    assert ps.peak_rss_mib(children=True) >= 55


def test_phase_timer_sums_phases_and_times_the_whole():
    timer = ps.PhaseTimer()
    for _ in range(2):
        with timer.phase("a"):
            time.sleep(0.01)
    with pytest.raises(ValueError):
        with timer.phase("b"):
            raise ValueError
    assert timer.seconds["a"] >= 0.02 and "b" in timer.seconds
    assert timer.elapsed() >= timer.seconds["a"] + timer.seconds["b"]


def test_tree_and_tree_rss_see_the_child():
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(s=30)])
    try:
        root, seen = psutil.Process(p.pid), {}
        deadline = time.monotonic() + 30  # a loaded machine starts Python slowly
        while time.monotonic() < deadline:
            procs = ps.tree(root, seen)
            total, biggest = ps.tree_rss(root)
            if len(procs) == 2 and total >= 0.18e9:
                break
            time.sleep(0.1)
        assert procs[0].pid == p.pid and len(procs) == 2 and set(seen) == {x.pid for x in procs}
        assert total >= 0.18e9 and 0.09e9 <= biggest <= total
        ps.kill_tree(procs)  # the child first, then the root
        assert p.wait(10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert ps.tree(root) == [] and ps.tree_rss(root) == (0, 0)


def _alive(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sampler_peaks_and_abort_kills_the_tree():
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(s=1.5)])
    with ps.TreeSampler(p.pid, 0.1, pss=True) as tree:
        assert p.wait(30) == 0
    assert tree.samples >= 2 and tree.aborted is None
    assert tree.peak_rss >= 0.18e9 and 0.09e9 <= tree.largest_rss <= tree.peak_rss
    assert 0 < tree.peak_pss <= tree.peak_rss and "python" in tree.largest_cmd
    assert ps.terminate_leftovers(tree.seen, p.pid, timeout=1) == 0

    p = subprocess.Popen([sys.executable, "-c", HOLD.format(s=30)])
    tree = ps.TreeSampler(p.pid, 0.1, abort=lambda rss: "too big" if rss > 0.15e9 else None)
    with tree:
        assert p.wait(30) != 0  # killed long before its 30 s
    assert tree.aborted == "too big" and len(tree.seen) == 2
    # killed: gone (or a zombie) once the kernel has delivered SIGKILL; on a loaded machine
    # that can take a moment after the sampler returns
    deadline = time.monotonic() + 20
    while any(_alive(x) for x in tree.seen.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(x) for x in tree.seen.values())


def test_sampler_kill_and_leftovers():
    # the child outlives its parent: the root exits at once, the orphan is terminated
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); time.sleep(1)",
        ]
    )
    with ps.TreeSampler(p.pid, 0.1) as tree:
        p.wait(30)
    assert ps.terminate_leftovers(tree.seen, p.pid, timeout=0.2) == 1

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with ps.TreeSampler(p.pid, 0.1) as tree:
        tree.kill("timed out")
        assert p.wait(10) == -signal.SIGKILL
    assert tree.aborted == "timed out"


def test_descendants_kill_descendants_and_alive():
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); time.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while len(ps.descendants(p.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = ps.descendants(p.pid)
        assert {p.pid, grandchild} <= ps.descendants() and ps.alive(grandchild)
        ps.kill_descendants({p.pid, grandchild}, grace=2.0)
        p.wait(10)
        assert not ps.alive(p.pid)
        deadline = time.monotonic() + 10
        while ps.alive(grandchild) and time.monotonic() < deadline:  # reaped by init
            time.sleep(0.05)
        assert not ps.alive(grandchild)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_end_group_terms_then_kills_and_die_with_parent_runs():
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", ignore_term],
        start_new_session=True,
        stdout=subprocess.PIPE,
        preexec_fn=ps.die_with_parent,
    )
    assert p.stdout.readline().strip() == b"ready"
    assert ps.end_group(p, grace=0.3) == -signal.SIGKILL
    p.stdout.close()
    ps.signal_group(p, signal.SIGTERM)  # a group that is gone: nothing
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    assert ps.end_group(p, grace=10) == -signal.SIGTERM


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_become_subreaper_in_a_child():
    code = (
        "from fedgraph.procstats import become_subreaper; import sys; "
        "sys.exit(0 if become_subreaper() else 1)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
