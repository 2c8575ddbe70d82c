"""GAP as a Flower strategy (Sajadmanesh et al., USENIX Security 2023), federated.

Phases: setup (each client calibrates its noise for its own epsilon target and reports its
plan) -> encoder rounds (FedAvg; node level: DP-SGD on the clients; edge level: best round by
validation accuracy) -> PMA hop by hop, with cross-client edges served by noisy partial sums
summed per node by the server and sent to the node's owner -> classifier rounds (FedAvg, best round by validation accuracy at
edge level) -> evaluation on the clients.

``inference = "inductive"``: PMA runs on the training graph (edges between train/val nodes),
and once more after the classifier rounds on the held-out graph (edges between test nodes;
fresh noise, same sigma and K), whose aggregates the test nodes are evaluated on. The two
graphs share no edge and no node, so their PMA releases compose in parallel and a client's
epsilon is that of one run; see :mod:`fedgraph.methods.gap.client_pma` for who decides which
cross-client edges exist and :mod:`fedgraph.methods.gap.privacy` for the argument. The ledger
records the held-out run under a subject of its own, ``client-i (held-out graph)``.

Ledger: each client's releases are recorded as their replies arrive (:meth:`GAPStrategy._released`:
a PMA hop, a node-level DP-SGD round), so a failed run reports what left the clients; each
client's epsilon target is its subject's budget. Node level: training replies carry no loss and
the constant weight 1 (the count of private training nodes never leaves a client).

Remote rows' noise: each client's own sigma by default; with ``secure_aggregation`` a share
sigma_max / sqrt(n - 1): the clients exchange X25519 public keys through the server after
setup (each signed under the client's identity key, provisioned outside the server, which
the server relays unchanged and never reads: :func:`.base.relayed_keys`; every client verifies
them) and send only pairwise-masked rows (:mod:`fedgraph.secure_aggregation`, SecAgg without
dropout recovery), the server adds them per node, which cancels the masks, and routes one
summed row per node to its owner; with undirected edges and different client sigmas,
sigma_max (:func:`fedgraph.methods.gap.privacy.remote_noise`). Clients check the value they
are sent over the contributors they count themselves
(:func:`~fedgraph.methods.gap.privacy.check_remote_sigma`,
:func:`~fedgraph.methods.gap.privacy.own_contributors`).
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
    push_message,
    record_workers,
    release_bulk,
    send_to_all,
    tensors,
    wait_for_nodes,
)
from fedgraph.methods.gap.models import build_classifier, build_encoder
from fedgraph.methods.gap.privacy import (
    plan_events,
    remote_noise,
    reply_events,
    undirected_edge_epsilon,
)
from fedgraph.methods.gap.server import PartialSums, unmask_partial_sums
from fedgraph.secure_aggregation import FRAC_BITS

from .base import PrivateStrategy, register_strategy, relayed_keys, secagg_record
from .fedavg import StrictFedSGD, client_sampling_note, round_strategy, strict_strategy


def streamed_sums(owner, num_clients: int) -> tuple[PartialSums, object]:
    """The server's sums of a PMA hop (or a ProGAP aggregation) and the ``on_reply`` of
    :meth:`~strategies.base.PrivateStrategy.send_and_record` that adds each reply's released
    rows (views of its bytes, only read) as it arrives."""
    total = PartialSums(owner, num_clients)

    def add(node, reply) -> None:
        out = bulk_tensors(reply["partial_sums"])
        total.add(out["ids"], out["sums"])

    return total, add


def _seeded_init(build, cfg, num_features: int, num_classes: int):
    """``build(cfg, num_features, num_classes)`` with its initial weights drawn from a torch
    generator seeded by the run's ``seed`` (public; the global RNG is left as it was), so that
    runs of one seed start from the same weights whatever the partition."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return build(cfg, num_features, num_classes)


