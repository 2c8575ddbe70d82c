"""PPGNN benchmark: the tables of issue 2 (not a test; minutes per dataset).

Runs the same client and server functions the Flower apps run (fedgraph.methods.ppgnn), with
one client holding every user (the paper's centralized setting), over several seeds:

A. one uniform level eps = 1 for features, clean labels, GraphSAGE: LPGNN (multi-bit + KProp)
   and PPGNN with a single level (MLR + FlexProp; ESW unused).
B. heterogeneous levels E = {1, 2, 4}, equal shares: PPGNN (PPM + FlexProp), BASE (PPM, no
   calibration) and LPGNN at the smallest level for everyone (multi-bit eps = 1 + KProp);
   with ``--settings "ref: LPGNN eps=4 (all)"`` also the upper reference (everyone at eps = 4),
   and with ``"control: LPGNN eps=0.01 (all)"`` a control whose features are nearly pure noise:
   the accuracy the graph structure and the training labels give without the features.

C. the K sweep of issue 18 (``--steps 0 2 4 8 16``): every setting trained at each K on the
   same reports (one perturbation per seed; :func:`fedgraph.methods.ppgnn.fit_each_steps`),
   by default LPGNN at the smallest and at the largest level for everyone, PPGNN, BASE and
   NonPriv; markdown tables per dataset with mean +- standard error, the LPGNN reference
   code's published figures (:data:`LPGNN_REFERENCE`), PPGNN - LPGNN(smallest) and
   LPGNN(largest) - LPGNN(smallest) paired by seed, and the share of the latter that PPGNN
   captures where it is separable.

Usage: python bench/ppgnn_table.py [--datasets cora citeseer facebook-pagepage] [--seeds 5]
       [--steps 0 2 4 8 16]
       [--first-seed 0] [--data-root ../shared/data] [--paired "B: LPGNN eps=1 (all)"]
       python bench/ppgnn_table.py --merge a.json b.json --paired "B: LPGNN eps=1 (all)"
Writes bench/results/ppgnn_table.json and prints a line per row (mean +- std test accuracy
over the seeds) and, for a K sweep, markdown tables (mean ± standard error). With
``--paired REF`` it also prints, per dataset, every setting's difference to REF paired by seed
(same seed = same split, same level assignment): mean +- standard error and wins/ties/losses.
``--merge`` combines earlier result files (runs keyed by seed; a later file wins a seed) and
prints the same tables without running anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fedgraph.config import parse_run_config
from fedgraph.federation import load_federated
from fedgraph.methods import ppgnn
from fedgraph.procstats import peak_rss_mib
from fedgraph.report import write_json_atomic

SETTINGS = {
    "A: LPGNN eps=1": {
        "budgets": "1",
        "mechanism": "multi-bit",
        "epsilon": 1.0,
        "denoiser": "kprop",
    },
    "A: PPGNN eps=1": {"budgets": "1", "mechanism": "ppm", "denoiser": "flexprop"},
    # PPGNN as published: FlexProp with the level weights of Eq. 12 at every step.
    "B: PPGNN E={1,2,4}": {
        "budgets": "1,2,4",
        "mechanism": "ppm",
        "denoiser": "flexprop",
        "weights": "level",
    },
    # PPGNN with FlexProp source weights from the posterior of the level given ESW's output
    # (``weights = "posterior"``, fedgraph.mechanisms.ppm.posterior_inverse_variance).
    "B: PPGNN E={1,2,4} posterior": {
        "budgets": "1,2,4",
        "mechanism": "ppm",
        "denoiser": "flexprop",
        "weights": "posterior",
    },
    "B: BASE E={1,2,4}": {"budgets": "1,2,4", "mechanism": "ppm", "denoiser": "none"},
    "B: LPGNN eps=1 (all)": {
        "budgets": "1,2,4",
        "mechanism": "multi-bit",
        "epsilon": 1.0,
        "denoiser": "kprop",
    },
    # Reference, not a baseline: every user at the largest level. PPGNN should land between
    # this and "LPGNN eps=1 (all)"; the gap between the two bounds is all PPGNN can win.
    # (budgets "4": every user's budget is the epsilon spent; the reports are the same as with
    # budgets "1,2,4", which a uniform mechanism ignores, but a run refuses an epsilon above a
    # level's budget: fedgraph.federation.check_feature_budgets)
    "ref: LPGNN eps=4 (all)": {
        "budgets": "4",
        "mechanism": "multi-bit",
        "epsilon": 4.0,
        "denoiser": "kprop",
    },
    # Ablation: PPGNN's reports (PPM) propagated uniformly (KProp) instead of with FlexProp's
    # level weights (Eq. 12, applied at every step).
    "ablation: PPM + KProp E={1,2,4}": {
        "budgets": "1,2,4",
        "mechanism": "ppm",
        "denoiser": "kprop",
    },
    # Control: features at eps = 0.01 carry almost nothing (a report's sign is +-1 with
    # probability 1/2 +- 0.0025 x). What this row reaches, the graph and the labels reach alone.
    "control: LPGNN eps=0.01 (all)": {
        "budgets": "1,2,4",
        "mechanism": "multi-bit",
        "epsilon": 0.01,
        "denoiser": "kprop",
    },
    # NonPriv (the paper's upper bound): clean features, no propagation. Multi-bit at
    # eps = 1e5 samples every dimension (m = d) at eps / d >= 21 per dimension on these datasets,
    # so a sign flips with probability < 1e-9: the features arrive unchanged.
    "ref: NonPriv (clean features)": {
        "budgets": "100000",
        "mechanism": "multi-bit",
        "epsilon": 1e5,
        "denoiser": "none",
    },
    # The same clean features propagated (KProp), K in {1, 2, 4, 8, 16} chosen on validation.
    "ref: clean features + KProp": {
        "budgets": "100000",
        "mechanism": "multi-bit",
        "epsilon": 1e5,
        "denoiser": "kprop",
        "steps": "1,2,4,8,16",
    },
}


#: issue 18's K sweep: LPGNN at the smallest and at the largest level for everyone, PPGNN as
#: shipped (posterior FlexProp weights), BASE and NonPriv (no propagation: K = 0 only).
SWEEP_SETTINGS = [
    "B: LPGNN eps=1 (all)",
    "ref: LPGNN eps=4 (all)",
    "B: PPGNN E={1,2,4} posterior",
    "B: BASE E={1,2,4}",
    "ref: NonPriv (clean features)",
]

#: The LPGNN reference code (github.com/sisaman/LPGNN: GraphSAGE, multi-bit features at
#: eps_x = 1, clean labels, 50/25/25 split, 3 repeats), test accuracy (%) by K (KProp steps
#: Kx), as issue 18 measured it. Printed beside "LPGNN eps=1 (all)"; not a result of ours.
LPGNN_REFERENCE = {
    "cora": {0: 78.58, 4: 84.19, 16: 84.15},
    "facebook-pagepage": {0: 90.97, 4: 93.03, 8: 92.89, 16: 90.51},
}


def run_once(dataset: str, setting: dict, seed: int, data_root: str, extra: dict) -> float:
    """Test accuracy of one run of ``setting`` (K chosen on validation, as the server does)."""
    return run_each_steps(dataset, setting, seed, data_root, extra, None)["selected"][0]


def run_each_steps(
    dataset: str, setting: dict, seed: int, data_root: str, extra: dict, steps: list[int] | None
) -> dict:
    """One perturbation of ``setting`` on ``seed``, then the server trained once per K.

    ``steps`` (the K sweep) overrides the setting's candidate K; ``None`` keeps them. Returns
    ``{K: (test acc, val acc, selected epoch), ..., "selected": that triple for the K with the
    best validation accuracy}``; a setting without denoiser has only K = 0.
    """
    over = {} if steps is None else {"steps": ",".join(map(str, steps))}
    cfg = parse_run_config(
        {
            "dataset": dataset,
            "data-root": data_root,
            "num-clients": 1,
            "seed": seed,
            **setting,
            **over,
            **extra,
        }
    )
    data, clients = load_federated(cfg, cfg.budgets, cfg.shares)
    gen = torch.Generator().manual_seed(seed)
    c = clients[0]
    rep = ppgnn.client_report(c, cfg, data.feature_domain, int(data.y.max()) + 1, gen)
    out, best = {}, None
    for fit in ppgnn.fit_each_steps(
        [rep], cfg, data.num_nodes, data.num_features, int(data.y.max()) + 1
    ):
        test = float((fit.predictions[c.test_mask] == c.y[c.test_mask]).float().mean())
        out[fit.train.steps] = (test, fit.train.val_accuracy, fit.train.best_epoch)
        if best is None or fit.train.val_accuracy > best[1]:
            best = out[fit.train.steps]
    out["selected"] = best
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["cora", "citeseer", "facebook-pagepage"])
    p.add_argument(
        "--settings",
        nargs="+",
        choices=list(SETTINGS),
        metavar="SETTING",
        default=None,
        help="rows to run (quote each): " + "; ".join(f"'{k}'" for k in SETTINGS),
    )
    p.add_argument(
        "--steps",
        nargs="+",
        type=int,
        default=None,
        metavar="K",
        help="K sweep: train every setting at each K on the same reports (default "
        "settings: " + "; ".join(SWEEP_SETTINGS) + ")",
    )
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument(
        "--paired", default=None, metavar="REF", help="setting to compare against, by seed"
    )
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON", help="combine result files")
    p.add_argument("--data-root", default=str(Path(__file__).parents[2] / "shared" / "data"))
    p.add_argument("--set", nargs="*", default=[], help="extra run-config key=value")
    p.add_argument(
        "--out",
        default=str(Path(__file__).parent / "results" / "ppgnn_table.json"),
        help="result JSON (default: bench/results/ppgnn_table.json)",
    )
    args = p.parse_args()
    if args.settings is None:
        args.settings = (
            SWEEP_SETTINGS
            if args.steps
            else [k for k in SETTINGS if not k.startswith(("ref", "control", "ablation"))]
        )
    if args.steps and any(k < 0 for k in args.steps):
        p.error(f"--steps: K must be >= 0, got {args.steps}")
    if args.paired is not None and args.paired not in SETTINGS:
        p.error(f"--paired: unknown setting {args.paired!r}; allowed: {', '.join(SETTINGS)}")
    if not args.merge and args.paired is not None and args.paired not in args.settings:
        p.error(f"--paired: {args.paired!r} is not among --settings")
    for path in args.merge or []:
        if not Path(path).is_file():
            p.error(f"--merge: no file {path!r}")
    if args.merge:
        results = merge_results(args.merge)
        print_table(results)
    else:
        results = run_sweep(args) if args.steps else run_table(args)
    if any(key.count(" | ") == 2 for key in results):
        print_sweep(results)
    if args.paired:
        print_paired(results, args.paired)
    out = write_json_atomic(args.out, {"args": vars(args), "results": results})
    print(f"wrote {out}")


def run_table(args) -> dict:
    extra = dict(kv.split("=", 1) for kv in args.set)
    results = {}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    for ds in args.datasets:
        for name in args.settings:
            accs, t0 = [], time.time()
            for seed in seeds:
                accs.append(run_once(ds, SETTINGS[name], seed, args.data_root, extra))
            row = summarize(accs, seeds)
            row.update(
                {"seconds_per_run": (time.time() - t0) / len(seeds), "peak_rss_mib": peak_rss_mib()}
            )
            results[f"{ds} | {name}"] = row
            print_row(f"{ds} | {name}", row)
    return results


def run_sweep(args) -> dict:
    """Issue 18's K sweep: per dataset, setting and seed one perturbation, the server trained
    at every K of ``--steps``. Rows ``"<dataset> | <setting> | K=<k>"``."""
    extra = dict(kv.split("=", 1) for kv in args.set)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results = {}
    for ds in args.datasets:
        for name in args.settings:
            by_k: dict[int, list[tuple[float, float, int]]] = {}
            t0 = time.time()
            for seed in seeds:
                out = run_each_steps(ds, SETTINGS[name], seed, args.data_root, extra, args.steps)
                for k, accs in out.items():
                    if k != "selected":
                        by_k.setdefault(k, []).append(accs)
            for k, accs in sorted(by_k.items()):
                row = summarize([a[0] for a in accs], seeds, [a[1] for a in accs])
                row["best_epochs"] = [a[2] for a in accs]
                row.update(
                    {
                        "seconds_per_run": (time.time() - t0) / len(seeds),
                        "peak_rss_mib": peak_rss_mib(),
                    }
                )
                results[f"{ds} | {name} | K={k}"] = row
                print_row(f"{ds} | {name} | K={k}", row)
    return results


def summarize(accs: list[float], seeds: list[int], val: list[float] | None = None) -> dict:
    row = {
        "mean": statistics.mean(accs),
        "std": statistics.pstdev(accs),
        "runs": accs,
        "seeds": seeds,
    }
    if val is not None:
        row.update({"val_mean": statistics.mean(val), "val_runs": val})
    return row


def print_row(key: str, row: dict) -> None:
    ds, name = key.split(" | ", 1)
    timing = (
        f"   ({row['seconds_per_run']:.1f} s/run, process peak RSS so far "
        f"{row['peak_rss_mib']:.0f} MiB)"
        if "seconds_per_run" in row
        else ""
    )
    val = f" (val {100 * row['val_mean']:.1f})" if "val_mean" in row else ""
    if "best_epochs" in row:
        val += f" (selected epochs {min(row['best_epochs'])}-{max(row['best_epochs'])})"
    print(
        f"{ds:<18} {name:<30} test acc {100 * row['mean']:.1f} +- {100 * row['std']:.1f} (std){val}"
        f"  ({len(row['runs'])} seeds){timing}",
        flush=True,
    )


def print_table(results: dict) -> None:
    for key, row in results.items():
        print_row(key, row)


def runs_by_seed(row: dict) -> dict[int, float]:
    """A result row's test accuracies keyed by seed (rows without ``seeds`` ran 0..n-1)."""
    return dict(zip(row.get("seeds", range(len(row["runs"]))), row["runs"]))


