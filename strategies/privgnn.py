"""PrivGNN as a Flower strategy (Olatunji, Funke & Khosla, "Releasing Graph Neural Networks
with Differential Privacy Guarantees", TMLR 2023, arXiv 2109.08907, Alg. 1), federated.

The server owns the public graph (features and edges of all its nodes, labels of its test nodes
only); the private graph is partitioned over the clients. Phases:

1. ``connect``; ``public graph (server)``: load and split the dataset
   (:func:`fedgraph.methods.privgnn.public_graph`), fit the optional public PCA.
2. ``answer queries (clients)``: ``query.privgnn`` with the public neighbourhoods of ``Q``
   query nodes; every client answers what its epsilon budget allows with Laplace-noised
   posteriors of per-query teachers (Poisson subsample, K nearest, GraphSAGE). With
   ``query-policy = entropy`` two rounds: ``ceil(Q/2)`` random queries, then the ``Q/2``
   pool nodes where a student trained on the first pseudo-labels is least certain (public
   data and released answers only: no extra privacy cost).
3. ``student (server)``: pseudo-labels = argmax of the summed noisy answers of the clients that
   answered (queries nobody answered are dropped); a 2-layer GraphSAGE trained transductively
   on the public graph, model selection on a held-out 20% of the pseudo-labelled queries;
   accuracy on the public test nodes.

Privacy (node-level DP of each client's private nodes, for the released student and every
answer): client ``c`` answering ``m_c`` queries spends ``m_c`` compositions of a
Poisson-subsampled Laplace mechanism (:func:`fedgraph.methods.privgnn.privgnn_events`),
recorded in the ledger as ``client-<c>`` as each reply arrives (a run that fails later still
reports the answers given) and composed with PLD (dp-accounting) at ``delta``, with the RDP
figure beside it. Clients refuse beyond their target (``client-epsilons``), which is the
subject's budget in the report (``over_budget``).

Answer modes (``answer-mode``; docs/explanations/privgnn.md): ``posterior`` / ``vote`` as above;
``log-softmax-paper`` reproduces the authors' release (Laplace(1/lam) on log-softmax outputs),
which is NOT differentially private: each client is recorded with
:meth:`~fedgraph.accounting.PrivacyLedger.record_unprotected` (epsilon inf) and the paper's
figure only as ``claimed`` (``holds: false``); ``ensemble`` is PATE's (Confident-)GNMax:
clients release noisy vote histograms of disjoint teachers
(:func:`fedgraph.methods.privgnn.noisy_votes`, Gaussian events of multiplier sigma/sqrt 2 per
copy, :func:`~fedgraph.methods.privgnn.ensemble_events`), the server sums, thresholds and
takes the argmax (:func:`fedgraph.methods.privgnn.aggregate_ensemble`). With
``secure-aggregation`` the ensemble's clients exchange X25519 keys first (``query.privgnn_keys``;
signed under identity keys provisioned outside the server, relayed unchanged, verified by
every client: :func:`.base.relayed_keys`) and send pairwise-masked histograms, each with a ``1/n`` share of the noise; the server
unmasks only their sum (:func:`~fedgraph.methods.privgnn.unmask_histograms`), the
ledger records the sum's events, and ``privacy.collusion`` states each client's epsilon
against a server colluding with the other clients. A target means the same as in the other
methods: without ``sigma-votes`` the strategy calibrates it (:func:`calibrate_sigma_votes`)
so that the ``num-queries`` histograms spend the smallest client target; a ``sigma-votes``
given makes the targets caps (``privacy.sigma_votes`` says which).

Noise convention (a deliberate choice; see docs/explanations/privgnn.md): the answer is a probability
vector (or a one-hot vote), whose L1 sensitivity is 2, so the Laplace scale is ``2 / lam``
(noise multiplier ``1 / lam``). The paper writes the scale as ``beta = 1 / lambda`` while its
privacy analysis (RDP curve of the Laplace mechanism with ``b = 1/lambda`` at sensitivity 1)
gives the epsilon that our accountant gives for noise multiplier ``1 / lambda``. Adding the
paper's ``1 / lambda`` to a sensitivity-2 answer would only be ``2 lambda``-DP per query, so
with our convention a given ``lam`` reproduces the paper's epsilon and carries twice the
paper's literal noise: accuracies at the same ``lam`` are lower than the paper's tables.
"""

from __future__ import annotations

