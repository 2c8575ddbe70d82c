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


#: the environment variable through which ``fedgraph run`` gives every simulated client its
#: own run config (a JSON object of flat run-config keys): the simulation's stand-in for a
#: deployed client's node config (:func:`own_config`)
OWN_CONFIG_ENV = "FEDGRAPH_CLIENT_RUN_CONFIG"
#: ``context.state`` keys: the client's authority (its own ledger) and its transcript
AUTHORITY_STATE, TRANSCRIPT_STATE = "fedgraph.authority", "fedgraph.transcript"
#: purposes whose draws are fixed for the run whatever the server sends (bound to the client's
#: data, not to its transcript): GAP's and ProGAP's degree sampling (the same edges at every
#: hop, rebuilt by any process that serves a hop), PPGNN's draw of its users' levels
RUN_FIXED_PURPOSES = frozenset({"gap:degree", "gap:degree:test", "progap:degree", "ppgnn:levels"})
#: parsed run configs by their JSON text, per process (every message carries one)
_PARSED: dict[str, object] = {}
#: (run id, node id) -> (purpose, request digest, reply records): the last release, kept in
#: this process to answer an identical retry with the same release
_LAST_RELEASE: dict[tuple, tuple] = {}


def _parsed(text: str):
    cfg = _PARSED.get(text)
    if cfg is None:
        if len(_PARSED) > 64:
            _PARSED.clear()
        cfg = _PARSED[text] = parse_run_config(json.loads(text))
    return cfg


def own_config(context: Context):
    """The client's own run config, the one its guarantee is computed from, never the server's
    word (:mod:`fedgraph.client_authority`): ``context.run_config`` (``flwr run``: the run
    config as the user submitted it to the SuperLink, which the ServerApp cannot change; a
    deployment: the SuperNode's), else the JSON object in ``$FEDGRAPH_CLIENT_RUN_CONFIG``
    (``fedgraph run`` sets it before Ray starts: the simulation's stand-in for node config).

    Raises:
        fedgraph.client_authority.ReleaseRefused: neither is there.
    """
    import os

    from fedgraph.client_authority import ReleaseRefused

    if context.run_config:
        return _parsed(json.dumps(dict(context.run_config), sort_keys=True, default=str))
    text = os.environ.get(OWN_CONFIG_ENV, "")
    if text:
        return _parsed(text)
    raise ReleaseRefused("this client has no run config of its own (context.run_config is "
                         f"empty and ${OWN_CONFIG_ENV} is unset): it cannot know its own budget, "
                         "so it releases nothing")


def request_digest(msg: Message) -> str:
    """SHA-256 (hex) of everything a request carries: every record's name and fields (tensors
    by dtype, shape and bytes; a record in Ray's object store by the tensors it holds)."""
    import hashlib

    from fedgraph.messaging import bulk_tensors, is_bulk_record

    h = hashlib.sha256()
    for name in sorted(msg.content.keys()):
        record = msg.content[name]
        h.update(f"{name}\0{type(record).__name__}\0".encode())
        if is_bulk_record(record):
            for key, t in sorted(bulk_tensors(record).items()):
                h.update(f"{key}\0{t.dtype}{tuple(t.shape)}\0".encode())
                h.update(t.contiguous().reshape(-1).view(torch_uint8()).numpy())
        elif hasattr(record, "to_torch_state_dict"):  # ArrayRecord: the arrays' own bytes
            for key in sorted(record.keys()):
                a = record[key]
                h.update(f"{key}\0{a.dtype}{tuple(a.shape)}\0".encode())
                h.update(a.data)
        else:
            for key in sorted(record.keys()):
                h.update(f"{key}\0{record[key]!r}\0".encode())
    return h.hexdigest()


def torch_uint8():
    import torch

    return torch.uint8


def _advance(msg: Message, context: Context) -> tuple[str, str]:
    """``(request digest, transcript)``: the client's transcript after this request
    (:func:`fedgraph.client_authority.transcript`), kept in its state."""
    from fedgraph.client_authority import transcript

    digest = request_digest(msg)
    before = (str(context.state[TRANSCRIPT_STATE]["digest"])
              if TRANSCRIPT_STATE in context.state else "")
    after = transcript(before, msg.metadata.message_type, digest)
    context.state[TRANSCRIPT_STATE] = ConfigRecord({"digest": after, "request": digest})
    return digest, after


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
    from fedgraph.client_authority import check_asks_no_more

    cfg = _parsed(str(msg.content["config"]["json"]))
    pid = int(context.node_config["partition-id"])
    check_asks_no_more(cfg, own_config(context), pid)
    _, inputs = _advance(msg, context)
    if not view:
        return cfg, pid, None, None
    view = client_view(cfg, pid)

    def generator(purpose: str):
        bound = "" if purpose in RUN_FIXED_PURPOSES else inputs
        return client_generator(cfg, context, pid, purpose, data=view.graph, inputs=bound)

    return cfg, pid, view, generator


