"""What ``flwr run`` shows when a run cannot start (issue 17, item 2): one plain line naming the
bad key (no traceback), and a supernode count that does not match ``num-clients`` fails at once
instead of after the 60 s connect timeout."""
from __future__ import annotations

import logging
import time

import pytest

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.federation import ClientFailure, wait_for_nodes
from simulations.server_app import OneLineUserErrors


def _record_for(err: BaseException) -> logging.LogRecord:
    try:
        raise RuntimeError("An error was encountered. Ending simulation.") from err
    except RuntimeError:
        import sys

        return logging.LogRecord("flwr", logging.ERROR, __file__, 1,
                                 "%s raised an exception", ("Simulation",), sys.exc_info())


def test_config_error_is_one_line_without_traceback():
    try:
        parse_run_config({"budgets": "-1,2"})
    except ConfigError as err:
        record = _record_for(err)
    handler = logging.StreamHandler()
    assert OneLineUserErrors().filter(record)
    text = handler.format(record)
    assert "Traceback" not in text and "\n" not in text
    assert text.startswith("fedgraph: invalid run config: budgets: every epsilon")


def test_other_exceptions_keep_their_traceback():
    record = _record_for(ZeroDivisionError("boom"))
    OneLineUserErrors().filter(record)
    assert "Traceback" in logging.StreamHandler().format(record)


class InMemoryGrid:  # the name is what wait_for_nodes recognizes as a simulation
    def __init__(self, n):
        self.n = n

    def get_node_ids(self):
        return list(range(self.n))


def test_simulation_with_too_few_supernodes_fails_within_seconds(monkeypatch):
    import fedgraph.federation as federation

    monkeypatch.setattr(federation, "SETTLE_S", 0.5)
    start = time.time()
    with pytest.raises(ClientFailure, match="has 5 supernodes .* num-clients=10"):
        wait_for_nodes(InMemoryGrid(5), 10, timeout=60)
    assert time.time() - start < 5


def test_too_few_supernodes_fail_within_seconds_behind_the_interruptible_grid(monkeypatch):
    """fedgraph's ServerApp wraps Flower's grid (simulations.interrupt): the simulation is
    still recognized (it waited out the 60 s timeout before)."""
    import fedgraph.federation as federation
    from simulations.grid import InterruptibleGrid

    monkeypatch.setattr(federation, "SETTLE_S", 0.5)
    start = time.time()
    with pytest.raises(ClientFailure, match="has 5 supernodes .* num-clients=10"):
        wait_for_nodes(InterruptibleGrid(InMemoryGrid(5)), 10, timeout=60)
    assert time.time() - start < 5


def test_deployment_grid_keeps_waiting_for_late_supernodes():
    class Grid(InMemoryGrid):
        pass  # another class name: a deployment, where supernodes connect one by one

    with pytest.raises(ClientFailure, match="only 5 of 10 supernodes connected"):
        wait_for_nodes(Grid(5), 10, timeout=1.0)
