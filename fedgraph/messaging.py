"""The server's messaging with clients: send a message to every node and collect the replies
(:func:`send_to_all`), refuse a failed or non-finite reply (:func:`check_finite_reply`,
:func:`last_error_line`), wait for the supernodes (:func:`wait_for_nodes`), the ``meta``
record's placement of each client (:func:`worker_info`, :func:`record_workers`), and encode
and decode ArrayRecords (:func:`array_record` with one copy; :func:`tensors`;
:func:`read_only_tensors` without a copy), and a Ray simulation's bulk records
(:func:`bulk_record`, :func:`bulk_tensors`: large tensors by Ray's object store, the message
holding a reference).

Flower, numpy and torch are imported where they are used: ``fedgraph run`` imports the strategies
before Ray starts (fedgraph.simulations.cli).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

from .errors import ClientFailure


def push_message(grid, message_type: str, node: int, content) -> str:
    """Send one message now, ahead of the exchange it belongs to: a later :func:`send_to_all`
    collects its reply (its ``pushed``). For a server that can build one client's next message
    before the others' (GAP's PMA: :class:`~fedgraph.strategies.gap.GAPStrategy`). Returns the
    message id."""
    from flwr.app import Message

    (message_id,) = grid.push_messages(
        [Message(content=content, dst_node_id=node, message_type=message_type)]
    )
    return message_id


def send_to_all(
    grid,
    message_type: str,
    contents: dict[int, object],
    timeout: float,
    on_reply=None,
    pushed: dict[int, str] | None = None,
):
    """Send one message per node (``contents``: node id -> RecordDict) and wait for all replies.

    ``on_reply(node, content)``, if given, is called for every reply in the order of
    ``contents``, each once it and every earlier node's reply arrived and passed
    :func:`check_finite_reply`: where the grid streams its replies (fedgraph's
    :class:`~fedgraph.simulations.grid.InterruptibleGrid`, ``streams_replies``), while later
    clients still compute; else after all arrived. None is called past a failed reply.
    ``pushed``: node id -> message id of this exchange's messages already sent
    (:func:`push_message`; only on a grid that streams its replies); their nodes come first in
    that order, before those of ``contents``.

    Returns:
        dict node id -> reply content (RecordDict).
    Raises:
        ClientFailure: naming the nodes that failed or timed out and their error reasons, or
            the client and field of a reply with a non-finite value
            (:func:`check_finite_reply`), or the client whose reply ``on_reply`` could not use
            (its error the cause); its ``replies`` holds the replies that did arrive (a
            non-finite one included: it left its client too).
    """
    from flwr.app import Message

    pushed = dict(pushed or {})
    if set(pushed) & set(contents):
        raise ValueError(
            f"nodes both pushed and in contents: {sorted(set(pushed) & set(contents))}"
        )
    messages = [
        Message(content=c, dst_node_id=n, message_type=message_type) for n, c in contents.items()
    ]
    nodes = list(pushed) + [n for n in contents if n not in pushed]
    stream = _InOrder(nodes, message_type, on_reply)
    streams = getattr(grid, "streams_replies", False)
    if pushed and not streams:
        raise ValueError("pushed: messages sent ahead need a grid that streams its replies")
    if streams and (on_reply is not None or pushed):
        ahead = {"pushed": list(pushed.values())} if pushed else {}
        replies = list(
            grid.send_and_receive(messages, timeout=timeout, on_reply=stream.arrived, **ahead)
        )
    else:
        replies = list(grid.send_and_receive(messages, timeout=timeout))
    out, failed = {}, {}
    for r in replies:
        node = r.metadata.src_node_id
        if r.has_error():
            failed[node] = r.error.reason
        else:
            out[node] = r.content
    missing = set(nodes) - set(out) - set(failed)
    if not failed and not missing:
        try:
            stream.finish(out)  # the finiteness check (and on_reply) of what was not streamed
        except ClientFailure as err:
            raise ClientFailure(str(err), replies=out) from err.__cause__
    if failed or missing:
        causes: dict[str, int] = {}
        for reason in failed.values():
            cause = last_error_line(reason)
            causes[cause] = causes.get(cause, 0) + 1
        lines = [f"{n} client(s): {c}" for c, n in causes.items()]
        if missing:
            lines.append(f"{len(missing)} client(s): no reply within {timeout:g} s")
        raise ClientFailure(
            f"{message_type} failed on {len(failed) + len(missing)} of "
            f"{len(nodes)} clients: " + "; ".join(lines),
            replies=out,
        )
    return out


class _InOrder:
    """:func:`send_to_all`'s replies checked (and handed to ``on_reply``) in the nodes' order,
    as they arrive; a failed check is kept and raised by :meth:`finish`."""

    def __init__(self, order: list[int], message_type: str, on_reply) -> None:
        self.order, self.message_type, self.on_reply = order, message_type, on_reply
        self.contents: dict[int, object] = {}
        self.done, self.failure, self.stopped = 0, None, False

    def arrived(self, reply) -> None:
        """A grid's ``on_reply``: one pulled reply (a Flower ``Message``)."""
        if reply.has_error():
            self.stopped = True  # the exchange reports it; nothing more is handed on
            return
        self.contents[reply.metadata.src_node_id] = reply.content
        self._advance()

    def finish(self, out: dict) -> None:
        """Every reply arrived without error (``out``): check and hand on the rest.

        Raises:
            ClientFailure: the first failed check or ``on_reply`` error."""
        self.contents.update(out)
        self._advance()
        if self.failure is not None:
            raise self.failure

    def _advance(self) -> None:
        while (
            not self.stopped
            and self.failure is None
            and self.done < len(self.order)
            and self.order[self.done] in self.contents
        ):
            node = self.order[self.done]
            content = self.contents[node]
            label = client_label(node, content)
            try:
                check_finite_reply(content, label, self.message_type)
            except ClientFailure as err:
                self.failure = err
                return
            if self.on_reply is not None:
                try:
                    self.on_reply(node, content)
                except Exception as err:  # noqa: BLE001 - a reply the server cannot use
                    self.failure = ClientFailure(
                        f"{self.message_type}: {label} sent a reply the server cannot use: "
                        f"{type(err).__name__}: {err}"
                    )
                    self.failure.__cause__ = err
                    return
            self.done += 1