def aggregation_note(cfg, remote: tuple[float, int], sigmas: list[float]) -> str:
    """The report's ``privacy.aggregation``: why the remote rows carry ``remote`` noise
    (:func:`fedgraph.methods.gap.privacy.remote_noise`) and what that assumes (GAP's PMA
    rows and ProGAP's aggregation rows alike)."""
    if cfg.secure_aggregation:
        return (
            f"secure aggregation (pairwise masking as in SecAgg, Bonawitz et al. 2017, "
            f"without dropout recovery): each client masks its remote rows, in fixed point "
            f"(2^-{FRAC_BITS}) modulo 2^64, with ChaCha20 masks from pairwise X25519 + "
            f"HKDF-SHA256 keys; the server receives only masked rows and learns only the "
            f"sum of the n - 1 other clients' rows for each node, which it routes to the "
            f"node's owner. Each client adds noise std {remote[0]:.4g} to its remote rows "
            f"(sigma_max / sqrt(n - 1)), so every summed row has std sigma_max = "
            f"{max(sigmas):.4g}, at least each client's own sigma. The public keys are "
            f"signed under identity keys provisioned outside the server; every client "
            f"verifies every signature and counts the contributors itself, so a server that "
            f"substitutes keys is refused. Assumes no collusion between the server and any "
            f"client (no Sybil clients), no coalition of clients that includes a node's "
            f"owner removing shares, and every client adding the same share; no dropout "
            f"tolerance: a missing client fails the round. With "
            f"2 clients a sum has one contributor: the server reads that client's row "
            f"(noise std sigma_max)."
        )
    if cfg.level == "node":
        return (
            f"node level with different client sigmas: every remote row gets sigma_max = "
            f"{remote[0]:.4g}, so the rows the other clients release for a client's node "
            f"carry at least the noise that client planned for"
        )
    return (
        f"undirected edges with different client sigmas: every remote row gets "
        f"sigma_max = {remote[0]:.4g}, so both halves of a cross-client edge carry at least "
        f"the noise either client planned for"
    )


def _schedule_note(cfg) -> str:
    """The report's ``privacy.schedule``: what the training rounds release and what epsilon
    they spend (docs/explanations/client-releases.md)."""
    rounds = f"{cfg.encoder_rounds} encoder + {cfg.classifier_rounds} classifier rounds"
    if cfg.level == "node":
        return (
            f"FedAvg ({_round_label(cfg)}), {rounds} of {cfg.local_epochs} local epoch(s) "
            "of DP-SGD: each round every client taking part sends its weights, noised by DP-SGD (ledger 'encoder dp-sgd' / "
            "'classifier dp-sgd', part of each client's epsilon) and the count 1; no loss, "
            "no validation metric (validation labels are private at node level)"
        )
    inputs = (
        "functions of the client's features, labels and PMA's noisy rows: no epsilon "
        "beyond PMA's (ledger 'pma'; the encoder reads no edge)"
    )
    val = (
        " With model selection each round's validation accuracy, loss and count leave "
        "too (edge level: labels are not the unit), "
    )
    if cfg.schedule == "fedsgd":
        return (
            f"FedSGD with a server Adam, {rounds}: each round every client sends the "
            "full-batch gradient of its mean training loss"
            + (" and its batch norms' running statistics after the pass" if cfg.batch_norm else "")
            + ", its training-node count and its training loss."
            f"{val}from round 2 in the training reply, for the weights "
            f"received. All {inputs}"
        )
    return (
        f"FedAvg ({_round_label(cfg)}), {rounds} of {cfg.local_epochs} local epoch(s): "
        "each round every client taking part sends its weights after its local epochs, its "
        f"training-node count and its training loss.{val}in an evaluation round. All "
        f"{inputs}"
    )


def _round_label(cfg) -> str:
    """``server-optimizer``, or ``round-strategy`` with its arguments."""
    if not cfg.round_strategy:
        return cfg.server_optimizer
    args = ", ".join(f"{k}={v}" for k, v in cfg.round_strategy_args.items())
    return cfg.round_strategy + (f": {args}" if args else "")


