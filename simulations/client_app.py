"""The fedgraph ClientApp: decode each message, call the method's client half, encode the reply.

No method logic lives here: GAP's steps are :mod:`fedgraph.methods.gap_client`, PPGNN's
:mod:`fedgraph.methods.ppgnn`, PrivGNN's :mod:`fedgraph.methods.privgnn_federated`. The run
config arrives inside each message; every draw comes from the client's own generator
(:func:`fedgraph.randomness.client_generator`, keyed by the client's data too). The message
types and their records: ``docs/extending.md``.
"""
from __future__ import annotations

import json

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgraph.config import parse_run_config
from fedgraph.federation import client_view, tensors, worker_info
from fedgraph.randomness import client_generator
from simulations import client_state, wakeups
from simulations.handler_times import handler_times

wakeups.install(if_imported=True)  # flwr run: patch Flower's message threads here (wakeups)
app = ClientApp(mods=[handler_times])  # off unless a benchmark asks (simulations.handler_times)


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
    graph = ppgnn.with_client_levels(view.graph, cfg, gen("ppgnn:levels"))
    report = ppgnn.client_report(graph, cfg, view.feature_domain, view.schema["num_classes"],
                                 gen("ppgnn"))
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
    from fedgraph.methods import gap_client

    cfg, pid, view, _ = _setup(msg, context)
    ids, plan = gap_client.setup(cfg, pid, view)
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


def _gap_model(cfg, view, context, phase: str, arrays, heldout: bool = False):
    """GAP's model and inputs for ``phase``; the private hops come from the client state."""
    from fedgraph.methods.gap_client import hops_key, inputs

    def hops(graph):
        return client_state.get_tensors(context, hops_key(graph))["hops"]

    weights = arrays.to_torch_state_dict() if len(arrays) else None
    if phase == "gap.encoder" or cfg.variant == "mlp":
        return inputs(cfg, view, phase, weights)
    held = hops("test") if heldout and cfg.inference == "inductive" else None
    return inputs(cfg, view, phase, weights, hops("all"), held)


@app.train()
def gap_train(msg: Message, context: Context) -> Message:
    from fedgraph.methods import gap_client

    cfg, pid, view, gen = _setup(msg, context)
    config = msg.content["config"]
    phase = str(config["phase"])
    model, x = _gap_model(cfg, view, context, phase, msg.content["arrays"])
    arrays, metrics = gap_client.train_round(
        cfg, pid, view, model, x, validate=bool(config.get("evaluate", False)),
        generator=gen(f"gap:{phase}:{int(config['server-round'])}"))
    return _reply(msg, arrays=ArrayRecord(arrays), metrics=MetricRecord(metrics))


@app.query("gap_pma")
def gap_pma(msg: Message, context: Context) -> Message:
    from fedgraph.methods.gap_client import PMAState, hops_key, pma_hop, pma_request

    cfg, pid, view, gen = _setup(msg, context)
    c = msg.content
    private = bytes(context.state["gap.secagg"]["private-key"]) if "secagg" in c else None
    req = pma_request(c, private, f"fedgraph gap pma run={context.run_id}")
    key = hops_key(req.graph) + ".pma"
    state = PMAState(tensors(context.state[key])) if req.hop > 1 else None
    state, release = pma_hop(cfg, pid, view, req, state, gen)
    if req.hop <= cfg.hops:
        context.state[key] = ArrayRecord(state.tensors)
    else:  # the last hop: the classifier's inputs, read in every classifier round
        del context.state[key]
        client_state.put_tensors(context, hops_key(req.graph), {"hops": state.stacked(cfg.hops)})
    return _reply(msg, partial_sums=ArrayRecord(release))


@app.evaluate()
def gap_evaluate_round(msg: Message, context: Context) -> Message:
    from fedgraph.methods import gap_client

    cfg, _, view, _ = _setup(msg, context)
    phase = gap_client.validation_phase(cfg, msg.content["config"].get("phase"))
    model, x = _gap_model(cfg, view, context, phase, msg.content["arrays"])
    return _reply(msg, metrics=MetricRecord(gap_client.validation(model, x, view)))


@app.evaluate("gap")
def gap_evaluate(msg: Message, context: Context) -> Message:
    from fedgraph.methods import gap_client

    cfg, _, view, _ = _setup(msg, context)
    model, x = _gap_model(cfg, view, context, "gap.classifier", msg.content["arrays"], True)
    return _reply(msg, metrics=MetricRecord(gap_client.evaluate_counts(model, x, view)))


@app.query("privgnn")
def privgnn_query(msg: Message, context: Context) -> Message:
    from fedgraph.methods.privgnn_federated import SecAggKeys, client_answer, client_graph

    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    state = context.state["privgnn"] if "privgnn" in context.state else {"answered": 0, "rounds": 0}
    before, rnd = int(state["answered"]), int(state["rounds"])
    gen = client_generator(cfg, context, pid, f"privgnn:{rnd}", data=client_graph(cfg, pid)[0])
    keys = None
    if "secagg" in msg.content and "privgnn.secagg" in context.state:
        sa = msg.content["secagg"]
        keys = SecAggKeys(bytes(context.state["privgnn.secagg"]["private-key"]),
                          list(sa["public-keys"]), int(sa["index"]),
                          f"fedgraph privgnn ensemble run={context.run_id} round={rnd}")
    reply = client_answer(cfg, pid, tensors(msg.content["queries"]), before, gen, keys)
    context.state["privgnn"] = ConfigRecord({"answered": reply.meta["answered_total"],
                                             "rounds": rnd + 1})
    return _reply(msg, answers=ArrayRecord({"answers": reply.answers}),
                  meta=ConfigRecord(reply.meta))



from simulations.progap_routes import register as _register_progap  # noqa: E402
_register_progap(app, _setup, _reply, _meta)  # ProGAP's handlers, decode / call / encode
