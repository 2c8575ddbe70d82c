"""GAP benchmark, centralized (one client): the paper's Facebook table on Facebook100 Wisconsin87.

Not a test (minutes per seed). Runs ``fedgraph.methods.gap.run_gap`` on
facebook100:Wisconsin87 (class years with >= 1000 students, 75/10/15 random split per seed):

  MLP (edge level, no edges), GAP-inf (no noise), GAP edge level at eps in {1, 2, 4, 8},
  GAP node level at eps in {4, 8, 16} (D = --max-degree, DP-SGD on encoder and classifier),
  and the paper's other baselines (issue #3 item 4): GraphSAGE without DP ("sage": PyG's
  GraphSAGE, K = --hops mean-aggregation layers), MLP-DP ("mlp-node:eps": the MLP trained with
  DP-SGD at node level) and GraphSAGE with DP-SGD ("sage-node:eps": one mean-aggregation layer
  on the graph with out-degrees bounded by D = --max-degree, DP-SGD with the group sensitivity
  (2D + 1) C and no amplification credit, noisy aggregation at inference; see
  ``fedgraph.methods.gap.train_sage_dp``), each at eps in {4, 8, 16}.

Hyperparameters are the paper's (reference code experiments.ipynb): K = --hops (the paper
tunes 1..5), encoder 2 layers of width 16, base 1 layer, head 1 layer, cat, SELU, dropout 0,
Adam lr 0.01; edge level/non-private: 100 encoder + 100 classifier epochs full batch with batch
norm; node level: 10 + 10 epochs, batch 256, clipping norm 1, no batch norm; delta = 1e-(digits
of |E|) (edge) or of the training nodes (node).

The edge-level runs of one seed (GAP-inf and every eps) share one encoder: it is trained
without the graph and without noise, so it is the same model for all of them (a run's "wall s"
adds that encoder's time to its own, as if run alone). Peak RSS is the process's maximum
resident set so far (ru_maxrss), so it is monotone over the table.

The paper's numbers on Facebook (UIllinois20, a sibling college) for the expected shape:
GAP-inf 80.0, GAP edge eps=4 76.3, GAP node eps=8 63.2, MLP 50.8.

Usage: python bench/gap_centralized.py [--seeds 5] [--first-seed 0] [--configs mlp gap-inf edge:4 node:8 sage
       sage-node:8 mlp-node:8 ...]
       [--data-root ../shared/data] [--hops 2] [--max-degree 100] [--delta 1e-7]
       [--dataset cora --min-class-size 1]
Writes bench/results/gap_centralized.json and prints a table (mean +- std accuracy).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from fedgraph.data import gap_split, load_dataset
from fedgraph.methods.gap import run_gap
from fedgraph.procstats import peak_rss_mib

CONFIGS = [
    "mlp",
    "gap-inf",
    "edge:1",
    "edge:2",
    "edge:4",
    "edge:8",
    "node:4",
    "node:8",
    "node:16",
    "sage",
    "mlp-node:4",
    "mlp-node:8",
    "mlp-node:16",
    "sage-node:4",
    "sage-node:8",
    "sage-node:16",
]
#: config prefix before ":eps" -> (method, level)
PRIVATE = {
    "edge": ("gap", "edge"),
    "node": ("gap", "node"),
    "mlp-node": ("mlp", "node"),
    "sage-node": ("sage", "node"),
}
PAPER = {"mlp": 50.8, "gap-inf": 80.0, "edge:4": 76.3, "node:8": 63.2}  # UIllinois20


def parse(config: str) -> dict:
    """``mlp``, ``gap-inf``, ``sage`` (non-private) or ``<prefix>:<eps>`` with a prefix of
    :data:`PRIVATE`, as keyword arguments of ``run_gap``."""
    if config in ("mlp", "gap-inf", "sage"):
        return {"method": config, "level": "edge"}
    prefix, _, eps = config.partition(":")
    if prefix not in PRIVATE or not eps:
        raise ValueError(
            f"unknown config {config!r}; known: mlp, gap-inf, sage, "
            f"{', '.join(p + ':<eps>' for p in PRIVATE)}"
        )
    method, level = PRIVATE[prefix]
    return {"method": method, "level": level, "epsilon": float(eps)}


def _finite(obj):
    """JSON without Infinity/NaN: non-finite floats become strings ("inf", "nan")."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def summarize(runs: dict[str, list[dict]], quiet: bool = False) -> dict:
    """Mean and std (population) over seeds per config; prints the table unless ``quiet``."""
    summary = {}
    if not quiet:
        print(
            f"\n{'config':<13} {'test acc':>13} {'val acc':>13} {'sigma':>7} {'eps spent':>9} "
            f"{'wall s':>7} {'peak MiB':>8}  paper (UIllinois20)"
        )
    for config, rs in runs.items():
        if not rs:
            continue
        acc = [100 * r["test_acc"] for r in rs]
        val = [100 * r["val_acc"] for r in rs]
        eps = [float(r["epsilon_spent"]) for r in rs]
        row = {
            "seeds": sorted(r["seed"] for r in rs),
            "test_mean": statistics.mean(acc),
            "test_std": statistics.pstdev(acc),
            "val_mean": statistics.mean(val),
            "val_std": statistics.pstdev(val),
            "sigma": statistics.mean(float(r["sigma"]) for r in rs),
            "epsilon_spent": max(eps),
            "wall_s": statistics.mean(r["wall_s"] for r in rs),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
            "paper": PAPER.get(config),
        }
        summary[config] = row
        if not quiet:
            paper = f"{row['paper']:.1f}" if row["paper"] is not None else ""
            print(
                f"{config:<13} {row['test_mean']:6.1f} +- {row['test_std']:4.1f} "
                f"{row['val_mean']:6.1f} +- {row['val_std']:4.1f} {row['sigma']:7.3f} "
                f"{row['epsilon_spent']:9.3f} {row['wall_s']:7.1f} {row['peak_rss_mib']:8.0f}  "
                f"{paper}"
            )
    return summary


