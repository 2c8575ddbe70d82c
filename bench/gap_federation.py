"""Federated GAP on Facebook100 (not a test): accuracy lost against one client, with and
without cross-client edges, through real Flower simulations (Ray backend).

Usage: python bench/gap_federation.py [--dataset facebook100:Wisconsin87] [--clients 10]
       [--epsilon 4] [--seeds 1] [--first-seed 0] [--data-root ../shared/data] [--reuse]
       [--settings louvain random] [--set secure-aggregation=true] [--local]
Prints the command, the load average, one line per setting (mean +- std over the seeds and
every seed's test accuracy, the clients' largest class shares, the largest client epsilon
recomposed from the ledger) and writes bench/results/gap_federation.json. The best measured
schedule for louvain clients (README, GAP results): ``--local --seeds 5 --set schedule=fedsgd
encoder-rounds=100 classifier-rounds=100 local-epochs=1 hops=4 secure-aggregation=true``.

Settings are compared paired by seed, so the clients' noise is reproducible:
``noise-source = secret`` with ``$FEDGRAPH_NOISE_SECRET`` (default: a fixed benchmark secret;
benchmark releases are not private releases). ``--set noise-source=secure`` for fresh noise.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from fedgraph.procstats import peak_rss_mib
from fedgraph.report import write_json_atomic
from fedgraph.simulations.local import run_local
from fedgraph.simulations.run_files import load_run_config
from fedgraph.simulations.simulate import run_simulation


def _reusable(run_config: dict) -> dict | None:
    """The ok report of an earlier run with this run name and the same config, else None."""
    import json

    path = Path(run_config["output-dir"]) / f"{run_config['run-name']}.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    from fedgraph.config import parse_run_config

    want = json.loads(json.dumps(parse_run_config(run_config).model_dump(), default=str))
    have = report.get("config", {})
    # a key the report lacks was added later with a default that keeps the old behaviour
    same = all(have.get(k, v) == v for k, v in want.items() if k not in ("output_dir", "data_root"))
    return report if report.get("status") == "ok" and same else None


def largest_class_shares(run_config: dict) -> list[float]:
    """Per client: the share of its training nodes in its most frequent class (1.0: one
    class only), from the run's own partition (no run needed)."""
    import torch

    from fedgraph.config import parse_run_config
    from fedgraph.federation import load_federated

    _, clients = load_federated(parse_run_config(run_config))
    out = []
    for c in clients:
        y = c.y[c.train_mask]
        out.append(float(torch.bincount(y).max()) / y.numel() if y.numel() else float("nan"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="facebook100:Wisconsin87")
    p.add_argument("--min-class-size", type=int, default=1000)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--level", default="edge")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1"
    )
    p.add_argument("--data-root", default=str(Path(__file__).parents[2] / "shared" / "data"))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gap_federation.json"))
    p.add_argument(
        "--settings",
        nargs="*",
        default=None,
        help="substrings of the settings to run besides '1 client' (default: the "
        "first three; e.g. random)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra run-config keys for every run, e.g. secure-aggregation=true",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="run in this process (fedgraph.simulations.local: the same strategy, handlers "
        "and ledger, clients one after another, no Ray): minutes faster for "
        "many-round schedules such as schedule=fedsgd",
    )
    p.add_argument(
        "--skip-one-client",
        action="store_true",
        help="run only the --settings (e.g. when the one-client row of the same "
        "--set was measured already)",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a run's accuracy from its report in gap_federation_runs/ when that "
        "report exists with status ok and the same config (e.g. after a crash)",
    )
    args = p.parse_args()
    settings = {
        "1 client": {"num-clients": 1, "partitioner": "random"},
        f"{args.clients} clients (louvain), cross-client edges": {
            "num-clients": args.clients,
            "partitioner": "louvain",
            "cross-client-edges": True,
        },
        f"{args.clients} clients (louvain), no cross-client edges": {
            "num-clients": args.clients,
            "partitioner": "louvain",
            "cross-client-edges": False,
        },
        f"{args.clients} clients (label-skew 0.5), cross-client edges": {
            "num-clients": args.clients,
            "partitioner": "label-skew",
            "alpha": 0.5,
            "cross-client-edges": True,
        },
        # Diagnostic: the same number of clients without label skew (each a random sample).
        f"{args.clients} clients (random), cross-client edges": {
            "num-clients": args.clients,
            "partitioner": "random",
            "cross-client-edges": True,
        },
    }
    if args.settings is None:
        settings.pop(f"{args.clients} clients (random), cross-client edges")
        settings.pop(f"{args.clients} clients (label-skew 0.5), cross-client edges")
    else:
        keep = [name for name in settings if any(k in name for k in args.settings)]
        settings = {name: settings[name] for name in dict.fromkeys(["1 client", *keep])}
    if args.skip_one_client:
        settings.pop("1 client")

    extra = load_run_config(None, args.set)  # typed like fedgraph run --set
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    load_start = os.getloadavg()
    print(
        f"command: {command}\nload average at start: " + " / ".join(f"{v:.1f}" for v in load_start),
        flush=True,
    )
    os.environ.setdefault("FEDGRAPH_NOISE_SECRET", "fedgraph-bench-gap-federation")
    tag = "".join(f"-{k}={v}" for k, v in sorted(extra.items()))
    results = {}
    for name, s in settings.items():
        accs, secs, eps = [], [], []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t = time.time()
            run_config = {
                "method": "gap",
                "dataset": args.dataset,
                "data-root": args.data_root,
                "min-class-size": args.min_class_size,
                "split": "random-75-10-15",
                "level": args.level,
                "client-epsilons": str(args.epsilon),
                "seed": seed,
                "encoder-rounds": 10,
                "classifier-rounds": 10,
                "local-epochs": 10,
                "noise-source": "secret",
                "output-dir": str(Path(args.out).parent / "gap_federation_runs"),
                "run-name": (
                    f"{name.replace(' ', '_').replace(',', '')}-{args.level}"
                    f"-eps{args.epsilon:g}{tag}-seed{seed}"
                ),
                **s,
                **extra,
            }
            if not s.get("cross-client-edges", True):  # nothing to aggregate securely
                run_config.pop("secure-aggregation", None)
            report = _reusable(run_config) if args.reuse else None
            if report is None:
                report = (
                    run_local(run_config) if args.local else run_simulation(run_config, num_cpus=2)
                )
                secs.append(time.time() - t)
            else:
                secs.append(report["timings_s"]["total"])
            accs.append(report["accuracy"]["test"])
            eps.append(max(v["epsilon"] for v in report["privacy"]["per_subject"].values()))
        shares = largest_class_shares(run_config)
        results[name] = {
            "mean": statistics.mean(accs),
            "std": statistics.pstdev(accs),
            "largest_class_share": {
                "min": min(shares),
                "median": statistics.median(shares),
                "max": max(shares),
            },
            "max_client_epsilon_from_ledger": max(eps),
            "released_per_round": report["privacy"]["schedule"],  # the report's
            "runs": accs,
            "seconds": statistics.mean(secs),
            "peak_rss_mib_driver": peak_rss_mib(),
        }
        print(
            f"{name:<48} test acc {100 * results[name]['mean']:.1f} +- "
            f"{100 * results[name]['std']:.1f} over {len(accs)} seed(s) "
            f"({', '.join(f'{100 * a:.1f}' for a in accs)})  "
            f"({results[name]['seconds']:.0f} s/run; "
            f"largest class share per client {min(shares):.2f}-{max(shares):.2f}; "
            f"max client eps {max(eps):.3g})\n    privacy cost of the schedule: "
            f"{report['privacy']['schedule']}",
            flush=True,
        )
    if "1 client" in results:
        base = results["1 client"]["mean"]
        for r in results.values():
            r["lost_vs_one_client"] = base - r["mean"]
    load_end = os.getloadavg()
    print("load average at end: " + " / ".join(f"{v:.1f}" for v in load_end))
    out = write_json_atomic(
        args.out,
        {
            "args": vars(args),
            "command": command,
            "load_average": {"start": load_start, "end": load_end},
            "results": results,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
