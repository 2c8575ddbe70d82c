"""Wall time and peak memory of whole preset runs (``fedgraph run <preset>``), one after another.

Not a test (minutes per preset). Each preset runs as its own ``fedgraph run`` process, exactly
as a user starts it (Flower simulation on Ray, every client a Ray worker). While it runs, the
process tree (the ``fedgraph`` process, Ray's GCS, raylet and workers) is sampled every
``--interval`` seconds with psutil:

* ``tree_peak_gib``: the largest sum of resident set sizes over the tree at one sample. Pages
  shared between processes (Ray's object store, shared libraries) count once per process, so
  this overstates what the machine needs; it is the figure to compare against RAM to be safe.
* ``largest_process_gib``: the largest resident set of any one process of the tree.

Wall time is the whole command's, Ray's start and stop included; ``run_s`` is the report's own
``timings_s.total`` (from the strategy's start to the report). The test accuracy and the
largest epsilon spent by any client/level come from the report the run wrote.

Usage:
    python bench/presets.py [gap-edge-cora gap-node-cora ...] [--match gap-]
        [--data-root ../shared/data] [--out bench/results/presets.json] [--timeout 1800]

Without names, runs every preset in ``simulations/presets`` whose name contains ``--match``.
Writes the JSON rows after every preset (atomically) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "simulations" / "presets"
sys.path.insert(0, str(ROOT))  # this checkout's packages first

from fedgraph.procstats import GIB, PhaseTimer, TreeSampler  # noqa: E402


def largest_epsilon(report: dict) -> float | None:
    """The largest primary ``epsilon`` over the report's ``privacy.per_subject`` entries
    (clients or privacy levels); the RDP figure and the cross-check beside it are skipped."""
    subjects = report.get("privacy", {}).get("per_subject", {})
    found = [
        float(v["epsilon"])
        for v in subjects.values()
        if isinstance(v, dict) and isinstance(v.get("epsilon"), (int, float))
    ]
    return max(found) if found else None


def run_preset(name: str, out_dir: Path, timeout: float, interval: float, env: dict) -> dict:
    run_name = f"bench-{name}"
    cmd = [
        sys.executable,
        "-m",
        "fedgraph.simulations.cli",
        "run",
        name,
        "--set",
        f"output-dir={out_dir}",
        "--set",
        f"run-name={run_name}",
    ]
    timer = PhaseTimer()
    log = out_dir / f"{run_name}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
        with TreeSampler(proc.pid, interval) as tree:  # summed and largest RSS (module docs)
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                tree.kill(f"timed out after {timeout:g} s")
                rc = proc.wait()
    wall = timer.elapsed()
    row = {
        "preset": name,
        "exit_code": rc,
        "wall_s": round(wall, 1),
        "tree_peak_gib": round(tree.peak_rss / GIB, 2),
        "largest_process_gib": round(tree.largest_rss / GIB, 2),
        "log": str(log),
    }
    report_path = out_dir / f"{run_name}.json"
    if report_path.exists():
        rep = json.loads(report_path.read_text())
        row.update(
            status=rep.get("status"),
            dataset=rep.get("config", {}).get("dataset"),
            num_clients=rep.get("config", {}).get(
                "num-clients", rep.get("config", {}).get("num_clients")
            ),
            test_acc=rep.get("accuracy", {}).get("test"),
            largest_epsilon=largest_epsilon(rep),
            run_s=rep.get("timings_s", {}).get("total"),
        )
    else:
        row.update(status="no report")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("presets", nargs="*", help="preset names (default: all matching --match)")
    p.add_argument("--match", default="", help="only presets whose name contains this")
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "presets.json"))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per preset")
    p.add_argument("--interval", type=float, default=0.5, help="memory sampling period (s)")
    args = p.parse_args()
    names = args.presets or sorted(f.stem for f in PRESETS.glob("*.toml") if args.match in f.stem)
    unknown = [n for n in names if not (PRESETS / f"{n}.toml").exists()]
    if unknown:
        known = ", ".join(sorted(f.stem for f in PRESETS.glob("*.toml")))
        p.error(f"unknown preset(s) {', '.join(unknown)}; known: {known}")
    env = {**os.environ, "FEDGRAPH_DATA": args.data_root}
    out_dir = Path(tempfile.mkdtemp(prefix="fedgraph-presets-"))
    rows: list[dict] = []
    print(
        f"{'preset':<20} {'exit':>4} {'status':>7} {'test':>6} {'max eps':>8} {'wall s':>7} "
        f"{'run s':>7} {'tree GiB':>8} {'max proc GiB':>12}",
        flush=True,
    )
    for name in names:
        row = run_preset(name, out_dir, args.timeout, args.interval, env)
        rows.append(row)
        test = f"{row['test_acc']:.3f}" if row.get("test_acc") is not None else "-"
        eps = f"{row['largest_epsilon']:.2f}" if row.get("largest_epsilon") is not None else "-"
        run_s = f"{row['run_s']:.1f}" if row.get("run_s") is not None else "-"
        print(
            f"{name:<20} {row['exit_code']:>4} {row['status']:>7} {test:>6} {eps:>8} "
            f"{row['wall_s']:>7.1f} {run_s:>7} {row['tree_peak_gib']:>8.2f} "
            f"{row['largest_process_gib']:>12.2f}",
            flush=True,
        )
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        tmp.write_text(
            json.dumps({"args": vars(args), "cpus": os.cpu_count(), "rows": rows}, indent=2)
        )
        os.replace(tmp, out)
    print(f"wrote {args.out} (reports and logs in {out_dir})")
    if any(r["exit_code"] != 0 for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
