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

from . import common
from .common import meta, reply, setup


def _stage(msg: Message, context: Context, stage: int):
    """``(cfg, pid, view, gen, model, x)``: ProGAP's model at ``stage`` with the received
    weights, on this client's cached aggregations of stages ``1..stage``."""
    from fedgraph.methods.progap.client import stage_model

    cfg, pid, view, gen = setup(msg, context)
    cache = client_state.get_tensors(context, "progap.cache") if stage else {}
    model, x = stage_model(
        cfg,
        view,
        stage,
        msg.content["arrays"].to_torch_state_dict(),
        [cache[f"x{i}"] for i in range(1, stage + 1) if f"x{i}" in cache],
    )
    return cfg, pid, view, gen, model, x


def _authority(cfg, pid: int, view, context: Context):
    """``(authority, plan)``: this client's own ledger (its own target, whatever the request
    asks; :func:`.common.authority`) and its plan, checked against that budget once."""
    from fedgraph.methods.progap.client import client_plan
    from fedgraph.methods.progap.privacy import plan_events

    own = common.own_config(context)
    plan = client_plan(cfg, pid, view).to_dict()
    subject = f"client-{pid}"
    auth = common.authority(context, {subject: own.client_epsilon(pid)}, own.delta, own.accountant)
    if subject not in auth.allowance:
        auth.allow(subject, [e for _, e in plan_events(plan)])
    return auth, plan


def progap_setup(msg: Message, context: Context) -> Message:
    from fedgraph.methods.progap.client import setup as client_setup

    cfg, pid, view, _ = setup(msg, context)
    ids, plan = client_setup(cfg, pid, view)
    auth, _ = _authority(cfg, pid, view, context)
    common.save(context, auth)
    return reply(
        msg, ids=ArrayRecord({"node_ids": ids}), meta=meta(view, pid, plan=json.dumps(plan))
    )


def progap_train(msg: Message, context: Context) -> Message:
    """``train.progap_stage``: a round of the stage's Flower strategy (its config record holds
    the run config, ``stage``, Flower's ``server-round`` and, FedSGD, ``evaluate``)."""
    from fedgraph.methods.progap.client import admit_round, train_round
    from fedgraph.methods.progap.privacy import reply_events

    c = msg.content["config"]
    stage, rnd = int(c["stage"]), int(c["server-round"])
    cfg, pid, view, gen, model, x = _stage(msg, context, stage)  # reads, releases nothing
    last = dict(context.state["progap.rounds"]) if "progap.rounds" in context.state else {}
    admitted = admit_round(cfg, stage, rnd, last)
    auth, plan = _authority(cfg, pid, view, context)
    charges = (
        [(f"client-{pid}", r, e) for r, e in reply_events(plan, "train", cfg.epochs)]
        if cfg.level == "node"
        else []
    )

    def records():
        context.state["progap.rounds"] = ConfigRecord(admitted)
        arrays, metrics = train_round(
            cfg,
            pid,
            view,
            model,
            x,
            gen(f"progap:train:{stage}:{rnd}"),
            validate=bool(c.get("evaluate", False)),
            proximal_mu=float(c.get("proximal-mu", 0.0)),
        )
        return {"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)}

    return common.release(
        msg, context, auth, f"progap:train:{stage}:{rnd}", charges, records, with_ledger=False
    )


def progap_validate(msg: Message, context: Context) -> Message:
    """``evaluate.progap_stage``: the validation of a stage's last weights (edge level)."""
    from fedgraph.methods.progap.client import validation

    cfg, _, view, _, model, x = _stage(msg, context, int(msg.content["config"]["stage"]))
    return reply(msg, metrics=MetricRecord(validation(cfg, model, x, view)))


def progap_eval(msg: Message, context: Context) -> Message:
    from fedgraph.methods.progap.client import counts

    cfg, pid, view, _, model, x = _stage(msg, context, int(msg.content["stage"]["stage"]))
    auth, _ = _authority(cfg, pid, view, context)
    return reply(
        msg, metrics=MetricRecord(counts(model, x, view)), ledger=common.ledger_record(auth)
    )


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
        cache[f"x{stage}"] = finish(
            client_state.get_tensors(context, "progap.pending")["sums"],
            view.graph.node_ids,
            inc["ids"],
            inc["sums"],
        )
        client_state.put_tensors(context, "progap.cache", cache)
        client_state.drop(context, "progap.pending")
        return reply(msg, done=ConfigRecord({"stage": stage}))
    from fedgraph.methods.progap.privacy import reply_events

    cfg, pid, view, gen, model, x = _stage(msg, context, stage - 1)
    auth, plan = _authority(cfg, pid, view, context)
    charges = [(f"client-{pid}", r, e) for r, e in reply_events(plan, "aggregation")]
    secagg = None
    if "secagg" in c:  # the relayed key list, verified against this client's own identity
        private, keys = common.verified_keys(msg, context, cfg, "progap")  # directory first
        secagg = (
            private,
            keys,
            tensors(c["owner"])["owner"],
            f"fedgraph progap run={context.run_id} stage={stage}",
        )

    def records():
        local, out = release(
            cfg,
            pid,
            view,
            model,
            x,
            remote_sigma=float(agg["remote-sigma"]) if "remote-sigma" in agg else None,
            contributors=int(agg["remote-contributors"]) if "remote-contributors" in agg else None,
            secagg=secagg,
            generator=gen,
        )
        client_state.put_tensors(context, "progap.pending", {"sums": local})
        shared = bool(agg.get("object-store", False)) and client_state.in_ray_worker()
        return {"partial_sums": bulk_record(out, slot if shared else None)}

    return common.release(msg, context, auth, f"progap:aggregation{stage}", charges, records)
