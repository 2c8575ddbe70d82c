"""The fedgraph ClientApp: decode each message, call the method's client half, encode the reply.

No method logic lives here: GAP's steps are :mod:`fedgraph.methods.gap.client`, PPGNN's
:mod:`fedgraph.methods.ppgnn.client`, PrivGNN's :mod:`fedgraph.methods.privgnn.client`. The run
config arrives inside each message; every draw comes from the client's own generator
(:func:`fedgraph.randomness.client_generator`, keyed by the client's data too). The message
types and their records: ``docs/extending.md``.
"""
from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgraph._lazy import LazyModule
from fedgraph.config import parse_run_config
from fedgraph.federation import client_view
from fedgraph.messaging import tensors, worker_info
from fedgraph.randomness import client_generator
from simulations import client_state, wakeups
from simulations.handler_times import handler_times

wakeups.install(if_imported=True)  # flwr run: patch Flower's message threads here (wakeups)
app = ClientApp(mods=[handler_times])  # off unless a benchmark asks (simulations.handler_times)
gap = LazyModule("fedgraph.methods.gap.client")  # GAP's client half, at its first message


def _setup(msg: Message, context: Context):
    """``(run config, partition id, ClientView, generator(purpose))`` of this message."""
    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    view = client_view(cfg, pid)
    return cfg, pid, view, lambda p: client_generator(cfg, context, pid, p, data=view.graph)


def _reply(msg: Message, **records) -> Message:
    return Message(RecordDict(records), reply_to=msg)


def _meta(view, pid: int, **extra) -> ConfigRecord:
    return ConfigRecord({"schema": json.dumps(view.schema), "worker": worker_info(pid), **extra})


@app.query("ppgnn")
def ppgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn

    cfg, pid, view, gen = _setup(msg, context)
    report = ppgnn.client_query(view.graph, cfg, view.feature_domain,
                                view.schema["num_classes"], gen)
    return _reply(msg, report=ArrayRecord(report), meta=_meta(view, pid))


@app.evaluate("ppgnn")
def ppgnn_evaluate(msg: Message, context: Context) -> Message:
    from fedgraph.methods import ppgnn

    _, _, view, _ = _setup(msg, context)
    pred = tensors(msg.content["predictions"])
    return _reply(msg, metrics=MetricRecord(
        ppgnn.count_correct(view.graph, pred["node_ids"], pred["pred"])))


@app.query("gap_setup")
def gap_setup(msg: Message, context: Context) -> Message:
    cfg, pid, view, _ = _setup(msg, context)
    ids, plan = gap.setup(cfg, pid, view)
    return _reply(msg, ids=ArrayRecord({"node_ids": ids}),
                  meta=_meta(view, pid, plan=json.dumps(plan)))


@app.query("gap_keys")
@app.query("privgnn_keys")
def advertise_key(msg: Message, context: Context) -> Message:
    """Secure aggregation: a fresh X25519 key pair; the private key stays in this client's
    state, the public key is sent (:mod:`fedgraph.secure_aggregation`)."""
    from fedgraph.secure_aggregation import generate_key_pair

    private, public = generate_key_pair()
    key = "gap.secagg" if msg.metadata.message_type == "query.gap_keys" else "privgnn.secagg"
    context.state[key] = ConfigRecord({"private-key": private})
    return _reply(msg, secagg=ConfigRecord({"public-key": public}))


gap_keys = privgnn_keys = advertise_key  # the handlers by their message names


def _kept(context: Context):
    """A reader of the tensors this client keeps between messages (:mod:`.client_state`)."""
    return lambda key: client_state.get_tensors(context, key)


@app.train()
def gap_train(msg: Message, context: Context) -> Message:
    cfg, pid, view, gen = _setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])  # empty: fresh weights
    arrays, metrics = gap.train(cfg, pid, view, str(c["phase"]), weights, _kept(context),
                                server_round=int(c["server-round"]),
                                validate=bool(c.get("evaluate", False)), generator=gen)
    return _reply(msg, arrays=ArrayRecord(arrays), metrics=MetricRecord(metrics))


@app.query("gap_pma")
def gap_pma(msg: Message, context: Context) -> Message:
    cfg, pid, view, gen = _setup(msg, context)
    c = msg.content
    private = bytes(context.state["gap.secagg"]["private-key"]) if "secagg" in c else None
    req = gap.pma_request(c, private, f"fedgraph gap pma run={context.run_id}")
    key = gap.pma_state_key(req.graph)
    kept = tensors(context.state[key]) if key in context.state else None
    step = gap.pma_step(cfg, pid, view, req, kept, gen)
    if step.pending is not None:
        context.state[key] = ArrayRecord(step.pending)
    else:  # the last hop: the PMA state goes, the classifier's inputs stay
        del context.state[key]
        client_state.put_tensors(context, gap.hops_key(req.graph), {"hops": step.hops})
    return _reply(msg, partial_sums=ArrayRecord(step.release))


@app.evaluate()
def gap_evaluate_round(msg: Message, context: Context) -> Message:
    cfg, _, view, _ = _setup(msg, context)
    c, weights = msg.content["config"], tensors(msg.content["arrays"])
    return _reply(msg, metrics=MetricRecord(
        gap.validate(cfg, view, c.get("phase"), weights, _kept(context))))


@app.evaluate("gap")
def gap_evaluate(msg: Message, context: Context) -> Message:
    cfg, _, view, _ = _setup(msg, context)
    counts = gap.final_counts(cfg, view, tensors(msg.content["arrays"]), _kept(context))
    return _reply(msg, metrics=MetricRecord(counts))


@app.query("privgnn")
def privgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods.privgnn import query_round

    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid, c, s = int(context.node_config["partition-id"]), msg.content, context.state
    reply, state = query_round(
        cfg, pid, tensors(c["queries"]), dict(s["privgnn"]) if "privgnn" in s else None,
        lambda purpose, data: client_generator(cfg, context, pid, purpose, data=data),
        s["privgnn.secagg"]["private-key"] if "privgnn.secagg" in s else None,
        dict(c["secagg"]) if "secagg" in c else None, context.run_id)
    s["privgnn"] = ConfigRecord(state)
    return _reply(msg, answers=ArrayRecord({"answers": reply.answers}),
                  meta=ConfigRecord(reply.meta))
