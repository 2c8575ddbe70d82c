"""``fedgraph`` command line: run a simulation that fails loudly, sweep a grid of runs, report
a sweep as CSV, plots and markdown, list datasets.

``flwr run .`` exits 0 even when a run fails; ``fedgraph run`` runs the same ServerApp and
ClientApp through Flower's simulation engine in-process, checks the report the strategy wrote,
and exits non-zero (1: the run failed, 2: invalid config) with the reason. ``fedgraph sweep``
runs one ``fedgraph run`` process per cell (see :mod:`simulations.sweep`); ``fedgraph report``
aggregates the cells (see :mod:`simulations.results`).
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
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
            if preset.endswith(".toml") or "/" in preset or "\\" in preset:
                raise typer.BadParameter(f"preset file {preset!r} not found (looked at "
                                         f"{Path(preset).resolve()}); bundled presets: {names}")
            raise typer.BadParameter(f"preset {preset!r} not found; known presets: {names}")
        try:
            cfg.update(relative_to_file(tomllib.loads(path.read_text()), path))
        except tomllib.TOMLDecodeError as err:
            raise typer.BadParameter(f"{path}: not valid TOML: {err}") from None
    for item in overrides:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        cfg[k.strip()] = _parse_value(v.strip())
    return cfg


#: keys whose value is a folder: relative ones in a TOML file are relative to that file
FOLDER_KEYS = ("data-root", "output-dir")
#: keys that may name a ``path/to/file.py:attribute`` (:func:`fedgraph.registry.is_file_spec`)
SPEC_KEYS = ("dataset", "partitioner", "mechanism", "strategy")


def relative_to_file(values: dict, toml_path: Path) -> dict:
    """``values`` of the TOML file ``toml_path`` with its relative paths made absolute
    against the file's folder, not the working directory: the folders of
    :data:`FOLDER_KEYS`, and the ``.py`` file of a :data:`SPEC_KEYS` spec where that file
    exists next to the TOML (else the spec is left to the working directory, as a TOML
    written for the repository root has it: ``examples/custom_dataset/run.toml``)."""
    from fedgraph.registry import is_file_spec

    base = toml_path.expanduser().resolve().parent
    out = dict(values)
    for key in FOLDER_KEYS:
        v = out.get(key)
        if isinstance(v, str) and v.strip() and not Path(v).expanduser().is_absolute():
            out[key] = str(base / v)
    for key in SPEC_KEYS:
        v = out.get(key)
        if isinstance(v, str) and is_file_spec(v):
            module, _, attr = v.strip().rpartition(":")
            file = Path(module.strip()).expanduser()
            if not file.is_absolute() and (base / file).is_file():
                out[key] = f"{base / file}:{attr.strip()}"
    return out


def check_resources(num_cpus: Optional[int], cpus_per_client: float,
                    gpus_per_client: float) -> None:
    """Refuse, before Ray starts, resource requests no client could get on this machine (Ray
    would leave every client unscheduled: "ActorPool is empty"). With ``RAY_ADDRESS`` (an
    existing cluster) the cluster's resources decide, so only the numbers are checked.

    Raises:
        fedgraph.config.ConfigError: naming the option and the allowed values.
    """
    import math

    from fedgraph.config import ConfigError

    for name, value in (("--cpus-per-client", cpus_per_client),
                        ("--gpus-per-client", gpus_per_client)):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name}: must be a finite number >= 0, got {value}")
    if cpus_per_client <= 0:
        raise ConfigError("--cpus-per-client: must be > 0 (each client needs some CPU)")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"--num-cpus: must be >= 1, got {num_cpus}")
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address(os.environ["RAY_ADDRESS"])
        if gpus_per_client > 0:
            gpus = cluster_gpus(os.environ["RAY_ADDRESS"])
            if gpus < gpus_per_client:
                raise ConfigError(f"--gpus-per-client: {gpus_per_client} asked but the Ray "
                                  f"cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']!r} has "
                                  f"{gpus:g} GPU(s); no client could start: use 0 (CPU) or a "
                                  "cluster with GPUs")
        return
    cpus = num_cpus or os.cpu_count() or 1
    if cpus_per_client > cpus:
        raise ConfigError(f"--cpus-per-client: {cpus_per_client} is more than the {cpus} CPUs "
                          "Ray may use here (--num-cpus); no client could start")
    if gpus_per_client > 0:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ConfigError(f"--gpus-per-client: {gpus_per_client} asked but this machine "
                              "has no GPU that torch can see; use 0 (CPU), or set RAY_ADDRESS "
                              "to a Ray cluster with GPUs")
        if gpus_per_client > gpus:
            raise ConfigError(f"--gpus-per-client: {gpus_per_client} is more than the {gpus} "
                              "GPU(s) of this machine; no client could start")


def cluster_gpus(address: str) -> float:
    """GPUs of the Ray cluster at ``address`` (``ray.cluster_resources()``, with a driver
    connected for the question only and disconnected after it)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return float(ray.cluster_resources().get("GPU", 0.0))
    finally:
        ray.shutdown()


