"""What the clients' own privacy checks cost against a whole run (issue 60).

Not a test. Runs presets in-process on :class:`fedgraph.simulations.local.LocalGrid`
(``run_local``: the same strategies and client handlers as ``fedgraph run``, without Ray) with
every client-side check timed: the request digest and transcript (``client_guard.advance``),
the client's own config and its comparison with the request's (``client_guard.own_config``,
``client_guard.check_own``), loading and saving the
client's ledger (``client_guard.authority``, ``ClientAuthority.to_json``), the plan's one
composition (``ClientAuthority.allow``), each charge (``ClientAuthority.charge``) and the ledger
summary sent with a reply (``ClientAuthority.summary``). Prints and writes, per preset and
seed, the checks' seconds, the run's seconds and their ratio.

Usage:
    python bench/client_checks_cost.py gap-edge-cora ppgnn-cora progap-edge-cora \\
        privgnn-ensemble-cora [--seeds 0,1,2] [--out bench/results/client_checks_cost.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed(owner, name: str, spent: dict) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
            spent["calls"] = spent.get("calls", 0) + 1

    setattr(owner, name, wrapper)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "client_checks_cost.json"
    )
    args = ap.parse_args(argv)

    import tomllib

    from fedgraph import client_authority
    from fedgraph.simulations import client_guard
    from fedgraph.simulations.local import run_local

    spent: dict = {}
    from fedgraph.simulations.routes import common

    # setup() looks client_guard.advance and check_own up at call time; the routes call
    # common.authority and common.own_config; ClientAuthority's methods are the class's
    for name in ("advance", "check_own", "own_config", "authority"):
        _timed(client_guard, name, spent)
    common.authority, common.own_config = client_guard.authority, client_guard.own_config
    for name in ("allow", "charge", "summary", "to_json"):
        _timed(client_authority.ClientAuthority, name, spent)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            base = tomllib.loads((ROOT / "simulations" / "presets" / f"{preset}.toml").read_text())
            base = base.get("tool", {}).get("flwr", {}).get("app", {}).get("config", base)
            for seed in (int(s) for s in args.seeds.split(",")):
                spent.clear()
                t = time.perf_counter()
                report = run_local(
                    {**base, "seed": seed, "output-dir": tmp, "run-name": f"{preset}-{seed}"}
                )
                wall = time.perf_counter() - t
                checks = sum(v for k, v in spent.items() if k != "calls")
                rows.append(
                    {
                        "preset": preset,
                        "seed": seed,
                        "status": report["status"],
                        "run_s": round(wall, 3),
                        "checks_s": round(checks, 4),
                        "ratio": round(checks / wall, 5),
                        "calls": spent.get("calls", 0),
                        "by_check_s": {k: round(v, 4) for k, v in spent.items() if k != "calls"},
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(rows, indent=1))
    os.replace(tmp_out, args.out)
    for preset in args.presets:
        r = [x["ratio"] for x in rows if x["preset"] == preset]
        c = [x["checks_s"] for x in rows if x["preset"] == preset]
        print(
            f"{preset}: checks {statistics.mean(c):.3f} s = {100 * statistics.mean(r):.2f} % "
            f"of the run (+- {100 * (statistics.stdev(r) if len(r) > 1 else 0):.2f}, "
            f"n={len(r)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
