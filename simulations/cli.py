"""``fedgraph`` command line: run a simulation that fails loudly, sweep a grid of runs, report
a sweep as CSV, plots and markdown, list datasets.

``flwr run .`` exits 0 even when a run fails; ``fedgraph run`` runs the same ServerApp and
ClientApp through Flower's simulation engine in-process, checks the report the strategy wrote,
and exits non-zero (1: the run failed, 2: invalid config) with the reason
(:mod:`fedgraph.simulations.simulate`). ``fedgraph sweep`` runs one ``fedgraph run`` process per cell
(see :mod:`fedgraph.simulations.sweep`); ``fedgraph report`` aggregates the cells (see
:mod:`fedgraph.simulations.results`).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import typer

from fedgraph.simulations.resources import check_resources
from fedgraph.simulations.run_files import PRESETS, load_run_config
from fedgraph.simulations.simulate import check_run_config, run_simulation
from fedgraph.simulations.user_code import user_traceback

cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Federated simulations of differentially private graph learning.",
)


def _command(fn):
    """``@cli.command()`` with the docstring's paragraphs each on one line as the help: a rich
    help keeps the docstring's line breaks, which broke sentences mid-line."""
    paragraphs = (" ".join(p.split()) for p in (fn.__doc__ or "").split("\n\n"))
    return cli.command(help="\n\n".join(p for p in paragraphs if p))(fn)