def user_code(run_config: dict) -> list[str]:
    """The keys of ``run_config`` that name a user's code (an import path
    ``package.module:attr`` or ``path/to/file.py:attr``, not a built-in dataset family such as
    ``facebook100:<College>``)."""
    out = []
    for key in SPEC_KEYS:
        v = run_config.get(key)
        if isinstance(v, str) and ":" in v and not (
                key == "dataset" and v.strip().lower().startswith(("facebook100:",
                                                                   "synthetic-sbm:"))):
            out.append(key)
    return out


def user_traceback(err: BaseException) -> str:
    """The traceback of the exception under ``err`` (its causes and contexts) that a user's
    code raised: only its frames outside fedgraph's own packages, or ``""`` where none is."""
    import traceback

    ours = tuple(str(Path(__file__).resolve().parents[1] / pkg) for pkg in
                 ("fedgraph", "strategies", "simulations"))
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not f.filename.startswith(ours) and "site-packages" not in f.filename
                  and not f.filename.startswith("<frozen")]
        if frames and e is not err:
            return ("Traceback (the user's code):\n" + "".join(traceback.format_list(frames))
                    + "".join(traceback.format_exception_only(type(e), e)))
        todo += [e.__cause__, e.__context__]
    return ""


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Refuse a ``RAY_ADDRESS`` behind which no Ray cluster answers within ``timeout``
    seconds: for ``auto`` and ``host[:port]``, Ray's own lookup and then its GCS client
    (which Ray itself would retry for ever, the run waiting on clients that never start); for
    ``ray://host:port`` (Ray Client), a TCP connection.

    Raises:
        fedgraph.config.ConfigError: naming ``RAY_ADDRESS``, the address and what to do.
    """
    import socket

    from fedgraph.config import ConfigError

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            f"RAY_ADDRESS={address!r}: {why}; start a cluster (`ray start --head "
            "--port=PORT`) and use its address (host:port, ray://host:port for Ray Client, "
            "or auto), or unset RAY_ADDRESS to run on a local Ray started for this run")

    def connect(host_port: str) -> None:
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError) as err:
            raise refuse(f"nothing answers there ({getattr(err, 'strerror', None) or err})"
                         ) from None

    target = address.strip()
    scheme, sep, rest = target.partition("://")
    if sep and scheme != "ray":
        raise refuse(f"unknown scheme {scheme + '://'!r}")
    if sep:  # Ray Client: its server, not the GCS
        _, colon, port = rest.rpartition(":")
        if not colon or not port.isdigit():
            raise refuse("Ray Client addresses are ray://host:port")
        connect(rest)
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address
        from ray._raylet import GcsClient
    except ImportError:  # another Ray: left to it
        return
    try:
        gcs = canonicalize_bootstrap_address(target)
    except Exception as err:  # noqa: BLE001 - e.g. auto without a cluster
        raise refuse(str(err).splitlines()[0]) from None
    if not gcs:
        raise refuse("no Ray cluster found there")
    connect(gcs)
    outcome: dict = {}

    def probe() -> None:  # blocks ~35 s when something that is not Ray's GCS answers
        try:
            GcsClient(address=gcs)
            outcome["ok"] = True
        except Exception as err:  # noqa: BLE001
            outcome["error"] = err

    thread = threading.Thread(target=probe, daemon=True, name="fedgraph-ray-address-check")
    thread.start()
    thread.join(timeout)
    if not outcome.get("ok"):
        raise refuse(f"something answers at {gcs} but not Ray's GCS within {timeout:g} s"
                     + (f" ({outcome['error']})" if "error" in outcome else ""))


def check_run_config(run_config: dict):
    """Validate ``run_config`` (:func:`fedgraph.config.parse_run_config`) and its strategy's
    name without importing torch, PyG, Flower or Ray where the names are fedgraph's own
    (:mod:`fedgraph.catalog`): a config error is reported in well under a second. Returns the
    parsed config.

    Raises:
        fedgraph.config.ConfigError: naming the key and the allowed values (the same message
            :func:`run_simulation` gives).
    """
    from fedgraph import catalog
    from fedgraph.config import ConfigError, check_data_root, check_output_dir, parse_run_config

    cfg = parse_run_config(run_config)
    check_data_root(cfg)
    check_output_dir(cfg)
    if cfg.noise_source == "secret" and not os.environ.get("RAY_ADDRESS"):
        from fedgraph.secret import check_secret  # a local Ray's workers inherit it

        check_secret({})
    spec = str(run_config.get("strategy", "") or run_config.get("method", "ppgnn"))
    try:
        catalog.check_name("strategy", spec)
    except ValueError as err:  # as simulations.server_app.validate_run_config words it
        raise ConfigError(str(err)) from None
    return cfg


def run_simulation(run_config: dict, num_cpus: Optional[int] = None,
                   cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
                   label: Optional[str] = None) -> dict:
    """Run one simulation in-process; return the report dict. Without ``run-name`` the report
    is named ``<label or method>-<dataset>-seed<seed>-<time>-<pid>`` (``method``: the
    strategy's, as under ``flwr run``, which writes the same name for the same config; a
    ``label`` ending with the dataset does not repeat it).

    Raises:
        fedgraph.config.ConfigError: invalid config (before anything starts).
        RuntimeError: the run failed; the message carries the report's error.
    """
    from simulations.early_ray import start_early_ray

    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
               "init_args": {"num_cpus": num_cpus or os.cpu_count() or 1,
                             "include_dashboard": False}}
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster: its resources, not ours
        backend["init_args"] = {"address": os.environ["RAY_ADDRESS"]}
    # Ray starts while the imports and the preflight below run (simulations.early_ray);
    # Flower then finds it running and uses it.
    # With its client actors, which import while the driver does (simulations.early_ray).
    method = _early_ray_method(run_config)
    early = None if method is None else start_early_ray(
        backend["init_args"], backend["client_resources"], method)
    try:
        flwr_run_simulation, cfg, make_server_app, client_app, default_run_name, spec_label = \
            _prepare(run_config, num_cpus, cpus_per_client, gpus_per_client)
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
        return _run(run_config, cfg, label, backend, flwr_run_simulation, make_server_app,
                    client_app, default_run_name, spec_label)
    finally:
        if early is not None:
            early.release()


def _run(run_config, cfg, label, backend, flwr_run_simulation, make_server_app, client_app,
         default_run_name, spec_label) -> dict:
    from fedgraph.errors import RunInterrupted
    # Default name: the strategy's method and the dataset's, file-name safe; the same rule as
    # the strategy's own under flwr run (strategies.base.PrivateStrategy.report_path).
    from simulations.server_app import validate_run_config

    method = label or validate_run_config(run_config)[0].method
    run_name = cfg.run_name or default_run_name(method, spec_label(cfg.dataset), cfg.seed)
    run_config = {**run_config, "run-name": run_name,
                  "output-dir": str(Path(cfg.output_dir).expanduser().resolve())}
    report_path = Path(run_config["output-dir"]) / f"{run_name}.json"
    report_path.unlink(missing_ok=True)
    from simulations.interrupt import REPORT_PATH

    REPORT_PATH[:] = [report_path]
    flwr_run_simulation(server_app=make_server_app(run_config), client_app=client_app,
                        num_supernodes=cfg.num_clients, backend_config=backend)
    if not report_path.exists():
        raise RuntimeError(f"the run wrote no report at {report_path}: it failed before the "
                           "strategy started (see the log above)")
    report = json.loads(report_path.read_text())
    if report["status"] == "interrupted":
        raise RunInterrupted(f"run interrupted; its report, with what was spent: {report_path}")
    if report["status"] != "ok":
        raise RuntimeError(f"run failed: {report['error']} (report: {report_path})")
    return report


def _early_ray_method(run_config: dict) -> Optional[str]:
    """The run's method if :func:`check_run_config` accepts ``run_config`` (no torch import;
    with ``noise-source = secret`` that includes the secret in this environment, which a local
    Ray's workers inherit): only then is Ray started early, with client actors warmed up for
    this method; else ``None``."""
    from fedgraph.config import ConfigError

    if user_code(run_config):  # the user's code is imported and run (the preflight) first:
        return None  # its error comes before Ray starts, not after
    try:
        return check_run_config(run_config).method
    except (ConfigError, ValueError):  # (a secret run without its secret among them)
        return None


def _prepare(run_config: dict, num_cpus, cpus_per_client: float, gpus_per_client: float):
    """The imports, the config's validation and the preflight of :func:`run_simulation`."""
    from flwr.simulation import run_simulation as flwr_run_simulation

    from fedgraph.federation import preflight
    from fedgraph.registry import spec_label
    from fedgraph.report import default_run_name
    from simulations.client_app import app as client_app
    from simulations.server_app import make_server_app, validate_run_config
    from simulations.wakeups import install

    install()  # Flower's message polls -> wake-ups (simulations.wakeups)
    _, cfg = validate_run_config(run_config)
    check_resources(num_cpus, cpus_per_client, gpus_per_client)
    preflight(cfg)
    if cfg.noise_source == "secret" and not os.environ.get("RAY_ADDRESS"):
        # a local Ray's workers inherit this environment: check the secret before they start
        from fedgraph.secret import check_secret

        check_secret({})
    from simulations.early_ray import SERVER_WARM_IMPORTS, import_quietly

    threading.Thread(target=import_quietly, args=SERVER_WARM_IMPORTS, daemon=True,
                     name="fedgraph-server-imports").start()
    return flwr_run_simulation, cfg, make_server_app, client_app, default_run_name, spec_label


