"""What every method's handlers share: the message's run config, client view and generators;
the reply; the reply's ``meta`` record; the tensors a client keeps between messages; and the
secure-aggregation key exchange."""
from __future__ import annotations

import json

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedgraph.config import parse_run_config
from fedgraph.federation import client_view
from fedgraph.messaging import worker_info
from fedgraph.randomness import client_generator
from fedgraph.simulations import client_state


def setup(msg: Message, context: Context):
    """``(run config, partition id, ClientView, generator(purpose))`` of this message."""
    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    view = client_view(cfg, pid)
    return cfg, pid, view, lambda p: client_generator(cfg, context, pid, p, data=view.graph)


def reply(msg: Message, **records) -> Message:
    return Message(RecordDict(records), reply_to=msg)


def meta(view, pid: int, **extra) -> ConfigRecord:
    """The public part of a setup reply: the dataset's schema and the worker's facts."""
    return ConfigRecord({"schema": json.dumps(view.schema), "worker": worker_info(pid), **extra})


def kept(context: Context):
    """A reader of the tensors this client keeps between messages (:mod:`.client_state`)."""
    return lambda key: client_state.get_tensors(context, key)


def advertise_key(msg: Message, context: Context) -> Message:
    """Secure aggregation (``query.<method>_keys``): a fresh X25519 key pair; the private key
    stays in this client's state (``<method>.secagg``), the public key is sent
    (:mod:`fedgraph.secure_aggregation`)."""
    from fedgraph.secure_aggregation import generate_key_pair

    private, public = generate_key_pair()
    method = msg.metadata.message_type.removeprefix("query.").removesuffix("_keys")
    context.state[f"{method}.secagg"] = ConfigRecord({"private-key": private})
    return reply(msg, secagg=ConfigRecord({"public-key": public}))