def version_line() -> str:
    """``fedgraph <version>`` and the versions of the libraries a run depends on (for a bug
    report), from the installed distributions' metadata; a missing one reads ``missing``."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "missing"

    deps = ", ".join(
        f"{name} {of(name)}"
        for name in ("flwr", "torch", "torch_geometric", "ray", "prv-accountant", "pydantic")
    )
    return f"fedgraph {of('fedgraph')} ({deps}; Python {sys.version.split()[0]})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@cli.callback()
def _options(
    version: bool = typer.Option(  # noqa: ARG001 - handled by its callback
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print fedgraph's version and its libraries' and exit.",
    ),
) -> None:
    """Federated simulations of differentially private graph learning."""


def _run_help() -> str:
    # The command's help names PRESET (typer 0.20 with click 8.5 drops arguments' own help).
    names = ", ".join(sorted(f.stem for f in PRESETS.glob("*.toml")))
    return (
        "Run one simulation; exit 1 if it fails, 2 if the config is invalid, 130 if interrupted (Ctrl-C: once the run has started, its report is written with status interrupted; Ctrl-C twice quits at once), 143 if stopped by SIGTERM (the same way).\n\n"
        f"PRESET: a preset's name ({names}) or the path of a TOML run config; without it, "
        "the main job (the defaults of pyproject.toml's \\[tool.flwr.app.config]: PPGNN on "
        "Cora). Keys set with --set go on top."
    )


@cli.command(help=_run_help())
def run(
    preset: str | None = typer.Argument(None, help="preset name or TOML file"),
    set_: list[str] = typer.Option([], "--set", "-s", help="override a run-config key: key=value"),
    num_cpus: int | None = typer.Option(None, help="CPUs Ray may use (default: all)"),
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
    from fedgraph.report import epsilon_warning

    if epsilon_warning(cfg):  # before the run, and again in its table
        typer.echo(f"fedgraph: {epsilon_warning(cfg)}", err=True)
    from fedgraph.errors import RunInterrupted
    from fedgraph.simulations.interrupt import StopOnSignal, end_all_descendants

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
        raise typer.Exit(stop.exit_code)  # 130 after Ctrl-C, 143 after SIGTERM
    except Exception as err:  # noqa: BLE001 - report every failure and exit non-zero
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        if user_traceback(err):
            typer.echo(user_traceback(err), err=True)
        raise typer.Exit(1)


class _Bar:
    """A rich progress bar on a terminal; elsewhere (logs, CI) one line per finished cell."""

    def __init__(self, console) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.live = console.is_terminal
        self.bar = Progress(
            TextColumn("[bold]cells"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
        )
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
            self.console.print(
                f"[{self.n}/{self.total}] ok {result.cell.describe()} {test} "
                f"({result.wall_s:.0f} s)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def stop(self) -> None:
        self.bar.stop()


def _dry_run(sw, console) -> int:
    """``fedgraph sweep --dry-run``: print every cell's state (done, to run, or no data: its
    dataset's files are not there, with why) and the counts; returns the exit code: 2 when some
    cell lacks its data and none is left to run (the sweep could run nothing), else 0."""
    from fedgraph.simulations.dataset_listing import data_problem
    from fedgraph.simulations.sweep_runner import cell_is_done

    problems: dict = {}  # (dataset, data-root, min-class-size) -> why it does not load
    states: dict = {}
    for c in sw.cells():
        key = (
            c.run_config.get("dataset", "cora"),
            c.run_config.get("data-root") or None,
            int(c.run_config.get("min-class-size", 1000)),
        )
        if key not in problems:
            problems[key] = data_problem(*key)
        state = (
            "done"
            if cell_is_done(sw.cell_dir(c), c.run_config)
            else "no data"
            if problems[key]
            else "to run"
        )
        states[state] = states.get(state, 0) + 1
        console.print(f"{state:<7} {sw.cell_dir(c)}", markup=False)
    missing = dict.fromkeys((k[0], w) for k, w in problems.items() if w)
    for name, why in missing:
        console.print(f"no data: {name}: {why}", markup=False)
    total = sum(states.values())
    console.print(
        f"{total} cell{'s' if total != 1 else ''}: "
        + ", ".join(f"{states.get(k, 0)} {k}" for k in ("done", "to run", "no data")),
        markup=False,
    )
    n = states.get("no data", 0)
    if not n or states.get("to run"):
        return 0
    names = ", ".join(dict.fromkeys(name for name, _ in missing))
    which = "the only cell not done lacks" if n == 1 else f"none of the {n} cells not done has"
    typer.echo(
        f"fedgraph: no cell can run: {which} its data ({names}: the 'no data' lines above say why)",
        err=True,
    )
    return 2


class _Terminated(KeyboardInterrupt):
    """SIGTERM on ``fedgraph sweep``: stops it as Ctrl-C does, and it exits 143, not 130."""


def _raise_interrupt(signum, frame):  # SIGTERM: stop like Ctrl-C (kill the running cells)
    raise _Terminated(f"signal {signum}")


@_command
def sweep(
    sweep_file: str = typer.Argument(..., help="sweep TOML file, or a name in simulations/sweeps"),
    output_dir: str | None = typer.Option(
        None, "--output-dir", "-o", help="where the cells go (default: the file's output-dir)"
    ),
    parallel: int | None = typer.Option(
        None, help="cells at a time (default: cores // cpus-per-cell)"
    ),
    executor: str | None = typer.Option(None, help="local (process pool), ray (Ray tasks) or auto"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="list the cells and which are done; run nothing"
    ),
) -> None:
    """Run a grid of simulations (methods x datasets x epsilons x clients x seeds), resumable:
    cells whose report is ok are skipped. Exit 0 if every cell is ok, 1 if any failed, 2 for
    an invalid sweep file (or, with --dry-run, when no cell left to run has its data), 130 if
    interrupted (Ctrl-C), 143 if stopped by SIGTERM."""
    from rich.console import Console

    from fedgraph.config import ConfigError, check_output_dir
    from fedgraph.simulations.interrupt import signal_exit_code
    from fedgraph.simulations.sweep import SweepError, load_sweep
    from fedgraph.simulations.sweep_runner import run_sweep

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
    try:  # the cells' folder can be made (a dry run makes nothing), as `fedgraph run` checks
        check_output_dir(sw, create=not dry_run)
    except ConfigError as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    if dry_run:
        code = _dry_run(sw, console)
        if code:
            raise typer.Exit(code)
        return
    bar = _Bar(console)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        summary = run_sweep(
            sw,
            parallel,
            executor,
            echo=lambda line: console.print(line, markup=False),
            progress=bar,
        )
    except KeyboardInterrupt as err:
        bar.stop()
        console.print(
            f"fedgraph: sweep interrupted; run the same command again to finish the "
            f"rest ({sw.output_dir})",
            markup=False,
        )
        raise typer.Exit(
            signal_exit_code(signal.SIGTERM if isinstance(err, _Terminated) else signal.SIGINT)
        )
    finally:
        bar.stop()
        signal.signal(signal.SIGTERM, previous)
    if summary.failed:
        raise typer.Exit(1)


@_command
def audit(
    preset: str = typer.Argument(..., help="preset name or TOML file"),
    set_: list[str] = typer.Option([], "--set", "-s", help="override a run-config key: key=value"),
    trials: int | None = typer.Option(None, help="trials a side per subject (default 20000)"),
    subject: list[str] = typer.Option([], "--subject", help="audit only this subject (repeatable)"),
    seed: int | None = typer.Option(
        None, help="seed of the canary choices (noise: the clients' own)"
    ),
) -> None:
    """Audit a run's privacy on the real client code: plant canaries (a cross-client edge, a
    user's features at the domain's corners), run the clients' real release handlers on both
    neighbouring inputs with fresh noise, and turn the best threshold test's errors into a
    lower bound on epsilon at 95 % confidence (Clopper-Pearson), beside the ledger's epsilon of
    the audited release (docs/explanations/auditing.md).

    PRESET as for fedgraph run. Writes <output-dir>/<run-name>.audit.json; exits 0 when every
    bound is at or below the ledger's epsilon, 3 when any is above (the release spends more
    than it reports), 2 on an invalid config, 1 on a failure."""
    from fedgraph.config import ConfigError

    try:
        cfg = load_run_config(preset, set_)
        check_run_config(cfg)
    except (ConfigError, typer.BadParameter) as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    except Exception as err:  # noqa: BLE001 - e.g. a preset that is not TOML
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        raise typer.Exit(1)
    from fedgraph.simulations.auditor import DEFAULT_TRIALS, audit_run, write_audit

    if trials is not None and trials < 1:
        typer.echo(
            f"fedgraph: --trials: {trials}; allowed: integers >= 1 (default {DEFAULT_TRIALS})",
            err=True,
        )
        raise typer.Exit(2)
    try:
        out = audit_run(cfg, trials or DEFAULT_TRIALS, subjects=list(subject) or None, seed=seed)
    except ConfigError as err:
        typer.echo(f"fedgraph: {err}", err=True)
        raise typer.Exit(2)
    except Exception as err:  # noqa: BLE001 - report every failure and exit non-zero
        typer.echo(f"fedgraph: FAILED: {err}", err=True)
        if user_traceback(err):
            typer.echo(user_traceback(err), err=True)
        raise typer.Exit(1)
    missing = sorted(set(subject) - set(out["subjects"]))
    if missing:  # nothing written: an earlier audit is kept
        typer.echo(
            f"fedgraph: --subject: {', '.join(map(repr, missing))} is not a subject "
            "this audit covers; allowed: the run's client-<i> (GAP, ProGAP) or "
            "level-<tau> (PPGNN, the feature subjects); nothing was written",
            err=True,
        )
        raise typer.Exit(2)
    path = write_audit(out, cfg, preset)
    typer.echo(audit_table(out))
    typer.echo(f"audit written to {path}")
    if out["above"]:
        typer.echo(
            f"fedgraph: audited bound above the ledger's epsilon: {', '.join(out['above'])}",
            err=True,
        )
        raise typer.Exit(3)


def audit_table(out: dict) -> str:
    """The audit's table: one row per subject (ledger epsilon, bound, canary, test, trials)."""
    rows = [
        f"audit of {out['method']} at delta {out['delta']:g} "
        f"({out['confidence']:.0%} confidence, {out['seconds']:.0f} s)",
        f"{'subject':<12} {'release':<22} {'epsilon':>8} {'bound':>7} {'trials':>7}  canary / test",
    ]
    for name, s in out["subjects"].items():
        flag = "  ABOVE" if s["above"] else ""
        rows.append(
            f"{name:<12} {s['release']:<22} {s['epsilon']:>8.3f} "
            f"{s['epsilon_lower_bound']:>7.3f} {s['trials']:>7}  {s['canary']}{flag}"
        )
        rows.append(f"{'':<60}{s['test']}")
    rows += [f"not audited: {line}" for line in out["not_audited"]]
    return "\n".join(rows)


