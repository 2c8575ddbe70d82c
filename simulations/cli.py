"""``fedgraph`` command line: run a simulation that fails loudly, list datasets.

``flwr run .`` exits 0 even when a run fails; ``fedgraph run`` runs the same ServerApp and
ClientApp through Flower's simulation engine in-process, checks the report the strategy wrote,
and exits non-zero (1: the run failed, 2: invalid config) with the reason.
"""
from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import List, Optional

import typer

cli = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Federated simulations of differentially private graph learning.")
PRESETS = Path(__file__).parent / "presets"


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_run_config(preset: Optional[str], overrides: List[str]) -> dict:
    """Defaults of ``pyproject``'s ``[tool.flwr.app.config]`` are the config models' defaults;
    a preset (name in ``simulations/presets`` or a TOML path) and ``key=value`` overrides go
    on top."""
    cfg: dict = {}
    if preset:
        path = Path(preset)
        if not path.exists():
            path = PRESETS / f"{preset}.toml"
        if not path.exists():
            names = sorted(p.stem for p in PRESETS.glob("*.toml"))
            raise typer.BadParameter(f"preset {preset!r} not found; known presets: {names}")
        cfg.update(tomllib.loads(path.read_text()))
    for item in overrides:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        cfg[k.strip()] = _parse_value(v.strip())
    return cfg


def run_simulation(run_config: dict, num_cpus: Optional[int] = None,
                   cpus_per_client: float = 1.0, gpus_per_client: float = 0.0) -> dict:
    """Run one simulation in-process; return the report dict.

    Raises:
        fedgraph.config.ConfigError: invalid config (before anything starts).
        RuntimeError: the run failed; the message carries the report's error.
    """
    from flwr.simulation import run_simulation as flwr_run_simulation

    from fedgraph.federation import preflight
    from simulations.client_app import app as client_app
    from simulations.server_app import make_server_app, validate_run_config

    _, cfg = validate_run_config(run_config)
    preflight(cfg)
    run_name = cfg.run_name or f"{cfg.method}-{cfg.dataset.replace(':', '_')}-seed{cfg.seed}-{os.getpid()}"
    run_config = {**run_config, "run-name": run_name,
                  "output-dir": str(Path(cfg.output_dir).expanduser().resolve())}
    report_path = Path(run_config["output-dir"]) / f"{run_name}.json"
    report_path.unlink(missing_ok=True)
    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
               "init_args": {"num_cpus": num_cpus or os.cpu_count() or 1,
                             "include_dashboard": False}}
    flwr_run_simulation(server_app=make_server_app(run_config), client_app=client_app,
                        num_supernodes=cfg.num_clients, backend_config=backend)
    if not report_path.exists():
        raise RuntimeError(f"the run wrote no report at {report_path}: it failed before the "
                           "strategy started (see the log above)")
    report = json.loads(report_path.read_text())
    if report["status"] != "ok":
        raise RuntimeError(f"run failed: {report['error']} (report: {report_path})")
    return report


@cli.command()
def run(
    preset: Optional[str] = typer.Argument(None, help="preset name in simulations/presets or a TOML file"),
    set_: List[str] = typer.Option([], "--set", "-s", help="override a run-config key: key=value"),
    num_cpus: Optional[int] = typer.Option(None, help="CPUs Ray may use (default: all)"),
    cpus_per_client: float = typer.Option(1.0, help="CPUs reserved per client"),
    gpus_per_client: float = typer.Option(0.0, help="GPU share per client (0: CPU)"),
) -> None:
    """Run one simulation; exit 1 if it fails, 2 if the config is invalid."""
    from fedgraph.config import ConfigError

    try:
        cfg = load_run_config(preset, set_)
        run_simulation(cfg, num_cpus, cpus_per_client, gpus_per_client)
    except (ConfigError, typer.BadParameter) as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    except Exception as err:  # noqa: BLE001 - report every failure and exit non-zero
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        raise typer.Exit(1)


@cli.command()
def datasets(root: Optional[str] = typer.Option(None, help="dataset root (default: $FEDGRAPH_DATA or cache)")) -> None:
    """List the known datasets, their statistics and whether each loads offline."""
    from fedgraph.data import KNOWN_DATASETS, dataset_statistics, load_dataset

    for name in KNOWN_DATASETS:
        if ":" in name:
            typer.echo(f"{name:<24} Facebook100 college, e.g. facebook100:Caltech36 (class-year task)")
            continue
        try:
            s = dataset_statistics(load_dataset(name, root))
            typer.echo(f"{name:<24} offline  nodes {s['num_nodes']:>7}  edges {s['num_edges']:>9}  "
                       f"features {s['num_features']:>5}  classes {s['num_classes']}")
        except FileNotFoundError:
            typer.echo(f"{name:<24} not available offline (downloads when online)")


def main() -> None:  # console script entry point
    cli()


if __name__ == "__main__":
    sys.exit(main())
