"""The fedgraph ServerApp: validate the run config, run the method's strategy, write the report."""
from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.federation import preflight
from strategies import resolve_strategy


def run_server(grid: Grid, run_config: dict) -> dict:
    """Validate ``run_config`` and run its strategy on ``grid``; returns the report dict.

    Raises:
        fedgraph.config.ConfigError: invalid config (names the key and the allowed values).
        Exception: whatever the strategy raised (the report on disk says ``failed``).
    """
    strategy_cls, cfg = validate_run_config(run_config)
    preflight(cfg)
    return strategy_cls(cfg).start(grid)


def validate_run_config(run_config: dict):
    """``(strategy class, validated config)``; raises ConfigError naming the bad key."""
    run_config = dict(run_config)
    strategy_spec = str(run_config.get("strategy", "") or run_config.get("method", "ppgnn"))
    cfg = parse_run_config(run_config)  # a strategy name (e.g. "privgnn") selects its config
    try:
        return resolve_strategy(strategy_spec), cfg
    except ValueError as err:
        raise ConfigError(str(err)) from None


def make_server_app(overrides: dict | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated with ``overrides``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, {**dict(context.run_config), **(overrides or {})})

    return app


app = make_server_app()
