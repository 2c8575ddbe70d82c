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
(:func:`fedgraph.methods.privgnn.aggregate_partial`) and trains the student. Clients
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
import math
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
from fedgraph.methods.privgnn.split import _induced  # noqa: E402
from fedgraph.procstats import peak_rss_mib  # noqa: E402
from fedgraph.report import write_json_atomic  # noqa: E402

DATA = REPO.parent / "shared" / "data"
PRESETS = {"cora": "privgnn-cora", "facebook100:Wisconsin87": "privgnn-wisconsin"}


def run_config(name: str, clients: int, seed: int, args) -> object:
    """The preset of ``name`` with the bench's overrides (no budget limit)."""
    preset = tomllib.loads((REPO / "simulations" / "presets" / f"{PRESETS[name]}.toml").read_text())
    over = {
        "num-clients": clients,
        "seed": seed,
        "client-epsilons": "inf",
        "num-queries": args.queries,
        "num-neighbours": args.k,
        "teacher-epochs": args.teacher_epochs,
        "epochs": args.student_epochs,
        "projection-dim": args.projection_dim,
        **(
            {"weight-decay": args.student_weight_decay}
            if args.student_weight_decay is not None
            else {}
        ),
        **({"student-holdout": args.student_holdout} if args.student_holdout is not None else {}),
    }
    return parse_run_config({**preset, **over})


def setup(cfg, name: str, seed: int, args, num_queries: int, audit_fraction: float):
    """Data and the server's query message: ``(private, public, audit or None, client parts,
    C, generator, query ids, neighbourhoods, projection)``."""
    data = load_dataset(name, root=args.data_root, min_class_size=cfg.min_class_size)
    split = pg.privgnn_split(
        data,
        public_fraction=cfg.public_fraction,
        public_test_fraction=cfg.public_test_fraction,
        audit_fraction=audit_fraction,
        seed=seed,
    )
    private, public, audit = split if len(split) == 3 else (*split, None)
    parts = partition(private, cfg.num_clients, cfg.partitioner, seed, alpha=cfg.alpha)
    gen = torch.Generator().manual_seed(seed)
    # server: queries, public neighbourhoods, public PCA (the query.privgnn message)
    proj = pg.public_projection(public.x, cfg.projection_dim, seed) if cfg.projection_dim else None
    qidx = pg.select_queries(public, num_queries, "random", generator=gen)
    hoods, proj = pg.decode_queries(pg.make_queries(public, qidx, cfg, gen, proj))
    return private, public, audit, parts, int(data.y.max()) + 1, gen, qidx, hoods, proj


class Memo:
    """Trains the attacker's shadow model once per graph (the audits share it)."""

    def __init__(self, train):
        self.train, self.cache = train, {}

    def __call__(self, graph):
        if id(graph) not in self.cache:
            self.cache[id(graph)] = self.train(graph)
        return self.cache[id(graph)]


def lambdas_of(args, cfg, num_queries: int) -> list[float]:
    """The lambdas of a posterior-mode run: ``--lambdas``, or in ``--mode table`` the largest
    lambda at which ``num_queries`` answers cost each ``--epsilons`` per client
    (:func:`~fedgraph.methods.privgnn.lam_for_epsilon`, PLD at the preset's delta)."""
    if args.mode != "table":
        return list(args.lambdas)
    return [pg.lam_for_epsilon(e, cfg.delta, num_queries, cfg.gamma) for e in args.epsilons]


