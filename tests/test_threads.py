"""The apps' processes make OpenMP wait passively and torch's allocator use huge pages
(simulations/__init__.py) unless the user chose otherwise, and the report records the server
process's thread and allocator settings."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedgraph.procstats import PROCFS, SYSFS

ROOT = Path(__file__).resolve().parents[1]
#: Linux's transparent-huge-page settings and a process's memory summary (kernel interfaces,
#: not project paths; overridable for a kernel that puts them elsewhere)
THP_SETTINGS = Path(
    os.environ.get("FEDGRAPH_THP_SETTINGS", SYSFS / "kernel" / "mm" / "transparent_hugepage")
)
SMAPS_ROLLUP = str(os.environ.get("FEDGRAPH_SMAPS_ROLLUP", PROCFS / "self" / "smaps_rollup"))
SCRIPT = (
    "import json, os, simulations; from fedgraph.report import _host; "
    "import torch; t = torch.empty(1 << 20); "
    "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), _host()['env'], "
    "os.environ.get('THP_MEM_ALLOC_ENABLE')]))"
)


def _run(env):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_openmp_waits_passively_unless_the_user_set_a_policy():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    policy, recorded, _ = _run(env)
    assert policy == "PASSIVE" and recorded["OMP_WAIT_POLICY"] == "PASSIVE"
    assert _run({**env, "OMP_WAIT_POLICY": "ACTIVE"})[0] == "ACTIVE"


def test_torch_allocates_huge_pages_unless_the_user_turned_them_off():
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    _, recorded, thp = _run(env)
    assert thp == "1" and recorded["THP_MEM_ALLOC_ENABLE"] == "1"
    _, recorded, thp = _run({**env, "THP_MEM_ALLOC_ENABLE": "0"})
    assert thp == "0" and recorded["THP_MEM_ALLOC_ENABLE"] == "0"


def _kernel_thp(name: str) -> str:
    try:  # e.g. "always [madvise] never": the bracketed one is in force
        text = (THP_SETTINGS / name).read_text()
    except OSError:
        return "unknown"
    return text.split("[", 1)[-1].split("]", 1)[0]


@pytest.mark.skipif(
    _kernel_thp("enabled") not in ("always", "madvise")
    or _kernel_thp("defrag") not in ("always", "madvise", "defer+madvise"),
    reason="the kernel gives no huge pages on request here",
)
def test_a_large_tensor_is_backed_by_huge_pages():
    script = (
        "import re, simulations, torch; t = torch.ones(1 << 24); "  # 64 MiB, touched
        "print(re.search(r'AnonHugePages:\\s+(\\d+) kB', "
        f"open({SMAPS_ROLLUP!r}).read()).group(1))"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) >= 32 * 1024  # kB: at least half of the tensor