def client_label(node: int, content) -> str:
    """``"node N"``, with ``" (partition P)"`` when the reply's ``meta`` record carries a
    ``worker`` entry (:func:`worker_info`)."""
    try:
        return f"node {node} (partition {json.loads(content['meta']['worker'])['partition_id']})"
    except (KeyError, TypeError, ValueError):
        return f"node {node}"


def _non_finite(value, allow_inf: bool = False) -> bool:
    """Whether ``value`` (an Array, a float, or a list of them) holds NaN or (unless
    ``allow_inf``) +-inf."""
    import numpy as np

    if isinstance(value, np.ndarray) or hasattr(value, "numpy"):  # (a bulk record's) or Array
        a = value if isinstance(value, np.ndarray) else array_view(value)
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)):
            return False
        # One pass without an [n] bool temporary: a NaN or inf makes the float64 sum non-finite;
        # a non-finite sum of finite values (float64 overflow) is settled element by element.
        with np.errstate(over="ignore", invalid="ignore"):
            total = a.sum(dtype=np.complex128 if np.iscomplexobj(a) else np.float64)
        return not (np.isfinite(total) or bool(np.isfinite(a).all()))
    if isinstance(value, float):
        return math.isnan(value) or (not allow_inf and math.isinf(value))
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v, allow_inf) for v in value)
    return False


