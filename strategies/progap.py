"""ProGAP as a Flower strategy (Sajadmanesh and Gatica-Perez, WSDM 2024), federated.

Phases: setup (each client calibrates its own noise for its own target and reports its plan)
-> [secure aggregation: key exchange] -> for stage ``i = 0..K``: if ``i > 0`` the private
aggregation of stage ``i-1``'s embedding (``query.progap_aggregate``: step ``release``, the
clients' noisy rows for each other's nodes summed per node (or unmasked as sums) by the server,
then step ``finish``: each client adds the sums for its nodes and caches the result), then the stage's
training rounds, driven by a Flower strategy (messages ``train.progap_stage`` and
``evaluate.progap_stage``) -> evaluation (``query.progap_eval``).

Training: edge level FedSGD (:class:`~fedgraph.strategies.fedavg.StrictFedSGD`: each round one
full-batch gradient per client over the stage's parameters, weighted by training nodes, one
step of a server Adam created per stage, as the official code creates one optimizer per stage;
the round whose weights have the best validation accuracy, ties: lower loss, is kept, its
validation travelling with the next round's training message); node level FedAvg of DP-SGD
rounds (uniform weights, the last round kept: validation labels are private), or any Flower
strategy by ``round-strategy`` (FedProx, client sampling by ``fraction_train``, a user's own).
Earlier stages' parameters are frozen (sent, kept as sent).

Ledger: per client, ``aggregation`` (one Gaussian mechanism per stage after the first) when its
release reply arrives and, node level, ``stage dp-sgd`` per round; with one client and no noise
this is the centralized algorithm (:func:`fedgraph.methods.progap.run_progap`).
"""

from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgraph.errors import ClientFailure
from fedgraph.messaging import (
    bulk_record,
    bulk_tensors,
    object_store_available,
    record_workers,
    release_bulk,
    tensors,
)
from fedgraph.methods.gap.privacy import undirected_edge_epsilon
from fedgraph.methods.gap.server import unmask_partial_sums
from fedgraph.methods.progap.client import build_model
from fedgraph.methods.progap.privacy import plan_events, remote_noise, reply_events

from .base import PrivateStrategy, register_strategy, relayed_keys, secagg_record
from .fedavg import StrictFedAvg, StrictFedSGD, client_sampling_note, round_strategy
from .gap import aggregation_note, streamed_sums


