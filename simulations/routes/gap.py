"""GAP's handlers (:mod:`fedgraph.methods.gap.client`): setup, training rounds (encoder and
classifier), the PMA hops, validation and the final counts."""
from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from fedgraph._lazy import LazyModule
from fedgraph.messaging import array_record, bulk_record, bulk_tensors, release_bulk, tensors
from fedgraph.simulations import client_state

from .common import kept, meta, reply, setup

gap = LazyModule("fedgraph.methods.gap.client")  # GAP's client half, at its first message


def gap_setup(msg: Message, context: Context) -> Message:
    cfg, pid, view, _ = setup(msg, context)
    ids, plan = gap.setup(cfg, pid, view)
    return reply(msg, ids=ArrayRecord({"node_ids": ids}),
                 meta=meta(view, pid, plan=json.dumps(plan)))


def gap_train(msg: Message, context: Context) -> Message:
    cfg, pid, view, gen = setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])  # empty: fresh weights
    last = dict(context.state["gap.rounds"]) if "gap.rounds" in context.state else {}
    context.state["gap.rounds"] = ConfigRecord(
        gap.admit_round(cfg, str(c["phase"]), int(c["server-round"]), last))
    arrays, metrics = gap.train(cfg, pid, view, str(c["phase"]), weights, kept(context),
                                server_round=int(c["server-round"]),
                                validate=bool(c.get("evaluate", False)), generator=gen,
                                proximal_mu=float(c.get("proximal-mu", 0.0)))
    return reply(msg, arrays=ArrayRecord(arrays), metrics=MetricRecord(metrics))


def gap_pma(msg: Message, context: Context) -> Message:
    cfg, pid, view, gen = setup(msg, context)
    c = msg.content
    private = bytes(context.state["gap.secagg"]["private-key"]) if "secagg" in c else None
    req = gap.pma_request(c, private, f"fedgraph gap pma run={context.run_id}", bulk_tensors)
    key = gap.pma_state_key(req.graph)
    kept = client_state.get_tensors(context, key) if key in context.state else None
    # the sums over the client's edges, built at the first hop for the rest (dropped with
    # the state at the last hop)
    step = gap.pma_step(cfg, pid, view, req, kept, gen,
                        lambda build: client_state.derived(context, key, build))
    # the release by Ray's object store when both ends read it (fedgraph.messaging.bulk_record;
    # the previous hop's, read by the server before it sent this hop, is freed)
    slot = (int(context.run_id), int(context.node_id), key + ".release")
    shared = req.object_store and client_state.in_ray_worker()
    if step.pending is not None:  # kept out of the Context Flower ships with every message
        client_state.put_tensors(context, key, step.pending)
        return reply(msg, partial_sums=bulk_record(step.release, slot if shared else None))
    # the last hop: the PMA state and the last release go, the classifier's inputs stay
    release_bulk(slot)
    client_state.drop(context, key)
    client_state.put_tensors(context, gap.hops_key(req.graph), {"hops": step.hops})
    return reply(msg, partial_sums=array_record(step.release))


def gap_evaluate_round(msg: Message, context: Context) -> Message:
    cfg, _, view, _ = setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])
    return reply(msg, metrics=MetricRecord(
        gap.validate(cfg, view, c.get("phase"), weights, kept(context))))


def gap_evaluate(msg: Message, context: Context) -> Message:
    cfg, _, view, _ = setup(msg, context)
    counts = gap.final_counts(cfg, view, tensors(msg.content["arrays"]), kept(context))
    return reply(msg, metrics=MetricRecord(counts))
