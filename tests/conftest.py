"""Suite-wide hooks.

Ray's memory monitor kills workers when the machine is short of memory (a loaded CI host):
such a test is reported as *skipped*, with the reason and Ray's own line, instead of failing
the suite for something the code did not do (issue 17, item 8). Every other failure stays a
failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

#: every Ray the suite starts (in-process or in a subprocess, which inherits the environment)
#: caps its object store at 512 MiB instead of 30 % of the machine's memory: the suite's
#: graphs are small, and a busy CI host keeps its memory for the workers
os.environ.setdefault("RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES", str(512 * 2**20))

#: the suite's partition cache (fedgraph.partition_cache) is its own, removed at the end by
#: the process that made it: the user's cache gets no test graphs, and no entry of an earlier
#: run is read. pytest-xdist's workers inherit the variable and share the folder (the cache's
#: writes are atomic and its misses locked), which the controller removes when they are done.
_PARTITIONS = None
if "FEDGRAPH_PARTITION_CACHE" not in os.environ:
    _PARTITIONS = tempfile.mkdtemp(prefix="fedgraph-test-partitions-")
    os.environ["FEDGRAPH_PARTITION_CACHE"] = _PARTITIONS


def pytest_sessionfinish(session, exitstatus):
    if _PARTITIONS is not None:
        shutil.rmtree(_PARTITIONS, ignore_errors=True)


@pytest.fixture(scope="session")
def load_script():
    """``load_script("bench/scale.py")``: a script of the repository that is not a package
    (``bench/``), loaded as a module."""
    root = Path(__file__).resolve().parents[1]

    def load(relative: str):
        spec = importlib.util.spec_from_file_location(
            "script_" + Path(relative).stem, root / relative
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="session")
def free_port():
    """``free_port()``: a TCP port of 127.0.0.1 free now (for a SuperLink of a test's own, so
    that tests running side by side do not share one)."""
    import socket

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return port


#: what Ray prints when its memory monitor kills a task or actor
RAY_OOM = re.compile(
    r"OutOfMemoryError|running low on memory|memory usage threshold|"
    r"killed by the memory monitor",
    re.IGNORECASE,
)


def ray_oom_line(text: str) -> str | None:
    """The first line of ``text`` that says Ray's memory monitor killed a worker, else None."""
    for line in text.splitlines():
        if RAY_OOM.search(line):
            return line.strip()[:300]
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        line = ray_oom_line(report.longreprtext or "")
        if line:
            report.outcome = "skipped"
            report.longrepr = (
                str(item.path),
                item.location[1] or 0,
                "Skipped: Ray's memory monitor killed a worker (this machine "
                f"was short of memory, not a fedgraph failure): {line}",
            )
