"""PPGNN as a Flower strategy (He et al., PPGNN; Alg. 3 on clients, Alg. 4 on the server).

Phases:
1. ``query.ppgnn``: every client returns its users' PPM reports (mechanism output, released
   levels), the labels of its training/validation users and the edges it knows.
2. ``fit`` (server only): decode, FlexProp, train the GNN backbone, predict.
3. ``evaluate.ppgnn``: every client receives the predictions for its users and returns how
   many are correct per split (test labels never leave the clients).
"""

from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgraph._lazy import LazyModule
from fedgraph.messaging import record_workers, send_to_all, tensors, wait_for_nodes

from .base import PrivateStrategy, register_strategy

ppgnn = LazyModule("fedgraph.methods.ppgnn")  # PyG: imported by PPGNN runs only


@register_strategy("ppgnn")
class PPGNNStrategy(PrivateStrategy):
    """Server side of PPGNN and its baselines (BASE: ``denoiser = none``; LPGNN:
    ``mechanism = multi-bit, denoiser = kprop``)."""

    method = "ppgnn"
    config_method = "ppgnn"

    def run(self, grid) -> None:
        cfg = self.config
        payload = ConfigRecord({"json": json.dumps(cfg.model_dump())})
        with self.report.phase("connect"):
            nodes = wait_for_nodes(grid, cfg.num_clients, timeout=min(cfg.timeout, 60.0))
        mech = ppgnn.build_mechanism(cfg)
        ppgnn.set_budgets(self.ledger, cfg)
        recorded = []

        def record(node, reply):
            """The users' reports left with the first reply: every user reports once, so the
            per-level events are recorded once (a failure of another client spends nothing
            more)."""
            if not recorded:
                ppgnn.record_privacy(self.ledger, cfg, mech)
                recorded.append(node)

        with self.report.phase("perturb (clients)"):
            replies = self.send_and_record(
                grid, "query.ppgnn", {n: RecordDict({"config": payload}) for n in nodes}, record
            )
        reports = {n: tensors(r["report"]) for n, r in replies.items()}
        stats = json.loads(next(iter(replies.values()))["meta"]["schema"])
        self.report.dataset = stats  # the public schema only (fedgraph.federation.SCHEMA_FIELDS)
        record_workers(self.report, [r["meta"] for r in replies.values()])
        with self.report.phase("calibrate+train (server)"):
            fit = ppgnn.server_fit(
                list(reports.values()),
                cfg,
                stats["num_nodes"],
                stats["num_features"],
                stats["num_classes"],
            )
        self.report.extra["training"] = {
            "best_epoch": fit.train.best_epoch,
            "epochs_run": fit.train.epochs,
            "steps_selected": fit.train.steps,
        }
        with self.report.phase("evaluate (clients)"):
            contents = {}
            for n, rep in reports.items():
                ids = rep["node_ids"]
                contents[n] = RecordDict(
                    {
                        "predictions": ArrayRecord({"node_ids": ids, "pred": fit.predictions[ids]}),
                        "config": payload,
                    }
                )
            counts = send_to_all(grid, "evaluate.ppgnn", contents, cfg.timeout)
        self.record_accuracy(counts, stats)
        self.report.privacy.update(
            {
                "model": "personalized LDP (per user, per level)",
                "unit": "epsilon per user (whole run: each user reports once)",
                "labels": (
                    f"randomized response, epsilon {cfg.label_epsilon}"
                    if cfg.label_epsilon > 0
                    else "labels of training/validation users known to the server (paper setting)"
                ),
                "evaluation": "the clients' correct/total counts per split (the report's accuracy) "
                "are evaluation outputs, outside the guarantee, as in the paper",
            }
        )
        if len(cfg.budgets) > 1 and not mech.hides_level:
            self.report.privacy["level"] = (
                "not analysed: the mechanism does not claim to hide the level (the built-in "
                "uniform mechanisms give every user the same epsilon: their reports do not "
                "depend on the level)"
            )
        elif len(cfg.budgets) > 1:
            self.report.privacy["level"] = (
                f"subjects '{ppgnn.level_subject(1)}', ...: epsilon of what one user's whole "
                "report (ESW output, sampled indices, signs) reveals about its level against any "
                "other level, features fixed, bound for any number of features; report['levels']: "
                "the same for this dataset (level_epsilon) and with the features free to change "
                "too (level_and_features_epsilon)"
            )
        for level, budget in enumerate(cfg.budgets, start=1):
            self.ledger_budget(level, budget)
            if mech.hides_level and len(cfg.budgets) > 1:
                self.report.extra["levels"][f"level-{level}"].update(
                    {
                        "level_epsilon": mech.level_epsilon(level, stats["num_features"]),
                        "level_and_features_epsilon": mech.level_epsilon(
                            level, stats["num_features"], "level+features"
                        ),
                    }
                )

    def ledger_budget(self, level: int, budget: float) -> None:
        self.report.extra.setdefault("levels", {})[f"level-{level}"] = {
            "budget": budget,
            "share": self.config.shares[level - 1],
        }