def check_finite_reply(content, client: str, message_type: str = "reply") -> None:
    """Reject a reply holding a non-finite number in any float field: NaN or +-inf in every
    array of its ArrayRecords and every value of its MetricRecords, NaN in its ConfigRecords
    (metadata, where ``inf`` has a meaning: e.g. PrivGNN's ``epsilon_target`` of a client
    without a limit). A noisy release is finite by construction; a non-finite one comes from
    a faulty or malicious client, and averaging it in would silently wreck the model (one NaN
    makes every average NaN) while the round reports "ok".

    Args:
        content: the reply's RecordDict.
        client: how to name the client (:func:`client_label`).
    Raises:
        ClientFailure: naming ``message_type``, the client, the record and the field.
    """
    from flwr.app import ConfigRecord

    for name, record in content.items():
        allow_inf = isinstance(record, ConfigRecord)
        items = record.items()
        if is_bulk_record(record):  # the tensors it refers to, as an ArrayRecord's would be
            items, allow_inf = _bulk_arrays(record).items(), False
        for key, value in items:
            if _non_finite(value, allow_inf):
                raise ClientFailure(
                    f"{message_type}: {client} replied with a non-finite value "
                    f"(NaN or inf) in {name}[{key!r}]"
                )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def last_error_line(reason: str) -> str:
    """The exception line of a client's error reason (Flower sends the whole traceback)."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(reason)).strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Failure|Interrupt)\b", ln):
            return ln.removesuffix("'>")  # Flower wraps some reasons in "<... '...'>"
    return lines[-1].removesuffix("'>") if lines else "unknown error"


#: seconds a simulation's supernode count must hold still before it is taken as final
SETTLE_S = 3.0


def wait_for_nodes(grid, num_nodes: int, timeout: float = 60.0) -> list[int]:
    """Block until ``num_nodes`` supernodes are connected; returns their ids (sorted).

    Raises:
        ClientFailure: if fewer connect within ``timeout`` seconds, or more are connected
            (each client holds one partition: num-supernodes must equal num-clients).
    """
    start = seen_at = time.time()
    seen = -1
    # A simulation (Flower's in-memory grid) registers all its supernodes at once, so a count
    # that holds still for a few seconds is final: a mismatch fails at once, not after timeout.
    # (``wrapped``: the grid inside a wrapper such as fedgraph.simulations.grid.InterruptibleGrid)
    simulated = type(getattr(grid, "wrapped", grid)).__name__ == "InMemoryGrid"
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) != seen:
            seen, seen_at = len(nodes), time.time()
        if simulated and 0 < len(nodes) < num_nodes and time.time() - seen_at > SETTLE_S:
            raise ClientFailure(
                f"the simulation has {len(nodes)} supernodes but the run config "
                f"has num-clients={num_nodes}; set num-supernodes={num_nodes} in "
                "the federation config (or num-clients to match)"
            )
        if len(nodes) > num_nodes:
            raise ClientFailure(
                f"{len(nodes)} supernodes are connected but the run config has "
                f"num-clients={num_nodes}; set num-supernodes={num_nodes} in the "
                "federation config (or num-clients to match)"
            )
        if len(nodes) == num_nodes:
            return nodes
        if time.time() - start > timeout:
            raise ClientFailure(
                f"only {len(nodes)} of {num_nodes} supernodes connected; set "
                "num-supernodes equal to the run config's num-clients"
            )
        time.sleep(0.5)


def worker_info(partition_id: int) -> str:
    """Where this client runs, as JSON for a reply's ``meta`` record: ``partition_id``,
    ``hostname``, ``pid``, ``device`` (``cpu``/``cuda`` as torch sees it here) and, inside a
    Ray worker (Flower's simulation engine), ``ray_node_id`` and ``ray_node_ip`` of the Ray
    node (``None`` outside Ray)."""
    import os
    import socket

    import torch

    info = {
        "partition_id": int(partition_id),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "ray_node_id": None,
        "ray_node_ip": None,
    }
    try:
        import ray

        if ray.is_initialized():
            info["ray_node_id"] = ray.get_runtime_context().get_node_id()
            # The address the Ray node was started with (not this host's routable address).
            info["ray_node_ip"] = ray.get_runtime_context().worker.node_ip_address
    except Exception:  # noqa: BLE001 - placement is informative only
        pass
    return json.dumps(info)


def record_workers(report, metas) -> None:
    """Store in ``report.extra["workers"]`` which host / Ray node ran which client, from the
    ``worker`` entries (:func:`worker_info`) of the replies' ``meta`` records ``metas``."""
    workers = {}
    for meta in metas:
        if "worker" in meta:
            info = json.loads(meta["worker"])
            workers[f"client-{info['partition_id']}"] = info
    report.extra["workers"] = dict(sorted(workers.items(), key=lambda kv: kv[1]["partition_id"]))


def tensors(record) -> dict[str, Tensor]:
    """ArrayRecord -> dict of torch tensors."""
    return dict(record.to_torch_state_dict())


def array_view(array):
    """A flwr ``Array`` as a read-only numpy array over its bytes, without the copy that
    ``Array.numpy()`` (``np.load``) makes; a copy where no view is possible (not numpy's
    ``.npy`` serialization, Fortran order, an object dtype)."""
    import io

    import numpy as np
    from numpy.lib import format as npy

    if array.stype != "numpy.ndarray" or not isinstance(array.data, (bytes, bytearray)):
        return array.numpy()
    f = io.BytesIO(array.data)  # shares the bytes
    version = npy.read_magic(f)
    header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran, dtype = header(f)
    if fortran or dtype.hasobject:
        return array.numpy()
    view = np.frombuffer(array.data, dtype=dtype, count=math.prod(shape), offset=f.tell())
    view = view.reshape(shape)
    view.flags.writeable = False  # bytearray data: still no writes through the view
    return view


def array_record(tensors: dict[str, Tensor]):
    """``ArrayRecord(tensors)`` (CPU tensors, any dtype numpy has) with one copy of each
    tensor's bytes instead of ``np.save``'s two (into a ``BytesIO`` that grows, then out of it):
    the same ``.npy`` bytes, so any reader (``Array.numpy``, :func:`array_view`) decodes them
    alike. For the large payloads: a client's PMA release at 1e6 nodes is 48 MB per hop, built
    in 0.027 s instead of 0.05 s (one thread)."""
    import io

    from flwr.app import Array, ArrayRecord
    from numpy.lib import format as npy

    arrays = {}
    for name, t in tensors.items():
        a = t.detach().cpu().contiguous().numpy()
        head = io.BytesIO()
        npy.write_array_header_1_0(head, npy.header_data_from_array_1_0(a))
        data = head.getvalue() + (memoryview(a.reshape(-1)).cast("B") if a.size else b"")
        arrays[name] = Array(
            dtype=str(a.dtype), shape=tuple(a.shape), stype="numpy.ndarray", data=data
        )
    return ArrayRecord(arrays)


def read_only_tensors(record) -> dict[str, Tensor]:
    """ArrayRecord -> dict of torch tensors that view the record's bytes (:func:`array_view`)
    instead of copying them: for a consumer that only reads them, such as the server's sum
    of GAP's partial sums (a 54 MB reply per client and hop at 1e6 nodes). Writing to one is
    undefined (the message's bytes are immutable); :func:`tensors` copies."""
    return _torch_views({name: array_view(array) for name, array in record.items()})


def _torch_views(arrays: dict) -> dict[str, Tensor]:
    """numpy arrays (read-only views) -> torch tensors over the same memory."""
    import torch

    with warnings.catch_warnings():  # "not writable": the point of a view
        warnings.simplefilter("ignore", UserWarning)
        return {name: torch.from_numpy(a) for name, a in arrays.items()}


#: the ``ConfigRecord`` key of a bulk record: a pickled Ray ``ObjectRef`` (:func:`bulk_record`)
OBJECT_REF = "ray-ref"
#: slot -> the ``ObjectRef`` this process put there and keeps alive (:func:`bulk_record`)
_HELD: dict = {}


def object_store_available() -> bool:
    """Whether this process is connected to a Ray cluster: a Flower simulation's driver (where
    its ServerApp runs) or one of its ClientApp workers (Ray imported and initialized)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def bulk_record(tensors: dict[str, Tensor], slot=None):
    """The record of a message's large tensors (a GAP client's PMA release, the server's
    routed sums: 54 MB and 16 MB per client and hop at 1e6 nodes): ``slot=None``:
    :func:`array_record`; else (a Ray simulation whose other end reads the object store,
    :func:`object_store_available` on both) the tensors go into Ray's object store, once, as
    numpy arrays, and the record is ``ConfigRecord({OBJECT_REF: <pickled ObjectRef>})``. The
    reader (:func:`bulk_tensors`) maps them without a copy; Flower's messaging (a protobuf
    copy and the Ray actor's pickling of the message, each way) carries a few hundred bytes.
    Issue 31: at 1e6 nodes over 4 clients, one Ray CPU, GAP's PMA took 6.9 +- 0.5 s against
    8.5 +- 0.3 s before (``docs/results/performance.md``); the waits between one client's
    reply and the next client's request fell from about 0.2-0.35 s to 4 ms.

    The bytes are the same tensors in another envelope: what leaves a client is unchanged;
    every party of a simulation runs on the same Ray cluster, whose object store already
    carries Flower's messages. A deployed client (no Ray) always sends the ArrayRecord.

    Lifetime: a reference serialized into a message is pinned by Ray for its owner's life,
    so this process keeps it under ``slot`` (hashable; one per sender and stream, e.g.
    ``(run id, node id, "gap.pma")``) and frees it when the slot's next record is put or
    :func:`release_bulk` is called: the reader must have read the previous record by then
    (PMA: the next hop's request comes after the server summed the replies).

    Raises:
        RuntimeError: ``slot`` given outside a Ray cluster.
    """
    if slot is None:
        return array_record(tensors)
    if not object_store_available():
        raise RuntimeError("bulk_record: a slot needs a Ray cluster (object_store_available())")
    import ray
    from flwr.app import ConfigRecord

    release_bulk(slot)
    ref = ray.put({name: t.detach().cpu().contiguous().numpy() for name, t in tensors.items()})
    _HELD[slot] = ref
    return ConfigRecord({OBJECT_REF: ray.cloudpickle.dumps(ref)})


def release_bulk(slot) -> None:
    """Free the object :func:`bulk_record` put under ``slot`` (nothing if none): Ray's
    ``free``, since a reference serialized into a message is pinned for its owner's life."""
    ref = _HELD.pop(slot, None)
    if ref is not None:
        free_object(ref)


def free_object(ref) -> None:
    """Free the Ray object behind ``ref`` in every object store of the cluster, whichever
    process owns it (Ray's ``free``): a reference serialized into a message or a ``Context``
    is otherwise pinned for its owner's life. Only for an object nobody reads again: a
    borrower that resolves it afterwards waits for it (its owner gets ``ObjectFreedError``)."""
    from ray._private import internal_api

    with warnings.catch_warnings():  # deprecated, and still the only way to unpin it
        warnings.simplefilter("ignore")
        internal_api.free([ref])


def is_bulk_record(record) -> bool:
    """Whether ``record`` is a :func:`bulk_record` that refers to the object store."""
    from flwr.app import ConfigRecord

    return isinstance(record, ConfigRecord) and OBJECT_REF in record


def _bulk_arrays(record) -> dict:
    import ray

    if not object_store_available():
        raise RuntimeError(
            "a bulk record refers to Ray's object store, but this process is "
            "not connected to a Ray cluster"
        )
    return dict(ray.get(ray.cloudpickle.loads(bytes(record[OBJECT_REF]))))


def bulk_tensors(record) -> dict[str, Tensor]:
    """The tensors of a :func:`bulk_record` (or of any ArrayRecord), read-only and without a
    copy (:func:`read_only_tensors`; from the object store: views of its shared memory).
    Writing to one is undefined; :func:`tensors` copies an ArrayRecord.

    Raises:
        RuntimeError: a bulk record read outside a Ray cluster.
    """
    if not is_bulk_record(record):
        return read_only_tensors(record)
    return _torch_views(_bulk_arrays(record))