import copy
import json
import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgraph._lazy import LazyModule
from fedgraph.errors import ClientFailure
from fedgraph.messaging import send_to_all, tensors, wait_for_nodes
from fedgraph.report import progress

from .base import PrivateStrategy, register_strategy, relayed_keys, secagg_record

# PyG: imported by PrivGNN runs only
pg = LazyModule("fedgraph.methods.privgnn")


def calibrate_sigma_votes(cfg) -> tuple:
    """Ensemble mode: ``(cfg, note)`` with ``sigma_votes`` set where the config leaves it
    unset (``None``): the smallest std (votes) at which ``num_queries`` released histograms
    (:func:`fedgraph.methods.privgnn.ensemble_events`, with the configured threshold copy)
    compose to at most the smallest of the clients' ``client_epsilons`` at ``delta`` (analytic
    Gaussian composition, exact; :func:`fedgraph.methods.privgnn.ensemble_sigma_for_epsilon`),
    and at least 1. Every client then answers all queries within its target (the smallest
    spends it, up to the calibration's 0.1%). ``note`` (the report's ``privacy.sigma_votes``):
    the value and where it came from; ``None`` for the other answer modes.

    Raises:
        fedgraph.config.ConfigError: no std up to 1e6 votes meets the target (names
            ``client-epsilons``).
    """
    from fedgraph.accounting import calibrate
    from fedgraph.config import ConfigError

    if cfg.answer_mode != "ensemble":
        return cfg, None
    if cfg.sigma_votes is not None:
        return cfg, {"sigma_votes": cfg.sigma_votes, "source": "set: client-epsilons are caps"}
    target = min(cfg.client_epsilon(p) for p in range(cfg.num_clients))
    if math.isinf(target):
        sigma = 1.0  # no target: the least noise allowed
    else:
        try:
            sigma = (
                pg.ensemble_sigma_for_epsilon(target, cfg.delta, cfg.num_queries)
                if not cfg.sigma_threshold
                else calibrate(
                    target,
                    cfg.delta,
                    lambda s: pg.ensemble_events(cfg.num_queries, s, cfg.sigma_threshold),
                    accountant="analytic",
                    lower=1.0,
                    upper=1e6,
                )
            )
        except ValueError as err:
            raise ConfigError(
                f"client-epsilons: no sigma-votes up to 1e6 makes {cfg.num_queries} "
                f"histograms cost at most {target:g} at delta {cfg.delta:g} "
                f"({err}); raise client-epsilons or lower num-queries"
            ) from None
    sigma = max(1.0, float(sigma))
    note = {
        "sigma_votes": sigma,
        "source": "calibrated",
        "target_epsilon": target,
        "num_queries": cfg.num_queries,
        "delta": cfg.delta,
    }
    return cfg.model_copy(update={"sigma_votes": sigma}), note


