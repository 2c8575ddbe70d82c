"""``fedgraph run`` of the custom-dataset example on an existing Ray cluster (``RAY_ADDRESS``):
a head started with ``ray start --head`` on loopback, a temporary port and a temporary folder,
stopped afterwards by the ids of its own processes (never ``ray stop``, which stops every Ray
on the machine)."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedgraph.procstats import PROCFS
from fedgraph.report import majority_class

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids_under(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (our cluster's temporary folder)."""
    out = []
    for p in PROCFS.iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return [pid for pid in out if pid != os.getpid()]


class LocalCluster:
    """A one-node Ray cluster: ``ray start --head --block`` in its own process group."""

    def __init__(self, num_cpus: int = 2):
        # Short path: Ray's unix sockets live under it (108-byte limit).
        self.temp = tempfile.mkdtemp(prefix="fgray-", dir="/tmp")
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(Path(self.temp) / "ray-start.log", "w")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                "--node-ip-address=127.0.0.1",
                f"--temp-dir={self.temp}",
                f"--num-cpus={num_cpus}",
                "--num-gpus=0",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def node_ids(self, timeout: float = 120.0) -> list[str]:
        """Ids of the cluster's alive nodes (waits for the head to answer)."""
        code = (
            f"import ray, json; ray.init(address={self.address!r}, logging_level='ERROR'); "
            "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))"
        )
        deadline = time.time() + timeout
        while True:
            r = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
            )
            if r.returncode == 0:
                return json.loads(r.stdout.strip().splitlines()[-1])
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(
                    f"Ray head at {self.address} did not start: {r.stderr[-2000:]}"
                    f"\n{(Path(self.temp) / 'ray-start.log').read_text()[-2000:]}"
                )
            time.sleep(2)

    def stop(self) -> list[int]:
        """SIGTERM, then SIGKILL, to this cluster's processes only; returns any left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            for pid in _pids_under(self.temp):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 15
            while _pids_under(self.temp) and time.time() < deadline:
                time.sleep(0.5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()
        return _pids_under(self.temp)


@pytest.mark.slow
def test_custom_dataset_example_on_an_existing_ray_cluster(tmp_path):
    """Two things in one real Flower run (each Ray start costs half a minute on 2 cores): the
    one command of examples/custom_dataset (GAP on a user's graph and partitioner, which the
    clients load by file path too), and ``fedgraph run`` on an existing Ray cluster (the
    clients run on its node; the default, a Ray of fedgraph's own, runs in the other e2e
    tests)."""
    cluster = LocalCluster(num_cpus=2)
    try:
        nodes = cluster.node_ids()
        assert len(nodes) == 1
        env = {
            **os.environ,
            "RAY_ADDRESS": cluster.address,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        }
        cmd = [
            str(BIN / "fedgraph"),
            "run",
            "examples/custom_dataset/run.toml",
            "--set",
            f"output-dir='{tmp_path}'",
        ]
        r = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=420, cwd=Path(__file__).parents[1]
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        report = json.loads((tmp_path / "example-custom-dataset.json").read_text())
        assert report["status"] == "ok"
        assert report["dataset"]["name"] == "sbm-400" and report["dataset"]["num_nodes"] == 400
        acc = report["accuracy"]
        assert acc["test"] > majority_class(report) + 0.2, acc
        per_client = report["privacy"]["per_subject"]
        assert sorted(per_client) == ["client-0", "client-1", "client-2"]
        assert all(row["epsilon"] <= 4.0 + 1e-6 for row in per_client.values())
        workers = report["workers"]
        assert sorted(workers) == ["client-0", "client-1", "client-2"]
        for info in workers.values():
            # Ran on the cluster's node (a fresh local Ray would have another node id).
            assert info["ray_node_id"] == nodes[0]
            assert info["pid"] != os.getpid()
    finally:
        left = cluster.stop()
    assert left == [], f"cluster processes left running: {left}"


def test_cluster_stop_stops_only_its_own_cluster(tmp_path):
    """``fedgraph cluster start`` / ``stop`` (issue 61): ``ray stop`` stops every Ray of the
    machine. One real head (about 10-30 s on 2 cores); an unrelated process whose command line
    names Ray and a folder whose name starts like the cluster's stands for another cluster
    and must survive the stop."""
    from typer.testing import CliRunner

    from fedgraph.simulations import cluster
    from fedgraph.simulations.cli import cli

    folder = Path(tempfile.mkdtemp(prefix="fgray-", dir="/tmp"))
    other = Path(str(folder) + "x")  # another cluster's folder: the same prefix
    other.mkdir()
    decoy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
            "ray",
            f"--temp-dir={other}",
            f"{other}/session_latest",
        ]
    )
    try:
        res = CliRunner().invoke(cli, ["cluster", "start", "--dir", str(folder), "--num-cpus", "1"])
        assert res.exit_code == 0, res.output
        record = json.loads((folder / cluster.RECORD).read_text())
        assert f"RAY_ADDRESS={record['address']}" in res.output
        assert f"fedgraph cluster stop {folder}" in res.output
        pids = cluster.cluster_pids(folder)
        assert len(pids) >= 2 and decoy.pid not in pids  # gcs_server, raylet, ...
        res = CliRunner().invoke(cli, ["cluster", "stop", str(folder)])
        assert res.exit_code == 0, res.output
        assert cluster.cluster_pids(folder) == []
        assert all(
            not (PROCFS / str(p)).exists() or (PROCFS / str(p) / "cmdline").read_bytes() == b""
            for p in pids
        )
        assert decoy.poll() is None  # the other "cluster" runs on
    finally:
        import shutil

        decoy.kill()
        cluster.stop(folder, grace_s=2)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)