def _privacy_model(cfg, plan: dict) -> str:
    """The report's ``privacy.model``: level, protected unit and PMA's per-hop sensitivity
    (``plan``: one client's plan; the sensitivity is the same for every client)."""
    if cfg.level == "edge":
        unit = (
            "undirected edge (both directed halves; sensitivity sqrt 2 per hop)"
            if cfg.edge_unit == "undirected"
            else "directed edge (sensitivity 1 per hop; GAP's paper unit: one half of an "
            "undirected edge; a whole one costs privacy.undirected_edge_epsilon)"
        )
        return f"edge-level DP per client (protected unit: {unit})"
    clip = (
        f"; every remote row clipped to norm {plan['remote_norm']:g}, so a node's in-edges "
        f"from the other {cfg.num_clients - 1} clients count"
        + (" as their summed row (secure aggregation)" if cfg.secure_aggregation else "")
        if plan.get("remote_norm") is not None
        else ""
    )
    pma = f"; PMA sensitivity {plan['sensitivity']:.4g} per hop" if plan.get("hops") else ""
    return (
        f"node-level DP per client (protected unit: a node of the degree-bounded graph, "
        f"with its features, label and edges; node ids public (the node directory: "
        f"neighbouring graphs have the same node universe, the protected node's data and "
        f"edges change); out-degree bounded by {cfg.max_degree}{clip}{pma}; on the raw "
        f"graph the bound does not hold: removing a node frees its in-neighbours' sampled "
        f"out-edge slots, which the sampler refills)"
    )


