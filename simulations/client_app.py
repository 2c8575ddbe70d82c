"""The fedgraph ClientApp: routes each message type to the method's client half.

It holds no method logic: ``query.<method>`` and ``evaluate.<method>`` call
:mod:`fedgraph.methods`. The run config arrives inside each message from the server.
"""
from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgraph.config import parse_run_config
from fedgraph.device import resolve_device, to_cpu
from fedgraph.federation import client_view, tensors, worker_info
from fedgraph.randomness import client_generator
from simulations import client_state, wakeups
from simulations.handler_times import handler_times

# flwr run: Flower's simulation process imports this module before its runtime starts the
# threads that move messages; patch them there (simulations.wakeups), not in Ray's workers.
wakeups.install(if_imported=True)

app = ClientApp(mods=[handler_times])  # off unless a benchmark asks (simulations.handler_times)


def _setup(msg: Message, context: Context):
    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    return cfg, pid, client_view(cfg, pid)


@app.query("ppgnn")
def ppgnn_query(msg: Message, context: Context) -> Message:
    """Answer a PPM request with this client's users' reports (on the CPU whatever ``device``:
    see :func:`fedgraph.methods.ppgnn.client_report`); the users' levels are drawn here."""
    from fedgraph.methods import ppgnn

    cfg, pid, view = _setup(msg, context)
    graph = ppgnn.with_client_levels(view.graph, cfg, client_generator(
        cfg, context, pid, "ppgnn:levels", data=view.graph))
    report = ppgnn.client_report(graph, cfg, view.feature_domain, view.schema["num_classes"],
                                 client_generator(cfg, context, pid, "ppgnn", data=view.graph))
    meta = ConfigRecord({"schema": json.dumps(view.schema), "worker": worker_info(pid)})
    return Message(RecordDict({"report": ArrayRecord(report), "meta": meta}), reply_to=msg)


@app.evaluate("ppgnn")
def ppgnn_evaluate(msg: Message, context: Context) -> Message:
    """Count correct predictions of this client's users per split."""
    from fedgraph.methods import ppgnn

    _, _, view = _setup(msg, context)
    pred = tensors(msg.content["predictions"])
    counts = ppgnn.count_correct(view.graph, pred["node_ids"], pred["pred"])
    return Message(RecordDict({"metrics": MetricRecord(counts)}), reply_to=msg)


# ---------------------------------------------------------------------------------- GAP
def _gap_plan(cfg, pid: int, view):
    from fedgraph.methods.gap_federated import privacy_plan

    return privacy_plan(cfg, cfg.client_epsilon(pid), int(view.graph.train_mask.sum()))


@app.query("gap_setup")
def gap_setup(msg: Message, context: Context) -> Message:
    """Calibrate this client's noise for its own epsilon target; report the plan and its ids."""
    cfg, pid, view = _setup(msg, context)
    g = view.graph
    # Counts of nodes are not protected by edge-level DP's unit, edge counts would be: none sent.
    plan = {**_gap_plan(cfg, pid, view).to_dict(), "partition_id": pid,
            "num_nodes": g.num_nodes, "num_train": int(g.train_mask.sum())}
    meta = ConfigRecord({"schema": json.dumps(view.schema), "plan": json.dumps(plan),
                         "worker": worker_info(pid)})
    return Message(RecordDict({"ids": ArrayRecord({"node_ids": g.node_ids}), "meta": meta}),
                   reply_to=msg)


def _advertise_key(msg: Message, context: Context, state_key: str) -> Message:
    """Secure aggregation's key advertisement: a fresh X25519 key pair; the private key stays
    in this client's state (``state_key``), the public key goes to the server
    (:mod:`fedgraph.secure_aggregation`)."""
    from fedgraph.secure_aggregation import generate_key_pair

    private, public = generate_key_pair()
    context.state[state_key] = ConfigRecord({"private-key": private})
    return Message(RecordDict({"secagg": ConfigRecord({"public-key": public})}), reply_to=msg)


@app.query("gap_keys")
def gap_keys(msg: Message, context: Context) -> Message:
    """GAP's secure aggregation of remote PMA rows: advertise a public key."""
    return _advertise_key(msg, context, "gap.secagg")


@app.query("privgnn_keys")
def privgnn_keys(msg: Message, context: Context) -> Message:
    """PrivGNN's secure aggregation of ensemble histograms: advertise a public key."""
    return _advertise_key(msg, context, "privgnn.secagg")


