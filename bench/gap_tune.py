"""One-client GAP architecture and hyperparameter sweep (diagnostic, not a test).

Runs the computation a one-client federated GAP run does (``fedgraph.methods.gap.models``'
``build_encoder`` / ``build_classifier``, full-batch Adam, PMA with the calibrated noise, the
classifier's best validation epoch), without the Flower round trips, so that a sweep over
architectures and hyperparameters costs seconds per run. The encoder does not depend on the
noise, so one encoder serves every epsilon of a seed (as ``bench/gap_centralized.py`` does).
The final figures of the README come from ``bench/gap_federation.py`` (the real strategy).

Usage:
  python bench/gap_tune.py --seeds 5 --epsilons 4 8 inf --grid batch-norm=false,true \
      encoder-select=false,true [--set edge-unit=directed] [--out results.json]
Every ``--grid`` key is a ``GAPConfig`` key (``batch-norm``, ``lr``, ``hidden``, ``hops``,
``encoder-rounds``, ``classifier-rounds``, ``edge-unit``, ``batch-size``: shuffled
mini-batches of that size instead of full batch, with ``--set schedule=fedavg`` for the config
to accept it, ...) or one of the diagnostics
``encoder-select`` (keep the encoder's best validation epoch, as federated runs at edge level
do), ``encoder-batch-size`` (the encoder's alone: its mini-batches, 0 full batch) and
``bn-parts`` (with ``batch-norm=true``: keep only some batch norms, ``enc-hidden``,
``enc-out``, ``cls-out``, joined by ``+``); the product of the grids runs, each over every
seed and epsilon. Prints mean +- std test accuracy per setting (and every seed's).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import torch

from fedgraph.config import parse_run_config
from fedgraph.data import apply_split
from fedgraph.federation import load_graph
from fedgraph.methods.gap import calibrate_gap, edge_sensitivity, evaluate, fit, pma
from fedgraph.methods.gap.models import build_classifier, build_encoder
from fedgraph.nn.gap import stack_hops

BENCH_KEYS = ("encoder-select", "bn-parts", "encoder-batch-size")


def _bn_parts(model, parts: str):
    """Diagnostic: keep only the batch norms named in ``parts`` (``+``-separated:
    ``enc-hidden``, ``enc-out``, ``cls-out``; ``all``: keep all)."""
    from torch import nn

    if parts == "all":
        return model
    keep = set(parts.split("+"))
    if hasattr(model, "encoder"):
        if "enc-hidden" not in keep:
            model.encoder.norms = nn.ModuleList(nn.Identity() for _ in model.encoder.norms)
        if "enc-out" not in keep:
            model.out_norm = nn.Identity()
    elif "cls-out" not in keep:
        model.out_norm = nn.Identity()
    return model


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _seeded(build, cfg, f, c):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return build(cfg, f, c)


def run_setting(data0, base: dict, setting: dict, seeds: list[int], epsilons: list[float]):
    """Test accuracy per (epsilon, seed) of one setting."""
    out = {eps: [] for eps in epsilons}
    for seed in seeds:
        rc = {**base, **{k: v for k, v in setting.items() if k not in BENCH_KEYS}, "seed": seed}
        cfg = parse_run_config(rc)
        data = apply_split(data0.clone(), cfg.split, seed)
        x, y = data.x, data.y
        nf, nc = x.size(1), int(y.max()) + 1
        torch.manual_seed(seed)  # dropout draws
        parts = str(setting.get("bn-parts", "all"))
        enc = _bn_parts(_seeded(build_encoder, cfg, nf, nc), parts)
        batch = cfg.batch_size or None  # 0: full batch; n: shuffled mini-batches of n
        enc_batch = int(setting.get("encoder-batch-size", cfg.batch_size)) or None
        fit(
            enc,
            x,
            y,
            data.train_mask,
            data.val_mask,
            epochs=cfg.encoder_rounds,
            lr=cfg.lr,
            batch_size=enc_batch,
            select_on_val=bool(setting.get("encoder-select", False)),
        )
        x0 = enc.embed(x)
        for eps in epsilons:
            z = (
                calibrate_gap(
                    eps, cfg.delta, num_hops=cfg.hops, level="edge", accountant="analytic"
                )
                if math.isfinite(eps)
                else 0.0
            )
            sigma = z * edge_sensitivity(cfg.edge_unit)
            gen = torch.Generator().manual_seed(10_000 + seed)
            feats = stack_hops(pma(x0, data.edge_index, cfg.hops, sigma, gen))
            clf = _bn_parts(_seeded(build_classifier, cfg, nf, nc), parts)
            fit(
                clf,
                feats,
                y,
                data.train_mask,
                data.val_mask,
                epochs=cfg.classifier_rounds,
                lr=cfg.lr,
                batch_size=batch,
                select_on_val=True,
                generator=torch.Generator().manual_seed(20_000 + seed),
            )
            out[eps].append(evaluate(clf, feats, y, data.test_mask)["accuracy"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="facebook100:Wisconsin87")
    p.add_argument("--data-root", default=str(Path(__file__).parents[2] / "shared" / "data"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--epsilons", type=float, nargs="+", default=[4.0])
    p.add_argument("--grid", nargs="*", default=[], metavar="KEY=V1,V2")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    base = {
        "method": "gap",
        "dataset": args.dataset,
        "data-root": args.data_root,
        "min-class-size": 1000,
        "split": "random-75-10-15",
        "level": "edge",
        "num-clients": 1,
        "partitioner": "random",
        "encoder-rounds": 100,
        "classifier-rounds": 100,
        "local-epochs": 1,
        "schedule": "fedsgd",
    }
    for kv in args.set:
        k, v = kv.split("=", 1)
        base[k] = _value(v)
    grid = [
        (k, [_value(v) for v in vs.split(",")]) for k, vs in (g.split("=", 1) for g in args.grid)
    ]
    data0 = load_graph(parse_run_config(base))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results = []
    for combo in itertools.product(*[vs for _, vs in grid]) if grid else [()]:
        setting = dict(zip([k for k, _ in grid], combo))
        t = time.time()
        accs = run_setting(data0, base, setting, seeds, args.epsilons)
        secs = time.time() - t
        for eps, a in accs.items():
            row = {
                "setting": setting,
                "set": args.set,
                "epsilon": eps,
                "seeds": seeds,
                "runs": a,
                "mean": statistics.mean(a),
                "std": statistics.pstdev(a) if len(a) > 1 else 0.0,
            }
            results.append(row)
            print(
                f"{json.dumps(setting)} {' '.join(args.set)} eps {eps:g}: "
                f"{100 * row['mean']:.2f} +- {100 * row['std']:.2f} "
                f"({', '.join(f'{100 * v:.1f}' for v in a)})  [{secs:.0f} s]",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
