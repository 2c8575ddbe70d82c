"""A client's large private tensors between messages, out of Flower's ``Context`` under Ray.

Flower 1.42's simulation engine ships a node's whole ``Context`` to the Ray actor that runs a
message and back with the reply (``RayBackend.process_message``), so every tensor kept in
``context.state`` crosses Ray's object store twice per message. GAP's classifier reads the
client's private hops in each of its rounds: at 1e5 nodes over 4 clients (K = 2, 4.8 MB per
client) one actor round trip took 17.6 ms with the hops in the state against 1.0 ms without,
about half of each classifier round.

:func:`put_tensors` keeps the tensors, under Ray, in the Ray cluster's object store, owned by
the actor that computed them, and puts in ``context.state[key]`` only a reference (bytes) and a
token; :func:`get_tensors` returns them on whichever actor serves the node's next message (Ray
fetches them from their owner, from another machine of the cluster if it must) and memoizes
them per process under the token, so the actor that computed them, or one that read them
once, decodes nothing again. Outside a Ray worker (:mod:`fedgraph.simulations.local`, a deployed
SuperNode) they stay in ``context.state[key]`` as an ``ArrayRecord``, with the same token.

The only client actor (:func:`keep_in_this_process`): when ``fedgraph run`` starts Ray itself
and Flower's pool holds a single ``ClientAppActor`` (``--num-cpus 1``: the 2-core setting of
issue 31), every message of every node runs in that one process, so nothing needs to leave it:
:func:`put_tensors` keeps the tensors in the memo only, and ``context.state[key]`` holds the
process's name and the token. At 1e6 nodes over 4 clients GAP's PMA put about 0.5 GB into the
object store per run for nothing, a second copy of each client's state (peak PSS of the run
4.43 +- 0.07 GiB without it against 4.65 +- 0.08 GiB, no difference in time beyond the noise:
``docs/results/performance.md``). A message of such a node served by another process (a pool
that grew after all, a restarted actor) fails loudly in :func:`get_tensors` instead of
computing on something else. ``FEDGRAPH_CLIENT_STATE=object-store`` turns this off (the object
store, as with several actors; ``auto``, the default, is this).

Lifetime: the owning actor holds the reference (:data:`_OWNED`), and Ray frees the object
within seconds of that actor's exit (``tests/test_client_state.py``); Flower's simulation ends
its actors with the run, so nothing outlives it on an existing cluster. A reference serialized
into the ``Context`` would otherwise stay pinned until then, so :func:`put_tensors` frees the
object it replaces under the same key, and :func:`drop` the one it forgets, on whichever actor
serves the message (GAP's PMA keeps about 80 MB per client at 1e6 nodes between hops). The
node's previous ``Context`` then names a freed object (an actor resolving it would wait): a
message that fails after the put leaves no state to retry from, and the strategies end the run
on a failed client (:mod:`fedgraph.strategies.base`) rather than retry it. Memory: one copy in
the object store and one decoded copy per process that read it (the memo keeps the current
run's only). A client's tensors in the object store are visible to the simulation's
processes, as the ``Context`` that Flower sends through the same store already is: the
simulation runs every party on the same cluster; in a deployment nothing of this applies.
"""

from __future__ import annotations

import os
import sys

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from fedgraph.messaging import free_object

__all__ = ["put_tensors", "get_tensors", "derived", "drop", "in_ray_worker", "keep_in_this_process"]

#: (run id, node id, key) -> (token, {name: tensor}): what this process decoded last
_MEMO: dict[tuple, tuple[str, dict]] = {}
#: (run id, node id, key) -> ObjectRef this actor put (keeps the object alive with the actor)
_OWNED: dict[tuple, object] = {}
#: (run id, node id, key) -> (token, what this process derived for the node) (:func:`derived`)
_DERIVED: dict[tuple, object] = {}
#: the record key that names the process holding a node's tensors (:func:`keep_in_this_process`)
IN_PROCESS = "in-process"
#: whether this process is the simulation's only client actor (:func:`keep_in_this_process`)
_SOLE = {"on": False}


def keep_in_this_process(on: bool = True) -> None:
    """Declare this Ray worker the simulation's only client actor (module docs): from now on
    :func:`put_tensors` keeps tensors in this process's memory instead of the object store.
    Called in the actor's ``__init__`` by :func:`fedgraph.simulations.early_ray.prestart_actors`
    when Flower's pool holds one actor; nothing else may call it, since a message served by
    another process then fails (:func:`get_tensors`)."""
    _SOLE["on"] = bool(on)


def _process_name() -> str:
    import socket

    return f"pid {os.getpid()} on {socket.gethostname()}"


