"""The fedgraph ClientApp: routes each message type to the method's client half.

It holds no method logic: ``query.<method>`` and ``evaluate.<method>`` call
:mod:`fedgraph.methods`. The run config arrives inside each message from the server.
"""
from __future__ import annotations

import json
import zlib

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgraph.config import parse_run_config
from fedgraph.federation import client_view, tensors
from fedgraph.methods import ppgnn

app = ClientApp()


def _setup(msg: Message, context: Context):
    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    view = client_view(cfg, pid, cfg.budgets, cfg.shares)
    return cfg, pid, view


@app.query("ppgnn")
def ppgnn_query(msg: Message, context: Context) -> Message:
    """Answer a PPM request with this client's users' reports."""
    cfg, pid, view = _setup(msg, context)
    # Simulation: seeded per client for reproducibility. Deployed clients use fresh randomness.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{cfg.seed}:{pid}:ppgnn".encode()))
    report = ppgnn.client_report(view.graph, cfg, view.feature_domain,
                                 view.statistics["num_classes"], gen)
    meta = ConfigRecord({"statistics": json.dumps(view.statistics)})
    return Message(RecordDict({"report": ArrayRecord(report), "meta": meta}), reply_to=msg)


@app.evaluate("ppgnn")
def ppgnn_evaluate(msg: Message, context: Context) -> Message:
    """Count correct predictions of this client's users per split."""
    _, _, view = _setup(msg, context)
    pred = tensors(msg.content["predictions"])
    counts = ppgnn.count_correct(view.graph, pred["node_ids"], pred["pred"])
    return Message(RecordDict({"metrics": MetricRecord(counts)}), reply_to=msg)