@register_strategy("privgnn")
class PrivGNNStrategy(PrivateStrategy):
    """Server side of federated PrivGNN (config: :class:`fedgraph.config.PrivGNNConfig`).

    Report: ``accuracy`` (``test``: the student on the public test nodes; ``pseudo_label``:
    agreement of the pseudo-labels with the true labels of the kept queries, a
    simulation-only diagnostic: the query nodes are unlabelled for the public server, which
    could not compute it in a deployment (nothing is trained on it); ``holdout``: the student against held-out pseudo-labels;
    ``majority_class``), ``clients`` (per client: target, limit, asked, answered, refused),
    ``queries`` (asked, kept, dropped per round) and ``privacy.per_subject`` (epsilon per
    client, PLD, with ``rdp`` and a cross-check).

    Raises (from :meth:`run`):
        fedgraph.errors.ClientFailure: a client failed or timed out.
        RuntimeError: no client answered any query (every budget exhausted).
    """

    method = "privgnn"
    privacy_accountant = "pld"

    def __init__(self, config):
        config, note = calibrate_sigma_votes(config)
        super().__init__(config)
        if note is not None:
            self.report.privacy["sigma_votes"] = note

    def privacy_parameters(self) -> tuple[float, str]:
        """PLD (dp-accounting) for the Laplace modes; the ensemble's Gaussian events compose
        exactly in closed form (analytic Gaussian), cross-checked by PLD in the report."""
        from fedgraph.methods.privgnn.privacy import accountant

        delta, _ = super().privacy_parameters()
        return delta, accountant(self.config)

    def run(self, grid) -> None:
        cfg = self.config
        payload = ConfigRecord({"json": json.dumps(cfg.model_dump())})
        self._describe_privacy()
        with self.report.phase("connect"):
            nodes = wait_for_nodes(grid, cfg.num_clients, timeout=min(cfg.timeout, 60.0))
        for p in range(cfg.num_clients):
            self.ledger.set_budget(f"client-{p}", cfg.client_epsilon(p))
        keys = None  # secure aggregation: the clients' signed X25519 public keys, by index
        if cfg.secure_aggregation:
            with self.report.phase("secure aggregation: key exchange (clients)"):
                replies = send_to_all(
                    grid,
                    "query.privgnn_keys",
                    {n: RecordDict({"config": payload}) for n in nodes},
                    cfg.timeout,
                )
                keys = relayed_keys(replies, nodes)  # signed; relayed unchanged
        index = {n: i for i, n in enumerate(nodes)}
        with self.report.phase("public graph (server)"):
            public, stats = pg.public_graph(cfg)
            proj = (
                pg.public_projection(public.x, cfg.projection_dim, cfg.seed)
                if cfg.projection_dim
                else None
            )
        self.report.dataset = stats
        num_classes = int(stats["num_classes"])
        gen = torch.Generator().manual_seed(cfg.seed)
        sizes = (
            [cfg.num_queries]
            if cfg.query_policy == "random"
            else [math.ceil(cfg.num_queries / 2), cfg.num_queries // 2]
        )
        asked = torch.zeros(public.num_nodes, dtype=torch.bool)
        kept_idx, kept_labels, rounds = [], [], []
        clients: dict[int, dict] = {}
        for r, size in enumerate(s for s in sizes if s > 0):
            policy, student = "random", None
            if r > 0 and kept_idx:
                policy = "entropy"
                student = self._student(public, kept_idx, kept_labels).model
            pool = copy.copy(public)  # shallow: only the query pool differs
            pool.train_mask = public.train_mask & ~asked
            qidx = pg.select_queries(pool, size, policy, student, generator=gen)
            asked[qidx] = True
            arrays = ArrayRecord(pg.make_queries(public, qidx, cfg, gen, proj))
            answers, masked = [], {}

            def record(node, rec, answers=answers, masked=masked):
                """Ledger first (the answers left the client), then the checks."""
                meta = dict(rec["meta"])
                answers.append(tensors(rec["answers"])["answers"])
                masked[index[node]] = answers[-1]
                self._record_answers(
                    int(meta["partition_id"]), max(int(answers[-1].shape[0]), int(meta["answered"]))
                )
                row = clients.setdefault(
                    int(meta["partition_id"]),
                    {
                        "epsilon_target": meta["epsilon_target"],
                        "asked": 0,
                        "answered": 0,
                        "refused": 0,
                    },
                )
                row["limit"] = int(meta["limit"])
                for k in ("asked", "answered", "refused"):
                    row[k] += int(meta[k])
                if keys is not None:  # in the report as soon as the release is
                    self._collusion(clients)
                progress(
                    "queries answered",
                    sum(int(a.shape[0]) for a in answers),
                    int(qidx.numel()) * len(nodes),
                )
                if int(answers[-1].shape[0]) != int(meta["answered"]):
                    raise RuntimeError(
                        f"client {meta['partition_id']} sent "
                        f"{answers[-1].shape[0]} answers, said {meta['answered']}"
                    )

            contents = {n: RecordDict({"config": payload, "queries": arrays}) for n in nodes}
            if keys is not None:
                for n in nodes:
                    contents[n]["secagg"] = secagg_record(keys, index[n])
            with self.report.phase(f"answer queries round {r + 1} (clients)"):
                try:
                    self.send_and_record(grid, "query.privgnn", contents, record)
                except ClientFailure as err:
                    if keys is None:
                        raise
                    raise ClientFailure(
                        f"{err}. Secure aggregation has no dropout recovery: "
                        f"the masks of a client that fails or does not reply "
                        f"do not cancel, so the round fails",
                        replies=err.replies,
                    ) from err
            if keys is not None:  # the server learns only the sum
                agg = pg.aggregate_ensemble(
                    [pg.unmask_histograms(masked, len(nodes))],
                    int(qidx.numel()),
                    num_classes,
                    cfg.threshold,
                    cfg.keep_fraction,
                )
            elif cfg.answer_mode == "ensemble":
                agg = pg.aggregate_ensemble(
                    answers, int(qidx.numel()), num_classes, cfg.threshold, cfg.keep_fraction
                )
            else:
                agg = pg.aggregate_partial(answers, int(qidx.numel()), num_classes)
            kept_idx.append(qidx[agg.kept])
            kept_labels.append(agg.labels)
            rounds.append(
                {
                    "policy": policy,
                    "asked": int(qidx.numel()),
                    "kept": int(agg.kept.sum()),
                    "dropped": int((~agg.kept).sum()),
                    "answers_per_query_mean": float(agg.votes.float().mean()),
                }
            )
        self.report.extra["clients"] = {f"client-{p}": clients[p] for p in sorted(clients)}
        silent = [f"client-{p}" for p in sorted(clients) if not int(clients[p]["answered"])]
        if silent:  # no ledger subject: say so rather than leave them out of the table
            self.report.privacy["released_nothing"] = silent
            self.report.privacy["released_nothing_why"] = (
                "answered no query: a budget too small for one answer, or no query asked; "
                "report clients.<client>"
            )
        self.report.extra["queries"] = {
            "asked": int(asked.sum()),
            "kept": sum(x["kept"] for x in rounds),
            "dropped": sum(x["dropped"] for x in rounds),
            "rounds": rounds,
        }
        if not sum(x["kept"] for x in rounds):
            answered = sum(int(c["answered"]) for c in clients.values())
            if cfg.answer_mode != "ensemble":
                why = (
                    "every client's epsilon budget allows 0 answers at this lam, gamma, "
                    "delta): raise client-epsilons or lower lam"
                )
            elif answered:
                why = (
                    f"the clients released {answered} histograms but the threshold check "
                    f"kept none): lower threshold ({cfg.threshold:g}) or sigma-threshold"
                )
            else:
                why = (
                    "every client's epsilon budget allows 0 histograms at this sigma-votes, "
                    "sigma-threshold, delta"
                    + (
                        ", and with secure-aggregation every client "
                        "answers as many as the strictest client-epsilons allows"
                        if cfg.secure_aggregation
                        else ""
                    )
                    + "): raise client-epsilons or "
                    "sigma-votes"
                )
            raise RuntimeError(f"no query was labelled ({why}")
        with self.report.phase("student (server)"):
            st = self._student(public, kept_idx, kept_labels)
        idx, labels = torch.cat(kept_idx), torch.cat(kept_labels)
        self.report.accuracy.update(
            {
                "test": st.test_accuracy,
                **({} if math.isnan(st.holdout_accuracy) else {"holdout": st.holdout_accuracy}),
                "pseudo_label": float((labels == public.y[idx]).float().mean()),
                "majority_class": pg.majority_accuracy(public),
            }
        )
        self.report.extra["training"] = {
            "best_epoch": st.train.best_epoch,
            "epochs_run": st.train.epochs,
        }

    def _student(self, public, kept_idx, kept_labels) -> pg.StudentResult:
        cfg = self.config
        return pg.train_student(
            public,
            torch.cat(kept_idx),
            torch.cat(kept_labels),
            hidden=cfg.hidden,
            dropout=cfg.dropout,
            epochs=cfg.epochs,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            seed=cfg.seed,
            propagation=cfg.student_propagation,
            holdout_fraction=cfg.student_holdout,
        )

    def _collusion(self, clients: dict) -> None:
        """Secure aggregation's weak point, in the report: each client's epsilon against a
        server colluding with all other clients (its own noise share only)."""
        cfg = self.config
        self.report.privacy["collusion"] = {
            "threat": "a server colluding with all other clients subtracts their noise "
            "shares from the sum: only the client's own share (std sigma / sqrt n) "
            "protects it",
            "epsilon": {
                f"client-{p}": pg.ensemble_collusion_epsilon(
                    int(clients[p]["answered"]),
                    cfg.sigma_votes,
                    cfg.sigma_threshold or None,
                    cfg.delta,
                    cfg.num_clients,
                )
                for p in sorted(clients)
            },
            "delta": cfg.delta,
        }

    def _record_answers(self, partition_id: int, answered: int) -> None:
        """Ledger: ``answered`` more answers of client ``partition_id`` left it (recorded when
        its reply arrives, so a run that fails later reports them): Poisson-subsampled Laplace
        events, merged with the client's earlier rounds into one entry."""
        from fedgraph.methods.privgnn.privacy import reply_events

        cfg = self.config
        if cfg.answer_mode not in (*pg.DP_MODES, "ensemble"):  # log-softmax-paper: no epsilon
            self.ledger.record_unprotected(
                f"client-{partition_id}",
                "noisy answers (log-softmax, paper's rule)",
                pg.NOT_DP_REASON,
                claimed=pg.privgnn_events(answered, cfg.gamma, cfg.lam),
                claimed_by="Olatunji et al. (TMLR 2023)",
            )
            return
        for name, event in reply_events(cfg, answered):
            self.ledger.record(f"client-{partition_id}", name, event)

    def _describe_privacy(self) -> None:
        cfg = self.config
        if cfg.answer_mode == "log-softmax-paper":
            self.report.privacy.update(
                {
                    "model": "NONE: not differentially private (a reproduction of the authors' "
                    "release rule)",
                    "unit": "no finite epsilon; privacy.per_subject[...].claimed is the paper's "
                    "figure for the same answers, which does not hold",
                    "mechanism": f"Laplace, scale 1/lam = {1.0 / cfg.lam:g}, on log-softmax "
                    f"outputs (unbounded sensitivity), Poisson subsample "
                    f"gamma={cfg.gamma}",
                    "not_dp_reason": pg.NOT_DP_REASON,
                }
            )
            return
        if cfg.answer_mode == "ensemble":
            check = (
                f"; threshold copy N(0, {cfg.sigma_threshold:g}^2) for the Confident-GNMax "
                f"check (T = {cfg.threshold:g} on the summed copies)"
                if cfg.sigma_threshold
                else ""
            )
            if cfg.secure_aggregation:
                self.report.privacy.update(
                    {
                        "model": "node-level DP per client (its private nodes), for every reply "
                        "and the released student; against the server (it does not "
                        "collude with clients; the public keys are signed under identity "
                        "keys provisioned outside it, and every client verifies them, so "
                        "it learns only the sum of the clients' masked histograms), "
                        "other clients that do not collude with it, and "
                        "third parties; against a server colluding with the other "
                        "clients see privacy.collusion",
                        "unit": "epsilon per client for the whole run (all its released "
                        "histograms), at delta; data-independent (the guarantee)",
                        "mechanism": f"{cfg.num_teachers} teachers per client on disjoint groups "
                        "of its nodes (each node's teacher drawn independently: "
                        "one node changes one teacher); per query the vote "
                        f"histogram (L2 sensitivity sqrt 2) + a 1/{cfg.num_clients} "
                        "share of N(0, "
                        f"{cfg.sigma_votes:g}^2) per class{check}, pairwise-masked "
                        f"(secure aggregation); the summed noise is N(0, "
                        f"{cfg.sigma_votes:g}^2); the server takes the argmax of the "
                        "sum (GNMax, post-processing)",
                        "aggregation": "secure aggregation (pairwise masking as in SecAgg, "
                        "Bonawitz et al. 2017, without dropout recovery: a missing "
                        "client fails the round); every client answers the same "
                        "queries (the smallest client limit)",
                    }
                )
                return
            self.report.privacy.update(
                {
                    "model": "node-level DP per client (its private nodes), for every reply and "
                    "the released student; against the server (honest-but-curious: "
                    "it sees every client's noisy histograms), the other clients and "
                    "third parties",
                    "unit": "epsilon per client for the whole run (all its released histograms), "
                    "at delta; data-independent (the guarantee)",
                    "mechanism": f"{cfg.num_teachers} teachers per client on disjoint groups of "
                    "its nodes (each node's teacher drawn independently: one node "
                    "changes one teacher); per query the vote histogram (L2 "
                    f"sensitivity sqrt 2) + N(0, {cfg.sigma_votes:g}^2) per "
                    f"class{check}; the server sums "
                    "over clients and takes the argmax (GNMax, post-processing)",
                    "data_dependent": "PATE's data-dependent bound needs the noise-free summed "
                    "votes, which no party of the federation holds; it is "
                    "measured in bench/privgnn_federation.py (a simulation-only "
                    "figure, itself data-dependent: not a released guarantee)",
                }
            )
            return
        self.report.privacy.update(
            {
                "model": "node-level DP per client (its private nodes), for every answer and the "
                "released student",
                "unit": "epsilon per client for the whole run (all its answers), at delta; "
                "clients that answered nothing spent 0",
                "mechanism": f"Poisson-subsampled (gamma={cfg.gamma}) Laplace, scale 2/lam = "
                f"{2.0 / cfg.lam:g} on an answer of L1 sensitivity 2 "
                f"(noise multiplier 1/lam)",
            }
        )