def _gap_state_key(graph: str) -> str:
    """Key of the private hops of a PMA run on ``graph`` (``all``/``train``: the classifier's
    training inputs; ``test``: the held-out graph's, inductive inference), kept by
    :mod:`simulations.client_state`; PMA's hop-by-hop state is ``context.state[key + ".pma"]``
    until the last hop."""
    return "gap.hops.test" if graph == "test" else "gap.hops"


def _gap_inputs(cfg, view, context: Context, phase: str, arrays=None, heldout: bool = False):
    """Model and inputs of a training phase, on this client's device (``device``: the GPU Ray
    assigned, else the CPU): the encoder on raw features, the classifier on the stacked private
    hops kept in ``context.state`` (the MLP baseline: raw features). ``arrays``: an
    ``ArrayRecord`` of weights to load (empty or ``None``: fresh weights). ``heldout``
    (inductive inference): the test nodes' rows come from the held-out graph's PMA."""
    from fedgraph.methods.gap_federated import build_classifier, build_encoder

    g, s = view.graph, view.schema
    dev = resolve_device(cfg.device)
    if phase == "gap.encoder":
        model, x = build_encoder(cfg, s["num_features"], s["num_classes"]), g.x
    else:
        model = build_classifier(cfg, s["num_features"], s["num_classes"])
        if cfg.variant == "mlp":
            x = g.x.unsqueeze(1)
        else:
            x = _stacked_hops(context, _gap_state_key("all"), cfg.hops)
            if heldout and cfg.inference == "inductive":
                x_test = _stacked_hops(context, _gap_state_key("test"), cfg.hops)
                x = torch.where(g.test_mask.view(-1, 1, 1), x_test.to(x.dtype), x)
    if arrays is not None and len(arrays):
        model.load_state_dict(arrays.to_torch_state_dict())
    return model.to(dev), x.to(dev)


def _stacked_hops(context: Context, key: str, num_hops: int) -> torch.Tensor:
    """The private hops 0..K kept under ``key`` (:func:`gap_pma`'s last hop), ``[n, K + 1, e]``
    (shared between messages: not to be written in place)."""
    hops = client_state.get_tensors(context, key)["hops"]
    if hops.size(1) != num_hops + 1:
        raise ValueError(f"client state {key!r} holds {hops.size(1) - 1} hops, the run config "
                         f"says hops = {num_hops}")
    return hops


def _on(x, tensor):
    """``tensor`` on ``x``'s device."""
    return tensor.to(x.device)


@app.train()
def gap_train(msg: Message, context: Context) -> Message:
    """A FedAvg round of GAP's encoder or classifier (node level: DP-SGD through Opacus)."""
    from fedgraph.methods.gap import local_train

    cfg, pid, view = _setup(msg, context)
    phase = str(msg.content["config"]["phase"])
    model, x = _gap_inputs(cfg, view, context, phase, msg.content["arrays"])
    rnd = int(msg.content["config"]["server-round"])
    if cfg.schedule == "fedsgd":  # edge level (config): the gradient, weighted by train nodes
        from fedgraph.methods.gap import local_gradient

        config = msg.content["config"]
        # the received weights' validation, for the previous round (strategies.fedavg.StrictFedSGD)
        val = {}
        if "evaluate" in config and config["evaluate"]:
            if cfg.level != "edge":  # (the config allows FedSGD at edge level only)
                raise ValueError("level: node: the validation labels are private")
            val = dict(_val_metrics(model, x, view))
            val["val-examples"] = val.pop("num-examples")
        n, loss, grads = local_gradient(model, x, _on(x, view.graph.y),
                                        _on(x, view.graph.train_mask))
        grads.update(model.named_buffers())  # batch norm: running statistics after the pass
        return Message(RecordDict({"arrays": ArrayRecord(to_cpu(grads)), "metrics": MetricRecord(
            {"num-examples": n, "train-loss": float(loss) if n else 0.0, **val})}), reply_to=msg)
    dp = _gap_plan(cfg, pid, view).dpsgd(cfg)  # node level: DP-SGD's schedule
    n, loss = local_train(model, x, _on(x, view.graph.y), _on(x, view.graph.train_mask),
                          cfg.local_epochs,
                          cfg.dpsgd_batch_size if dp else (cfg.batch_size or None), cfg.lr, dp,
                          generator=client_generator(cfg, context, pid, f"gap:{phase}:{rnd}",
                                                     data=view.graph),
                          num_public=int(view.graph.train_mask.sum()))  # _gap_plan's count
    # Node level: the count and the loss of the private nodes would leave unnoised: uniform
    # FedAvg weights, no loss (tests/test_client_releases.py lists what may leave).
    metrics = MetricRecord({"num-examples": max(n, 1), "train-loss": float(loss)}
                           if cfg.level == "edge" else {"num-examples": 1})
    return Message(RecordDict({"arrays": ArrayRecord(to_cpu(model.state_dict())),
                               "metrics": metrics}), reply_to=msg)


