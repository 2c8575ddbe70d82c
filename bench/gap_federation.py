"""Federated GAP on Facebook100 (not a test): accuracy lost against one client, with and
without cross-client edges, through real Flower simulations (Ray backend).

Usage: python bench/gap_federation.py [--dataset facebook100:Wisconsin87] [--clients 10]
       [--epsilon 4] [--seeds 1] [--data-root ../shared/data]
Prints a table and writes bench/results/gap_federation.json.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from fedgraph.report import write_json_atomic
from simulations.cli import run_simulation


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="facebook100:Wisconsin87")
    p.add_argument("--min-class-size", type=int, default=1000)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--level", default="edge")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--data-root", default=str(Path(__file__).parents[2] / "shared" / "data"))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gap_federation.json"))
    args = p.parse_args()
    settings = {
        "1 client": {"num-clients": 1, "partitioner": "random"},
        f"{args.clients} clients (louvain), cross-client edges": {
            "num-clients": args.clients, "partitioner": "louvain", "cross-client-edges": True},
        f"{args.clients} clients (louvain), no cross-client edges": {
            "num-clients": args.clients, "partitioner": "louvain", "cross-client-edges": False},
    }
    results = {}
    for name, s in settings.items():
        accs, secs = [], []
        for seed in range(args.seeds):
            t = time.time()
            report = run_simulation({
                "method": "gap", "dataset": args.dataset, "data-root": args.data_root,
                "min-class-size": args.min_class_size, "split": "random-75-10-15",
                "level": args.level, "client-epsilons": str(args.epsilon), "seed": seed,
                "encoder-rounds": 10, "classifier-rounds": 10, "local-epochs": 10,
                "output-dir": str(Path(args.out).parent / "gap_federation_runs"),
                "run-name": f"{name.replace(' ', '_').replace(',', '')}-seed{seed}", **s},
                num_cpus=2)
            accs.append(report["accuracy"]["test"])
            secs.append(time.time() - t)
        results[name] = {"mean": statistics.mean(accs), "std": statistics.pstdev(accs),
                         "runs": accs, "seconds": statistics.mean(secs),
                         "peak_rss_mib_driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        print(f"{name:<48} test acc {100 * results[name]['mean']:.1f} +- "
              f"{100 * results[name]['std']:.1f}  ({results[name]['seconds']:.0f} s/run)", flush=True)
    base = results["1 client"]["mean"]
    for name, r in results.items():
        r["lost_vs_one_client"] = base - r["mean"]
    out = write_json_atomic(args.out, {"args": vars(args), "results": results})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
