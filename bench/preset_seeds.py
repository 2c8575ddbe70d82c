"""Test accuracy, epsilon and wall time of presets over several seeds, from any checkout.

Not a test (a minute or more per run). Each run is ``<python> -m fedgraph.simulations.cli run
<preset> --set seed=<s>`` in ``--root`` (default: this checkout), exactly as a user starts it,
so the same script measures an older commit from a worktree with its own venv (issue 60's
before/after table: ``--root /tmp/before --python /tmp/vb/bin/python``). Writes the rows after
every run (atomically) and prints mean and standard deviation per preset.

Usage:
    python bench/preset_seeds.py gap-edge-cora ppgnn-cora --seeds 0,1,2 \\
        [--root DIR] [--python PY] [--data-root ../shared/data] [--out FILE] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(
    python: str, root: Path, preset: str, seed: int, out_dir: Path, sets: list[str], timeout: float
) -> dict:
    name = f"seeds-{preset}-{seed}"
    cmd = [
        python,
        "-m",
        "fedgraph.simulations.cli",
        "run",
        preset,
        "--set",
        f"seed={seed}",
        "--set",
        f"output-dir={out_dir}",
        "--set",
        f"run-name={name}",
    ]
    for s in sets:
        cmd += ["--set", s]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    row = {"preset": preset, "seed": seed, "rc": proc.returncode, "wall_s": round(wall, 2)}
    report = out_dir / f"{name}.json"
    if report.exists():
        r = json.loads(report.read_text())
        subjects = r.get("privacy", {}).get("per_subject", {})
        eps = [
            float(v["epsilon"])
            for v in subjects.values()
            if isinstance(v, dict) and isinstance(v.get("epsilon"), (int, float))
        ]
        row.update(
            status=r.get("status"),
            test=r.get("accuracy", {}).get("test"),
            epsilon_max=max(eps) if eps else None,
            run_s=r.get("timings_s", {}).get("total"),
            client_ledgers_agree=(
                all(v.get("agree") for v in r["privacy"]["client_ledgers"].values())
                if r.get("privacy", {}).get("client_ledgers")
                else None
            ),
        )
    else:
        row["error"] = proc.stdout[-2000:] + proc.stderr[-2000:]
    return row


def _write(path: Path, rows: list) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "preset_seeds.json")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    os.environ.setdefault("FEDGRAPH_DATA", args.data_root)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            for seed in seeds:
                rows.append(
                    run_one(
                        args.python, args.root, preset, seed, Path(tmp), args.sets, args.timeout
                    )
                )
                print(json.dumps(rows[-1]), flush=True)
                _write(args.out, rows)
    for preset in args.presets:
        tests = [r["test"] for r in rows if r["preset"] == preset and r.get("test") is not None]
        walls = [r["wall_s"] for r in rows if r["preset"] == preset]
        if tests:
            sd = statistics.stdev(tests) if len(tests) > 1 else 0.0
            print(
                f"{preset}: test {statistics.mean(tests):.4f} +- {sd:.4f} (n={len(tests)}), "
                f"wall {statistics.mean(walls):.1f} s"
            )
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
