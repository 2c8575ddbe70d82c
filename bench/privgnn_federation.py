"""Federated PrivGNN (not a test): student accuracy and per-client epsilon (PLD, RDP) against
lambda, with 1 and 5 clients, beside the non-private baselines (B1: a teacher trained on the
whole private graph, inductive; B2: the student trained on the true labels of the same query
nodes) and the membership-inference AUROC (shadow attack, paper App. C, fedgraph.audit) of the
released student and of B1; mean and std over seeds, wall time and peak memory.

    nice -n 10 .venv/bin/python bench/privgnn_federation.py --datasets cora --seeds 3

The federation runs in-process with the code the Flower apps run (no Ray): the private graph is
partitioned with the run's partitioner, every client's teachers answer the same ``Q`` public
queries (:func:`fedgraph.methods.privgnn.teacher_posteriors` on its own part, public
neighbourhoods and public PCA as in ``query.privgnn``), the server sums the noisy answers
(:func:`fedgraph.methods.privgnn_federated.aggregate_partial`) and trains the student. Clients
have no budget limit here (every client answers all ``Q``), so each client's epsilon is that of
``Q`` answers. The clean posteriors are computed once per (dataset, clients, seed) and noised
for every lambda with fresh Laplace draws of scale 2/lambda: each lambda's result has exactly
the distribution of a separate run (lambdas are correlated through the shared teachers, not
biased). 20% of the nodes are held out of both graphs for the membership audit (shadow
training and non-members), so the private/public graphs are 40%/40% of the nodes.

Writes ``bench/results/privgnn_federation.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tomllib
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from privgnn_centralized import predict_fn, shadow_trainer  # noqa: E402

from fedgraph.audit import membership_auroc, node_sample_graph  # noqa: E402
from fedgraph.config import parse_run_config  # noqa: E402
from fedgraph.data import load_dataset, partition  # noqa: E402
from fedgraph.methods import privgnn as pg  # noqa: E402
from fedgraph.methods import privgnn_federated as pf  # noqa: E402
from fedgraph.report import write_json_atomic  # noqa: E402

DATA = REPO.parent / "shared" / "data"
PRESETS = {"cora": "privgnn-cora", "facebook100:Wisconsin87": "privgnn-wisconsin"}


def run_config(name: str, clients: int, seed: int, args) -> object:
    """The preset of ``name`` with the bench's overrides (no budget limit)."""
    preset = tomllib.loads((REPO / "simulations" / "presets" / f"{PRESETS[name]}.toml").read_text())
    over = {"num-clients": clients, "seed": seed, "client-epsilons": "inf",
            "num-queries": args.queries, "num-neighbours": args.k,
            "teacher-epochs": args.teacher_epochs, "epochs": args.student_epochs,
            "projection-dim": args.projection_dim}
    return parse_run_config({**preset, **over})


class Memo:
    """Trains the attacker's shadow model once per graph (the audits share it)."""

    def __init__(self, train):
        self.train, self.cache = train, {}

    def __call__(self, graph):
        if id(graph) not in self.cache:
            self.cache[id(graph)] = self.train(graph)
        return self.cache[id(graph)]


