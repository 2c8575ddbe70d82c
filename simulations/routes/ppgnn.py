"""PPGNN's handlers (:mod:`fedgraph.methods.ppgnn.client`): the client's perturbed report and
its count of correct predictions (test labels never leave it)."""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord

from fedgraph.messaging import array_record, tensors

from . import common
from .common import meta, reply, setup


def _authority(context: Context):
    """This client's own ledger: each level's budget (and ``every-user``'s, the smallest)
    from its own config (:func:`.common.own_config`), whatever the request asks."""
    own = common.own_config(context)
    budgets = {f"level-{t}": b for t, b in enumerate(own.budgets, start=1)}
    budgets["every-user"] = min(own.budgets)
    return common.authority(context, budgets, own.delta, "prv")


def ppgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn
    from fedgraph.methods.ppgnn.privacy import build_mechanism, reply_events

    cfg, pid, view, gen = setup(msg, context)
    auth = _authority(context)

    def records():
        report = ppgnn.client_query(
            view.graph, cfg, view.feature_domain, view.schema["num_classes"], gen
        )
        return {"report": array_record(report), "meta": meta(view, pid)}

    return common.release(
        msg, context, auth, "ppgnn", reply_events(cfg, build_mechanism(cfg)), records
    )


def ppgnn_evaluate(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn

    _, _, view, _ = setup(msg, context)
    pred = tensors(msg.content["predictions"])
    return reply(
        msg,
        metrics=MetricRecord(ppgnn.count_correct(view.graph, pred["node_ids"], pred["pred"])),
        ledger=common.ledger_record(_authority(context)),
    )