@app.query("gap_pma")
def gap_pma(msg: Message, context: Context) -> Message:
    """PMA hop k: finish hop k-1 with the partial sums received, then release this client's
    noisy partial sums of hop k for remote nodes (k = K+1: finish only). The ``pma`` record's
    ``graph`` selects the edge set (``all``: the whole graph; inductive inference: ``train``,
    the training graph, or ``test``, the held-out graph, see
    :mod:`fedgraph.methods.gap_federated`); each run draws its own noise."""
    from fedgraph.methods.gap_federated import (check_remote_sigma, client_edges, graph_nodes,
                                                masked_release, pma_finish, pma_partial_sums)

    cfg, pid, view = _setup(msg, context)
    g = view.graph
    k = int(msg.content["pma"]["hop"])
    graph = str(msg.content["pma"]["graph"]) if "graph" in msg.content["pma"] else "all"
    in_graph = graph_nodes(view.test_mask, graph)
    tag = ":test" if graph == "test" else ""  # fresh noise for the held-out run
    key = _gap_state_key(graph)
    pma_key = key + ".pma"
    dev = resolve_device(cfg.device)
    if k == 1:
        model, x = _gap_inputs(cfg, view, context, "gap.encoder", msg.content["encoder"])
        state = {"hop0": model.embed(x)}
    else:
        state = tensors(context.state[pma_key])
        inc = tensors(msg.content["incoming"])
        state[f"hop{k - 1}"] = pma_finish(state.pop("local_sums").to(dev), g.node_ids,
                                          inc["ids"], inc["sums"])
    out = {"ids": torch.zeros(0, dtype=torch.long), "sums": torch.zeros(0, cfg.encoder_dim)}
    if k <= cfg.hops:
        plan = _gap_plan(cfg, pid, view)
        degree_gen = client_generator(cfg, context, pid, f"gap:degree{tag}", data=g)
        local, boundary = client_edges(g, cfg, degree_gen, in_graph)
        # Release a row for every node of the graph held elsewhere (ids independent of the
        # edges: fixed by who holds which node and by the public split).
        others = torch.ones(view.schema["num_nodes"], dtype=torch.bool)
        others[g.node_ids] = False
        if in_graph is not None:
            others &= in_graph
        remote = others.nonzero().flatten() if cfg.cross_client_edges else others.nonzero()[:0].flatten()
        remote_sigma = None
        if "remote-sigma" in msg.content["pma"]:  # fedgraph.methods.gap_federated.remote_noise
            remote_sigma = float(msg.content["pma"]["remote-sigma"])
            check_remote_sigma(remote_sigma, plan.sigma,
                               int(msg.content["pma"]["remote-contributors"]))
        local_sums, ids, sums = pma_partial_sums(state[f"hop{k - 1}"].to(dev), local, boundary,
                                                 plan.sigma,
                                                 client_generator(cfg, context, pid,
                                                                  f"gap:pma{k}{tag}", data=g),
                                                 remote_ids=remote, remote_sigma=remote_sigma,
                                                 remote_norm=plan.remote_norm)
        state["local_sums"] = local_sums
        out = {"ids": ids, "sums": sums}
        if cfg.secure_aggregation and ids.numel():  # only masked rows leave
            if "secagg" not in msg.content:  # (fedgraph.secure_aggregation)
                raise ValueError("secure-aggregation = true but the server sent no public keys: "
                                 "refusing to release unmasked rows")
            sa = msg.content["secagg"]
            out = masked_release(ids, sums, bytes(context.state["gap.secagg"]["private-key"]),
                                 list(sa["public-keys"]), int(sa["index"]),
                                 tensors(msg.content["owner"])["owner"],
                                 f"fedgraph gap pma run={context.run_id} graph={graph} hop={k}")
    if k <= cfg.hops:
        context.state[pma_key] = ArrayRecord(to_cpu(state))
    else:  # the last hop: the classifier's inputs, read in every classifier round
        del context.state[pma_key]
        client_state.put_tensors(context, key, {"hops": torch.stack(
            [state[f"hop{j}"].cpu() for j in range(cfg.hops + 1)], dim=1)})
    return Message(RecordDict({"partial_sums": ArrayRecord(to_cpu(out))}), reply_to=msg)