@_command
def report(
    dirs: list[str] = typer.Argument(..., help="sweep output folders (each holds cells/)"),
    csv_path: str | None = typer.Option(
        None, "--csv", help="CSV file (default: DIR/results.csv, or beside --markdown)"
    ),
    plots: str | None = typer.Option(
        None, "--plots", help="folder for the PNGs (default: DIR/plots, or img/ beside --markdown)"
    ),
    markdown_path: str | None = typer.Option(None, "--markdown", help="also write a results page"),
    published: list[str] = typer.Option(
        [],
        "--published",
        help="another sweep file whose "
        r"\[\[published]] numbers to show",
    ),
    formats: str = typer.Option(
        "png", "--format", help="figure formats, comma-separated: png, pdf, svg"
    ),
    combined: bool = typer.Option(
        False, "--combined", help="also one figure with every plot as a panel (combined.<format>)"
    ),
) -> None:
    """Aggregate sweep folders: one CSV (mean and std per cell over seeds: accuracy per split,
    epsilon, wall time) and privacy-utility plots (PNG), optionally a markdown page."""
    import tomllib

    from fedgraph.config.checks import unwritable_folder
    from fedgraph.simulations import results

    def refuse(option: str, message: str):
        typer.echo(f"fedgraph: {option}: {message}", err=True)
        raise typer.Exit(2)

    dirs = list(dict.fromkeys(dirs))  # a folder named twice counts once
    for d in dirs:
        if not Path(d).is_dir():
            refuse(
                "DIRS",
                f"{d} is a file, not a folder (give sweep output folders)"
                if Path(d).exists()
                else f"no such folder: {d} (give sweep output folders)",
            )
    rows = results.collect(dirs)
    if not rows:
        typer.echo(
            f"fedgraph: no sweep cells (cells/*/cell.json) under {', '.join(dirs)}", err=True
        )
        raise typer.Exit(2)
    first = Path(dirs[0])
    md = Path(markdown_path) if markdown_path else None
    csv_file = (
        Path(csv_path) if csv_path else (md.with_suffix(".csv") if md else first / "results.csv")
    )
    plot_dir = Path(plots) if plots else (md.parent / "img" if md else first / "plots")
    # the option a path came from (the CSV and the plots default to beside --markdown)
    csv_option = "--csv" if csv_path else ("--markdown" if md else "DIRS")
    plots_option = "--plots" if plots else ("--markdown" if md else "DIRS")
    # every output's place is checked before anything is written (no CSV left behind by a
    # run that then cannot write its plots)
    for option, path in ((csv_option, csv_file), ("--markdown", md)):
        if path is not None and path.is_dir():
            refuse(option, f"{path} is a folder; name a file")
    for option, folder in (
        (csv_option, csv_file.parent),
        ("--markdown", md and md.parent),
        (plots_option, plot_dir),
    ):
        why = folder and unwritable_folder(folder)
        if why:
            refuse(option, f"{why} (writing to {folder})")
    try:
        pub = results.load_published(
            [
                *[Path(d) / "sweep.toml" for d in dirs if (Path(d) / "sweep.toml").exists()],
                *published,
            ]
        )
    except (OSError, ValueError, tomllib.TOMLDecodeError) as err:
        refuse("--published", f"cannot read a sweep file's [[published]] numbers: {err}")
    fmts = [f.strip().lower() for f in formats.split(",") if f.strip()]
    if not fmts or set(fmts) - set(results.FORMATS):
        typer.echo(
            f"fedgraph: --format: got {formats!r}; allowed: "
            f"{', '.join(results.FORMATS)} (comma-separated)",
            err=True,
        )
        raise typer.Exit(2)
    groups = results.aggregate(rows)
    try:
        results.write_csv(groups, csv_file)
    except OSError as err:
        refuse(csv_option, f"cannot write {csv_file}: {err.strerror or err}")
    try:
        figures = results.plot(groups, plot_dir, pub, fmts, combined)
    except OSError as err:
        refuse(plots_option, f"cannot write the plots under {plot_dir}: {err.strerror or err}")
    for warning in results.unplaced_published(pub, figures):
        typer.echo(f"fedgraph: warning: {warning}", err=True)
    for g in groups:
        eps = "-" if g["epsilon"] is None else f"{g['epsilon']:g}"
        test = results.pct(g["test_mean"], g["test_std"])
        failed = f"  ({g['failed']} failed)" if g["failed"] else ""
        typer.echo(
            f"{g['label']:<32} {g['dataset']:<24} eps {eps:<6} clients {g['num_clients']:<4} "
            f"seeds {g['seeds']}  test {test}{failed}"
        )
    typer.echo(f"csv: {csv_file}")
    for f in figures:
        for path in f.paths:
            typer.echo(f"plot: {path}")
    if md:
        command = (
            "fedgraph report "
            + " ".join(shlex.quote(d) for d in dirs)
            + f" --markdown {shlex.quote(markdown_path)}"
            + "".join(f" --published {shlex.quote(p)}" for p in published)
            + (f" --csv {shlex.quote(csv_path)}" if csv_path else "")
            + (f" --plots {shlex.quote(plots)}" if plots else "")
            + (f" --format {shlex.quote(formats)}" if formats != "png" else "")
            + (" --combined" if combined else "")
        )
        text = results.markdown(
            groups, figures, md, pub, command, results.sweep_summaries(dirs, rows), csv_file
        )
        try:
            results.write_bytes_atomic(md, text.encode())
        except OSError as err:
            refuse("--markdown", f"cannot write {md}: {err.strerror or err}")
        typer.echo(f"markdown: {md}")


