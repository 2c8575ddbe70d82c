"""The auditor on the cora presets at several epsilons (issue 63): the ledger's epsilon of the
audited release beside the audited lower bound at 95 %, with trials and time.

For every preset and client epsilon (GAP/ProGAP: ``client-epsilons``; PPGNN: ``budgets``, one
level at that epsilon), :func:`fedgraph.simulations.auditor.audit_run` on ``--subjects``
(default ``client-0`` and every PPGNN level):

    OMP_NUM_THREADS=1 nice -n 5 python bench/audit_presets.py --trials 20000 \\
        --presets gap-edge-cora,progap-edge-cora,ppgnn-cora --epsilons 1,4,8

Output: a table on stdout and JSON rows in ``--out`` (default
``bench/results/audit_presets.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="gap-edge-cora,progap-edge-cora,ppgnn-cora")
    p.add_argument("--epsilons", default="1,4,8")
    p.add_argument("--trials", type=int, default=20000)
    p.add_argument("--subjects", default="client-0,level-1,every-user")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/audit_presets.json")
    args = p.parse_args()

    from fedgraph.simulations.auditor import audit_run
    from fedgraph.simulations.run_files import load_run_config

    rows = []
    for preset in args.presets.split(","):
        for eps in args.epsilons.split(","):
            key = "budgets" if preset.startswith("ppgnn") else "client-epsilons"
            cfg = load_run_config(preset, [f"{key}={eps}", "output-dir=/tmp/fedgraph-audit"])
            started = time.perf_counter()
            out = audit_run(cfg, args.trials, subjects=args.subjects.split(","), seed=args.seed)
            for name, s in out["subjects"].items():
                rows.append(
                    {
                        "preset": preset,
                        "epsilon_target": float(eps),
                        "subject": name,
                        "release": s["release"],
                        "ledger_epsilon": s["epsilon"],
                        "bound": s["epsilon_lower_bound"],
                        "trials": s["trials"],
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                )
                r = rows[-1]
                print(
                    f"{preset:<18} eps {eps:>3} {name:<10} {r['release']:<22} "
                    f"ledger {r['ledger_epsilon']:.3f} bound {r['bound']:.3f} "
                    f"trials {r['trials']} {r['seconds']} s",
                    flush=True,
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