@register_strategy("gap")
class GAPStrategy(PrivateStrategy):
    """Server side of federated GAP and its baselines (``variant``: gap, gap-inf, mlp)."""

    method = "gap"
    config_method = "gap"

    def run(self, grid) -> None:
        cfg = self.config
        cfg_json = json.dumps(cfg.model_dump())
        payload = ConfigRecord({"json": cfg_json})
        with self.report.phase("connect"):
            nodes = wait_for_nodes(grid, cfg.num_clients, timeout=min(cfg.timeout, 60.0))
        with self.report.phase("setup + calibration (clients)"):
            setup = send_to_all(
                grid,
                "query.gap_setup",
                {n: RecordDict({"config": payload}) for n in nodes},
                cfg.timeout,
            )
        stats = json.loads(next(iter(setup.values()))["meta"]["schema"])
        self.report.dataset = stats  # the public schema only (fedgraph.federation.SCHEMA_FIELDS)
        record_workers(self.report, [rec["meta"] for rec in setup.values()])
        owner = torch.full((stats["num_nodes"],), -1, dtype=torch.long)  # index into nodes
        clients = {}
        for n, rec in setup.items():
            meta = json.loads(rec["meta"]["plan"])
            ids = tensors(rec["ids"])["node_ids"]
            owner[ids] = nodes.index(n)
            clients[n] = meta
            for suffix in ("", " (held-out graph)"):
                self.ledger.set_budget(
                    f"client-{meta['partition_id']}{suffix}", meta["epsilon_target"]
                )
        self._plans = clients  # releases are recorded as their replies arrive (_released)
        self.report.extra["clients"] = {
            f"client-{m['partition_id']}": {
                k: m[k]
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
            for m in clients.values()
        }
        num_classes, num_features = stats["num_classes"], stats["num_features"]
        self.report.privacy.update(
            {
                "model": _privacy_model(cfg, next(iter(clients.values()))),
                "unit": "epsilon per client for the whole run, at the client's delta",
                "inference": cfg.inference,
                "evaluation": "the clients' correct/total counts per split (the report's accuracy) "
                "are evaluation outputs, outside the guarantee, as in the paper",
                "schedule": _schedule_note(cfg),
            }
        )
        if client_sampling_note(cfg):
            self.report.privacy["client_sampling"] = client_sampling_note(cfg)
        if cfg.level == "edge" and cfg.edge_unit == "directed":
            self.report.privacy["undirected_edge_epsilon"] = undirected_edge_epsilon(
                cfg, list(clients.values())
            )
        inductive = cfg.inference == "inductive" and cfg.variant != "mlp"
        if inductive:
            self.report.privacy["inference_note"] = (
                "inductive: training and held-out graphs share no edge (and no node); their PMA "
                "releases compose in parallel. The held-out graph's PMA is recorded under "
                "'client-i (held-out graph)'; client i's epsilon is the larger of its two "
                "subjects', i.e. client-i's"
            )
        self.report.extra["inference"] = cfg.inference
        sigmas = [m["sigma"] for m in clients.values()]
        self._remote = remote_noise(cfg, sigmas)  # (std on remote rows, contributors) or None
        if self._remote is not None:
            self.report.privacy["aggregation"] = aggregation_note(cfg, self._remote, sigmas)
        self._keys = None  # secure aggregation: the clients' signed X25519 public keys
        if cfg.secure_aggregation and self._remote is not None:
            with self.report.phase("secure aggregation: key exchange (clients)"):
                keys = send_to_all(
                    grid,
                    "query.gap_keys",
                    {n: RecordDict({"config": payload}) for n in nodes},
                    cfg.timeout,
                )
                self._keys = relayed_keys(keys, nodes)  # signed; relayed unchanged
        encoder_arrays = ArrayRecord()
        select = cfg.level == "edge"  # node level: validation labels are private
        training = {}
        if cfg.variant != "mlp" and cfg.encoder_rounds > 0:
            with self.report.phase(
                f"encoder rounds ({self._server_name()})", rounds=cfg.encoder_rounds
            ):
                enc = _seeded_init(build_encoder, cfg, num_features, num_classes)
                # Edge level: the encoder, like the classifier, is the round with the best
                # validation accuracy of its pre-training head (the reference code's
                # checkpointing); it reads no edge, so the per-round validation counts are
                # no PMA release (docs/explanations/client-releases.md).
                fedavg = self._trainer("encoder", enc, select)
                fedavg.on_train_reply = lambda rnd, r: self._released(
                    r.metadata.src_node_id, "encoder"
                )
                enc_cfg = ConfigRecord({"json": cfg_json, "phase": "gap.encoder"})
                res = fedavg.start(
                    grid,
                    ArrayRecord(enc.state_dict()),
                    cfg.encoder_rounds,
                    cfg.timeout,
                    enc_cfg,
                    enc_cfg,
                )
                encoder_arrays = fedavg.best[2] if select and fedavg.best else res.arrays
                training["encoder_selected_round"] = (
                    fedavg.best[1] if select and fedavg.best else cfg.encoder_rounds
                )
        if cfg.variant != "mlp":
            with self.report.phase("PMA (clients, via server)"):
                self._pma(
                    grid, nodes, owner, payload, encoder_arrays, "train" if inductive else "all"
                )
        with self.report.phase(
            f"classifier rounds ({self._server_name()})", rounds=cfg.classifier_rounds
        ):
            clf = _seeded_init(build_classifier, cfg, num_features, num_classes)
            fedavg = self._trainer("classifier", clf, select)
            fedavg.on_train_reply = lambda rnd, r: self._released(
                r.metadata.src_node_id, "classifier"
            )
            train_cfg = ConfigRecord({"json": cfg_json, "phase": "gap.classifier"})
            res = fedavg.start(
                grid,
                ArrayRecord(clf.state_dict()),
                cfg.classifier_rounds,
                cfg.timeout,
                train_cfg,
                train_cfg,
            )
            arrays = fedavg.best[2] if select and fedavg.best else res.arrays
            self.report.extra["training"] = {
                "selected_round": fedavg.best[1]
                if select and fedavg.best
                else cfg.classifier_rounds,
                **training,
            }
        if inductive:
            with self.report.phase("PMA on the held-out graph (clients, via server)"):
                self._pma(grid, nodes, owner, payload, encoder_arrays, "test")
        with self.report.phase("evaluate (clients)"):
            counts = send_to_all(
                grid,
                "evaluate.gap",
                {n: RecordDict({"config": payload, "arrays": arrays}) for n in nodes},
                cfg.timeout,
            )
        self.record_accuracy(counts, stats)

    #: keep every FedSGD round's averaged gradient in ``self.gradients[module]`` (tests)
    keep_gradients = False

    def _trainer(self, module: str, model, select_on_val: bool = False):
        """The Flower strategy of the ``module`` (encoder, classifier) rounds of ``model``:
        ``schedule`` fedsgd: :class:`~fedgraph.strategies.fedavg.StrictFedSGD` (server Adam with
        ``lr``); else ``round-strategy`` (:func:`~fedgraph.strategies.fedavg.round_strategy`)
        or the ``server-optimizer``'s :func:`~fedgraph.strategies.fedavg.strict_strategy`.
        Client sampling is seeded from ``seed`` and ``module``."""
        cfg = self.config
        if cfg.schedule == "fedsgd":
            strategy = StrictFedSGD(
                cfg.num_clients,
                select_on_val,
                lr=cfg.lr,
                keep_gradients=self.keep_gradients,
                param_names=[k for k, _ in model.named_parameters()],
            )
            self.gradients = {**getattr(self, "gradients", {}), module: strategy.gradients}
            return strategy
        if cfg.round_strategy:
            strategy = round_strategy(
                cfg.round_strategy, cfg.round_strategy_args, cfg.num_clients, select_on_val
            )
            strategy.sampling_seed = cfg.seed * 2 + (module == "classifier")
            return strategy
        return strict_strategy(
            cfg.server_optimizer, cfg.num_clients, select_on_val, server_lr=cfg.server_lr
        )

    def _server_name(self) -> str:
        """The rounds' Flower strategy, for the phase labels (e.g. ``FedAdam``)."""
        from .fedavg import STRICT_STRATEGIES, resolve_round_strategy

        if self.config.schedule == "fedsgd":
            return "FedSGD, server Adam"
        if self.config.round_strategy:
            return resolve_round_strategy(self.config.round_strategy).__name__
        return STRICT_STRATEGIES[self.config.server_optimizer].__bases__[-1].__name__

    def _released(self, node: int, phase: str) -> None:
        """Ledger entries for one reply of ``node`` that has arrived (what left the client in
        it, recorded at once so that a run failing later reports it): ``phase`` ``pma`` / ``pma
        (held-out graph)`` (one hop: a Gaussian mechanism), ``encoder`` / ``classifier`` (one
        FedAvg round: at node level its DP-SGD steps, the plan's schedule over the rounds; at
        edge level nothing: the encoder reads no edge, the classifier only PMA's noisy
        output). Together, a run's replies give exactly :func:`plan_events` (and
        :func:`heldout_events`). A client without noise (epsilon target inf, the gap-inf
        variant) is listed with epsilon inf at its first release; the MLP variant at edge level
        reads no edge (epsilon 0)."""
        cfg, plan = self.config, self._plans[node]
        heldout = phase.endswith("(held-out graph)")
        subject = f"client-{plan['partition_id']}" + (" (held-out graph)" if heldout else "")
        if not plan_events(plan):
            if subject in self.ledger.subjects:
                return
            if cfg.level == "edge" and not plan["hops"]:
                self.ledger.record_unused(subject, "training", "MLP: no edge is read")
            elif cfg.level == "node" or phase.startswith("pma"):  # edge level: PMA reads edges
                self.ledger.record_unprotected(subject, phase, "epsilon target inf: no noise")
            return
        rounds = cfg.encoder_rounds if phase == "encoder" else cfg.classifier_rounds
        for release, event in reply_events(plan, phase, rounds):
            self.ledger.record(subject, release, event)

    def _pma(self, grid, nodes, owner, payload, encoder_arrays, graph: str = "all") -> None:
        """Hops 1..K; message k also carries the partial sums for hop k-1 (k = K+1: finish).
        ``graph``: the edge set (``all``, ``train``: the training graph, ``test``: the
        held-out graph), decided on the clients. In a Ray simulation the rows travel by Ray's
        object store, both ways (``object-store``; :func:`fedgraph.messaging.bulk_record`).

        Pipelined where the grid streams its replies (no secure aggregation): the rows are
        summed as each reply arrives, in the hop's order of clients; once the last client's
        reply is summed, every reply of the hop has arrived and passed its checks, and that
        client's sums for the next hop are complete (the others' rows are in), so its next
        message goes out at once, ahead of the others' (routed while it computes). The next
        hop's order starts with it: the order rotates by one client per hop, and the float
        sums follow the order, never the arrival times."""
        cfg = self.config
        empty = {"ids": torch.zeros(0, dtype=torch.long), "sums": torch.zeros(0, cfg.encoder_dim)}
        incoming = {n: empty for n in nodes}
        shared = object_store_available()
        slots = {n: ("gap.incoming", graph, n) if shared else None for n in nodes}
        release = "pma" + (" (held-out graph)" if graph == "test" else "")
        index = {n: i for i, n in enumerate(nodes)}  # owner[] holds these indices

        def message(k: int, n: int, rows: dict) -> RecordDict:
            pma = {"hop": k, "graph": graph, "object-store": shared}
            if self._remote is not None:
                pma["remote-sigma"], pma["remote-contributors"] = (
                    float(self._remote[0]),
                    self._remote[1],
                )
            content = RecordDict(
                {
                    "config": payload,
                    "pma": ConfigRecord(pma),
                    "incoming": bulk_record(rows, slots[n]),
                    "encoder": encoder_arrays,
                }
            )
            if self._keys is not None:  # every client gets every public key and the owners
                content["secagg"] = secagg_record(self._keys, index[n])
                content["owner"] = ArrayRecord({"owner": owner})
            return content

        def routed(total, clients) -> dict:
            return {
                n: {"ids": ids, "sums": sums} if ids.numel() else empty
                for n, (ids, sums) in zip(clients, total.routed([index[n] for n in clients]))
            }

        order, ahead = list(nodes), {}  # ahead: node -> its message of this hop, already sent
        pipelined = self._keys is None and getattr(grid, "streams_replies", False)
        for k in range(1, cfg.hops + 2):
            contents = {n: message(k, n, incoming[n]) for n in order if n not in ahead}
            sent_ahead = {}
            if self._keys is None:
                # the released rows are summed as each reply arrives, in the hop's order,
                # while the others compute (views of the replies' bytes: only read; none
                # outlives its hop, the client frees them next hop)
                total, add = streamed_sums(owner, len(nodes))

                def on_reply(n, reply, k=k, total=total, add=add):
                    add(n, reply)
                    if pipelined and k <= cfg.hops and n == order[-1]:
                        sent_ahead[n] = push_message(
                            grid, "query.gap_pma", n, message(k + 1, n, routed(total, [n])[n])
                        )
            else:
                on_reply = None
            try:
                replies = self.send_and_record(
                    grid,
                    "query.gap_pma",
                    contents,
                    lambda n, r, k=k: self._released(n, release) if k <= cfg.hops else None,
                    on_reply=on_reply,
                    pushed=ahead,
                )
            except ClientFailure as err:
                if self._keys is None:
                    raise
                raise ClientFailure(
                    f"{err}. Secure aggregation has no dropout recovery: the "
                    f"masks of a client that fails or does not reply do not "
                    f"cancel, so the round fails",
                    replies=err.replies,
                ) from err
            if self._keys is not None:
                unmasked = unmask_partial_sums(
                    [bulk_tensors(replies[n]["partial_sums"]) for n in nodes],
                    owner,
                    cfg.encoder_dim,
                )
                incoming = {
                    n: {"ids": ids, "sums": sums} for n, (ids, sums) in zip(nodes, unmasked)
                }
                continue
            if k <= cfg.hops:  # the next hop's rows for the clients not sent ahead
                incoming = routed(total, [n for n in order if n not in sent_ahead])
            if sent_ahead:
                order = list(sent_ahead) + [n for n in order if n not in sent_ahead]
            ahead = sent_ahead
        for slot in slots.values():  # (the process's exit frees them if a hop fails)
            release_bulk(slot)
