"""The exceptions a run can end with, below every layer that raises or reports them.

``ClientFailure`` and ``RunInterrupted`` are raised by the federation's messaging
(:mod:`fedgraph.federation`) and read by the report (:mod:`fedgraph.report`) and the command
line; keeping them here lets the report sit below the federation (the layer contract in
``pyproject.toml``).
"""
from __future__ import annotations


class ClientFailure(RuntimeError):
    """A client answered with an error or did not answer in time.

    ``replies``: node id -> reply content of the clients that did answer (their releases left
    them: a strategy records them in its ledger before re-raising)."""

    def __init__(self, message: str, replies: dict | None = None):
        super().__init__(message)
        self.replies = dict(replies or {})


class RunInterrupted(Exception):
    """The user interrupted the run (Ctrl-C or SIGTERM): the report says ``interrupted``."""

    def __init__(self, message: str = "interrupted (Ctrl-C or SIGTERM)") -> None:
        super().__init__(message)
