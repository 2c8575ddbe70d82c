"""The exceptions a run can end with, below every layer that raises or reports them.

``ConfigError`` is raised by the run config's validation (:mod:`fedgraph.config`) and by every
check that refuses an input before anything runs (the noise secret, the device, the
preflight); it lives here so that those checks sit below the config in the layer contract.

``ClientFailure`` and ``RunInterrupted`` are raised by the federation's messaging
(:mod:`fedgraph.messaging`) and read by the report (:mod:`fedgraph.report`) and the command
line; keeping them here lets the report sit below the federation (the layer contract in
``pyproject.toml``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A run-config value is invalid; the message names the key and the allowed values."""


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