def in_ray_worker() -> bool:
    """Whether this code runs in a Ray actor (Flower's simulation engine's ClientApp workers)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def _slot(context: Context, key: str) -> tuple:
    return (int(context.run_id), int(context.node_id), key)


def _remember(slot: tuple, token: str, tensors: dict) -> None:
    for other in [s for s in _MEMO if s[0] != slot[0]]:  # another run: forget its tensors
        del _MEMO[other]
    _MEMO[slot] = (token, tensors)


def put_tensors(context: Context, key: str, tensors: dict[str, torch.Tensor]) -> None:
    """Keep ``tensors`` (CPU tensors, any shapes) for this node's later messages under ``key``.

    Under Ray: in the object store, a reference and a token in ``context.state[key]``;
    otherwise an ``ArrayRecord`` under ``key`` and a token under ``key + ".token"``.
    """
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    token = os.urandom(16).hex()
    slot = _slot(context, key)
    if in_ray_worker():
        replaced = _stored_ref(context, key)
        if _SOLE["on"]:  # every message of this node runs here: the memo is the store
            _OWNED.pop(slot, None)
            context.state[key] = ConfigRecord({IN_PROCESS: _process_name(), "token": token})
        else:
            import ray

            ref = ray.put({name: t.numpy() for name, t in tensors.items()})
            _OWNED[slot] = ref
            context.state[key] = ConfigRecord(
                {"ray-ref": ray.cloudpickle.dumps(ref), "token": token}
            )
        if replaced is not None:  # else pinned until its owner (maybe another actor) exits
            free_object(replaced)
    else:
        context.state[key] = ArrayRecord(tensors)
        context.state[key + ".token"] = ConfigRecord({"token": token})
    _remember(slot, token, tensors)


def get_tensors(context: Context, key: str) -> dict[str, torch.Tensor]:
    """The tensors :func:`put_tensors` kept under ``key`` (read-only by convention: the memo
    shares them between messages; copy before writing in place).

    Raises:
        KeyError: nothing kept under ``key``.
        RuntimeError: under Ray, the tensors were lost with the worker that held them, or
            freed since (a later :func:`put_tensors` under ``key``, or :func:`drop`).
    """
    if key not in context.state:
        raise KeyError(f"no client state under {key!r}")
    record = context.state[key]
    inline = isinstance(record, ArrayRecord)
    token_record = context.state.get(key + ".token") if inline else record
    token = str(token_record["token"]) if token_record is not None else None
    slot = _slot(context, key)
    hit = _MEMO.get(slot)
    if token is not None and hit is not None and hit[0] == token:
        return hit[1]
    if inline:
        tensors = dict(record.to_torch_state_dict())
    elif IN_PROCESS in record:
        where = str(record[IN_PROCESS])
        why = (
            "it was replaced or dropped since"
            if where == _process_name()
            else f"this message runs in {_process_name()} (the actor was restarted, or Flower's "
            "pool grew); rerun the simulation, or with FEDGRAPH_CLIENT_STATE=object-store"
        )
        raise RuntimeError(
            f"client state {key!r} of node {context.node_id} was kept in the "
            f"memory of the simulation's only client actor ({where}), but {why}"
        )
    else:
        import ray

        try:
            arrays = ray.get(ray.cloudpickle.loads(bytes(record["ray-ref"])))
        except ray.exceptions.RayError as err:
            raise RuntimeError(
                f"client state {key!r} of node {context.node_id} was lost with "
                "the Ray worker that held it, or replaced since "
                f"({type(err).__name__}); rerun the simulation"
            ) from err
        tensors = {name: torch.from_numpy(a.copy()) for name, a in arrays.items()}
    if token is not None:
        _remember(slot, token, tensors)
    return tensors


def derived(context: Context, key: str, build):
    """``build()``, memoized in this process for this node's run under ``key``: what a client
    derives from its own data and the run and reads in several messages (GAP's sums over its
    edges, the same at every PMA hop: :func:`fedgraph.methods.gap.client_pma.pma_edge_sums`).
    Only a token goes into the ``Context`` (under ``key + ".derived"``), nothing into the
    object store: a process without the token's value (another worker, or a new ``Context``
    of a run that reuses a run id, as an in-process simulation may) calls ``build`` again, so
    ``build`` must give the same value for the same ``Context`` (a draw from the client's
    generator of a fixed purpose does). Other runs' entries are forgotten; :func:`drop`
    forgets this one."""
    slot, name = _slot(context, key), key + ".derived"
    for other in [s for s in _DERIVED if s[0] != slot[0]]:
        del _DERIVED[other]
    token = str(context.state[name]["token"]) if name in context.state else None
    hit = _DERIVED.get(slot)
    if token is not None and hit is not None and hit[0] == token:
        return hit[1]
    token = os.urandom(16).hex()
    value = build()
    context.state[name] = ConfigRecord({"token": token})
    _DERIVED[slot] = (token, value)
    return value


def _stored_ref(context: Context, key: str):
    """The object reference kept under ``key`` in the object store, or None."""
    record = context.state.get(key)
    if not isinstance(record, ConfigRecord) or "ray-ref" not in record:
        return None
    import ray

    return ray.cloudpickle.loads(bytes(record["ray-ref"]))


def drop(context: Context, key: str) -> None:
    """Forget what is kept under ``key`` (no error if nothing is), and what was derived under
    it (:func:`derived`); under Ray, free its object in the object store."""
    ref = _stored_ref(context, key) if in_ray_worker() else None
    if ref is not None:
        free_object(ref)
    for k in (key, key + ".token", key + ".derived"):
        if k in context.state:
            del context.state[k]
    _DERIVED.pop(_slot(context, key), None)
    _MEMO.pop(_slot(context, key), None)
    _OWNED.pop(_slot(context, key), None)
