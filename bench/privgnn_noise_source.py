"""PrivGNN's pseudo-labels with the federated clients' noise source against the plain run's (not
a test): issue 31 asks for federated runs "at equal accuracy", and over 7 seeds at 1e6 nodes
the federated pseudo-labels averaged 0.50 against 0.57 for ``bench/scale.py``'s plain process.
The two sides run the same code on the same queries and client graphs; what differs is the
randomness: the plain process draws every client's Poisson samples, teacher weights, dropout
masks and Laplace noise from one seeded ``torch.Generator``, a federated client from its own
:class:`fedgraph.randomness.SecureRandom` (the default ``noise-source``).

Per repetition, the same ``Q`` public queries (chosen with ``--seed``, as both runs choose
them) are answered by every client's teachers (:func:`fedgraph.methods.privgnn.teacher_posteriors`
and :func:`~fedgraph.methods.privgnn.noisy_answers`, as ``answer_queries`` does), once with a
``torch.Generator`` shared by the clients and once with a fresh ``SecureRandom`` per client;
the server's argmax of the summed answers (:func:`~fedgraph.methods.privgnn.aggregate_answers`)
is scored against the queries' true labels, noisy and noise-free ("clean"). A third variant,
``client``, runs the federated client's own function on what it receives and holds: the
server's message (:func:`~fedgraph.methods.privgnn.make_queries`), each client's graph as the
partition cache serves it (:func:`fedgraph.federation.privgnn_client_graph`),
:func:`~fedgraph.methods.privgnn.client_answer` with a fresh ``SecureRandom``, and the server's
:func:`~fedgraph.methods.privgnn.aggregate_partial`. The settings are ``bench/scale.py``'s
(``RUN_SETTINGS["privgnn"]``). The partition cache goes to ``$XDG_CACHE_HOME``.

    OMP_NUM_THREADS=1 python bench/privgnn_noise_source.py --nodes 1000000 --seeds 0,1,2 \\
        --repetitions 8 --cache /tmp/sbm --out bench/results/privgnn_noise_source_1e6.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def load_graph(nodes: int, degree: float, cache: str):
    """``synthetic-sbm:<nodes>:<degree>``, from ``bench/scale.py``'s cache folder if there."""
    from fedgraph.data import load_dataset

    name = f"synthetic-sbm:{nodes}:{degree:g}"
    file = Path(cache) / f"{name.replace(':', '_')}.pt" if cache else None
    if file is not None and file.is_file():
        return torch.load(file, weights_only=False)
    return load_dataset(name)


def compare(data, degree: float, clients: int, seed: int, repetitions: int) -> dict:
    """The lists of pseudo-label accuracies per variant (module docs) for one query seed."""
    from scale import _settings

    from fedgraph import randomness as rng
    from fedgraph.config import parse_run_config
    from fedgraph.data import partition
    from fedgraph.methods import privgnn as pg
    from fedgraph.methods.privgnn import teacher_config

    cfg = parse_run_config(
        {**_settings("privgnn", data.num_nodes, degree, clients, "cpu", 64), "seed": seed}
    )
    private, public = pg.privgnn_split(
        data,
        public_fraction=cfg.public_fraction,
        public_test_fraction=cfg.public_test_fraction,
        seed=cfg.seed,
    )
    parts = partition(private, cfg.num_clients, cfg.partitioner, cfg.seed, alpha=cfg.alpha)
    c = int(data.y.max()) + 1
    gen = torch.Generator().manual_seed(cfg.seed)  # the server's query choice, both sides
    qidx = pg.select_queries(public, cfg.num_queries, "random", generator=gen)
    hoods = pg.query_neighbourhoods(public, qidx, cfg.hops, cfg.neighbourhood_size, gen)
    truth = public.y[qidx]
    # the federated clients' own path: the server's message (make_queries, the same queries),
    # each client's graph from the partition cache, client_answer, the server's aggregate_partial
    from fedgraph.federation import privgnn_client_graph
    from fedgraph.methods.privgnn import client as pf

    arrays = pg.make_queries(public, qidx, cfg, torch.Generator().manual_seed(cfg.seed))
    held = [privgnn_client_graph(cfg, i, data) for i in range(cfg.num_clients)]
    out = {k: [] for k in ("torch", "secure", "torch_clean", "secure_clean", "client")}
    for r in range(repetitions):
        replies = [
            pf.client_answer(cfg, i, arrays, 0, rng.SecureRandom(), data=held[i]).answers
            for i in range(cfg.num_clients)
        ]
        agg = pg.aggregate_partial(replies, int(qidx.numel()), c)
        out["client"].append(float((agg.labels == truth[agg.kept]).float().mean()))
        shared = torch.Generator().manual_seed(1000 + r)
        for kind in ("torch", "secure"):
            noisy, clean = [], []
            for p in parts:
                g = shared if kind == "torch" else rng.SecureRandom()
                post = pg.teacher_posteriors(
                    p,
                    hoods.query_x,
                    rate=cfg.gamma,
                    k=cfg.num_neighbours,
                    num_classes=c,
                    teacher=teacher_config(cfg),
                    neighbourhoods=hoods,
                    generator=g,
                )
                clean.append(post)
                noisy.append(pg.noisy_answers(post, cfg.lam, cfg.answer_mode, g))
            out[kind].append(float((pg.aggregate_answers(noisy) == truth).float().mean()))
            out[kind + "_clean"].append(
                float((pg.aggregate_answers(clean) == truth).float().mean())
            )
        print(
            f"seed {seed} repetition {r}: " + "  ".join(f"{k} {v[-1]:.3f}" for k, v in out.items()),
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--degree", type=float, default=50.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seeds", default="0", help="query seeds, comma-separated")
    ap.add_argument("--repetitions", type=int, default=8)
    ap.add_argument("--cache", default="", help="bench/scale.py's graph cache folder")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    data = load_graph(a.nodes, a.degree, a.cache)
    per_seed = {
        s: compare(data, a.degree, a.clients, int(s), a.repetitions) for s in a.seeds.split(",")
    }
    pooled = {
        k: [x for v in per_seed.values() for x in v[k]] for k in next(iter(per_seed.values()))
    }
    summary = {
        k: {"mean": round(statistics.mean(v), 4), "std": round(statistics.stdev(v), 4), "n": len(v)}
        for k, v in pooled.items()
    }
    print(json.dumps(summary))
    if a.out:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {"command": " ".join(sys.argv), "summary": summary, "per_seed": per_seed}, indent=1
            )
        )
        tmp.replace(a.out)


if __name__ == "__main__":
    main()