def merge_results(paths: list[str]) -> dict:
    """Rows of several result files, runs keyed by seed (a later file wins a seed)."""
    by_key: dict[str, dict[int, float]] = {}
    val_by_key: dict[str, dict[int, float]] = {}
    for path in paths:
        for key, row in json.loads(Path(path).read_text())["results"].items():
            by_key.setdefault(key, {}).update(runs_by_seed(row))
            if "val_runs" in row:
                val_by_key.setdefault(key, {}).update(zip(row["seeds"], row["val_runs"]))
    merged = {}
    for key, runs in by_key.items():
        seeds = sorted(runs)
        val = val_by_key.get(key)
        merged[key] = summarize(
            [runs[s] for s in seeds],
            seeds,
            [val[s] for s in seeds] if val and set(val) == set(runs) else None,
        )
    return merged


def paired_difference(row: dict, ref: dict) -> dict | None:
    """``row - ref`` over the seeds both ran: mean, standard error, wins/ties/losses (points)."""
    a, b = runs_by_seed(row), runs_by_seed(ref)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    diffs = [100 * (a[s] - b[s]) for s in common]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {
        "mean": statistics.mean(diffs),
        "se": se,
        "n": len(diffs),
        "wins": sum(d > 1e-9 for d in diffs),
        "ties": sum(abs(d) <= 1e-9 for d in diffs),
        "losses": sum(d < -1e-9 for d in diffs),
    }


