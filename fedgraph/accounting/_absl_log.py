"""dp-accounting logs through absl (the ``absl`` Python logger). Its RDP accountant warns once
per order when an extreme event (e.g. epsilon 1e-300) makes a divergence numerically negative:
about 100 lines per run; and its first warning, reaching a root logger without handlers, made
Python configure one (``logging.basicConfig``), after which Flower's DEBUG lines were printed
too (absl calls it whenever the root logger has none). :func:`install` gives the ``absl``
logger a handler of its own (stderr) that prints each distinct message once, and stops it
propagating to the root logger; :func:`fedgraph._lazy.no_root_logging_config` keeps absl from
configuring the root logger during a call into dp-accounting."""

from __future__ import annotations

import logging
import sys


class _Once(logging.Filter):
    """Pass the first record of each message template, drop the repeats."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _Stderr(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is at the time (tests capture it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def install() -> None:
    """Idempotent (module docs)."""
    logger = logging.getLogger("absl")
    if any(getattr(h, "_fedgraph", False) for h in logger.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(
        logging.Formatter("%(levelname)s: dp-accounting: %(message)s (shown once)")
    )
    handler.addFilter(_Once())
    handler._fedgraph = True
    logger.addHandler(handler)
    logger.propagate = False
