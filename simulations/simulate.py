"""One simulation in-process (``fedgraph run``): validate the run config without torch
(:func:`check_run_config`), start Ray early where the config allows (:mod:`fedgraph.simulations.early_ray`),
run the preflight and Flower's simulation engine, and read back the report the strategy wrote
(:func:`run_simulation`)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from fedgraph.simulations.resources import check_resources
from fedgraph.simulations.user_code import user_code


def check_run_config(run_config: dict):
    """Validate ``run_config`` (:func:`fedgraph.config.parse_run_config`) and its strategy's
    name without importing torch, PyG, Flower or Ray where the names are fedgraph's own
    (:mod:`fedgraph.catalog`): a config error is reported in well under a second. Returns the
    parsed config.

    Raises:
        fedgraph.config.ConfigError: naming the key and the allowed values (the same message
            :func:`run_simulation` gives), a built-in dataset's missing files among them
            (:func:`fedgraph.config.check_dataset_files`).
    """
    from fedgraph import catalog
    from fedgraph.config import (
        ConfigError,
        check_data_root,
        check_dataset_files,
        check_output_dir,
        parse_run_config,
    )

    cfg = parse_run_config(run_config)
    check_data_root(cfg)
    check_output_dir(cfg)
    check_dataset_files(cfg)
    if cfg.noise_source == "secret" and not os.environ.get("RAY_ADDRESS"):
        from fedgraph.secret import check_secret  # a local Ray's workers inherit it

        check_secret({})
    identity = os.environ.get("FEDGRAPH_IDENTITY_SECRET", "")  # (fedgraph.identity.IDENTITY_ENV)
    if getattr(cfg, "secure_aggregation", False) and identity and len(identity) < 16:
        raise ConfigError(
            f"$FEDGRAPH_IDENTITY_SECRET has {len(identity)} characters; use at "
            "least 16 random ones, or unset it (fedgraph run then draws one): it "
            "provisions the clients' identity keys for secure aggregation"
        )
    spec = str(run_config.get("strategy", "") or run_config.get("method", "ppgnn"))
    try:
        catalog.check_name("strategy", spec)
    except ValueError as err:  # as fedgraph.simulations.server_app.validate_run_config words it
        raise ConfigError(str(err)) from None
    return cfg


def run_simulation(
    run_config: dict,
    num_cpus: int | None = None,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    label: str | None = None,
) -> dict:
    """Run one simulation in-process; return the report dict. Without ``run-name`` the report
    is named ``<label or method>-<dataset>-seed<seed>-<time>-<pid>`` (``method``: the
    strategy's, as under ``flwr run``, which writes the same name for the same config; a
    ``label`` ending with the dataset does not repeat it).

    Raises:
        fedgraph.config.ConfigError: invalid config (before anything starts).
        RuntimeError: the run failed; the message carries the report's error.
    """
    from fedgraph.identity import ensure_simulation_secret
    from fedgraph.simulations.early_ray import start_early_ray

    # provisioning of the clients' identity keys (secure aggregation), before Ray starts: a
    # local Ray's workers inherit this environment; the server code never reads it
    ensure_simulation_secret()
    from fedgraph.simulations.client_guard import OWN_CONFIG_ENV

    # Every simulated client's own run config, the stand-in for a deployed client's node
    # config: its budget is its own, not the server's word (fedgraph.client_authority). Set
    # before Ray starts: its workers inherit it.
    os.environ[OWN_CONFIG_ENV] = json.dumps(dict(run_config), sort_keys=True, default=str)
    backend = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
        "init_args": {"num_cpus": num_cpus or os.cpu_count() or 1, "include_dashboard": False},
    }
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster: its resources, not ours
        backend["init_args"] = {"address": os.environ["RAY_ADDRESS"]}
    # Ray starts while the imports and the preflight below run (fedgraph.simulations.early_ray);
    # Flower then finds it running and uses it.
    # With its client actors, which import while the driver does (fedgraph.simulations.early_ray).
    method = _early_ray_method(run_config)
    early = (
        None
        if method is None
        else start_early_ray(backend["init_args"], backend["client_resources"], method)
    )
    try:
        flwr_run_simulation, cfg, make_server_app, client_app, default_run_name, spec_label = (
            _prepare(run_config, num_cpus, cpus_per_client, gpus_per_client)
        )
        if early is not None:
            early.wait()
    except BaseException:
        if early is not None:  # a refused config or preflight: no Ray left behind
            try:
                early.wait()
                import ray

                ray.shutdown()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
            early.release()
        raise
    try:
        return _run(
            run_config,
            cfg,
            label,
            backend,
            flwr_run_simulation,
            make_server_app,
            client_app,
            default_run_name,
            spec_label,
        )
    finally:
        if early is not None:
            early.release()


class _NotOurDeprecation:
    """Drops Flower's "`run_simulation` is deprecated ... use `flwr run`" warning: ``fedgraph
    run`` calls that API itself, and the user, who typed ``fedgraph run`` (or is told that
    ``flwr run .`` is the other way in), has nothing to change."""

    def filter(self, record) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()


def _run(
    run_config,
    cfg,
    label,
    backend,
    flwr_run_simulation,
    make_server_app,
    client_app,
    default_run_name,
    spec_label,
) -> dict:
    from fedgraph.errors import RunInterrupted

    # Default name: the strategy's method and the dataset's, file-name safe; the same rule as
    # the strategy's own under flwr run (fedgraph.strategies.base.PrivateStrategy.report_path).
    from fedgraph.simulations.server_app import validate_run_config

    method = label or validate_run_config(run_config)[0].method
    run_name = cfg.run_name or default_run_name(method, spec_label(cfg.dataset), cfg.seed)
    run_config = {
        **run_config,
        "run-name": run_name,
        "output-dir": str(Path(cfg.output_dir).expanduser().resolve()),
    }
    report_path = Path(run_config["output-dir"]) / f"{run_name}.json"
    report_path.unlink(missing_ok=True)
    from fedgraph.simulations.interrupt import REPORT_PATH

    REPORT_PATH[:] = [report_path]
    import logging

    flwr_log = logging.getLogger("flwr")
    quiet = _NotOurDeprecation()
    flwr_log.addFilter(quiet)
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster Ray was not started on early:
        import ray  # connect as Flower would, with what the clients need in their environment

        if not ray.is_initialized():
            from fedgraph.simulations.early_ray import worker_env

            ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": worker_env()})
    try:
        flwr_run_simulation(
            server_app=make_server_app(run_config),
            client_app=client_app,
            num_supernodes=cfg.num_clients,
            backend_config=backend,
        )
    finally:
        flwr_log.removeFilter(quiet)
    if not report_path.exists():
        raise RuntimeError(
            f"the run wrote no report at {report_path}: it failed before the "
            "strategy started (see the log above)"
        )
    report = json.loads(report_path.read_text())
    if report["status"] == "interrupted":
        raise RunInterrupted(f"run interrupted; its report, with what was spent: {report_path}")
    if report["status"] != "ok":
        raise RuntimeError(f"run failed: {report['error']} (report: {report_path})")
    return report


def _early_ray_method(run_config: dict) -> str | None:
    """The run's method if :func:`check_run_config` accepts ``run_config`` (no torch import;
    with ``noise-source = secret`` that includes the secret in this environment, which a local
    Ray's workers inherit): only then is Ray started early, with client actors warmed up for
    this method; else ``None``."""
    from fedgraph.config import ConfigError

    if user_code(run_config):  # the user's code is imported and run (the preflight) first:
        return None  # its error comes before Ray starts, not after
    try:
        cfg = check_run_config(run_config)
        if getattr(cfg, "round_strategy", ""):  # a Flower strategy by name: its error first
            from fedgraph.strategies.fedavg import round_strategy

            round_strategy(cfg.round_strategy, cfg.round_strategy_args, max(cfg.num_clients, 1))
        return cfg.method
    except (ConfigError, ValueError):  # (a secret run without its secret among them)
        return None


def _prepare(run_config: dict, num_cpus, cpus_per_client: float, gpus_per_client: float):
    """The imports, the config's validation and the preflight of :func:`run_simulation`."""
    from flwr.simulation import run_simulation as flwr_run_simulation

    from fedgraph.federation import preflight
    from fedgraph.registry import spec_label
    from fedgraph.report import default_run_name
    from fedgraph.simulations.client_app import app as client_app
    from fedgraph.simulations.server_app import make_server_app, validate_run_config
    from fedgraph.simulations.wakeups import install

    install()  # Flower's message polls -> wake-ups (fedgraph.simulations.wakeups)
    _, cfg = validate_run_config(run_config)
    check_resources(num_cpus, cpus_per_client, gpus_per_client)
    preflight(cfg)
    if cfg.noise_source == "secret" and not os.environ.get("RAY_ADDRESS"):
        # a local Ray's workers inherit this environment: check the secret before they start
        from fedgraph.secret import check_secret

        check_secret({})
    from fedgraph.simulations.early_ray import SERVER_WARM_IMPORTS, import_quietly

    threading.Thread(
        target=import_quietly, args=SERVER_WARM_IMPORTS, daemon=True, name="fedgraph-server-imports"
    ).start()
    return flwr_run_simulation, cfg, make_server_app, client_app, default_run_name, spec_label
