"""PrivGNN's handler (:func:`fedgraph.methods.privgnn.client.query_round`): one round of
answers to the server's queries, with the client's answered-query count as its state."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from fedgraph.federation import privgnn_client_graph
from fedgraph.messaging import tensors
from fedgraph.randomness import client_generator

from . import common


def privgnn_query(msg: Message, context: Context) -> Message:
    """``query.privgnn``: one round of answers (:func:`fedgraph.methods.privgnn.query_round`),
    charged to the client's own ledger before it leaves (:func:`.common.release`; its own
    target, whatever the request asks); every round is a purpose of its own (``privgnn:<round>``,
    the client's count), so the server cannot ask for one twice."""
    from fedgraph.methods.privgnn import query_round
    from fedgraph.methods.privgnn.privacy import accountant, reply_events

    cfg, pid, _, _ = common.setup(msg, context, view=False)
    c, s = msg.content, context.state
    inputs = str(s[common.TRANSCRIPT_STATE]["digest"])
    own = common.own_config(context)
    auth = common.authority(
        context, {f"client-{pid}": own.client_epsilon(pid)}, own.delta, accountant(own)
    )
    # secure aggregation: the relayed key list, verified against this client's own identity
    # directory before anything is computed or released (refused: ValueError)
    private, keys = common.verified_keys(msg, context, cfg, "privgnn") or (None, None)
    answer, state = query_round(
        cfg,
        pid,
        tensors(c["queries"]),
        dict(s["privgnn"]) if "privgnn" in s else None,
        lambda purpose, data: client_generator(
            cfg, context, pid, purpose, data=data, inputs=inputs
        ),
        private,
        keys,
        context.run_id,
        privgnn_client_graph(cfg, pid),
    )
    charges = [(f"client-{pid}", r, e) for r, e in reply_events(cfg, int(answer.meta["answered"]))]

    def records():
        s["privgnn"] = ConfigRecord(state)
        return {
            "answers": ArrayRecord({"answers": answer.answers}),
            "meta": ConfigRecord(answer.meta),
        }

    return common.release(
        msg, context, auth, f"privgnn:{int(state['rounds']) - 1}", charges, records
    )
