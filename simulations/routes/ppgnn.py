"""PPGNN's handlers (:mod:`fedgraph.methods.ppgnn.client`): the client's perturbed report and
its count of correct predictions (test labels never leave it)."""
from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord

from fedgraph.messaging import array_record, tensors

from .common import meta, reply, setup


def ppgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn

    cfg, pid, view, gen = setup(msg, context)
    report = ppgnn.client_query(view.graph, cfg, view.feature_domain,
                                view.schema["num_classes"], gen)
    return reply(msg, report=array_record(report), meta=meta(view, pid))


def ppgnn_evaluate(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn

    _, _, view, _ = setup(msg, context)
    pred = tensors(msg.content["predictions"])
    return reply(msg, metrics=MetricRecord(
        ppgnn.count_correct(view.graph, pred["node_ids"], pred["pred"])))