def authority(context: Context, budgets: dict[str, float], delta: float, accountant: str):
    """This client's :class:`~fedgraph.client_authority.ClientAuthority` from its state, or a
    new one with its own ``budgets`` (subject -> epsilon), ``delta`` and ``accountant``."""
    from fedgraph.client_authority import ClientAuthority

    if AUTHORITY_STATE in context.state:
        return ClientAuthority.from_json(str(context.state[AUTHORITY_STATE]["json"]))
    return ClientAuthority(dict(budgets), float(delta), str(accountant))


def release(msg: Message, context: Context, auth, purpose: str, charges: list,
            make_records, with_ledger: bool = True) -> Message:
    """The reply of the release ``purpose``, charged to the client's own ledger ``auth``
    (:func:`authority`) before it leaves: ``charges`` (``[(subject, release, event)]``, from the
    method's ``reply_events``); ``make_records()`` computes the reply's records (called only if
    the charge is admitted). An identical retry gets the release already made (if this process
    still holds it; else it is refused), a different request under a spent purpose is refused.
    The reply carries the client's ledger summary (record ``ledger``) unless ``with_ledger``
    is false (a training round's reply, read by Flower's own strategies).

    Raises:
        fedgraph.client_authority.ReleaseRefused: as :meth:`~fedgraph.client_authority.
            ClientAuthority.charge`; or a retry this process no longer holds.
    """
    from fedgraph.client_authority import ReleaseRefused

    digest = str(context.state[TRANSCRIPT_STATE]["request"])
    slot = (int(context.run_id), int(context.node_id))
    if auth.admit(purpose, digest) == "repeat":
        kept = _LAST_RELEASE.get(slot)
        if kept is None or kept[:2] != (purpose, digest):
            raise ReleaseRefused(f"release {purpose!r} was already made; this client no longer "
                                 "holds it to send again, and will not draw it anew")
        return reply(msg, **kept[2])
    auth.charge(purpose, digest, charges)
    context.state[AUTHORITY_STATE] = ConfigRecord({"json": auth.to_json()})
    records = dict(make_records())
    if with_ledger:
        records["ledger"] = ledger_record(auth)
    _LAST_RELEASE[slot] = (purpose, digest, records)
    return reply(msg, **records)


def ledger_record(auth) -> ConfigRecord:
    """The client's own ledger summary (:meth:`~fedgraph.client_authority.ClientAuthority.
    summary`: epsilon, budget and releases per subject; public, a function of its plan and of
    the requests it answered) as the reply record ``ledger``."""
    return ConfigRecord({"json": json.dumps(auth.summary())})


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
    stays in this client's state (``<method>.secagg``); the public key is sent with this
    client's partition id and its signature under the client's identity key
    (:func:`fedgraph.identity.client_identity`, provisioned outside the server;
    :mod:`fedgraph.secure_aggregation`), bound to the run, the method, the partition id and
    the key exchange's label."""
    from fedgraph.identity import client_identity, key_label, key_statement
    from fedgraph.secure_aggregation import generate_key_pair

    method = msg.metadata.message_type.removeprefix("query.").removesuffix("_keys")
    pid = int(context.node_config["partition-id"])
    cfg = parse_run_config(json.loads(msg.content["config"]["json"]))
    identity = client_identity(context.node_config, pid, cfg.num_clients)
    private, public = generate_key_pair()
    signature = identity.sign(key_statement(context.run_id, method, pid, public,
                                            key_label(method)))
    context.state[f"{method}.secagg"] = ConfigRecord({"private-key": private})
    return reply(msg, secagg=ConfigRecord({"public-key": public, "partition-id": pid,
                                           "signature": signature}))


def verified_keys(msg: Message, context: Context, cfg, method: str):
    """The key list of ``msg``'s ``secagg`` record, verified by this client against its own
    identity directory (:func:`fedgraph.secure_aggregation.verify_key_list`), with its private
    key: ``(private key, VerifiedKeys)``; ``None`` when the message carries no key list.

    Raises:
        ValueError: a list it cannot verify, or no key exchange of its own (nothing is
            released)."""
    from fedgraph.identity import client_identity
    from fedgraph.secure_aggregation import verify_key_list

    if "secagg" not in msg.content:
        return None
    pid = int(context.node_config["partition-id"])
    key = f"{method}.secagg"
    private = bytes(context.state[key]["private-key"]) if key in context.state else None
    keys = verify_key_list(msg.content["secagg"], private,
                           client_identity(context.node_config, pid, cfg.num_clients),
                           run_id=context.run_id, method=method, required=cfg.num_clients)
    return private, keys
