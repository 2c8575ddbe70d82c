"""PrivGNN's handler (:func:`fedgraph.methods.privgnn.client.query_round`): one round of
answers to the server's queries, with the client's answered-query count as its state."""
from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from fedgraph.config import parse_run_config
from fedgraph.federation import privgnn_client_graph
from fedgraph.messaging import tensors
from fedgraph.randomness import client_generator

from .common import reply, verified_keys


def privgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods.privgnn import query_round

    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid, c, s = int(context.node_config["partition-id"]), msg.content, context.state
    # secure aggregation: the relayed key list, verified against this client's own identity
    # directory before anything is computed or released (refused: ValueError)
    private, keys = verified_keys(msg, context, cfg, "privgnn") or (None, None)
    answer, state = query_round(
        cfg, pid, tensors(c["queries"]), dict(s["privgnn"]) if "privgnn" in s else None,
        lambda purpose, data: client_generator(cfg, context, pid, purpose, data=data),
        private, keys, context.run_id, privgnn_client_graph(cfg, pid))
    s["privgnn"] = ConfigRecord(state)
    return reply(msg, answers=ArrayRecord({"answers": answer.answers}),
                 meta=ConfigRecord(answer.meta))
