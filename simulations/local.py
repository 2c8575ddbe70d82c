"""Run a strategy against the ClientApp in one process, without Flower's simulation engine.

For unit tests of a custom strategy, mechanism or dataset: seconds instead of the half minute
a Ray start costs, tracebacks from the client half in the same process, and the same strategy,
ClientApp handlers, ledger and report as ``fedgraph run``. Clients answer one after another,
in the order the server sent the messages (as one Ray actor does), and the replies reach the
strategy one by one, as fedgraph's grid streams them (``on_reply``; messages sent ahead of an
exchange, ``pushed``), so GAP's pipelined PMA runs here as under Ray. Timeouts and
concurrency are not exercised: ``fedgraph run`` / ``flwr run .`` remain the real thing.

    from fedgraph.simulations.local import run_local
    report = run_local({"strategy": "mypkg.mod:MyStrategy", "num-clients": 2, "epochs": 5,
                        "output-dir": "runs"})
"""

from __future__ import annotations

from flwr.app import Context, Error, Message, RecordDict


class LocalGrid:
    """A Flower ``Grid`` stand-in: ``num_clients`` nodes (ids ``1..num_clients``, partition ids
    ``0..num_clients-1``), each with its own ``Context`` (state kept across messages), answered
    by ``client_app`` in this process.

    Args:
        num_clients: number of supernodes.
        client_app: the ClientApp (default: :data:`fedgraph.simulations.client_app.app`).
        fail: ``fail(message) -> bool``; the requests it selects get an error reply instead of
            an answer (a client that drops out).
        tamper: ``tamper(message, reply) -> reply``; replaces each answer (a misbehaving
            client, a lossy network).
        record: keep every ``(request, reply)`` the server sees in :attr:`log`, after
            ``fail`` and ``tamper`` (an audit of what leaves the clients).

    Each client's own run config (its budget: :func:`fedgraph.simulations.client_guard.
    own_config`) is its ``context.run_config``: :func:`run_local` provisions it
    (:meth:`provision`), as ``fedgraph run`` and ``flwr run`` do; a grid no launcher
    provisioned (a strategy's unit test, ``MyStrategy(cfg).start(LocalGrid(2))``) gives each
    client the first run config it receives (trust on first use: a server's word, so a test of
    a hostile server provisions first).

    Like ``fedgraph run``, it provisions the clients' identity keys for secure aggregation
    (:func:`fedgraph.identity.ensure_simulation_secret`: ``$FEDGRAPH_IDENTITY_SECRET`` from
    ``os.urandom`` when unset; the clients read it, the strategy never does).
    """

    def __init__(
        self, num_clients: int, client_app=None, *, fail=None, tamper=None, record: bool = False
    ):
        from flwr.supercore.task_identity import TaskIdentity

        from fedgraph.identity import ensure_simulation_secret

        ensure_simulation_secret()  # the launcher provisions the clients' identity keys
        if client_app is None:
            from fedgraph.simulations.client_app import app as client_app
        self.client_app = client_app
        # Flower stamps new messages with the running task's identity; set one (a server).
        for attr, value in (("run_id", 1), ("node_id", 0), ("task_id", 0)):
            if getattr(TaskIdentity, f"_{attr}") is None:
                setattr(TaskIdentity, attr, value)
        self.contexts = {
            i + 1: Context(
                run_id=1,
                node_id=i + 1,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": i, "num-partitions": num_clients},
            )
            for i in range(num_clients)
        }
        self.fail, self.tamper, self.record = fail, tamper, record
        self.log: list[tuple[Message, Message]] = []
        self._queue: list[tuple[str, Message]] = []  # pushed, not yet answered, in push order
        self._answered: dict[str, Message] = {}  # answered, reply not yet collected
        self._pushed = 0

    def provision(self, run_config: dict) -> None:
        """Give every client without one its own run config (``context.run_config``), as a
        deployment's node config does: its budget and guarantee are its own, never the
        server's word (:func:`fedgraph.simulations.routes.common.own_config`)."""
        for ctx in self.contexts.values():
            if not ctx.run_config:
                ctx.run_config = dict(run_config)

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(
            content=content,
            dst_node_id=dst_node_id,
            message_type=message_type,
            group_id=group_id,
            ttl=ttl,
        )

    #: :meth:`send_and_receive` takes ``on_reply`` and ``pushed``, as fedgraph's grid over
    #: Flower's (:class:`fedgraph.simulations.grid.InterruptibleGrid`)
    streams_replies = True

    def push_messages(self, messages) -> list[str]:
        """Queue ``messages`` (answered in push order, as one Ray actor answers them, when an
        exchange waits for them or for a later one); returns their ids."""
        ids = []
        for m in messages:
            self._pushed += 1
            ids.append(f"local-{self._pushed}")
            self._queue.append((ids[-1], m))
        return ids

    def send_and_receive(
        self, messages, *, timeout: float | None = None, on_reply=None, pushed=()
    ) -> list[Message]:
        """Push ``messages``, then answer the queue in push order (each message by the
        ClientApp of its destination) until the replies of these and of ``pushed`` (ids of
        messages pushed earlier) are in; ``on_reply(reply)`` is called with each as it is
        answered (its time is the server's own, not the exchange's). A handler's exception
        becomes an error reply, as in Flower (the time goes to the report's ``exchange_s``,
        as with Flower's grid)."""
        import time

        from fedgraph.report import exchanged

        started, handling, replies = time.perf_counter(), 0.0, []
        pending = list(pushed) + self.push_messages(messages)
        waiting = set(pending)

        def collect(reply) -> None:
            nonlocal handling
            replies.append(reply)
            if on_reply is not None:
                t = time.perf_counter()
                on_reply(reply)
                handling += time.perf_counter() - t

        for mid in pending:  # answered while an earlier exchange waited
            if mid in self._answered:
                waiting.discard(mid)
                collect(self._answered.pop(mid))
        while waiting:
            if not self._queue:
                raise ValueError(f"pushed: no message was pushed with id(s) {sorted(waiting)}")
            mid, m = self._queue.pop(0)
            reply = self._answer(m)
            if mid in waiting:
                waiting.discard(mid)
                collect(reply)
            else:  # pushed for a later exchange
                self._answered[mid] = reply
        exchanged(time.perf_counter() - started - handling)
        return replies

    def _answer(self, m: Message) -> Message:
        if self.fail is not None and self.fail(m):
            reply = Message(Error(code=1, reason="RuntimeError: dropped out"), reply_to=m)
        else:
            context = self.contexts[m.metadata.dst_node_id]
            if not context.run_config and "config" in m.content:
                # a unit test's grid that no launcher provisioned (strategy(cfg).start(grid)):
                # the client takes the first run config it receives as its own (trust on first
                # use; run_local and provision() give it its own beforehand, as fedgraph run
                # and flwr run do)
                import json

                context.run_config = json.loads(str(m.content["config"]["json"]))
            reply = self.client_app(m, context)
            if self.tamper is not None:
                reply = self.tamper(m, reply)
        if self.record:
            self.log.append((m, reply))
        return reply


def run_local(run_config: dict, grid: LocalGrid | None = None) -> dict:
    """Validate ``run_config`` (flat Flower keys), run its strategy on ``grid`` (default: a
    :class:`LocalGrid` with ``num-clients`` nodes); returns the report dict (also written to
    ``output-dir``).

    Raises:
        fedgraph.config.ConfigError: invalid config or failed preflight.
        Exception: whatever the strategy raised (the report on disk says ``failed``).
    """
    from fedgraph.federation import preflight
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(run_config)
    stats = preflight(cfg)  # the report's ground_truth, written after the run, never sent
    grid = grid if grid is not None else LocalGrid(cfg.num_clients)
    grid.provision(run_config)
    return strategy_cls(cfg).start(grid, ground_truth=stats)