def run_setting(name: str, clients: int, seed: int, args) -> dict:
    """One (dataset, number of clients, seed): teachers once, then every lambda."""
    t0 = time.perf_counter()
    cfg = run_config(name, clients, seed, args)
    private, public, audit, parts, C, gen, qidx, hoods, proj = setup(
        cfg, name, seed, args, cfg.num_queries, args.audit_fraction
    )
    # clients: clean teacher posteriors (kept inside the client in a real run)
    timing = pg.TeacherTiming()
    # K at most the smallest client's expected Poisson sample (pg.check_neighbours); the bench
    # lowers --k to it and records the K it used
    k = min(cfg.num_neighbours, *(pg.max_neighbours(int(c.num_nodes), cfg.gamma) for c in parts))
    posts = [
        pg.teacher_posteriors(
            c,
            hoods.query_x,
            rate=cfg.gamma,
            k=k,
            num_classes=C,
            teacher=pg.teacher_config(cfg),
            neighbourhoods=hoods,
            projection=proj,
            generator=gen,
            timing=timing,
        )
        for c in parts
    ]
    clean = pg.aggregate_partial(posts, int(qidx.numel()), C).labels
    row = {
        "dataset": name,
        "clients": clients,
        "seed": seed,
        "private_nodes": int(private.num_nodes),
        "public_nodes": int(public.num_nodes),
        "queries": int(qidx.numel()),
        "num_neighbours": k,
        "teacher_seconds_per_query": timing.per_query,
        "clean_label_accuracy": float((clean == public.y[qidx]).float().mean()),
        "majority": pg.majority_accuracy(public),
        "lambdas": {},
    }
    kw = dict(
        hidden=cfg.hidden,
        dropout=cfg.dropout,
        epochs=cfg.epochs,
        lr=cfg.lr,
        holdout_fraction=cfg.student_holdout,
        weight_decay=cfg.weight_decay,
        seed=seed,
    )
    b1 = pg.nonprivate_teacher(private, public, epochs=cfg.epochs, seed=seed)
    row["B1_nonprivate_teacher"] = b1.test_accuracy
    row["B2_public_labels"] = pg.public_label_student(public, qidx, **kw).test_accuracy
    auroc = None  # no audit set (--audit-fraction 0): no membership audit
    if audit is not None:
        # membership audit: members from the private graph, shadow and non-members from the
        # audit set
        m = int(audit.num_nodes) // 3
        perm = torch.randperm(int(audit.num_nodes), generator=gen)
        shadow_in, shadow_out, nonmembers = (
            _induced(audit, perm[i * m : (i + 1) * m]) for i in range(3)
        )
        members = node_sample_graph(private, m, gen)
        shadow = Memo(shadow_trainer(C, cfg.epochs))
        audit_kw = dict(
            shadow_train=shadow, shadow_members=shadow_in, shadow_nonmembers=shadow_out, seed=seed
        )

        def auroc(model):
            return membership_auroc(predict_fn(model), members, nonmembers, **audit_kw)

    row["auroc_B1"] = auroc(b1.model) if auroc else float("nan")
    for lam in lambdas_of(args, cfg, int(qidx.numel())):
        answers = [pg.noisy_answers(p, lam, cfg.answer_mode, gen) for p in posts]
        labels = pg.aggregate_partial(answers, int(qidx.numel()), C).labels
        st = pg.train_student(public, qidx, labels, **kw)
        # the same teachers under the paper's rules (NOT DP at the epsilon beside them): its
        # literal scale 1/lam on probabilities (2 lam-DP per answer, not lam), and the authors'
        # code, Laplace(1/lam) on log-softmax outputs (unbounded sensitivity: no finite epsilon)
        paper = {}
        for rule in ("literal", "log-softmax-paper"):
            noisy = [
                p + pg.laplace_noise(p.shape, 1.0 / lam, gen)
                if rule == "literal"
                else pg.noisy_answers(p, lam, "log-softmax-paper", gen)
                for p in posts
            ]
            lab = pg.aggregate_partial(noisy, int(qidx.numel()), C).labels
            paper[rule] = (
                pg.train_student(public, qidx, lab, **kw).test_accuracy,
                float((lab == public.y[qidx]).float().mean()),
            )
        row["lambdas"][str(lam)] = {
            "paper_literal_student": paper["literal"][0],
            "paper_literal_label_accuracy": paper["literal"][1],
            "log_softmax_paper_student": paper["log-softmax-paper"][0],
            "log_softmax_paper_label_accuracy": paper["log-softmax-paper"][1],
            "student_test_accuracy": st.test_accuracy,
            "pseudo_label_accuracy": float((labels == public.y[qidx]).float().mean()),
            # every client answered all Q queries: the same epsilon for each client
            "epsilon_pld": pg.privgnn_epsilon(int(qidx.numel()), cfg.gamma, lam, cfg.delta, "pld"),
            "epsilon_rdp": pg.privgnn_epsilon(int(qidx.numel()), cfg.gamma, lam, cfg.delta, "rdp"),
            "auroc_student": auroc(st.model) if auroc else float("nan"),
        }
    row["seconds"] = time.perf_counter() - t0
    row["peak_rss_mib"] = peak_rss_mib()
    return row