@_command
def datasets(
    root: str | None = typer.Option(None, help="dataset root (default: $FEDGRAPH_DATA or cache)"),
) -> None:
    """List the known datasets, their statistics and whether each loads offline; Facebook100
    colleges found under the root with their graph size."""
    from fedgraph.data import (
        KNOWN_DATASETS,
        dataset_statistics,
        known_datasets,
        load_dataset,
        resolve_root,
    )
    from fedgraph.simulations.dataset_listing import facebook100_size

    if root is not None and not Path(root).expanduser().is_dir():
        typer.echo(
            f"fedgraph: --root: {root} is not a folder (give an existing data root, or "
            "leave --root out to use $FEDGRAPH_DATA or the user cache)",
            err=True,
        )
        raise typer.Exit(2)
    env = os.environ.get("FEDGRAPH_DATA", "")
    if root is None and env and not Path(env).expanduser().is_dir():
        typer.echo(
            f"fedgraph: $FEDGRAPH_DATA = {env} is not a folder (set it to an existing "
            "data root, unset it for the user cache, or give --root)",
            err=True,
        )
        raise typer.Exit(2)
    where = (
        "--root"
        if root
        else "$FEDGRAPH_DATA"
        if os.environ.get("FEDGRAPH_DATA")
        else "the user cache; set $FEDGRAPH_DATA or --root to use another folder"
    )
    typer.echo(f"data root: {resolve_root(root)} (from {where})")
    for name in known_datasets():
        if name.startswith("facebook100:"):
            colleges = sorted((resolve_root(root) / "facebook100").glob("*.mat"))
            if not colleges:
                typer.echo(
                    f"{name:<27} none under {resolve_root(root) / 'facebook100'} (no download)"
                )
            for path in colleges:
                typer.echo(f"{'facebook100:' + path.stem:<27} {facebook100_size(path)}")
            continue
        if name.startswith("synthetic-sbm:"):
            typer.echo(f"{name:<27} generated (seeded SBM, no files; e.g. synthetic-sbm:2000:10)")
            continue
        if name == "files":  # the user's own graph, read from data-root: nothing to list
            typer.echo(
                f"{name:<27} your own graph: data-root names a .pt file or a folder with "
                "edges.csv, features.csv, labels.csv (docs: tutorials/own-dataset)"
            )
            continue
        try:
            s = dataset_statistics(load_dataset(name, root))
            typer.echo(
                f"{name:<27} offline  nodes {s['num_nodes']:>7}  edges {s['num_edges']:>9}  "
                f"features {s['num_features']:>5}  classes {s['num_classes']}"
            )
        except Exception as err:  # noqa: BLE001 - missing files; a registered loader's own needs
            if name in KNOWN_DATASETS and isinstance(err, FileNotFoundError):
                typer.echo(f"{name:<27} not under the data root (downloads when online)")
            else:
                first = str(err).splitlines()[0] if str(err) else type(err).__name__
                typer.echo(
                    f"{name:<27} registered; not loadable with this root: "
                    f"{first if len(first) <= 100 else first[:97] + '...'}"
                )