def _run_help() -> str:
    # The command's help names PRESET (typer 0.20 with click 8.5 drops arguments' own help).
    names = ", ".join(sorted(f.stem for f in PRESETS.glob("*.toml")))
    return ("Run one simulation; exit 1 if it fails, 2 if the config is invalid, 130 if interrupted (Ctrl-C: the report is written with status interrupted; Ctrl-C twice quits at once).\n\n"
            f"PRESET: a preset's name ({names}) or the path of a TOML run config; without it, "
            "the main job (the defaults of pyproject.toml's \\[tool.flwr.app.config]: PPGNN on "
            "Cora). Keys set with --set go on top.")


@cli.command(help=_run_help())
def run(
    preset: Optional[str] = typer.Argument(None, help="preset name or TOML file"),
    set_: List[str] = typer.Option([], "--set", "-s", help="override a run-config key: key=value"),
    num_cpus: Optional[int] = typer.Option(None, help="CPUs Ray may use (default: all)"),
    cpus_per_client: float = typer.Option(1.0, help="CPUs reserved per client"),
    gpus_per_client: float = typer.Option(0.0, help="GPU share per client (0: CPU)"),
) -> None:
    from fedgraph.config import ConfigError, reject_keys_of_other_methods

    try:  # the config first, before torch, Flower and Ray are imported (seconds each)
        cfg = load_run_config(preset, set_)
        reject_keys_of_other_methods(cfg)  # only the keys the user set: preset and --set
        check_run_config(cfg)
        check_resources(num_cpus, cpus_per_client, gpus_per_client)
    except (ConfigError, typer.BadParameter) as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    except Exception as err:  # noqa: BLE001 - e.g. a preset that is not TOML: as below
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        raise typer.Exit(1)
    from fedgraph.errors import RunInterrupted
    from simulations.interrupt import StopOnSignal, end_all_descendants

    stop = StopOnSignal(lambda line: typer.echo(line, err=True))
    try:
        with stop:
            try:
                run_simulation(cfg, num_cpus, cpus_per_client, gpus_per_client)
            finally:  # Ray's processes (GCS, raylet, agents) outlive a cut-short run
                end_all_descendants(stop.remember())
    except (ConfigError, typer.BadParameter) as err:
        typer.echo(f"fedgraph: {err}", err=True)
        if user_traceback(err):  # a user's loader, partitioner, mechanism or strategy
            typer.echo(user_traceback(err), err=True)
        raise typer.Exit(2)
    except (RunInterrupted, KeyboardInterrupt) as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(130)
    except Exception as err:  # noqa: BLE001 - report every failure and exit non-zero
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        if user_traceback(err):
            typer.echo(user_traceback(err), err=True)
        raise typer.Exit(1)


