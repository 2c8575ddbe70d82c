"""Run a strategy against the ClientApp in one process, without Flower's simulation engine.

For unit tests of a custom strategy, mechanism or dataset: seconds instead of the half minute
a Ray start costs, tracebacks from the client half in the same process, and the same strategy,
ClientApp handlers, ledger and report as ``fedgraph run``. Clients answer one after another,
so timeouts and concurrency are not exercised: ``fedgraph run`` / ``flwr run .`` remain the
real thing.

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
    """

    def __init__(self, num_clients: int, client_app=None, *, fail=None, tamper=None,
                 record: bool = False):
        from flwr.supercore.task_identity import TaskIdentity

        if client_app is None:
            from fedgraph.simulations.client_app import app as client_app
        self.client_app = client_app
        # Flower stamps new messages with the running task's identity; set one (a server).
        for attr, value in (("run_id", 1), ("node_id", 0), ("task_id", 0)):
            if getattr(TaskIdentity, f"_{attr}") is None:
                setattr(TaskIdentity, attr, value)
        self.contexts = {i + 1: Context(run_id=1, node_id=i + 1, state=RecordDict(), run_config={},
                                        node_config={"partition-id": i, "num-partitions": num_clients})
                         for i in range(num_clients)}
        self.fail, self.tamper, self.record = fail, tamper, record
        self.log: list[tuple[Message, Message]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        """Every message handled by the ClientApp of its destination, in order; a handler's
        exception becomes an error reply, as in Flower (the time goes to the report's
        ``exchange_s``, as with Flower's grid)."""
        import time

        from fedgraph.report import exchanged

        started, replies = time.perf_counter(), []
        for m in messages:
            if self.fail is not None and self.fail(m):
                reply = Message(Error(code=1, reason="RuntimeError: dropped out"), reply_to=m)
            else:
                reply = self.client_app(m, self.contexts[m.metadata.dst_node_id])
                if self.tamper is not None:
                    reply = self.tamper(m, reply)
            if self.record:
                self.log.append((m, reply))
            replies.append(reply)
        exchanged(time.perf_counter() - started)
        return replies


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
    return strategy_cls(cfg).start(grid if grid is not None else LocalGrid(cfg.num_clients),
                                   ground_truth=stats)