def print_paired(results: dict, ref_name: str) -> None:
    print(f"\npaired by seed, difference to '{ref_name}' (test accuracy points):")
    for key, row in results.items():
        ds, name = key.split(" | ", 1)
        ref = results.get(f"{ds} | {ref_name}")
        if ref is None or name == ref_name:
            continue
        d = paired_difference(row, ref)
        if d is not None:
            print(
                f"{ds:<18} {name:<30} {d['mean']:+.2f} +- {d['se']:.2f} (se, n={d['n']})"
                f"   wins/ties/losses {d['wins']}/{d['ties']}/{d['losses']}"
            )


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    n = len(row["runs"])
    if n == 1:
        return f"{100 * row['mean']:.1f} (1 seed)"
    return f"{100 * row['mean']:.1f} ± {100 * statistics.stdev(row['runs']) / n**0.5:.1f}"


def _diff_cell(d: dict | None) -> str:
    if d is None:
        return ""
    se = f" ± {d['se']:.2f}" if d["n"] > 1 else ""
    return f"{d['mean']:+.2f}{se} ({d['wins']}/{d['ties']}/{d['losses']})"


def print_sweep(results: dict) -> None:
    """Markdown tables of a K sweep, per dataset: mean ± standard error test accuracy (%) per
    setting and K; the LPGNN reference code's figures; paired-by-seed differences PPGNN - LPGNN
    at the smallest level and largest - smallest level (mean ± se, wins/ties/losses), and the
    share of the largest-minus-smallest gap PPGNN captures where that gap is separable
    (mean > 2 se)."""
    lo, hi, pp = "B: LPGNN eps=1 (all)", "ref: LPGNN eps=4 (all)", "B: PPGNN E={1,2,4} posterior"
    datasets = list(dict.fromkeys(k.split(" | ")[0] for k in results if k.count(" | ") == 2))
    for ds in datasets:
        rows = {
            tuple(k.split(" | ")[1:]): v
            for k, v in results.items()
            if k.startswith(ds + " | ") and k.count(" | ") == 2
        }
        ks = sorted({int(k[1][2:]) for k in rows})
        names = list(dict.fromkeys(name for name, _ in rows))
        seeds = max(len(v["runs"]) for v in rows.values())
        print(f"\n{ds}: test accuracy % (mean ± standard error, {seeds} seeds, paired by seed)\n")
        print("| setting | " + " | ".join(f"K = {k}" for k in ks) + " |")
        print("|---|" + "---|" * len(ks))
        for name in names:
            print(f"| {name} | " + " | ".join(_cell(rows.get((name, f"K={k}"))) for k in ks) + " |")
        ref = LPGNN_REFERENCE.get(ds)
        if ref:
            print(
                "| LPGNN reference code (sisaman/LPGNN, eps 1) | "
                + " | ".join(f"{ref[k]:.2f}" if k in ref else "" for k in ks)
                + " |"
            )
            print(
                "| LPGNN eps=1 (ours) - reference | "
                + " | ".join(
                    f"{100 * rows[(lo, f'K={k}')]['mean'] - ref[k]:+.2f}"
                    if k in ref and (lo, f"K={k}") in rows
                    else ""
                    for k in ks
                )
                + " |"
            )
        for a, b, label in ((pp, lo, "PPGNN - LPGNN eps=1"), (hi, lo, "LPGNN eps=4 - eps=1")):
            diffs = [
                paired_difference(rows[(a, f"K={k}")], rows[(b, f"K={k}")])
                if (a, f"K={k}") in rows and (b, f"K={k}") in rows
                else None
                for k in ks
            ]
            if any(diffs):
                print(f"| Δ {label} (points) | " + " | ".join(map(_diff_cell, diffs)) + " |")
        shares = []
        for k in ks:
            keys = [(n, f"K={k}") for n in (pp, lo, hi)]
            if not all(key in rows for key in keys):
                shares.append("")
                continue
            gap = paired_difference(rows[keys[2]], rows[keys[1]])
            won = paired_difference(rows[keys[0]], rows[keys[1]])
            shares.append(
                f"{won['mean'] / gap['mean']:.0%}"
                if gap["n"] > 1 and gap["mean"] > 2 * gap["se"]
                else "not separable"
            )
        if any(shares):
            print("| share of (eps=4 - eps=1) PPGNN captures | " + " | ".join(shares) + " |")


if __name__ == "__main__":
    main()
