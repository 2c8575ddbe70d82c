"""A custom strategy: PPGNN's clients, a different server (APPNP instead of FlexProp).

The clients run PPGNN's client half unchanged (``query.ppgnn``: PPM reports, ``evaluate.ppgnn``:
counts of correct predictions), so the privacy is PPGNN's and is recorded the same way. The
server's idea is new: denoise the decoded features with personalized PageRank (APPNP, Gasteiger
et al. 2019: ``h <- (1 - alpha) A_hat h + alpha x``, K steps) instead of FlexProp, then train
the backbone. Everything on the server is post-processing of the clients' DP reports.

Run: fedgraph run examples/custom_strategy/run.toml
"""

import json

from flwr.app import ArrayRecord
from torch_geometric.nn import APPNP

from fedgraph.messaging import tensors
from fedgraph.methods import ppgnn
from fedgraph.methods.training import train_node_classifier
from fedgraph.nn import adjacency_for, make_backbone
from fedgraph.strategies import PrivateStrategy


class PPGNNWithAPPNP(PrivateStrategy):
    config_method = "ppgnn"  # PPGNN's config keys and client handlers
    alpha = 0.1  # APPNP teleport probability

    def run(self, grid):
        cfg = self.config
        self.connect(grid)
        mech = ppgnn.build_mechanism(cfg)
        ppgnn.set_budgets(self.ledger, cfg)  # each level's target: the table's "(budget ...)"
        ppgnn.record_privacy(self.ledger, cfg, mech)  # every user's release, before it happens
        with self.report.phase("perturb (clients)"):
            replies = self.ask(grid, "query.ppgnn")
        stats = json.loads(next(iter(replies.values()))["meta"]["schema"])
        self.report.dataset = stats
        reports = {n: tensors(r["report"]) for n, r in replies.items()}
        with self.report.phase("APPNP + train (server)"):
            x, _, y, train, val, edges = ppgnn.assemble(
                list(reports.values()), mech, stats["num_nodes"], stats["num_features"]
            )
            h = APPNP(K=max(cfg.steps), alpha=self.alpha)(x, edges)
            h = (h - h.mean(0)) / h.std(0).clamp_min(1e-6)
            graph = adjacency_for(cfg.backbone, edges, stats["num_nodes"])  # fast sparse form
            model = make_backbone(cfg.backbone, h.shape[1], stats["num_classes"], cfg.hidden)
            fit = train_node_classifier(
                model,
                h,
                graph,
                y.clamp_min(0),
                train,
                val,
                epochs=cfg.epochs,
                lr=cfg.lr,
                weight_decay=cfg.weight_decay,
            )
            pred = fit.model(h, graph).argmax(-1)
        with self.report.phase("evaluate (clients)"):
            counts = self.ask(
                grid,
                "evaluate.ppgnn",
                per_node={
                    n: {
                        "predictions": ArrayRecord(
                            {"node_ids": r["node_ids"], "pred": pred[r["node_ids"]]}
                        )
                    }
                    for n, r in reports.items()
                },
            )
        self.record_accuracy(counts)