class _Bar:
    """A rich progress bar on a terminal; elsewhere (logs, CI) one line per finished cell."""

    def __init__(self, console) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.console = console
        self.live = console.is_terminal
        self.bar = Progress(TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                            TextColumn("left"), TimeRemainingColumn(), console=console,
                            disable=not self.live)
        self.task, self.total, self.n, self.failed = None, 0, 0, 0

    def start(self, total: int) -> None:
        self.total = total
        self.task = self.bar.add_task("cells", total=total, status="")
        self.bar.start()

    def advance(self, result) -> None:
        self.n += 1
        self.failed += result.status != "ok"
        self.bar.update(self.task, advance=1, status=f"{self.failed} failed" if self.failed else "")
        if not self.live and result.status == "ok":
            test = f"test {result.test:.4f}" if result.test is not None else ""
            self.console.print(f"[{self.n}/{self.total}] ok {result.cell.describe()} {test} "
                               f"({result.wall_s:.0f} s)", markup=False, highlight=False,
                               soft_wrap=True)

    def stop(self) -> None:
        self.bar.stop()


def _raise_interrupt(signum, frame):  # SIGTERM: stop like Ctrl-C (kill the running cells)
    raise KeyboardInterrupt(f"signal {signum}")


@cli.command()
def sweep(
    sweep_file: str = typer.Argument(..., help="sweep TOML file, or a name in simulations/sweeps"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o",
                                             help="where the cells go (default: the file's output-dir)"),
    parallel: Optional[int] = typer.Option(None, help="cells at a time (default: cores // cpus-per-cell)"),
    executor: Optional[str] = typer.Option(None, help="local (process pool), ray (Ray tasks) or auto"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the cells and which are done; run nothing"),
) -> None:
    """Run a grid of simulations (methods x datasets x epsilons x clients x seeds), resumable:
    cells whose report is ok are skipped. Exit 0 if every cell is ok, 1 if any failed, 2 for
    an invalid sweep file, 130 if interrupted."""
    from rich.console import Console

    from simulations.sweep import SweepError, load_sweep
    from simulations.sweep_runner import cell_is_done, run_sweep

    if executor not in (None, "auto", "local", "ray"):
        typer.echo(f"fedgraph: --executor must be local, ray or auto, got {executor!r}", err=True)
        raise typer.Exit(2)
    if parallel is not None and parallel < 1:
        typer.echo("fedgraph: --parallel must be >= 1", err=True)
        raise typer.Exit(2)
    try:
        sw = load_sweep(sweep_file, output_dir)
    except SweepError as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    console = Console(soft_wrap=True, highlight=False)
    if dry_run:
        problems: dict = {}  # (dataset, data-root, min-class-size) -> why it does not load
        states: dict = {}
        for c in sw.cells():
            key = (c.run_config.get("dataset", "cora"), c.run_config.get("data-root") or None,
                   int(c.run_config.get("min-class-size", 1000)))
            if key not in problems:
                problems[key] = _data_problem(*key)
            state = ("done" if cell_is_done(sw.cell_dir(c), c.run_config)
                     else "no data" if problems[key] else "to run")
            states[state] = states.get(state, 0) + 1
            console.print(f"{state:<7} {sw.cell_dir(c)}", markup=False)
        for name, why in dict.fromkeys((k[0], w) for k, w in problems.items() if w):
            console.print(f"no data: {name}: {why}", markup=False)
        console.print(f"{sum(states.values())} cells: " + ", ".join(
            f"{states.get(k, 0)} {k}" for k in ("done", "to run", "no data")), markup=False)
        return
    bar = _Bar(console)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        summary = run_sweep(sw, parallel, executor,
                            echo=lambda line: console.print(line, markup=False), progress=bar)
    except KeyboardInterrupt:
        bar.stop()
        console.print(f"fedgraph: sweep interrupted; run the same command again to finish the "
                      f"rest ({sw.output_dir})", markup=False)
        raise typer.Exit(130)
    finally:
        bar.stop()
        signal.signal(signal.SIGTERM, previous)
    if summary.failed:
        raise typer.Exit(1)


@cli.command()
def report(
    dirs: List[str] = typer.Argument(..., help="sweep output folders (each holds cells/)"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="CSV file (default: DIR/results.csv, "
                                           "or beside --markdown)"),
    plots: Optional[str] = typer.Option(None, "--plots", help="folder for the PNGs (default: "
                                        "DIR/plots, or img/ beside --markdown)"),
    markdown_path: Optional[str] = typer.Option(None, "--markdown", help="also write a results page"),
    published: List[str] = typer.Option([], "--published", help="another sweep file whose "
                                        r"\[\[published]] numbers to show"),
    formats: str = typer.Option("png", "--format", help="figure formats, comma-separated: "
                                "png, pdf, svg"),
    combined: bool = typer.Option(False, "--combined", help="also one figure with every plot "
                                  "as a panel (combined.<format>)"),
) -> None:
    """Aggregate sweep folders: one CSV (mean and std per cell over seeds: accuracy per split,
    epsilon, wall time) and privacy-utility plots (PNG), optionally a markdown page."""
    from simulations import results

    rows = results.collect(dirs)
    if not rows:
        typer.echo(f"fedgraph: no sweep cells (cells/*/cell.json) under {', '.join(dirs)}", err=True)
        raise typer.Exit(2)
    first = Path(dirs[0])
    md = Path(markdown_path) if markdown_path else None
    csv_file = Path(csv_path) if csv_path else (md.with_suffix(".csv") if md else first / "results.csv")
    plot_dir = Path(plots) if plots else (md.parent / "img" if md else first / "plots")
    pub = results.load_published([*[Path(d) / "sweep.toml" for d in dirs
                                    if (Path(d) / "sweep.toml").exists()], *published])
    fmts = [f.strip().lower() for f in formats.split(",") if f.strip()]
    if not fmts or set(fmts) - set(results.FORMATS):
        typer.echo(f"fedgraph: --format: got {formats!r}; allowed: "
                   f"{', '.join(results.FORMATS)} (comma-separated)", err=True)
        raise typer.Exit(2)
    groups = results.aggregate(rows)
    results.write_csv(groups, csv_file)
    figures = results.plot(groups, plot_dir, pub, fmts, combined)
    for warning in results.unplaced_published(pub, figures):
        typer.echo(f"fedgraph: warning: {warning}", err=True)
    for g in groups:
        eps = "-" if g["epsilon"] is None else f"{g['epsilon']:g}"
        test = results.pct(g["test_mean"], g["test_std"])
        failed = f"  ({g['failed']} failed)" if g["failed"] else ""
        typer.echo(f"{g['label']:<32} {g['dataset']:<24} eps {eps:<6} clients {g['num_clients']:<4} "
                   f"seeds {g['seeds']}  test {test}{failed}")
    typer.echo(f"csv: {csv_file}")
    for f in figures:
        for path in f.paths:
            typer.echo(f"plot: {path}")
    if md:
        command = "fedgraph report " + " ".join(shlex.quote(d) for d in dirs) + \
            f" --markdown {shlex.quote(markdown_path)}" + \
            "".join(f" --published {shlex.quote(p)}" for p in published) + \
            (f" --csv {shlex.quote(csv_path)}" if csv_path else "") + \
            (f" --plots {shlex.quote(plots)}" if plots else "")
        text = results.markdown(groups, figures, md, pub, command,
                                results.sweep_summaries(dirs, rows), csv_file)
        results.write_bytes_atomic(md, text.encode())
        typer.echo(f"markdown: {md}")


@cli.command()
def datasets(root: Optional[str] = typer.Option(None, help="dataset root (default: $FEDGRAPH_DATA or cache)")) -> None:
    """List the known datasets, their statistics and whether each loads offline; Facebook100
    colleges found under the root with their graph size."""
    from fedgraph.data import (KNOWN_DATASETS, dataset_statistics, known_datasets, load_dataset,
                               resolve_root)

    if root is not None and not Path(root).expanduser().is_dir():
        typer.echo(f"fedgraph: --root: {root} is not a folder (give an existing data root, or "
                   "leave --root out to use $FEDGRAPH_DATA or the user cache)", err=True)
        raise typer.Exit(2)
    where = ("--root" if root else "$FEDGRAPH_DATA" if os.environ.get("FEDGRAPH_DATA")
             else "the user cache; set $FEDGRAPH_DATA or --root to use another folder")
    typer.echo(f"data root: {resolve_root(root)} (from {where})")
    for name in known_datasets():
        if name.startswith("facebook100:"):
            colleges = sorted((resolve_root(root) / "facebook100").glob("*.mat"))
            if not colleges:
                typer.echo(f"{name:<27} none under {resolve_root(root) / 'facebook100'} (no download)")
            for path in colleges:
                typer.echo(f"{'facebook100:' + path.stem:<27} {_facebook100_size(path)}")
            continue
        if name.startswith("synthetic-sbm:"):
            typer.echo(f"{name:<27} generated (seeded SBM, no files; e.g. synthetic-sbm:2000:10)")
            continue
        try:
            s = dataset_statistics(load_dataset(name, root))
            typer.echo(f"{name:<27} offline  nodes {s['num_nodes']:>7}  edges {s['num_edges']:>9}  "
                       f"features {s['num_features']:>5}  classes {s['num_classes']}")
        except Exception as err:  # noqa: BLE001 - missing files; a registered loader's own needs
            if name in KNOWN_DATASETS and isinstance(err, FileNotFoundError):
                typer.echo(f"{name:<27} not under the data root (downloads when online)")
            else:
                typer.echo(f"{name:<27} registered; not loadable with this root: "
                           f"{str(err).splitlines()[0][:100]}")


def _data_problem(name: str, root: Optional[str], min_class_size: int) -> Optional[str]:
    """Why the dataset ``name`` does not load offline with this root (its first line), or
    ``None`` when it loads (``sweep --dry-run``; a cell of such a dataset would fail)."""
    from fedgraph.data import load_dataset

    if str(name).lower().startswith("synthetic-sbm:"):
        return None
    try:
        load_dataset(name, root, min_class_size=min_class_size)
    except FileNotFoundError as err:
        return str(err).splitlines()[0]
    except Exception:  # noqa: BLE001 - a user loader's own needs: the run will say
        pass
    return None


def _facebook100_size(path: Path) -> str:
    """Nodes and directed edges of a Facebook100 ``.mat`` (the adjacency only: cheap); the
    classes depend on ``min-class-size``."""
    import scipy.io

    try:
        adj = scipy.io.loadmat(path, variable_names=["A"])["A"]
    except Exception as err:  # noqa: BLE001 - a damaged file: say so, list the rest
        return f"unreadable: {err}"
    return (f"offline  nodes {adj.shape[0]:>7}  edges {adj.nnz:>9}  "
            "class-year task (classes: min-class-size)")


def main() -> None:  # console script entry point
    if sys.argv[1:2] != ["run"]:
        cli()
        return
    try:
        cli()
        code = 0
    except SystemExit as stop:
        code = stop.code
    # ``fedgraph run`` is done (report written, Ray's processes ended): exit without the
    # interpreter's finalization, which spent 1.7-3.5 s here freeing the run's objects and
    # joining what Ray and Flower left behind. atexit's handlers still run (logging's flush).
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
