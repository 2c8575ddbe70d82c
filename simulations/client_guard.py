"""The client's side of its privacy authority, in Flower terms (:mod:`fedgraph.client_authority`
holds the rules): its own run config, its transcript of the run, its ledger kept in its
``context.state``, and the release of a reply charged to that ledger before it leaves. Every
route calls :func:`fedgraph.simulations.routes.common.setup` (own config, transcript) and
:func:`release` for what it releases."""

from __future__ import annotations

import functools
import json

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedgraph.config import parse_run_config
from fedgraph.randomness import NOT_RELEASE_KEYS

#: the environment variable through which ``fedgraph run`` gives every simulated client its
#: own run config (a JSON object of flat run-config keys): the simulation's stand-in for a
#: deployed client's node config (:func:`own_config`)
OWN_CONFIG_ENV = "FEDGRAPH_CLIENT_RUN_CONFIG"
#: request fields that say how a reply travels, not what it is computed from (out of the digest)
TRANSPORT_KEYS = frozenset({"object-store"})
#: ``context.state`` keys: the client's authority (its own ledger) and its transcript
AUTHORITY_STATE, TRANSCRIPT_STATE = "fedgraph.authority", "fedgraph.transcript"
#: purposes whose draws are fixed for the run whatever the server sends (bound to the client's
#: data, not to its transcript): GAP's and ProGAP's degree sampling (the same edges at every
#: hop, rebuilt by any process that serves a hop), PPGNN's draw of its users' levels
RUN_FIXED_PURPOSES = frozenset({"gap:degree", "gap:degree:test", "progap:degree", "ppgnn:levels"})
#: parsed run configs by their JSON text, per process (every message carries one)
_PARSED: dict[str, object] = {}
#: (run id, node id) -> (ledger JSON, ClientAuthority): the ledger this process read or wrote
#: last for the node (the Context carries the JSON: another process parses it again)
_AUTHORITIES: dict[tuple, tuple] = {}
#: (run id, node id) -> (purpose, request digest, reply records): the last release, kept in
#: this process to answer an identical retry with the same release
_LAST_RELEASE: dict[tuple, tuple] = {}


def _parsed(text: str):
    cfg = _PARSED.get(text)
    if cfg is None:
        if len(_PARSED) > 64:
            _PARSED.clear()
            _CHECKED.clear()  # keyed by the ids of parsed configs
        cfg = _PARSED[text] = parse_run_config(json.loads(text))
    return cfg


#: (id of the request's parsed config, id of the client's own, partition id) already admitted
_CHECKED: set = set()


def check_own(asked, own, partition_id: int) -> None:
    """:func:`fedgraph.client_authority.check_asks_no_more`, once per pair of configs this
    process parsed (every message of a run carries the same one).

    Raises:
        fedgraph.client_authority.ReleaseRefused: as there.
    """
    from fedgraph.client_authority import check_asks_no_more

    key = (id(asked), id(own), int(partition_id))
    if key not in _CHECKED:
        check_asks_no_more(asked, own, partition_id)
        _CHECKED.add(key)


def own_config(context: Context):
    """The client's own run config, the one its guarantee is computed from, never the server's
    word (:mod:`fedgraph.client_authority`): ``context.run_config`` (``flwr run``: the run
    config as the user submitted it to the SuperLink, which the ServerApp cannot change; a
    deployment: the SuperNode's), else the JSON object in ``$FEDGRAPH_CLIENT_RUN_CONFIG``
    (``fedgraph run`` sets it before Ray starts: the simulation's stand-in for node config).
    ``num-clients = 0`` (one client per supernode) is the node's ``num-partitions``.

    Raises:
        fedgraph.client_authority.ReleaseRefused: neither is there.
    """
    import os

    from fedgraph.client_authority import ReleaseRefused

    own = dict(context.run_config) if context.run_config else None
    if own is None and os.environ.get(OWN_CONFIG_ENV, ""):
        own = json.loads(os.environ[OWN_CONFIG_ENV])
    if own is not None:
        for key in ("num-clients", "num_clients"):  # 0: one client per supernode (flwr run):
            if key in own and own[key] in (0, "0", "", None):  # the federation's size, as
                parts = context.node_config.get("num-partitions")  # the node knows it
                if parts is None:
                    del own[key]
                else:
                    own[key] = int(parts)
        return _parsed(json.dumps(own, sort_keys=True, default=str))
    raise ReleaseRefused(
        "this client has no run config of its own (context.run_config is "
        f"empty and ${OWN_CONFIG_ENV} is unset): it cannot know its own budget, "
        "so it releases nothing"
    )


