"""GAP's handlers (:mod:`fedgraph.methods.gap.client`): setup, training rounds (encoder and
classifier), the PMA hops, validation and the final counts."""

from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from fedgraph._lazy import LazyModule
from fedgraph.messaging import array_record, bulk_record, bulk_tensors, release_bulk, tensors
from fedgraph.simulations import client_state

from . import common
from .common import kept, meta, reply, setup, verified_keys

gap = LazyModule("fedgraph.methods.gap.client")  # GAP's client half, at its first message


def _authority(cfg, pid: int, view, context: Context):
    """``(authority, plan)``: this client's own ledger (:func:`.common.authority`: its own
    target for the training graph and the held-out graph, whatever the request asks) and its
    plan, whose events are checked against that budget once (the allowance)."""
    from fedgraph.methods.gap.privacy import heldout_events, plan_events

    own = common.own_config(context)
    plan = gap.client_plan(cfg, pid, view).to_dict()
    subject = f"client-{pid}"
    target = own.client_epsilon(pid)
    auth = common.authority(
        context, {subject: target, f"{subject} (held-out graph)": target}, own.delta, own.accountant
    )
    if subject not in auth.allowance:
        auth.allow(subject, [e for _, e in plan_events(plan)])
        auth.allow(f"{subject} (held-out graph)", [e for _, e in heldout_events(plan)])
    return auth, plan


def gap_setup(msg: Message, context: Context) -> Message:
    cfg, pid, view, _ = setup(msg, context)
    ids, plan = gap.setup(cfg, pid, view)
    auth, _ = _authority(cfg, pid, view, context)
    common.save(context, auth)
    return reply(
        msg, ids=ArrayRecord({"node_ids": ids}), meta=meta(view, pid, plan=json.dumps(plan))
    )


def gap_train(msg: Message, context: Context) -> Message:
    from fedgraph.methods.gap.privacy import reply_events

    cfg, pid, view, gen = setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])  # empty: fresh weights
    phase, server_round = str(c["phase"]), int(c["server-round"])
    last = dict(context.state["gap.rounds"]) if "gap.rounds" in context.state else {}
    admitted = gap.admit_round(cfg, phase, server_round, last)
    auth, plan = _authority(cfg, pid, view, context)
    name = phase.removeprefix("gap.")
    rounds = cfg.encoder_rounds if name == "encoder" else cfg.classifier_rounds
    charges = [(f"client-{pid}", r, e) for r, e in reply_events(plan, name, rounds)]

    def records():
        context.state["gap.rounds"] = ConfigRecord(admitted)
        arrays, metrics = gap.train(
            cfg,
            pid,
            view,
            phase,
            weights,
            kept(context),
            server_round=server_round,
            validate=bool(c.get("evaluate", False)),
            generator=gen,
            proximal_mu=float(c.get("proximal-mu", 0.0)),
        )
        return {"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)}

    return common.release(
        msg, context, auth, f"gap:{phase}:{server_round}", charges, records, with_ledger=False
    )


def gap_pma(msg: Message, context: Context) -> Message:
    from fedgraph.methods.gap.privacy import reply_events

    cfg, pid, view, gen = setup(msg, context)
    c = msg.content
    # secure aggregation: the relayed key list, verified against this client's own identity
    # directory before anything is computed or released (refused: ValueError)
    secagg = verified_keys(msg, context, cfg, "gap")
    req = gap.pma_request(c, secagg, f"fedgraph gap pma run={context.run_id}", bulk_tensors)
    key = gap.pma_state_key(req.graph)
    heldout = req.graph == "test"
    auth, plan = _authority(cfg, pid, view, context)
    phase = "pma (held-out graph)" if heldout else "pma"
    subject = f"client-{pid}" + (" (held-out graph)" if heldout else "")
    charges = [(subject, r, e) for r, e in reply_events(plan, phase)] if req.hop <= cfg.hops else []
    purpose = f"gap:pma{req.hop}" + (":test" if heldout else "")

    def records():
        kept = client_state.get_tensors(context, key) if key in context.state else None
        # the sums over the client's edges, built at the first hop for the rest (dropped with
        # the state at the last hop)
        step = gap.pma_step(
            cfg, pid, view, req, kept, gen, lambda build: client_state.derived(context, key, build)
        )
        # the release by Ray's object store when both ends read it (fedgraph.messaging.
        # bulk_record; the previous hop's, read by the server before it sent this hop, is freed)
        slot = (int(context.run_id), int(context.node_id), key + ".release")
        shared = req.object_store and client_state.in_ray_worker()
        if step.pending is not None:  # kept out of the Context Flower ships with every message
            client_state.put_tensors(context, key, step.pending)
            return {"partial_sums": bulk_record(step.release, slot if shared else None)}
        # the last hop: the PMA state and the last release go, the classifier's inputs stay
        release_bulk(slot)
        client_state.drop(context, key)
        client_state.put_tensors(context, gap.hops_key(req.graph), {"hops": step.hops})
        return {"partial_sums": array_record(step.release)}

    return common.release(msg, context, auth, purpose, charges, records)


def gap_evaluate_round(msg: Message, context: Context) -> Message:
    cfg, _, view, _ = setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])
    return reply(
        msg, metrics=MetricRecord(gap.validate(cfg, view, c.get("phase"), weights, kept(context)))
    )


def gap_evaluate(msg: Message, context: Context) -> Message:
    cfg, pid, view, _ = setup(msg, context)
    counts = gap.final_counts(cfg, view, tensors(msg.content["arrays"]), kept(context))
    auth, _ = _authority(cfg, pid, view, context)
    return reply(msg, metrics=MetricRecord(counts), ledger=common.ledger_record(auth))
