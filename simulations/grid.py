"""The grid of fedgraph's ServerApp: Flower's, made to give up at Ctrl-C
(:mod:`fedgraph.simulations.interrupt`) and to wake when a reply is stored (:mod:`fedgraph.simulations.wakeups`)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.serverapp import Grid

from fedgraph.errors import RunInterrupted
from fedgraph.simulations.interrupt import STOP
from fedgraph.simulations.wakeups import PUSHED, REPLIED

__all__ = ["InterruptibleGrid"]


class InterruptibleGrid(Grid):
    """A Flower ``Grid`` that forwards every call to ``grid`` and gives up waiting for replies
    (:class:`RunInterrupted`) within ``poll`` seconds of :data:`STOP` being set."""

    def __init__(self, grid: Grid, poll: float = 0.2) -> None:
        self._grid, self._poll = grid, poll
        self._handling = 0.0  # seconds in on_reply during the current send_and_receive

    @property
    def wrapped(self) -> Grid:
        """The grid this one forwards to."""
        return self._grid

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, *args, **kwargs):
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        self._check()
        return self._grid.get_node_ids()

    def push_messages(self, messages):
        self._check()
        ids = self._grid.push_messages(messages)
        PUSHED.set()  # Flower's simulation runtime takes them at once (fedgraph.simulations.wakeups)
        return ids

    def pull_messages(self, message_ids):
        return self._grid.pull_messages(message_ids)

    #: :meth:`send_and_receive` takes ``on_reply`` (:func:`fedgraph.messaging.send_to_all`)
    streams_replies = True

    def send_and_receive(self, messages, *, timeout: float | None = None, on_reply=None, pushed=()):
        """As Flower's: push, then pull until every reply arrived or ``timeout`` passed (between
        two pulls it waits ``poll`` seconds or until a reply was stored: :data:`REPLIED`).
        ``on_reply(message)``, if given, is called with every reply as it is pulled, so the
        server can work on it while the other clients compute; its time is the server's own
        work, not the exchange's. ``pushed``: ids of messages pushed earlier whose replies
        belong to this exchange (:func:`fedgraph.messaging.push_message`).

        Raises:
            RunInterrupted: :data:`STOP` was set (Ctrl-C) before all replies arrived.
        """
        from fedgraph.report import exchanged

        started, self._handling = time.perf_counter(), 0.0
        try:
            return self._exchange(list(messages), timeout, on_reply, list(pushed))
        finally:  # the report's exchange_s
            exchanged(time.perf_counter() - started - self._handling)

    def _exchange(
        self, messages: list, timeout: float | None, on_reply=None, pushed: list = ()
    ) -> list:
        """:meth:`send_and_receive`'s push and pulls."""
        from fedgraph.report import progress, progress_round

        first = getattr(messages[0], "metadata", None) if messages else None
        if getattr(first, "message_type", "").split(".")[0] == "train":
            progress_round()  # a Flower strategy's round: its train messages go out
        pending = set(pushed) | set(self.push_messages(messages))
        expected = len(pending)
        end = None if timeout is None else time.monotonic() + timeout
        replies = []
        while pending and (end is None or time.monotonic() < end):
            self._check()
            got = list(self.pull_messages(pending))
            replies.extend(got)
            if on_reply is not None and got:
                t = time.perf_counter()
                for m in got:
                    on_reply(m)
                self._handling += time.perf_counter() - t
            pending -= {m.metadata.reply_to_message_id for m in got}
            progress("clients", len(replies), expected)
            if pending:
                REPLIED.wait(self._poll)
                REPLIED.clear()
        return replies

    def __getattr__(self, name):  # anything else a grid offers
        return getattr(self._grid, name)

    @staticmethod
    def _check() -> None:
        if STOP.is_set():
            raise RunInterrupted("interrupted (Ctrl-C or SIGTERM)")
