"""Message latency of Flower's simulation engine: wake-ups instead of 100 ms polls.

Flower 1.42's simulation runtime (``flwr.server.superlink.fleet.vce.vce_api``) moves the
server's messages to the clients' queue in a thread that sweeps the link state and then waits
100 ms (``add_messages_to_queue``), and the grid waiting for replies polls the link state as
well; a federated round (train, then evaluate) therefore waits 0.1-0.4 s on polls alone. GAP's
default run has about 45 exchanges: at 1e5 nodes the waits were a third of the run.

:func:`install` replaces the sweeping thread's function with the same loop whose wait also
ends as soon as :data:`PUSHED` is set (the server pushed messages: set by
:class:`fedgraph.simulations.grid.InterruptibleGrid`), and the function of the thread that stores
the replies with the same loop that sets :data:`REPLIED` after each reply it stores (the
grid's wait for replies ends on it). Nothing else changes: the same link state, queues and
messages; without a wake-up each wait still ends after Flower's 100 ms, so a grid or a Flower
version that does not signal keeps Flower's behaviour. The runtime's queues become
:class:`PromptQueue`, so that its ClientApp workers see the stop event within 100 ms instead
of a second (the end of every simulation). :func:`install` leaves a Flower whose
functions differ from the ones it replaces untouched (returns ``False``).

It runs in the process of the simulation (``fedgraph run``'s own, or ``flwr run``'s simulation
process, where Flower imports the ClientApp module before it starts these threads); it must
be installed before the simulation runtime starts its threads.
"""

from __future__ import annotations

import inspect
import sys
import threading
from queue import Empty, Queue

__all__ = ["PUSHED", "REPLIED", "PromptQueue", "install", "installed"]

#: set when the server pushed messages (the sweeping thread wakes up at once)
PUSHED = threading.Event()
#: set when a client's reply was stored in the link state (a waiting grid wakes up at once)
REPLIED = threading.Event()

#: Flower's wait between two sweeps (and between two reads of the replies' queue), seconds
IDLE_WAIT_S = 0.1
_EXPECTED = {
    "add_messages_to_queue": ["state", "queue", "nodes_mapping", "f_stop"],
    "put_message_into_state": ["state", "queue", "f_stop"],
}
_STATE = {"installed": False}
_VCE_API = "flwr.server.superlink.fleet.vce.vce_api"


def add_messages_to_queue(state, queue, nodes_mapping, f_stop: threading.Event) -> None:
    """Flower's ``vce_api.add_messages_to_queue`` (put the messages of each node from the link
    state into the clients' queue, at most one per node per sweep), waking on :data:`PUSHED`."""
    while not f_stop.is_set():
        PUSHED.clear()
        for node_id in nodes_mapping.keys():
            for msg in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(msg)
        PUSHED.wait(IDLE_WAIT_S)


def put_message_into_state(state, queue, f_stop: threading.Event) -> None:
    """Flower's ``vce_api.put_message_into_state`` (store each reply from the queue in the link
    state), setting :data:`REPLIED` after each."""
    while not f_stop.is_set():
        try:
            reply = queue.get(timeout=IDLE_WAIT_S)
        except Empty:
            continue
        state.store_message_res(reply)
        REPLIED.set()


def install(if_imported: bool = False) -> bool:
    """Replace Flower's two thread functions by :func:`add_messages_to_queue` and
    :func:`put_message_into_state`; ``True`` when installed (also on a second call), ``False``
    when this Flower has no such functions or they take other arguments (left untouched).

    ``if_imported``: only where Flower's simulation runtime is already imported (the process
    that runs the simulation; not a Ray worker, which would import it for nothing)."""
    if _STATE["installed"]:
        return True
    if if_imported and _VCE_API not in sys.modules:
        return False
    try:
        from flwr.server.superlink.fleet.vce import vce_api
    except ImportError:
        return False
    for name, params in _EXPECTED.items():
        fn = getattr(vce_api, name, None)
        if fn is None or list(inspect.signature(fn).parameters) != params:
            return False
    vce_api.add_messages_to_queue = add_messages_to_queue
    vce_api.put_message_into_state = put_message_into_state
    if getattr(vce_api, "Queue", None) is Queue:  # the runtime's queues: see PromptQueue
        vce_api.Queue = PromptQueue
    _STATE["installed"] = True
    return True


class PromptQueue(Queue):
    """The runtime's message queues, whose timed ``get`` waits at most :data:`IDLE_WAIT_S`
    (raising ``Empty`` as a longer timeout would). Flower's ClientApp workers wait for the next
    message with ``get(timeout=1.0)`` and test the stop event only between two waits, so each
    simulation's end waited up to a second for them; every caller retries on ``Empty``."""

    def get(self, block: bool = True, timeout: float | None = None):
        if block and timeout is not None:
            timeout = min(timeout, IDLE_WAIT_S)
        return super().get(block, timeout)


def installed() -> bool:
    """Whether :func:`install` replaced Flower's functions in this process."""
    return _STATE["installed"]