cluster_cli = typer.Typer(
    no_args_is_help=True,
    help=(
        "A local Ray cluster of your own: start one with its own folder and port, stop exactly "
        "that one (ray stop would stop every Ray of the machine)."
    ),
)
cli.add_typer(cluster_cli, name="cluster")


@cluster_cli.command(
    "start",
    help=(
        "Start a Ray head on 127.0.0.1 with a temporary folder of its own (--dir, default a new short "
        "temporary fgray-* folder) and a free port (--port); prints the RAY_ADDRESS to run against it "
        "and the command that stops it. The folder records the address (fedgraph-cluster.json)."
    ),
)
def cluster_start(
    dir: str | None = typer.Option(
        None, "--dir", help="the cluster's temporary folder (short: Ray's sockets live in it)"
    ),  # noqa: A002
    port: int | None = typer.Option(None, help="the head's port (default: a free one)"),
    num_cpus: int | None = typer.Option(None, help="CPUs the head offers (default: Ray's count)"),
    num_gpus: int | None = typer.Option(None, help="GPUs the head offers (default: Ray's count)"),
) -> None:
    from fedgraph.simulations import cluster

    try:
        record = cluster.start(dir, port, num_cpus, num_gpus)
    except (RuntimeError, OSError) as err:
        typer.echo(f"fedgraph cluster start: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"Ray cluster started: RAY_ADDRESS={record['address']} (folder {record['folder']})")
    typer.echo(f"  run on it:  RAY_ADDRESS={record['address']} fedgraph run gap-edge-cora")
    typer.echo(f"  stop it:    fedgraph cluster stop {record['folder']}")


@cluster_cli.command(
    "stop",
    help=(
        "Stop the cluster that `fedgraph cluster start` (or ray start --head --temp-dir=DIR) "
        "started in DIR: only the processes that name that folder and their workers, SIGTERM "
        "then SIGKILL after --grace seconds. Exit 1 if some are left."
    ),
)
def cluster_stop(
    dir: str = typer.Argument(..., help="the cluster's temporary folder"),  # noqa: A002
    grace: float = typer.Option(10.0, help="seconds between SIGTERM and SIGKILL"),
) -> None:
    from fedgraph.simulations import cluster

    if not Path(dir).is_dir():
        typer.echo(
            f"fedgraph cluster stop: {dir} is not a folder (give the folder that "
            "`fedgraph cluster start` printed)",
            err=True,
        )
        raise typer.Exit(2)
    found = cluster.cluster_pids(dir)
    left = cluster.stop(dir, grace)
    if left:
        typer.echo(f"fedgraph cluster stop: still running after SIGKILL: {left}", err=True)
        raise typer.Exit(1)
    typer.echo(f"stopped {len(found)} process(es) of the Ray cluster in {dir}")


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