@app.evaluate()
def gap_evaluate_round(msg: Message, context: Context) -> Message:
    """FedAvg evaluation round: validation accuracy of the aggregated encoder (its
    pre-training head, on the raw features) or classifier (the config's ``phase``)."""
    cfg, _, view = _setup(msg, context)
    if cfg.level == "node":
        raise ValueError("level: node: the validation labels are private, validation accuracy "
                         "is not released (the strategy does not select rounds at node level)")
    config = msg.content["config"]
    phase = str(config["phase"]) if "phase" in config else "gap.classifier"
    if phase not in ("gap.encoder", "gap.classifier"):
        raise ValueError(f"unknown GAP phase {phase!r}")
    model, x = _gap_inputs(cfg, view, context, phase, msg.content["arrays"])
    return Message(RecordDict({"metrics": _val_metrics(model, x, view)}), reply_to=msg)


def _val_metrics(model, x, view) -> MetricRecord:
    """Validation accuracy and loss of ``model`` on this client's validation nodes, with their
    exact count as weight (0: this client has none); the loss breaks ties
    (:func:`strategies.fedavg.selection_key`)."""
    from fedgraph.methods.gap import evaluate

    res = evaluate(model, x, _on(x, view.graph.y), _on(x, view.graph.val_mask))
    acc, loss = (res["accuracy"], res["loss"]) if res["total"] else (0.0, 0.0)
    return MetricRecord({"num-examples": res["total"], "val-accuracy": float(acc),
                         "val-loss": float(loss)})


@app.evaluate("gap")
def gap_evaluate(msg: Message, context: Context) -> Message:
    """Final evaluation: correct predictions per split on this client (inductive inference:
    the test nodes on the held-out graph's aggregates)."""
    from fedgraph.methods.gap import evaluate

    cfg, _, view = _setup(msg, context)
    model, x = _gap_inputs(cfg, view, context, "gap.classifier", msg.content["arrays"],
                           heldout=True)
    counts = {}
    for split in ("train", "val", "test"):
        r = evaluate(model, x, _on(x, view.graph.y), _on(x, getattr(view.graph, f"{split}_mask")))
        counts[f"{split}_correct"], counts[f"{split}_total"] = r["correct"], r["total"]
    return Message(RecordDict({"metrics": MetricRecord(counts)}), reply_to=msg)


# ---------------------------------------------------------------------------------- PrivGNN
@app.query("privgnn")
def privgnn_query(msg: Message, context: Context) -> Message:
    """Answer the server's queries with Laplace-noised teacher posteriors, as many as this
    client's epsilon budget still allows (the rest refused); only the noisy answers and
    counts fixed by public parameters leave the client. The teachers run on this client's
    device (``device``: the GPU Ray assigned, else the CPU); the draws come from the client's
    own generator (:func:`fedgraph.randomness.client_generator`) and the answers come back as
    CPU tensors."""
    from fedgraph.methods.privgnn_federated import SecAggKeys, client_answer, client_graph

    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    state = context.state["privgnn"] if "privgnn" in context.state else {"answered": 0, "rounds": 0}
    before, rnd = int(state["answered"]), int(state["rounds"])
    gen = client_generator(cfg, context, pid, f"privgnn:{rnd}",
                           data=client_graph(cfg, pid)[0])
    keys = None
    if "secagg" in msg.content and "privgnn.secagg" in context.state:
        sa = msg.content["secagg"]
        keys = SecAggKeys(bytes(context.state["privgnn.secagg"]["private-key"]),
                          list(sa["public-keys"]), int(sa["index"]),
                          f"fedgraph privgnn ensemble run={context.run_id} round={rnd}")
    reply = client_answer(cfg, pid, tensors(msg.content["queries"]), before, gen, keys)
    context.state["privgnn"] = ConfigRecord({"answered": reply.meta["answered_total"],
                                             "rounds": rnd + 1})
    return Message(RecordDict({"answers": ArrayRecord({"answers": reply.answers}),
                               "meta": ConfigRecord(reply.meta)}), reply_to=msg)