@register_strategy("progap")
class ProGAPStrategy(PrivateStrategy):
    """Server side of federated ProGAP (edge and node level)."""

    method = "progap"
    config_method = "progap"

    def run(self, grid) -> None:
        cfg = self.config
        nodes = self.connect(grid)
        with self.report.phase("setup + calibration (clients)"):
            setup = self.ask(grid, "query.progap_setup")
        stats = json.loads(next(iter(setup.values()))["meta"]["schema"])
        self.report.dataset = stats
        record_workers(self.report, [rec["meta"] for rec in setup.values()])
        owner = torch.full((stats["num_nodes"],), -1, dtype=torch.long)
        self._plans = {}
        for n, rec in setup.items():
            plan = json.loads(rec["meta"]["plan"])
            owner[tensors(rec["ids"])["node_ids"]] = nodes.index(n)
            self._plans[n] = plan
            self.ledger.set_budget(f"client-{plan['partition_id']}", plan["epsilon_target"])
            if cfg.level == "edge" and cfg.depth == 0:  # stage 0 only: no edge is read
                self.ledger.record_unused(
                    f"client-{plan['partition_id']}", "training", "depth 0: no edge is read"
                )
        self.report.extra["clients"] = {
            f"client-{p['partition_id']}": {
                k: p[k]
                for k in (
                    "epsilon_target",
                    "delta",
                    "noise_multiplier",
                    "sigma",
                    "sensitivity",
                    "num_nodes",
                    "num_train",
                )
            }
            for p in self._plans.values()
        }
        sigmas = [p["sigma"] for p in self._plans.values()]
        self._remote = remote_noise(cfg, sigmas)
        self.report.privacy.update(
            {
                "model": f"{cfg.level}-level DP per client ({cfg.level} unit"
                + (
                    f": {cfg.edge_unit} edge"
                    if cfg.level == "edge"
                    else f": a node of the graph with out-degrees bounded by {cfg.max_degree}"
                )
                + f"); {cfg.depth} private aggregation{'s' if cfg.depth != 1 else ''} "
                "(Gaussian, sensitivity "
                f"{next(iter(self._plans.values()))['sensitivity']:.4g} each)"
                + ("; every stage trained with DP-SGD" if cfg.level == "node" else ""),
                "unit": "epsilon per client for the whole run, at the client's delta",
                "evaluation": "the clients' correct/total counts per split are evaluation outputs, "
                "outside the guarantee, as in the paper",
            }
        )
        if client_sampling_note(cfg):
            self.report.privacy["client_sampling"] = client_sampling_note(cfg)
        if cfg.level == "edge" and cfg.edge_unit == "directed":  # as GAP's: K = depth
            self.report.privacy["undirected_edge_epsilon"] = undirected_edge_epsilon(
                cfg, [{**p, "hops": p["depth"]} for p in self._plans.values()]
            )
        if self._remote is not None:
            self.report.privacy["aggregation"] = aggregation_note(cfg, self._remote, sigmas)
        self._keys = None
        if cfg.secure_aggregation and self._remote is not None:
            with self.report.phase("secure aggregation: key exchange (clients)"):
                keys = self.ask(grid, "query.progap_keys")
                self._keys = relayed_keys(keys, nodes)  # signed; relayed unchanged
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)  # the centralized run's initial weights
            model = build_model(cfg, stats["num_features"], stats["num_classes"])
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        selected = []
        for stage in range(cfg.depth + 1):
            if stage > 0:
                with self.report.phase(f"stage {stage}: aggregation (clients, via server)"):
                    self._aggregate(grid, stage, state, owner)
            with self.report.phase(
                f"stage {stage}: training rounds ({self._server_name()})", rounds=cfg.epochs
            ):
                state, best = self._train(grid, model, stage, state)
                selected.append(best)
        self.report.extra["training"] = {"selected_round_per_stage": selected}
        with self.report.phase("evaluate (clients)"):
            counts = self.ask(
                grid,
                "query.progap_eval",
                {"arrays": ArrayRecord(state), "stage": ConfigRecord({"stage": cfg.depth})},
            )
        self.record_accuracy(counts)

    # ------------------------------------------------------------------ training rounds
    def _train(self, grid, model, stage: int, state: dict) -> tuple[dict, int]:
        """The stage's rounds, driven by a Flower strategy (:meth:`_trainer`); returns the
        kept weights and their round."""
        cfg = self.config
        model.load_state_dict(state)
        model.set_stage(stage)
        strategy = self._trainer(stage, model)
        strategy.on_train_reply = lambda rnd, r: self._released(r.metadata.src_node_id, "train")
        stage_cfg = ConfigRecord({"json": json.dumps(cfg.model_dump()), "stage": stage})
        result = strategy.start(
            grid,
            ArrayRecord(state),
            cfg.epochs,
            cfg.timeout,
            stage_cfg,
            ConfigRecord(dict(stage_cfg.items())),
        )
        if cfg.level == "edge":  # the round with the best validation (StrictFedSGD's)
            _, rnd, arrays = strategy.best
        else:  # node level: the last round (validation labels are private)
            rnd, arrays = cfg.epochs, result.arrays
        return arrays.to_torch_state_dict(), rnd

    #: message types of a stage's rounds (``simulations/client_app.py``)
    TRAIN_MESSAGE, EVALUATE_MESSAGE = "train.progap_stage", "evaluate.progap_stage"

    def _trainer(self, stage: int, model):
        """The Flower strategy of stage ``stage``'s rounds over ``model``'s state: edge level
        :class:`~fedgraph.strategies.fedavg.StrictFedSGD` (one server Adam per stage with
        ``lr`` and ``weight-decay``, as the official code's optimizer per stage; the best
        round by validation kept); node level ``round-strategy``
        (:func:`~fedgraph.strategies.fedavg.round_strategy`, client sampling seeded from
        ``seed`` and the stage) or FedAvg. Earlier stages' parameters are frozen: sent,
        kept as sent."""
        cfg = self.config
        names = model.stage_parameter_names()
        buffers = {k for k, _ in model.named_buffers()}
        frozen = frozenset(k for k in model.state_dict() if k not in names and k not in buffers)
        if cfg.level == "edge":
            strategy = StrictFedSGD(
                cfg.num_clients,
                True,
                lr=cfg.lr,
                param_names=names,
                weight_decay=cfg.weight_decay,
                frozen=frozen,
            )
        elif cfg.round_strategy:
            strategy = round_strategy(cfg.round_strategy, cfg.round_strategy_args, cfg.num_clients)
            strategy.sampling_seed = cfg.seed * 16 + stage
        else:
            strategy = StrictFedAvg(cfg.num_clients)
        strategy.frozen = frozen
        strategy.train_message_type = self.TRAIN_MESSAGE
        strategy.evaluate_message_type = self.EVALUATE_MESSAGE
        return strategy

    def _server_name(self) -> str:
        """The rounds' Flower strategy, for the phase labels."""
        from .fedavg import resolve_round_strategy

        if self.config.level == "edge":
            return "FedSGD, server Adam"
        if self.config.round_strategy:
            return resolve_round_strategy(self.config.round_strategy).__name__
        return "FedAvg"

    # ------------------------------------------------------------------ aggregation
    def _aggregate(self, grid, stage: int, state: dict, owner) -> None:
        """Stage ``stage``'s input: step ``release`` (ledger ``aggregation``), summing per node or
        unmasking, step ``finish``."""
        shared = object_store_available()  # the rows by Ray's object store (messaging)
        agg = {"stage": stage, "step": "release", "object-store": shared}
        if self._remote is not None:
            agg["remote-sigma"], agg["remote-contributors"] = (
                float(self._remote[0]),
                self._remote[1],
            )
        contents = self._contents({"arrays": ArrayRecord(state), "agg": ConfigRecord(agg)})
        if self._keys is not None:
            for i, n in enumerate(self.nodes):
                contents[n]["secagg"] = secagg_record(self._keys, i)
                contents[n]["owner"] = ArrayRecord({"owner": owner})
        # summed as each reply arrives, in the clients' order (strategies.gap's PMA)
        total, add = streamed_sums(owner, len(self.nodes)) if self._keys is None else (None, None)
        try:
            replies = self.send_and_record(
                grid,
                "query.progap_aggregate",
                contents,
                lambda n, r: self._released(n, "aggregation"),
                on_reply=add,
            )
        except ClientFailure as err:
            if self._keys is None:
                raise
            raise ClientFailure(
                f"{err}. Secure aggregation has no dropout recovery: the round fails",
                replies=err.replies,
            ) from err
        empty = {
            "ids": torch.zeros(0, dtype=torch.long),
            "sums": torch.zeros(0, self.config.hidden),
        }
        if self._keys is not None:
            unmasked = unmask_partial_sums(
                [bulk_tensors(replies[n]["partial_sums"]) for n in self.nodes],
                owner,
                self.config.hidden,
            )
            incoming = {n: {"ids": i, "sums": s} for n, (i, s) in zip(self.nodes, unmasked)}
        else:
            incoming = {
                n: {"ids": i, "sums": s} if i.numel() else empty
                for n, (i, s) in zip(self.nodes, total.routed())
            }
        slots = {n: ("progap.incoming", n) if shared else None for n in self.nodes}
        finish = {
            n: {
                "agg": ConfigRecord({"stage": stage, "step": "finish"}),
                "incoming": bulk_record(incoming[n], slots[n]),
            }
            for n in self.nodes
        }
        self.ask(grid, "query.progap_aggregate", per_node=finish)
        for slot in slots.values():
            release_bulk(slot)

    def _contents(self, records: dict) -> dict:
        payload = ConfigRecord({"json": json.dumps(self.config.model_dump())})
        return {n: RecordDict({"config": payload, **records}) for n in self.nodes}

    def _released(self, node: int, phase: str) -> None:
        """Ledger entries of one reply of ``node``: ``aggregation`` (one Gaussian mechanism
        of the plan's multiplier) or, node level, one ``train`` round's DP-SGD steps; together
        a run's replies give exactly :func:`~fedgraph.methods.progap.privacy.plan_events`.
        A client without noise is listed as unprotected at its first edge or node release."""
        cfg, plan = self.config, self._plans[node]
        subject = f"client-{plan['partition_id']}"
        if not plan_events(plan):
            if subject not in self.ledger.subjects and (
                phase == "aggregation" or cfg.level == "node"
            ):
                self.ledger.record_unprotected(subject, phase, "epsilon target inf: no noise")
            return
        if phase == "aggregation" or cfg.level == "node":
            for release, event in reply_events(plan, phase, cfg.epochs):
                self.ledger.record(subject, release, event)