def run_setting(name: str, clients: int, seed: int, args) -> dict:
    """One (dataset, number of clients, seed): teachers once, then every lambda."""
    t0 = time.perf_counter()
    cfg = run_config(name, clients, seed, args)
    data = load_dataset(name, root=args.data_root, min_class_size=cfg.min_class_size)
    private, public, audit = pg.privgnn_split(
        data, public_fraction=cfg.public_fraction, public_test_fraction=cfg.public_test_fraction,
        audit_fraction=args.audit_fraction, seed=seed)
    parts = partition(private, cfg.num_clients, cfg.partitioner, seed, alpha=cfg.alpha)
    C = int(data.y.max()) + 1
    gen = torch.Generator().manual_seed(seed)
    # server: queries, public neighbourhoods, public PCA (the query.privgnn message)
    proj = pg.public_projection(public.x, cfg.projection_dim, seed) if cfg.projection_dim else None
    qidx = pg.select_queries(public, cfg.num_queries, "random", generator=gen)
    hoods, proj = pf.decode_queries(pf.make_queries(public, qidx, cfg, gen, proj))
    # clients: clean teacher posteriors (kept inside the client in a real run)
    timing = pg.TeacherTiming()
    posts = [pg.teacher_posteriors(c, hoods.query_x, rate=cfg.gamma, k=cfg.num_neighbours,
                                   num_classes=C, teacher=pf.teacher_config(cfg),
                                   neighbourhoods=hoods, projection=proj, generator=gen,
                                   timing=timing) for c in parts]
    clean = pf.aggregate_partial(posts, int(qidx.numel()), C).labels
    row = {"dataset": name, "clients": clients, "seed": seed,
           "private_nodes": int(private.num_nodes), "public_nodes": int(public.num_nodes),
           "queries": int(qidx.numel()), "teacher_seconds_per_query": timing.per_query,
           "clean_label_accuracy": float((clean == public.y[qidx]).float().mean()),
           "majority": pg.majority_accuracy(public), "lambdas": {}}
    kw = dict(hidden=cfg.hidden, dropout=cfg.dropout, epochs=cfg.epochs, lr=cfg.lr,
              weight_decay=cfg.weight_decay, seed=seed)
    b1 = pg.nonprivate_teacher(private, public, epochs=cfg.epochs, seed=seed)
    row["B1_nonprivate_teacher"] = b1.test_accuracy
    row["B2_public_labels"] = pg.public_label_student(public, qidx, **kw).test_accuracy
    # membership audit: members from the private graph, shadow and non-members from the audit set
    m = int(audit.num_nodes) // 3
    perm = torch.randperm(int(audit.num_nodes), generator=gen)
    shadow_in, shadow_out, nonmembers = (pg._induced(audit, perm[i * m:(i + 1) * m])
                                         for i in range(3))
    members = node_sample_graph(private, m, gen)
    shadow = Memo(shadow_trainer(C, cfg.epochs))
    audit_kw = dict(shadow_train=shadow, shadow_members=shadow_in, shadow_nonmembers=shadow_out,
                    seed=seed)
    row["auroc_B1"] = membership_auroc(predict_fn(b1.model), members, nonmembers, **audit_kw)
    for lam in args.lambdas:
        answers = [pg.noisy_answers(p, lam, cfg.answer_mode, gen) for p in posts]
        labels = pf.aggregate_partial(answers, int(qidx.numel()), C).labels
        st = pg.train_student(public, qidx, labels, **kw)
        row["lambdas"][str(lam)] = {
            "student_test_accuracy": st.test_accuracy,
            "pseudo_label_accuracy": float((labels == public.y[qidx]).float().mean()),
            # every client answered all Q queries: the same epsilon for each client
            "epsilon_pld": pg.privgnn_epsilon(int(qidx.numel()), cfg.gamma, lam, cfg.delta, "pld"),
            "epsilon_rdp": pg.privgnn_epsilon(int(qidx.numel()), cfg.gamma, lam, cfg.delta, "rdp"),
            "auroc_student": membership_auroc(predict_fn(st.model), members, nonmembers,
                                              **audit_kw)}
    row["seconds"] = time.perf_counter() - t0
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def mean_std(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(rows, lambdas) -> dict:
    out = {}
    for key in sorted({(r["dataset"], r["clients"]) for r in rows}):
        rs = [r for r in rows if (r["dataset"], r["clients"]) == key]
        s = {k: mean_std([r[k] for r in rs]) for k in
             ("B1_nonprivate_teacher", "B2_public_labels", "auroc_B1", "majority",
              "clean_label_accuracy", "teacher_seconds_per_query", "seconds")}
        for lam in lambdas:
            for k in rs[0]["lambdas"][str(lam)]:
                s[f"lambda={lam}:{k}"] = mean_std([r["lambdas"][str(lam)][k] for r in rs])
        s["seeds"] = len(rs)
        out[f"{key[0]} / {key[1]} client(s)"] = s
    return out


def print_table(summary, lambdas) -> None:
    for name, s in summary.items():
        print(f"\n{name} (mean ± std over {s['seeds']} seeds; epsilon per client at delta)")
        print(f"  majority {s['majority'][0]:.3f}  B1 non-private teacher "
              f"{s['B1_nonprivate_teacher'][0]:.3f} ± {s['B1_nonprivate_teacher'][1]:.3f}  "
              f"B2 public labels {s['B2_public_labels'][0]:.3f} ± {s['B2_public_labels'][1]:.3f}  "
              f"AUROC(B1) {s['auroc_B1'][0]:.3f} ± {s['auroc_B1'][1]:.3f}  "
              f"clean-teacher labels {s['clean_label_accuracy'][0]:.3f}  "
              f"{s['seconds'][0]:.0f} s/seed")
        print(f"  {'lambda':>7} {'student acc':>15} {'label acc':>15} {'eps PLD':>9} "
              f"{'eps RDP':>9} {'AUROC':>15}")
        for lam in lambdas:
            g = lambda k: s[f"lambda={lam}:{k}"]  # noqa: E731
            print(f"  {lam:>7g} {g('student_test_accuracy')[0]:>8.3f} ± "
                  f"{g('student_test_accuracy')[1]:.3f} {g('pseudo_label_accuracy')[0]:>8.3f} ± "
                  f"{g('pseudo_label_accuracy')[1]:.3f} {g('epsilon_pld')[0]:>9.3g} "
                  f"{g('epsilon_rdp')[0]:>9.3g} {g('auroc_student')[0]:>8.3f} ± "
                  f"{g('auroc_student')[1]:.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--clients", type=int, nargs="+", default=[1, 5])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.2, 0.4, 1.0, 2.0, 4.0, 8.0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--k", type=int, default=100, help="K: neighbours per teacher")
    p.add_argument("--teacher-epochs", type=int, default=100)
    p.add_argument("--student-epochs", type=int, default=200)
    p.add_argument("--projection-dim", type=int, default=64, help="0: raw features (paper)")
    p.add_argument("--audit-fraction", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared 2-core machine 2 threads ran 20x slower)")
    p.add_argument("--data-root", default=str(DATA))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "privgnn_federation.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    rows = []
    for name in args.datasets:
        for clients in args.clients:
            for seed in range(args.seeds):
                rows.append(run_setting(name, clients, seed, args))
                r = rows[-1]
                print(f"{name} clients={clients} seed={seed}: {r['seconds']:.0f} s, " + ", ".join(
                    f"lam {k}: {v['student_test_accuracy']:.3f}" for k, v in r["lambdas"].items()),
                    flush=True)
    summary = summarize(rows, args.lambdas)
    print_table(summary, args.lambdas)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"args": vars(args), "command": " ".join(sys.argv), "rows": rows, "summary": summary,
           "wall_seconds": time.perf_counter() - t0, "peak_rss_mib": peak}
    print(f"\nwall {out['wall_seconds']:.1f} s, peak RSS {peak:.0f} MiB")
    write_json_atomic(args.out, out)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
