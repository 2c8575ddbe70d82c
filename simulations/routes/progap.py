"""ProGAP's handlers (:mod:`fedgraph.methods.progap.client`): setup, a stage's training and
validation rounds (sent by the stage's Flower strategy), the final evaluation and the private
aggregation of each stage (steps ``release`` and ``finish``).

The client's state: ``progap.rounds`` (the last round it trained per stage),
``progap.cache`` (its aggregations ``x1..xk``), ``progap.pending`` (its noisy local sums
between the two steps of an aggregation), ``progap.secagg`` (its secure-aggregation key,
:func:`.common.advertise_key`).
"""
from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from fedgraph.messaging import bulk_record, bulk_tensors, release_bulk, tensors
from fedgraph.simulations import client_state

from .common import meta, reply, setup


def _stage(msg: Message, context: Context, stage: int):
    """``(cfg, pid, view, gen, model, x)``: ProGAP's model at ``stage`` with the received
    weights, on this client's cached aggregations of stages ``1..stage``."""
    from fedgraph.methods.progap.client import stage_model

    cfg, pid, view, gen = setup(msg, context)
    cache = client_state.get_tensors(context, "progap.cache") if stage else {}
    model, x = stage_model(cfg, view, stage, msg.content["arrays"].to_torch_state_dict(),
                           [cache[f"x{i}"] for i in range(1, stage + 1) if f"x{i}" in cache])
    return cfg, pid, view, gen, model, x


def progap_setup(msg: Message, context: Context) -> Message:
    from fedgraph.methods.progap.client import setup as client_setup

    cfg, pid, view, _ = setup(msg, context)
    ids, plan = client_setup(cfg, pid, view)
    return reply(msg, ids=ArrayRecord({"node_ids": ids}),
                 meta=meta(view, pid, plan=json.dumps(plan)))


def progap_train(msg: Message, context: Context) -> Message:
    """``train.progap_stage``: a round of the stage's Flower strategy (its config record holds
    the run config, ``stage``, Flower's ``server-round`` and, FedSGD, ``evaluate``)."""
    from fedgraph.methods.progap.client import admit_round, train_round

    c = msg.content["config"]
    stage, rnd = int(c["stage"]), int(c["server-round"])
    cfg, pid, view, gen, model, x = _stage(msg, context, stage)  # reads, releases nothing
    last = dict(context.state["progap.rounds"]) if "progap.rounds" in context.state else {}
    context.state["progap.rounds"] = ConfigRecord(admit_round(cfg, stage, rnd, last))
    arrays, metrics = train_round(cfg, pid, view, model, x, gen(f"progap:train:{stage}:{rnd}"),
                                  validate=bool(c.get("evaluate", False)),
                                  proximal_mu=float(c.get("proximal-mu", 0.0)))
    return reply(msg, arrays=ArrayRecord(arrays), metrics=MetricRecord(metrics))


def progap_validate(msg: Message, context: Context) -> Message:
    """``evaluate.progap_stage``: the validation of a stage's last weights (edge level)."""
    from fedgraph.methods.progap.client import validation

    cfg, _, view, _, model, x = _stage(msg, context, int(msg.content["config"]["stage"]))
    return reply(msg, metrics=MetricRecord(validation(cfg, model, x, view)))


def progap_eval(msg: Message, context: Context) -> Message:
    from fedgraph.methods.progap.client import counts

    _, _, view, _, model, x = _stage(msg, context, int(msg.content["stage"]["stage"]))
    return reply(msg, metrics=MetricRecord(counts(model, x, view)))


def progap_aggregate(msg: Message, context: Context) -> Message:
    from fedgraph.methods.progap.client import finish, release

    c, agg = msg.content, msg.content["agg"]
    stage = int(agg["stage"])
    # the release by Ray's object store when both ends read it (fedgraph.messaging.bulk_record),
    # freed at the finish, which the server sends after it summed the releases
    slot = (int(context.run_id), int(context.node_id), "progap.release")
    if str(agg["step"]) == "finish":
        release_bulk(slot)
        _, _, view, _ = setup(msg, context)
        inc = bulk_tensors(c["incoming"])
        cache = dict(client_state.get_tensors(context, "progap.cache")) if stage > 1 else {}
        cache[f"x{stage}"] = finish(client_state.get_tensors(context, "progap.pending")["sums"],
                                    view.graph.node_ids, inc["ids"], inc["sums"])
        client_state.put_tensors(context, "progap.cache", cache)
        client_state.drop(context, "progap.pending")
        return reply(msg, done=ConfigRecord({"stage": stage}))
    cfg, pid, view, gen, model, x = _stage(msg, context, stage - 1)
    secagg = None
    if "secagg" in c:
        sa = c["secagg"]
        secagg = (bytes(context.state["progap.secagg"]["private-key"]), list(sa["public-keys"]),
                  int(sa["index"]), tensors(c["owner"])["owner"],
                  f"fedgraph progap run={context.run_id} stage={stage}")
    local, out = release(cfg, pid, view, model, x,
                         remote_sigma=float(agg["remote-sigma"]) if "remote-sigma" in agg else None,
                         contributors=int(agg["remote-contributors"])
                         if "remote-contributors" in agg else None, secagg=secagg, generator=gen)
    client_state.put_tensors(context, "progap.pending", {"sums": local})
    shared = bool(agg.get("object-store", False)) and client_state.in_ray_worker()
    return reply(msg, partial_sums=bulk_record(out, slot if shared else None))
