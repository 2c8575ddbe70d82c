"""PrivGNN, centralized (one client): student accuracy and epsilon against lambda, beside the
non-private baselines (B1: teacher on the whole private graph, inductive; B2: student on the
true public labels of the query nodes) and the membership-inference AUROC (shadow attack,
paper App. C, Attack-1) of the released student and of B1.

    .venv/bin/python bench/privgnn_centralized.py --datasets cora --seeds 1

Data root: ``<repo>/../shared/data``. The clean teacher posteriors are computed once per seed
and noised for every lambda: each lambda's result has exactly the distribution of a separate
run (the lambdas are then correlated through the shared teachers, not biased).
Writes ``bench/results/privgnn_centralized.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from fedgraph.report import write_json_atomic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedgraph.audit import membership_auroc, node_sample_graph  # noqa: E402
from fedgraph.data import load_dataset  # noqa: E402
from fedgraph.methods import privgnn as pg  # noqa: E402
from fedgraph.methods.training import train_node_classifier  # noqa: E402
from fedgraph.nn import adjacency_for  # noqa: E402
from fedgraph.procstats import peak_rss_mib  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def predict_fn(model):
    def f(graph):
        model.eval()
        with torch.no_grad():
            return model(
                graph.x, adjacency_for("sage", graph.edge_index, int(graph.num_nodes))
            ).softmax(-1)

    return f


def shadow_trainer(num_classes, epochs):
    def train(graph):
        torch.manual_seed(0)
        m = pg.make_sage(graph.x.shape[1], num_classes)
        n = int(graph.num_nodes)
        mask = torch.ones(n, dtype=torch.bool)
        train_node_classifier(
            m,
            graph.x,
            adjacency_for("sage", graph.edge_index, n),
            graph.y,
            mask,
            mask,
            epochs=epochs,
        )
        return predict_fn(m)

    return train


def run_seed(name, seed, args):
    data = load_dataset(name, root=DATA)
    private, public, audit = pg.privgnn_split(
        data,
        public_fraction=args.public_fraction,
        public_test_fraction=args.public_test_fraction,
        audit_fraction=args.audit_fraction,
        seed=seed,
    )
    C = int(data.y.max()) + 1
    gen = torch.Generator().manual_seed(seed)
    qidx = pg.select_queries(public, args.queries, "random", generator=gen)
    hoods = pg.query_neighbourhoods(public, qidx, 2, generator=gen)
    proj = (
        pg.public_projection(public.x, args.projection_dim, seed) if args.projection_dim else None
    )
    cfg = pg.TeacherConfig(
        epochs=args.teacher_epochs, hidden=args.hidden, batch_size=args.batch_size
    )
    timing = pg.TeacherTiming()
    t0 = time.perf_counter()
    post = pg.teacher_posteriors(
        private,
        public.x[qidx],
        rate=args.rate,
        k=args.k,
        num_classes=C,
        teacher=cfg,
        neighbourhoods=hoods,
        projection=proj,
        generator=gen,
        timing=timing,
    )
    row = {
        "dataset": name,
        "seed": seed,
        "private_nodes": private.num_nodes,
        "public_nodes": public.num_nodes,
        "queries": int(qidx.numel()),
        "teacher_seconds_per_query": timing.per_query,
        "clean_label_accuracy": float((post.argmax(-1) == public.y[qidx]).float().mean()),
        "majority": pg.majority_accuracy(public),
        "lambdas": {},
    }
    b1 = pg.nonprivate_teacher(private, public, epochs=args.student_epochs, seed=seed)
    b2 = pg.public_label_student(public, qidx, epochs=args.student_epochs, seed=seed)
    row["B1_nonprivate_teacher"] = b1.test_accuracy
    row["B2_public_labels"] = b2.test_accuracy
    # membership audit graphs: equal-size induced subgraphs
    m = audit.num_nodes // 3
    parts = torch.randperm(audit.num_nodes, generator=gen)
    from fedgraph.methods.privgnn.split import _induced

    shadow_in, shadow_out, nonmem = (_induced(audit, parts[i * m : (i + 1) * m]) for i in range(3))
    members = node_sample_graph(private, m, gen)
    shadow = shadow_trainer(C, args.student_epochs)
    row["auroc_B1"] = membership_auroc(
        predict_fn(b1.model),
        members,
        nonmem,
        shadow_train=shadow,
        shadow_members=shadow_in,
        shadow_nonmembers=shadow_out,
        seed=seed,
    )
    for lam in args.lambdas:
        noisy = pg.noisy_answers(post, lam, args.mode, gen)
        labels = pg.aggregate_answers([noisy])
        st = pg.train_student(public, qidx, labels, epochs=args.student_epochs, seed=seed)
        eps = {
            acc: pg.privgnn_epsilon(int(qidx.numel()), args.rate, lam, args.delta, acc)
            for acc in ("pld", "rdp")
        }
        auc = membership_auroc(
            predict_fn(st.model),
            members,
            nonmem,
            shadow_train=shadow,
            shadow_members=shadow_in,
            shadow_nonmembers=shadow_out,
            seed=seed,
        )
        row["lambdas"][str(lam)] = {
            "student_test_accuracy": st.test_accuracy,
            "pseudo_label_accuracy": float((labels == public.y[qidx]).float().mean()),
            "epsilon_pld": eps["pld"],
            "epsilon_rdp": eps["rdp"],
            "auroc_student": auc,
        }
    row["seconds"] = time.perf_counter() - t0
    return row


def mean_std(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["cora", "facebook100:Wisconsin87"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.2, 0.4, 0.8, 1.0])
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--rate", type=float, default=0.3)
    p.add_argument("--k", type=int, default=300)
    p.add_argument("--delta", type=float, default=1e-4)
    p.add_argument("--mode", default="posterior", choices=["posterior", "vote"])
    p.add_argument("--teacher-epochs", type=int, default=200)
    p.add_argument("--student-epochs", type=int, default=200)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--projection-dim", type=int, default=0, help="0: raw features (paper)")
    p.add_argument("--public-fraction", type=float, default=0.5)
    p.add_argument("--public-test-fraction", type=float, default=0.5)
    p.add_argument("--audit-fraction", type=float, default=0.2)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "privgnn_centralized.json"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    rows = []
    for name in args.datasets:
        for seed in range(args.seeds):
            rows.append(run_seed(name, seed, args))
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for name in args.datasets:
        rs = [r for r in rows if r["dataset"] == name]
        s = {
            k: mean_std([r[k] for r in rs])
            for k in (
                "B1_nonprivate_teacher",
                "B2_public_labels",
                "auroc_B1",
                "majority",
                "clean_label_accuracy",
                "teacher_seconds_per_query",
            )
        }
        for lam in args.lambdas:
            for k in rs[0]["lambdas"][str(lam)]:
                s[f"lambda={lam}:{k}"] = mean_std([r["lambdas"][str(lam)][k] for r in rs])
        summary[name] = s
        print(f"\n{name} (mean ± std over {len(rs)} seeds)")
        for k, (mu, sd) in s.items():
            print(f"  {k:45s} {mu:8.4f} ± {sd:.4f}")
    peak = peak_rss_mib()
    out = {
        "args": vars(args),
        "rows": rows,
        "summary": summary,
        "wall_seconds": time.perf_counter() - t0,
        "peak_rss_mib": peak,
    }
    print(f"\nwall {out['wall_seconds']:.1f} s, peak RSS {peak:.0f} MiB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, out)


if __name__ == "__main__":
    main()