def request_digest(msg: Message) -> str:
    """SHA-256 (hex) of everything a request carries: every record's name and fields (tensors
    by dtype, shape and bytes; a record in Ray's object store by the tensors it holds; the run
    config without the keys that change no release, :data:`fedgraph.randomness.
    NOT_RELEASE_KEYS`, so that a run on another device or into another folder draws the same
    noise)."""
    import hashlib

    from fedgraph.messaging import is_bulk_record

    h = hashlib.sha256()
    for name in sorted(msg.content.keys()):
        record = msg.content[name]
        h.update(f"{name}\0".encode())
        if is_bulk_record(record) or hasattr(record, "to_torch_state_dict"):
            # tensors by value, whatever their envelope (ArrayRecord, Ray's object store)
            for key, (dtype, shape, payload) in sorted(_arrays(record).items()):
                h.update(f"{key}\0{dtype}{shape}\0".encode())
                h.update(payload)
        elif name == "config" and "json" in record:  # the run config, less what changes no
            h.update(_config_digest(str(record["json"])).encode())  # release
            h.update(repr(sorted((k, record[k]) for k in record.keys() if k != "json")).encode())
        else:  # (how the reply travels, object-store, is transport, not an input)
            for key in sorted(k for k in record.keys() if k not in TRANSPORT_KEYS):
                h.update(f"{key}\0{record[key]!r}\0".encode())
    return h.hexdigest()


def _arrays(record) -> dict:
    """A record's tensors as ``(dtype, shape, C-order bytes)`` without a copy, whatever the
    envelope: an ArrayRecord's ``.npy`` payload (its header skipped, not parsed: parsing it
    was most of a digest's time), or Ray's object store."""
    import struct

    from fedgraph.messaging import _bulk_arrays, array_view, is_bulk_record

    def entry(a):
        a = np.ascontiguousarray(a)
        return a.dtype.str, tuple(a.shape), a.reshape(-1).view(np.uint8)

    if is_bulk_record(record):
        return {k: entry(a) for k, a in _bulk_arrays(record).items()}
    out = {}
    for k in record.keys():
        arr = record[k]
        data = arr.data
        if (
            arr.stype == "numpy.ndarray"
            and isinstance(data, (bytes, bytearray))
            and data[:6] == b"\x93NUMPY"
            and data[6] in (1, 2)
        ):
            start = 10 if data[6] == 1 else 12
            size = struct.unpack("<H" if data[6] == 1 else "<I", data[8:start])[0]
            if b"True" not in data[start : start + size]:  # C order (fortran_order False)
                out[k] = (
                    np.dtype(arr.dtype).str,
                    tuple(arr.shape),
                    memoryview(data)[start + size :],
                )
                continue
        out[k] = entry(array_view(arr))
    return out


@functools.lru_cache(maxsize=64)
def _config_digest(text: str) -> str:
    """SHA-256 of a run config's JSON without :data:`fedgraph.randomness.NOT_RELEASE_KEYS`
    (memoized: every message of a run carries the same text)."""
    import hashlib

    cfg = json.loads(text)
    return hashlib.sha256(
        json.dumps(
            {k: v for k, v in cfg.items() if k not in NOT_RELEASE_KEYS}, sort_keys=True, default=str
        ).encode()
    ).hexdigest()