def run_ensemble(name: str, clients: int, seed: int, args, secure: bool | str = False) -> dict:
    """The ensemble mode (PATE's Confident-GNMax across clients) for one (dataset, clients,
    seed): each client's ``--teachers`` disjoint teachers vote once on ``--ensemble-queries``
    queries; for every per-client epsilon the per-client sigma is calibrated to it
    (:func:`~fedgraph.methods.privgnn.ensemble_sigma_for_epsilon`, delta of the preset), each
    client adds its own Gaussian noise, the server sums and thresholds; students with and
    without label propagation. Beside the guarantee (data-independent, against the server),
    the data-dependent epsilon (PATE 2018 Thm. 6) of the released labels for client 0, from the
    noise-free summed votes: a simulation-only figure (no party holds those votes) that is
    itself data-dependent, not a released guarantee.

    ``secure``: secure aggregation (``secure-aggregation = true``): each client adds a
    ``1/clients`` share of the noise variance (:func:`~fedgraph.methods.privgnn.noisy_votes`
    with ``shares``), so the sum carries std sigma, the same guarantee against a server that
    does not collude with clients; the row also gives the epsilon against a server colluding
    with all other clients (own share only). ``"both"``: the per-client rows under
    ``epsilons`` and the secure ones under ``epsilons_secure``, on the same teachers."""
    from fedgraph.accounting import PrivacyLedger
    from fedgraph.accounting.pate import confident_gnmax_cost

    t0 = time.perf_counter()
    cfg = run_config(name, clients, seed, args)
    private, public, _, parts, C, gen, qidx, hoods, proj = setup(
        cfg, name, seed, args, args.ensemble_queries, 0.0
    )
    Q = int(qidx.numel())
    teach = pg.teacher_config(cfg)
    votes = [
        pg.ensemble_votes(
            c,
            hoods.query_x,
            num_teachers=args.teachers,
            num_classes=C,
            teacher=teach,
            neighbourhoods=hoods,
            projection=proj,
            generator=gen,
        )
        for c in parts
    ]
    total = torch.stack(votes).sum(0)
    truth = public.y[qidx]
    kw = dict(
        hidden=cfg.hidden,
        dropout=cfg.dropout,
        epochs=cfg.epochs,
        lr=cfg.lr,
        holdout_fraction=cfg.student_holdout,
        weight_decay=cfg.weight_decay,
        seed=seed,
    )
    row = {
        "dataset": name,
        "clients": clients,
        "seed": seed,
        "queries": Q,
        "teachers_per_client": args.teachers,
        "majority": pg.majority_accuracy(public),
        "clean_vote_accuracy": float((total.argmax(-1) == truth).float().mean()),
        "B2_public_labels": pg.public_label_student(public, qidx, **kw).test_accuracy,
        "B2_public_labels_lp": pg.public_label_student(
            public, qidx, propagation=args.propagation, **kw
        ).test_accuracy,
        "epsilons": {},
    }
    n_teachers = clients * args.teachers
    for noise in (
        ("per-client", "secure") if secure == "both" else ("secure",) if secure else ("per-client",)
    ):
        key = "epsilons_secure" if secure == "both" and noise == "secure" else "epsilons"
        row["noise"] = "secure aggregation" if secure is True else "per-client"
        row[key] = {}
        for eps in args.epsilons:
            ratio = args.threshold_ratio or None
            s2 = pg.ensemble_sigma_for_epsilon(eps, cfg.delta, Q, ratio)
            s1 = ratio * s2 if ratio else None
            thr = args.threshold * n_teachers if ratio else None
            shares = clients if noise == "secure" else 1
            rel = [pg.noisy_votes(v, s2, s1, gen, shares=shares) for v in votes]
            answered, labels = pg.confident_aggregate(rel, C, thr)
            if int(answered.sum()) == 0:
                answered[:] = True  # nothing passed: (post-processing) fall back to every query
            gnmax_sum = torch.stack([r[:, -C:] for r in rel]).sum(0)
            kept = answered & pg.margin_filter(gnmax_sum, args.keep_fraction)  # post-processing
            idx, lab = qidx[kept], labels[kept]
            st = pg.train_student(public, idx, lab, **kw)
            st_lp = pg.train_student(public, idx, lab, propagation=args.propagation, **kw)
            ledger = PrivacyLedger()
            for e in pg.ensemble_events(Q, s2, s1):
                ledger.record("client-0", "noisy vote histograms", e)
            guarantee = ledger.epsilon("client-0", cfg.delta, "pld")[0]
            # the summed noise: clients' independent draws (secure: their shares sum to sigma)
            root = 1.0 if noise == "secure" else math.sqrt(clients)
            cost = confident_gnmax_cost(
                total.numpy(), answered.numpy(), s2 * root, thr, s1 * root if s1 else None
            )
            row[key][str(eps)] = {
                "sigma_votes": s2,
                "sigma_threshold": s1,
                "threshold": thr,
                "answered": int(answered.sum()),
                "kept": int(kept.sum()),
                "label_accuracy": float((lab == public.y[idx]).float().mean()),
                "student_test_accuracy": st.test_accuracy,
                "student_lp_test_accuracy": st_lp.test_accuracy,
                "epsilon_guarantee_pld": guarantee,
                "epsilon_if_server_colludes_with_other_clients": (
                    pg.ensemble_collusion_epsilon(Q, s2, s1, cfg.delta, clients)
                    if noise == "secure"
                    else guarantee
                ),
                "epsilon_labels_data_independent_rdp": cost.epsilon(cfg.delta),
                "epsilon_labels_data_dependent_rdp": cost.epsilon(cfg.delta, "dependent"),
            }
    row["seconds"] = time.perf_counter() - t0
    return row


