"""The fedgraph ServerApp: validate the run config, run the method's strategy, write the report."""

from __future__ import annotations

# First, before the heavy imports: under flwr run this is the task's own process, whose
# heartbeats a loaded machine must not lose (fedgraph.simulations.task_heartbeat).
from fedgraph.simulations import task_heartbeat

task_heartbeat.start()  # does nothing outside flwr run's task process

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.errors import ClientFailure
from fedgraph.federation import preflight
from fedgraph.registry import ContractError
from fedgraph.simulations.flower_exit import write_report_on_flower_exit
from fedgraph.simulations.grid import InterruptibleGrid
from fedgraph.simulations.interrupt import serving
from fedgraph.simulations.supernodes import resolve_num_clients
from fedgraph.strategies import resolve_strategy
from fedgraph.strategies.base import check_method

#: errors whose message says everything (the key and its allowed values, the failing clients):
#: under ``flwr run`` they are logged as one line, without a traceback.
USER_ERRORS = (ConfigError, ClientFailure, ContractError)


class OneLineUserErrors(logging.Filter):
    """A filter for Flower's ``flwr`` logger: a record carrying one of :data:`USER_ERRORS`
    (Flower logs the ServerApp's exception with its traceback, e.g. "Simulation raised an
    exception") becomes the plain line ``fedgraph: <error>``; other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        while err is not None and not isinstance(err, USER_ERRORS):
            err = err.__cause__ or err.__context__
        if err is not None:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            record.msg, record.args = "fedgraph: %s", (" ".join(lines),)
            record.exc_info = record.exc_text = None
        return True


def _install_log_filter() -> None:
    log = logging.getLogger("flwr")
    if not any(isinstance(f, OneLineUserErrors) for f in log.filters):
        log.addFilter(OneLineUserErrors())


def run_server(grid: Grid, run_config: dict) -> dict:
    """Validate ``run_config`` and run its strategy on ``grid``; returns the report dict.

    Raises:
        fedgraph.config.ConfigError: invalid config (names the key and the allowed values).
        Exception: whatever the strategy raised (the report on disk says ``failed``).
    """
    strategy_cls, cfg = validate_run_config(run_config)
    stats = preflight(cfg)  # the harness knows the whole graph (a simulation): ground truth,
    return strategy_cls(cfg).start(grid, ground_truth=stats)  # written after the run


def validate_run_config(run_config: dict):
    """``(strategy class, validated config)``; raises ConfigError naming the bad key."""
    run_config = dict(run_config)
    strategy_spec = str(run_config.get("strategy", "") or run_config.get("method", "ppgnn"))
    cfg = parse_run_config(run_config)  # a strategy name (e.g. "privgnn") selects its config
    try:
        strategy = resolve_strategy(strategy_spec)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    check_method(strategy, cfg)  # before anything starts (no report for a config error)
    if getattr(cfg, "round_strategy", ""):  # the user's Flower strategy: imported and built now
        from fedgraph.strategies.fedavg import round_strategy

        try:
            round_strategy(cfg.round_strategy, cfg.round_strategy_args, max(cfg.num_clients, 1))
        except ValueError as err:  # (its cause: a user's constructor's error, with traceback)
            raise ConfigError(str(err)) from err.__cause__
    return strategy, cfg


def check_flwr_run_config(run_config: dict, defaults: dict | None = None) -> None:
    """Under ``flwr run``: refuse a key the user set (its value differs from
    ``pyproject.toml``'s default, into which Flower fused ``--run-config``) that belongs only to
    another method, e.g. ``hops=5`` for a PPGNN run, which would be ignored
    (:func:`~fedgraph.config.reject_keys_of_other_methods`, as ``fedgraph run`` refuses it).
    ``defaults``: ``None`` reads the project file's; nothing is checked without one.

    Raises:
        fedgraph.config.ConfigError: naming each such key and the run's method.
    """
    from fedgraph.config import reject_keys_of_other_methods
    from fedgraph.simulations.run_files import pyproject_defaults

    defaults = pyproject_defaults() if defaults is None else defaults
    if defaults is None:
        return
    user_set = {k: v for k, v in run_config.items() if k not in defaults or defaults[k] != v}
    reject_keys_of_other_methods(
        {"method": run_config.get("method", defaults.get("method")), **user_set}
    )


def make_server_app(overrides: dict | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated with ``overrides``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        _install_log_filter()
        serving()
        write_report_on_flower_exit()
        grid = InterruptibleGrid(grid)
        if overrides is None:  # flwr run (fedgraph run checked the keys its user set)
            check_flwr_run_config(dict(context.run_config))
        run_server(
            grid, resolve_num_clients(grid, {**dict(context.run_config), **(overrides or {})})
        )

    return app


app = make_server_app()