def advance(msg: Message, context: Context) -> tuple[str, str]:
    """``(request digest, transcript)``: the client's transcript after this request
    (:func:`fedgraph.client_authority.transcript`), kept in its state."""
    from fedgraph.client_authority import transcript

    digest = request_digest(msg)
    before = (
        str(context.state[TRANSCRIPT_STATE]["digest"]) if TRANSCRIPT_STATE in context.state else ""
    )
    after = transcript(before, msg.metadata.message_type, digest)
    context.state[TRANSCRIPT_STATE] = ConfigRecord({"digest": after, "request": digest})
    return digest, after


def authority(context: Context, budgets: dict[str, float], delta: float, accountant: str):
    """This client's :class:`~fedgraph.client_authority.ClientAuthority` from its state, or a
    new one with its own ``budgets`` (subject -> epsilon), ``delta`` and ``accountant``."""
    from fedgraph.client_authority import ClientAuthority

    if AUTHORITY_STATE in context.state:
        text = str(context.state[AUTHORITY_STATE]["json"])
        slot = (int(context.run_id), int(context.node_id))
        kept = _AUTHORITIES.get(slot)
        if kept is not None and kept[0] == text:  # this process parsed (or wrote) it last
            return kept[1]
        auth = ClientAuthority.from_json(text)
        _remember(slot, text, auth)
        return auth
    return ClientAuthority(dict(budgets), float(delta), str(accountant))


def _remember(slot: tuple, text: str, auth) -> None:
    for other in [s for s in _AUTHORITIES if s[0] != slot[0]]:  # another run: forget it
        del _AUTHORITIES[other]
    _AUTHORITIES[slot] = (text, auth)


def save(context: Context, auth) -> None:
    """Keep ``auth`` in the client's state (and this process's memo of it)."""
    text = auth.to_json()
    context.state[AUTHORITY_STATE] = ConfigRecord({"json": text})
    _remember((int(context.run_id), int(context.node_id)), text, auth)


def release(
    msg: Message,
    context: Context,
    auth,
    purpose: str,
    charges: list,
    make_records,
    with_ledger: bool = True,
) -> Message:
    """The reply of the release ``purpose``, charged to the client's own ledger ``auth``
    (:func:`authority`) before it leaves: ``charges`` (``[(subject, release, event)]``, from the
    method's ``reply_events``); ``make_records()`` computes the reply's records (called only if
    the charge is admitted). An identical retry gets the release already made (if this process
    still holds it; else it is refused), a different request under a spent purpose is refused.
    The reply carries the client's ledger summary (record ``ledger``) unless ``with_ledger``
    is false (a training round's reply, read by Flower's own strategies). A release without
    charges (it reads no protected unit, or the client has no noise to account) is answered
    without entering the ledger.

    Raises:
        fedgraph.client_authority.ReleaseRefused: as :meth:`~fedgraph.client_authority.
            ClientAuthority.charge`; or a retry this process no longer holds.
    """
    from fedgraph.client_authority import ReleaseRefused

    if not charges:  # spends nothing of a protected unit (an edge-level training round, the
        records = dict(make_records())  # last PMA hop): nothing to charge or to keep
        if with_ledger:
            records["ledger"] = ledger_record(auth)
        return reply(msg, **records)
    digest = str(context.state[TRANSCRIPT_STATE]["request"])
    slot = (int(context.run_id), int(context.node_id))
    if auth.admit(purpose, digest) == "repeat":
        kept = _LAST_RELEASE.get(slot)
        if kept is None or kept[:2] != (purpose, digest):
            raise ReleaseRefused(
                f"release {purpose!r} was already made; this client no longer "
                "holds it to send again, and will not draw it anew"
            )
        return reply(msg, **kept[2])
    auth.charge(purpose, digest, charges)
    save(context, auth)
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


def transcript_of(requests) -> str:
    """The transcript a client holds after ``requests`` (its messages of the run, in order):
    what the noise key of its release on the last of them binds. For a replay of a client's
    noise from its secret (the tests, an auditor)."""
    from fedgraph.client_authority import transcript

    out = ""
    for m in requests:
        out = transcript(out, m.metadata.message_type, request_digest(m))
    return out