def write(out: str | Path, payload: dict) -> Path:
    """Atomic JSON write (temporary file + ``os.replace``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(_finite(payload), indent=2, default=str, allow_nan=False))
    os.replace(tmp, out)
    return out


def merge(paths: list[str], out: str) -> None:
    """Combine the runs of several result files (e.g. seeds run in parallel processes)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    runs: dict[str, list[dict]] = {}
    for part in parts:
        for config, rs in part["runs"].items():
            have = {r["seed"] for r in runs.get(config, [])}
            dup = have & {r["seed"] for r in rs}
            if dup:
                raise ValueError(f"{config}: seeds {sorted(dup)} appear in more than one file")
            runs.setdefault(config, []).extend(rs)
    payload = {k: parts[0][k] for k in ("args", "num_nodes", "num_edges")}
    payload["merged_from"] = paths
    payload.update(summary=summarize(runs), runs=runs)
    print(f"wrote {write(out, payload)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="facebook100:Wisconsin87")
    p.add_argument("--min-class-size", type=int, default=1000)
    p.add_argument(
        "--data-root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    p.add_argument("--configs", nargs="+", default=CONFIGS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--first-seed", type=int, default=0, help="run seeds first-seed .. first-seed + seeds - 1"
    )
    p.add_argument("--hops", type=int, default=2)
    p.add_argument("--max-degree", type=int, default=100)
    p.add_argument("--accountant", default="prv")
    p.add_argument(
        "--delta",
        type=float,
        default=None,
        help="delta of every private run (default: the paper's 1e-(digits of |E|), "
        "node level of the training nodes); 1e-7: ProGAP's rows "
        "(bench/progap.py)",
    )
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gap_centralized.json"))
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="only combine these result files' runs into --out (no training)",
    )
    args = p.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    specs = {c: parse(c) for c in args.configs}

    t0 = time.perf_counter()
    data = load_dataset(args.dataset, root=args.data_root, min_class_size=args.min_class_size)
    print(
        f"{args.dataset}: {data.num_nodes} nodes, {data.edge_index.size(1)} directed edges, "
        f"{data.x.size(1)} features, {int(data.y.max()) + 1} classes "
        f"(loaded in {time.perf_counter() - t0:.1f} s); torch threads {torch.get_num_threads()}",
        flush=True,
    )
    runs: dict[str, list[dict]] = {c: [] for c in specs}
    payload = {
        "args": vars(args),
        "num_nodes": int(data.num_nodes),
        "num_edges": int(data.edge_index.size(1)),
    }
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        split = gap_split(data, seed)
        shared = None  # (encoder output, seconds) of this seed's edge-level encoder
        for config, spec in specs.items():
            # edge_unit: the paper's (a directed edge), whose results this reproduces;
            # fedgraph's default is the undirected edge (sensitivity sqrt 2)
            kw = dict(
                num_hops=args.hops,
                max_degree=args.max_degree,
                edge_unit="directed",
                accountant=args.accountant,
                seed=seed,
                **spec,
            )
            if args.delta is not None:
                kw["delta"] = args.delta
            # GAP's edge-level encoder is shared; MLP and GraphSAGE have none
            share = spec["method"] in ("gap", "gap-inf") and spec["level"] == "edge"
            if share and shared is not None:
                kw["encoder_output"] = shared[0]
            t = time.perf_counter()
            r = run_gap(split, return_encoder_output=share and shared is None, **kw)
            wall = time.perf_counter() - t
            if share and shared is None:
                shared = (
                    r.pop("encoder_output"),  # its training and its output's time
                    r["timings"]["encoder"] + r["timings"].get("embed", 0.0),
                )
            elif share:
                wall += shared[1]
            r.update(seed=seed, wall_s=wall, peak_rss_mib=peak_rss_mib())
            runs[config].append(r)
            print(
                f"seed {seed} {config:<12} test {100 * r['test_acc']:5.1f} val "
                f"{100 * r['val_acc']:5.1f} sigma {r['sigma']:.3f} eps_spent "
                f"{r['epsilon_spent']:.3f} delta {r['delta']:.0e} wall {wall:6.1f} s "
                f"({', '.join(f'{k} {v:.1f}' for k, v in r['timings'].items())}) "
                f"peak RSS {r['peak_rss_mib']:.0f} MiB",
                flush=True,
            )
        # after every seed, so an interrupted bench keeps what it finished
        write(args.out, {**payload, "summary": summarize(runs, quiet=True), "runs": runs})

    summarize(runs)
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
