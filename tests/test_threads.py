"""The apps' processes make OpenMP wait passively (simulations/__init__.py) unless the user
chose otherwise, and the report records the server process's thread settings."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ("import json, os, simulations; from fedgraph.report import _host; "
          "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), _host()['env']]))")


def _run(env):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_openmp_waits_passively_unless_the_user_set_a_policy():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    policy, recorded = _run(env)
    assert policy == "PASSIVE" and recorded["OMP_WAIT_POLICY"] == "PASSIVE"
    assert _run({**env, "OMP_WAIT_POLICY": "ACTIVE"})[0] == "ACTIVE"