def print_ensemble(rows, epsilons) -> None:
    for key in sorted({(r["dataset"], r["clients"]) for r in rows}):
        rs = [r for r in rows if (r["dataset"], r["clients"]) == key]
        m = lambda k: mean_std([r[k] for r in rs])  # noqa: E731
        print(
            f"\n{key[0]} / {key[1]} clients, ensemble ({rs[0]['teachers_per_client']} "
            f"teachers each, Q = {rs[0]['queries']}; mean ± std over {len(rs)} seeds): "
            f"majority {m('majority')[0]:.3f}, clean votes {m('clean_vote_accuracy')[0]:.3f}, "
            f"B2 {m('B2_public_labels')[0]:.3f} (LP {m('B2_public_labels_lp')[0]:.3f})"
        )
        print(
            f"  {'eps/client':>10} {'sigma':>7} {'kept':>8} {'label acc':>9} "
            f"{'student':>15} {'student+LP':>15} {'eps labels indep/dep':>22}"
        )
        for eps in epsilons:
            g = lambda k: mean_std([r["epsilons"][str(eps)][k] for r in rs])  # noqa: E731
            print(
                f"  {eps:>10g} {g('sigma_votes')[0]:>7.2f} {g('kept')[0]:>8.1f} "
                f"{g('label_accuracy')[0]:>9.3f} {g('student_test_accuracy')[0]:>7.3f} ± "
                f"{g('student_test_accuracy')[1]:.3f} {g('student_lp_test_accuracy')[0]:>7.3f}"
                f" ± {g('student_lp_test_accuracy')[1]:.3f} "
                f"{g('epsilon_labels_data_independent_rdp')[0]:>10.3g} / "
                f"{g('epsilon_labels_data_dependent_rdp')[0]:.3g}"
            )


