"""What every method's handlers share: the message's run config, client view and generators;
the reply; the reply's ``meta`` record; the tensors a client keeps between messages; and the
secure-aggregation key exchange."""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, Context, Message

from fedgraph.federation import client_view
from fedgraph.messaging import worker_info
from fedgraph.randomness import client_generator
from fedgraph.simulations import client_guard as guard
from fedgraph.simulations import client_state
from fedgraph.simulations.client_guard import (  # noqa: F401 - the routes' one import
    AUTHORITY_STATE,
    OWN_CONFIG_ENV,
    RUN_FIXED_PURPOSES,
    TRANSCRIPT_STATE,
    _parsed,
    authority,
    ledger_record,
    own_config,
    release,
    reply,
    save,
)


def setup(msg: Message, context: Context, view: bool = True):
    """``(run config, partition id, ClientView, generator(purpose))`` of this message.

    The run config the message carries must be the client's own (:func:`own_config`) but for
    asking less privacy loss (:func:`fedgraph.client_authority.check_asks_no_more`); every
    release's generator binds the client's data and its transcript of the run (every request
    received, this one included), but for :data:`RUN_FIXED_PURPOSES` (data only).
    ``view=False``: no client view and no generator (``None``, ``None``; a method with a view
    of its own).

    Raises:
        fedgraph.client_authority.ReleaseRefused: the request asks for more privacy loss than
            the client's own config, or the client has none.
    """
    cfg = _parsed(str(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    guard.check_own(cfg, own_config(context), pid)
    _, inputs = guard.advance(msg, context)
    if not view:
        return cfg, pid, None, None
    view = client_view(cfg, pid)

    def generator(purpose: str):
        bound = "" if purpose in RUN_FIXED_PURPOSES else inputs
        return client_generator(cfg, context, pid, purpose, data=view.graph, inputs=bound)

    return cfg, pid, view, generator


def meta(view, pid: int, **extra) -> ConfigRecord:
    """The public part of a setup reply: the dataset's schema and the worker's facts."""
    return ConfigRecord({"schema": json.dumps(view.schema), "worker": worker_info(pid), **extra})


def kept(context: Context):
    """A reader of the tensors this client keeps between messages (:mod:`.client_state`)."""
    return lambda key: client_state.get_tensors(context, key)


def advertise_key(msg: Message, context: Context) -> Message:
    """Secure aggregation (``query.<method>_keys``): a fresh X25519 key pair, the private key
    kept (``<method>.secagg``), the public key sent signed under the client's identity key
    (:func:`fedgraph.secure_aggregation.advertise`)."""
    from fedgraph.secure_aggregation import advertise

    method = msg.metadata.message_type.removeprefix("query.").removesuffix("_keys")
    cfg, _, _, _ = setup(msg, context, view=False)  # its own config first
    private, fields = advertise(
        context.node_config,
        int(context.node_config["partition-id"]),
        context.run_id,
        method,
        cfg.num_clients,
    )
    context.state[f"{method}.secagg"] = ConfigRecord({"private-key": private})
    return reply(msg, secagg=ConfigRecord(fields))


def verified_keys(msg: Message, context: Context, cfg, method: str):
    """``(private key, VerifiedKeys)``: ``msg``'s key list verified against this client's own
    identity directory (:func:`fedgraph.secure_aggregation.verify_relayed`; refused:
    ValueError, nothing released); ``None`` without one."""
    from fedgraph.secure_aggregation import verify_relayed

    if "secagg" not in msg.content:
        return None
    key = f"{method}.secagg"
    private = bytes(context.state[key]["private-key"]) if key in context.state else None
    return private, verify_relayed(
        msg.content["secagg"],
        private,
        context.node_config,
        int(context.node_config["partition-id"]),
        context.run_id,
        method,
        cfg.num_clients,
    )
