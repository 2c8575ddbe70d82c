"""What ``flwr run`` shows when a run cannot start (issue 17, item 2): one plain line naming the
bad key (no traceback), and a supernode count that does not match ``num-clients`` fails at once
instead of after the 60 s connect timeout."""

from __future__ import annotations

import logging
import time

import pytest

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.errors import ClientFailure
from fedgraph.messaging import wait_for_nodes
from fedgraph.simulations.server_app import OneLineUserErrors


def _record_for(err: BaseException) -> logging.LogRecord:
    try:
        raise RuntimeError("An error was encountered. Ending simulation.") from err
    except RuntimeError:
        import sys

        return logging.LogRecord(
            "flwr",
            logging.ERROR,
            __file__,
            1,
            "%s raised an exception",
            ("Simulation",),
            sys.exc_info(),
        )


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
    import fedgraph.messaging as messaging

    monkeypatch.setattr(messaging, "SETTLE_S", 0.5)
    start = time.time()
    with pytest.raises(ClientFailure, match="has 5 supernodes .* num-clients=10"):
        wait_for_nodes(InMemoryGrid(5), 10, timeout=60)
    assert time.time() - start < 5


def test_too_few_supernodes_fail_within_seconds_behind_the_interruptible_grid(monkeypatch):
    """fedgraph's ServerApp wraps Flower's grid (fedgraph.simulations.interrupt): the simulation is
    still recognized (it waited out the 60 s timeout before)."""
    import fedgraph.messaging as messaging
    from fedgraph.simulations.grid import InterruptibleGrid

    monkeypatch.setattr(messaging, "SETTLE_S", 0.5)
    start = time.time()
    with pytest.raises(ClientFailure, match="has 5 supernodes .* num-clients=10"):
        wait_for_nodes(InterruptibleGrid(InMemoryGrid(5)), 10, timeout=60)
    assert time.time() - start < 5


def test_deployment_grid_keeps_waiting_for_late_supernodes():
    class Grid(InMemoryGrid):
        pass  # another class name: a deployment, where supernodes connect one by one

    with pytest.raises(ClientFailure, match="only 5 of 10 supernodes connected"):
        wait_for_nodes(Grid(5), 10, timeout=1.0)


def test_num_clients_comes_from_the_supernodes():
    """``flwr run .`` on Flower's default federation (2 supernodes): pyproject's
    ``num-clients = 0`` becomes the grid's count; a missing key too (``fedgraph run``)."""
    from fedgraph.simulations.grid import InterruptibleGrid
    from fedgraph.simulations.supernodes import resolve_num_clients

    grid = InterruptibleGrid(InMemoryGrid(2))
    assert resolve_num_clients(grid, {"num-clients": 0}, settle=0.1)["num-clients"] == 2
    assert resolve_num_clients(grid, {}, settle=0.1)["num-clients"] == 2
    assert resolve_num_clients(grid, {"num-clients": 2}, settle=0.1)["num-clients"] == 2


def test_explicit_num_clients_other_than_the_supernodes_is_refused_naming_both():
    from fedgraph.simulations.supernodes import resolve_num_clients

    start = time.time()
    with pytest.raises(ConfigError, match="num-clients=5 but the federation has 2 supernodes"):
        resolve_num_clients(InMemoryGrid(2), {"num-clients": 5}, settle=0.1)
    assert time.time() - start < 2


@pytest.mark.parametrize("bad", [-1, -5, True])
def test_a_num_clients_out_of_range_is_left_to_the_range_check(bad):
    """``flwr run . --run-config "num-clients=-1"`` gets the config's range error
    (``allowed: [1, 100000]``), not a hint to run with ``num-supernodes=-1``."""
    from fedgraph.config import parse_run_config
    from fedgraph.simulations.supernodes import resolve_num_clients

    assert resolve_num_clients(InMemoryGrid(2), {"num-clients": bad}, settle=0.1) == {
        "num-clients": bad
    }
    if bad is not True:
        with pytest.raises(ConfigError, match=r"num-clients: .*allowed: \[1, 100000\]"):
            parse_run_config({"method": "gap", "num-clients": bad})


def test_a_deployment_keeps_an_explicit_num_clients():
    from fedgraph.simulations.supernodes import resolve_num_clients

    class Grid(InMemoryGrid):
        pass  # supernodes connect one by one: the connect phase waits for them

    assert resolve_num_clients(Grid(2), {"num-clients": 5})["num-clients"] == 5


def test_flwr_run_refuses_a_key_of_another_method_the_user_set(monkeypatch):
    """Under ``flwr run`` every key of pyproject.toml reaches the ServerApp; one the user set
    (its value is not the file's default) that belongs only to another method would be
    ignored, so it is refused before anything starts, as ``fedgraph run`` refuses it."""
    from fedgraph.simulations import interrupt, run_files, server_app

    defaults = run_files.pyproject_defaults()
    assert defaults and defaults["method"] == "ppgnn" and "hops" in defaults
    server_app.check_flwr_run_config(dict(defaults))  # the defaults alone: nothing set
    server_app.check_flwr_run_config({**defaults, "method": "gap", "hops": 5})  # GAP's own
    for bad in ({"hops": 5}, {"hops": "two"}):
        with pytest.raises(
            ConfigError, match="hops: a key of method 'gap'.*not of this run's method 'ppgnn'"
        ):
            server_app.check_flwr_run_config({**defaults, **bad})

    class Context:  # what the ServerApp reads under flwr run
        run_config = {**defaults, "hops": 5}

    started = []
    monkeypatch.setattr(server_app, "run_server", lambda *a: started.append(a))
    monkeypatch.setattr(server_app, "write_report_on_flower_exit", lambda: None)
    monkeypatch.setattr(server_app, "_install_log_filter", lambda: None)  # no lasting filter
    monkeypatch.setattr(interrupt, "_SERVER_THREAD", [])
    with pytest.raises(ConfigError, match="hops"):
        server_app.make_server_app()._main(object(), Context())
    assert not started
    # an installed wheel has no project file beside it: nothing to compare with, no check
    assert run_files.pyproject_defaults(run_files.PYPROJECT.parent / "missing.toml") is None
    monkeypatch.setattr(run_files, "pyproject_defaults", lambda: None)
    server_app.check_flwr_run_config({**defaults, "hops": 5})
