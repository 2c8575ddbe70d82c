"""``fedgraph run`` starts Ray while it imports and checks (simulations.early_ray), and exits
without the interpreter's finalization (simulations.cli.main): the failure paths."""
import subprocess
import sys
from pathlib import Path

import pytest

from simulations import early_ray

ROOT = Path(__file__).resolve().parents[1]


def test_a_ray_that_fails_to_start_is_reported_not_waited_for(monkeypatch):
    import ray

    def broken(**kwargs):
        raise OSError("no room for the object store")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", broken)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    early = early_ray.start_early_ray({"num_cpus": 1})
    with pytest.raises(RuntimeError, match="Ray did not start: OSError: no room"):
        early.wait(timeout=30)
    early.release()


def test_no_early_start_for_an_existing_cluster_or_when_switched_off(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert early_ray.start_early_ray({"address": "127.0.0.1:1"}) is None
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("FEDGRAPH_EARLY_RAY", "0")
    assert early_ray.start_early_ray({"num_cpus": 1}) is None


def test_the_console_script_keeps_its_exit_codes_and_messages():
    """main() ends ``run`` with os._exit: the code and the message still come out."""
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['fedgraph', 'run', "
                           "'--set', 'budgets=-1']; from simulations.cli import main; main()"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "budgets: every epsilon must be finite and > 0" in proc.stderr