def print_issue_table(rows, epsilons) -> None:
    """Issue 15's table: per (dataset, clients), student test accuracy (mean ± std over the
    seeds) of every release rule at each epsilon per client."""
    for key in sorted({(r["posterior"]["dataset"], r["posterior"]["clients"]) for r in rows}):
        rs = [r for r in rows if (r["posterior"]["dataset"], r["posterior"]["clients"]) == key]
        pm = lambda k: mean_std([r["posterior"][k] for r in rs])  # noqa: E731
        em = lambda k: mean_std([r["ensemble"][k] for r in rs])  # noqa: E731
        f = lambda ms: f"{100 * ms[0]:.1f} ± {100 * ms[1]:.1f}"  # noqa: E731
        e0 = rs[0]["ensemble"]
        print(
            f"\n{key[0]} / {key[1]} clients, {len(rs)} seeds (mean ± std, %): majority "
            f"{f(pm('majority'))}; B2 (true labels of the Q = {rs[0]['posterior']['queries']}"
            f" queries) {f(pm('B2_public_labels'))}; B2 of the ensemble's Q = "
            f"{e0['queries']}: {f(em('B2_public_labels'))} (LP {f(em('B2_public_labels_lp'))})"
            f"; ensemble: {e0['teachers_per_client']} teachers per client, clean summed "
            f"votes {f(em('clean_vote_accuracy'))} correct"
        )
        print(
            "| epsilon per client | lam | honest posterior (DP) | paper's literal 1/lam "
            "(not DP) | authors' log-softmax (not DP) | ensemble, per-client noise | "
            "ensemble, secure aggregation | ensemble, secure aggregation + LP | "
            "secure: epsilon if the server colludes with the other clients |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for i, eps in enumerate(epsilons):
            lam = list(rs[0]["posterior"]["lambdas"])[i]
            pl = lambda k: mean_std([r["posterior"]["lambdas"][lam][k] for r in rs])  # noqa
            en = lambda grp, k: mean_std([r["ensemble"][grp][str(eps)][k] for r in rs])  # noqa
            print(
                f"| {eps:g} | {float(lam):.3g} | {f(pl('student_test_accuracy'))} | "
                f"{f(pl('paper_literal_student'))} | {f(pl('log_softmax_paper_student'))} | "
                f"{f(en('epsilons', 'student_test_accuracy'))} | "
                f"{f(en('epsilons_secure', 'student_test_accuracy'))} | "
                f"{f(en('epsilons_secure', 'student_lp_test_accuracy'))} | "
                f"{en('epsilons_secure', 'epsilon_if_server_colludes_with_other_clients')[0]:.3g} |"
            )


def mean_std(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(rows, lambdas) -> dict:
    out = {}
    for key in sorted({(r["dataset"], r["clients"]) for r in rows}):
        rs = [r for r in rows if (r["dataset"], r["clients"]) == key]
        s = {
            k: mean_std([r[k] for r in rs])
            for k in (
                "B1_nonprivate_teacher",
                "B2_public_labels",
                "auroc_B1",
                "majority",
                "clean_label_accuracy",
                "teacher_seconds_per_query",
                "seconds",
            )
        }
        for lam in lambdas:
            for k in rs[0]["lambdas"][str(lam)]:
                s[f"lambda={lam}:{k}"] = mean_std([r["lambdas"][str(lam)][k] for r in rs])
        s["seeds"] = len(rs)
        out[f"{key[0]} / {key[1]} client(s)"] = s
    return out


def print_table(summary, lambdas) -> None:
    for name, s in summary.items():
        print(f"\n{name} (mean ± std over {s['seeds']} seeds; epsilon per client at delta)")
        print(
            f"  majority {s['majority'][0]:.3f}  B1 non-private teacher "
            f"{s['B1_nonprivate_teacher'][0]:.3f} ± {s['B1_nonprivate_teacher'][1]:.3f}  "
            f"B2 public labels {s['B2_public_labels'][0]:.3f} ± {s['B2_public_labels'][1]:.3f}  "
            f"AUROC(B1) {s['auroc_B1'][0]:.3f} ± {s['auroc_B1'][1]:.3f}  "
            f"clean-teacher labels {s['clean_label_accuracy'][0]:.3f}  "
            f"{s['seconds'][0]:.0f} s/seed"
        )
        print(
            f"  {'lambda':>7} {'student acc':>15} {'label acc':>15} {'eps PLD':>9} "
            f"{'eps RDP':>9} {'AUROC':>15} {'paper literal (not DP)':>24} "
            f"{'log-softmax paper (not DP)':>28}"
        )
        for lam in lambdas:
            g = lambda k: s[f"lambda={lam}:{k}"]  # noqa: E731
            print(
                f"  {lam:>7g} {g('student_test_accuracy')[0]:>8.3f} ± "
                f"{g('student_test_accuracy')[1]:.3f} {g('pseudo_label_accuracy')[0]:>8.3f} ± "
                f"{g('pseudo_label_accuracy')[1]:.3f} {g('epsilon_pld')[0]:>9.3g} "
                f"{g('epsilon_rdp')[0]:>9.3g} {g('auroc_student')[0]:>8.3f} ± "
                f"{g('auroc_student')[1]:.3f} {g('paper_literal_student')[0]:>15.3f} ± "
                f"{g('paper_literal_student')[1]:.3f} {g('log_softmax_paper_student')[0]:>19.3f}"
                f" ± {g('log_softmax_paper_student')[1]:.3f}"
            )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--clients", type=int, nargs="+", default=[1, 5])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds first-seed .. first-seed + seeds - 1 (split a sweep over processes)",
    )
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.2, 0.4, 1.0, 2.0, 4.0, 8.0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument(
        "--k",
        type=int,
        default=100,
        help="K: neighbours per teacher (lowered to the smallest client's gamma * n)",
    )
    p.add_argument("--teacher-epochs", type=int, default=100)
    p.add_argument("--student-epochs", type=int, default=200)
    p.add_argument(
        "--student-weight-decay",
        type=float,
        default=None,
        help="the student's weight decay (default: the preset's)",
    )
    p.add_argument(
        "--student-holdout",
        type=float,
        default=None,
        help="share of pseudo-labels held out for the student's model selection "
        "(default: the preset's; 0: none)",
    )
    p.add_argument("--projection-dim", type=int, default=64, help="0: raw features (paper)")
    p.add_argument("--audit-fraction", type=float, default=0.2)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared 2-core machine 2 threads ran 20x slower)",
    )
    p.add_argument("--data-root", default=str(DATA))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "privgnn_federation.json"))
    p.add_argument(
        "--mode",
        choices=["posterior", "ensemble", "table"],
        default="posterior",
        help="ensemble: PATE's Confident-GNMax rows (run_ensemble); table: issue "
        "15's table, every release rule at each --epsilons per client on the "
        "same split (posterior at the lambda of that epsilon, the paper's two "
        "rules at that lambda, ensemble with per-client and with secure-"
        "aggregation noise), majority and B2",
    )
    p.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="ensemble: each client adds a 1/n share of the noise (secure "
        "aggregation); table mode runs both",
    )
    p.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=[1.0, 4.0, 8.0],
        help="ensemble: per-client epsilon targets at the preset's delta",
    )
    p.add_argument("--teachers", type=int, default=20, help="ensemble: teachers per client")
    p.add_argument("--ensemble-queries", type=int, default=50)
    p.add_argument(
        "--threshold",
        type=float,
        default=0.0,
        help="ensemble: Confident-GNMax threshold as a share of all teachers (0: off)",
    )
    p.add_argument(
        "--threshold-ratio",
        type=float,
        default=0.0,
        help="ensemble: sigma-threshold / sigma-votes (0: no threshold copy)",
    )
    p.add_argument(
        "--keep-fraction",
        type=float,
        default=1.0,
        help="ensemble: keep this share of the answered queries with the largest "
        "noisy top-2 margin (post-processing, free)",
    )
    p.add_argument(
        "--propagation", type=float, default=0.9, help="label-propagation alpha of the +LP students"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    rows = []
    if args.mode == "table":
        for name in args.datasets:
            for clients in args.clients:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    post = run_setting(name, clients, seed, args)
                    ens = run_ensemble(name, clients, seed, args, secure="both")
                    rows.append({"posterior": post, "ensemble": ens})
                    print(
                        f"{name} clients={clients} seed={seed}: "
                        f"{post['seconds'] + ens['seconds']:.0f} s",
                        flush=True,
                    )
                    write_json_atomic(
                        args.out,
                        {
                            "args": vars(args),
                            "command": " ".join(sys.argv),
                            "rows": rows,
                            "partial": True,
                        },
                    )
        print_issue_table(rows, args.epsilons)
        out = {
            "args": vars(args),
            "command": " ".join(sys.argv),
            "rows": rows,
            "wall_seconds": time.perf_counter() - t0,
            "peak_rss_mib": peak_rss_mib(),
        }
        write_json_atomic(args.out, out)
        print(f"results: {args.out}")
        return
    if args.mode == "ensemble":
        for name in args.datasets:
            for clients in args.clients:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    rows.append(
                        run_ensemble(name, clients, seed, args, secure=args.secure_aggregation)
                    )
                    r = rows[-1]
                    print(
                        f"{name} clients={clients} seed={seed}: {r['seconds']:.0f} s, "
                        f"clean votes {r['clean_vote_accuracy']:.3f}, "
                        + ", ".join(
                            f"eps {k}: {v['student_test_accuracy']:.3f}/"
                            f"{v['student_lp_test_accuracy']:.3f}"
                            for k, v in r["epsilons"].items()
                        ),
                        flush=True,
                    )
        print_ensemble(rows, args.epsilons)
        out = {
            "args": vars(args),
            "command": " ".join(sys.argv),
            "rows": rows,
            "wall_seconds": time.perf_counter() - t0,
        }
        write_json_atomic(args.out, out)
        print(f"results: {args.out}")
        return
    for name in args.datasets:
        for clients in args.clients:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                rows.append(run_setting(name, clients, seed, args))
                r = rows[-1]
                print(
                    f"{name} clients={clients} seed={seed}: {r['seconds']:.0f} s, "
                    + ", ".join(
                        f"lam {k}: {v['student_test_accuracy']:.3f}"
                        for k, v in r["lambdas"].items()
                    ),
                    flush=True,
                )
    summary = summarize(rows, args.lambdas)
    print_table(summary, args.lambdas)
    peak = peak_rss_mib()
    out = {
        "args": vars(args),
        "command": " ".join(sys.argv),
        "rows": rows,
        "summary": summary,
        "wall_seconds": time.perf_counter() - t0,
        "peak_rss_mib": peak,
    }
    print(f"\nwall {out['wall_seconds']:.1f} s, peak RSS {peak:.0f} MiB")
    write_json_atomic(args.out, out)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
