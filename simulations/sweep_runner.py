"""Running a sweep (:mod:`fedgraph.simulations.sweep`): its cells as ``fedgraph run`` processes, in parallel
without oversubscribing the cores, resumable.

A sweep file (TOML) names the axes: methods (presets or strategies) x datasets x epsilons x
num-clients x seeds. Every combination is a *cell*: one ``fedgraph run`` in its own folder,
``<output-dir>/cells/<method>__<dataset>__eps<e>__clients<n>__seed<s>/``, holding

- ``run.toml``  the cell's complete run config (``fedgraph run <that file>`` reruns it by hand),
- ``report.json`` the run's report, written atomically by the strategy,
- ``cell.json`` the sweep's record: parameters, status, error, exit code, wall time,
- ``log.txt`` the run's stdout and stderr.

A cell whose ``report.json`` says ``ok`` and whose ``run.toml`` matches the sweep's current config
is skipped, so an interrupted sweep, run again, finishes only the rest. Failed or interrupted
cells run again.

Execution: every cell is a separate ``fedgraph run`` process. Flower's simulation engine starts
its own Ray instance inside each run; running the cells as processes keeps those Ray instances
apart (no Ray inside a Ray worker sharing one cluster address), lets a hung cell be killed with
its whole process group, and keeps a crash in one cell away from the others. The cells are
scheduled either by a bounded pool (``executor = "local"``: ``cores // cpus-per-cell`` cells at
a time on this machine) or as Ray tasks with ``num_cpus = cpus-per-cell`` (``executor = "ray"``:
on a Ray cluster named by ``RAY_ADDRESS`` the cells spread over its nodes; the output folder
must then be shared). ``auto`` (the default) takes Ray when ``RAY_ADDRESS`` is set, else the
local pool: on one machine an outer Ray cluster only adds its daemons (about 800 MiB) to the
per-cell ones. Each cell's torch uses ``cpus-per-cell`` threads (``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from fedgraph.procstats import die_with_parent, end_group, signal_group
from fedgraph.report import write_bytes_atomic, write_json_atomic

from .sweep import Cell, Sweep

# ---------------------------------------------------------------- cell state on disk


def _comparable(run_config: dict) -> dict:
    return {k: v for k, v in run_config.items() if k not in ("output-dir", "run-name")}


def cell_is_done(cell_dir: Path, run_config: dict) -> bool:
    """True if the cell's report says ``ok`` and was made with this run config."""
    try:
        report = json.loads((cell_dir / "report.json").read_text())
        old = tomllib.loads((cell_dir / "run.toml").read_text())
    except (OSError, ValueError):
        return False
    return report.get("status") == "ok" and _comparable(old) == _comparable(run_config)


def _write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


@dataclass
class CellResult:
    cell: Cell
    status: str  # ok / failed / skipped / interrupted
    error: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    test: float | None = None


def _error_from_log(log: str, returncode: int) -> str:
    """The reason a ``fedgraph run`` failed, on one line: its ``fedgraph: ...`` message (with
    the indented lines that follow it), else the last line of its output."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("fedgraph: ")]
    if starts:
        i = starts[-1]
        msg = [lines[i][len("fedgraph: ") :].strip()]
        msg += [ln.strip() for ln in lines[i + 1 :] if ln.startswith("  ") and ln.strip()]
        return " ".join(msg)
    tail = [ln.strip() for ln in lines if ln.strip()]
    if returncode < 0:
        return f"killed by signal {-returncode}" + (f" (last output: {tail[-1]})" if tail else "")
    return tail[-1] if tail else f"exit code {returncode}, no output"


def cell_command(run_toml: Path, cpus: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fedgraph.simulations.cli",
        "run",
        str(run_toml),
        "--num-cpus",
        str(max(1, math.ceil(cpus))),
    ]


def _cell_env(cpus: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    threads = str(max(1, math.ceil(cpus)))
    env.update(
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class _Running:
    """Process groups of the cells now running, to kill them on an interrupt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def kill_all(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for p in procs:
            signal_group(p, signal.SIGTERM)
        deadline = time.time() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                signal_group(p, signal.SIGKILL)


def run_cell_process(
    cell_dir: str, cpus: float, timeout: float, running: _Running | None = None
) -> dict:
    """Run the cell in ``cell_dir`` (its ``run.toml`` written) as a ``fedgraph run`` process;
    return ``{"returncode", "wall_s", "error", "timed_out"}``. Used by both executors."""
    d = Path(cell_dir)
    cmd = cell_command(d / "run.toml", cpus)
    t0 = time.perf_counter()
    timed_out = False
    with open(d / "log.txt", "w") as log:
        p = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_cell_env(cpus),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if running is not None:
            with running.lock:
                running.procs.add(p)
                stopping = running.stopping
            if stopping:
                signal_group(p, signal.SIGTERM)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = end_group(p, grace=10)
        finally:
            if running is not None:
                with running.lock:
                    running.procs.discard(p)
    wall = time.perf_counter() - t0
    error = ""
    if timed_out:
        error = f"timed out after {timeout:g} s (sweep timeout)"
    elif rc != 0:
        error = _error_from_log((d / "log.txt").read_text(errors="replace"), rc)
    return {"returncode": rc, "wall_s": round(wall, 3), "error": error, "timed_out": timed_out}


# ---------------------------------------------------------------- the sweep


def _human_command(d: Path, cpus: float) -> str:
    return "fedgraph " + " ".join(cell_command(d / "run.toml", cpus)[3:])


def _write_cell(sweep: Sweep, cell: Cell, d: Path, **status) -> None:
    write_json_atomic(
        d / "cell.json",
        {
            **cell.params(),
            "sweep": sweep.name,
            **status,
            "command": _human_command(d, sweep.spec.sweep.cpus_per_cell),
        },
    )


def _prepare(sweep: Sweep, cell: Cell) -> Path:
    """Write the cell's ``run.toml`` and a ``queued`` ``cell.json``; drop a stale report."""
    d = sweep.cell_dir(cell)
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**cell.run_config, "output-dir": str(d), "run-name": "report"}
    (d / "report.json").unlink(missing_ok=True)
    _write_text_atomic(d / "run.toml", tomli_w.dumps(cfg))
    _write_cell(sweep, cell, d, status="queued")
    return d


def _finish(sweep: Sweep, cell: Cell, d: Path, res: dict) -> CellResult:
    """Record a finished cell in ``cell.json``: ok only if it exited 0 with an ok report."""
    report = {}
    try:
        report = json.loads((d / "report.json").read_text())
    except (OSError, ValueError):
        pass
    # Interrupted after the strategy wrote an ok report (while Ray shut down): the run is done.
    ok = report.get("status") == "ok" and (res["returncode"] == 0 or res.get("interrupted"))
    error = "" if ok else (res["error"] or report.get("error") or "the run wrote no report")
    status = "ok" if ok else ("interrupted" if res.get("interrupted") else "failed")
    _write_cell(
        sweep,
        cell,
        d,
        status=status,
        error=error or None,
        returncode=res["returncode"],
        wall_s=res["wall_s"],
    )
    test = report.get("accuracy", {}).get("test") if ok else None
    return CellResult(cell, status, error, res["returncode"], res["wall_s"], test)


def _display_path(p: Path) -> str:
    """``p`` relative to the current directory (for the commands we print)."""
    return os.path.relpath(p.resolve(), Path.cwd().resolve())


def _mark_ok(sweep: Sweep, cell: Cell) -> None:
    """A done cell (ok report) whose ``cell.json`` says otherwise (its process was stopped
    after the report was written) is recorded as ok."""
    d = sweep.cell_dir(cell)
    try:
        record = json.loads((d / "cell.json").read_text())
    except (OSError, ValueError):
        record = {}
    if record.get("status") != "ok":
        _write_cell(
            sweep,
            cell,
            d,
            status="ok",
            error=None,
            returncode=record.get("returncode"),
            wall_s=record.get("wall_s"),
            note="report written before the process was stopped",
        )


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class SweepSummary:
    results: list[CellResult]
    wall_s: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[CellResult]:
        return [r for r in self.results if r.status != "ok" and r.status != "skipped"]


def run_sweep(
    sweep: Sweep,
    parallel: int | None = None,
    executor: str | None = None,
    echo: Callable[[str], None] = print,
    progress: Any = None,
) -> SweepSummary:
    """Run every cell of ``sweep`` that is not done yet.

    Args:
        parallel: cells at a time (default: available cores // cpus-per-cell, at least 1).
        executor: ``local``, ``ray`` or ``auto`` (default: the sweep file's, else auto).
        echo: prints one line (a failed cell, the plan, the summary).
        progress: an object with ``start(total)`` and ``advance(result)`` (e.g. a rich bar).
    """
    t0 = time.perf_counter()
    axes = sweep.spec.sweep
    cells = sweep.cells()
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    _write_text_atomic(sweep.output_dir / "sweep.toml", sweep.path.read_text())
    results: list[CellResult] = []
    todo = []
    for c in cells:
        if cell_is_done(sweep.cell_dir(c), c.run_config):
            results.append(CellResult(c, "skipped"))
            _mark_ok(sweep, c)
        else:
            todo.append(c)
    cores = available_cpus()
    parallel = parallel or max(1, int(cores // axes.cpus_per_cell))
    executor = executor or axes.executor
    if executor == "auto":
        executor = "ray" if os.environ.get("RAY_ADDRESS") else "local"
    data = os.environ.get("FEDGRAPH_DATA")
    write_json_atomic(
        sweep.output_dir / "sweep.json",
        {
            "name": sweep.name,
            "source": _display_path(sweep.path),
            "FEDGRAPH_DATA": _display_path(Path(data)) if data else None,
            "cores": cores,
            "parallel": parallel,
            "executor": executor,
        },
    )
    at_once = (
        "as the Ray cluster's CPUs allow"
        if executor == "ray" and os.environ.get("RAY_ADDRESS")
        else f"{parallel} at a time"
    )
    echo(
        f"sweep {sweep.name}: {len(cells)} cells, {len(results)} already done, {len(todo)} to run, "
        f"{at_once} ({axes.cpus_per_cell:g} CPU each, {executor} executor, {cores} cores here) "
        f"-> {sweep.output_dir}"
    )
    if progress is not None:
        progress.start(len(todo))

    def done(cell: Cell, d: Path, res: dict) -> None:
        r = _finish(sweep, cell, d, res)
        results.append(r)
        if r.status != "ok":
            error = r.error if len(r.error) <= 300 else r.error[:297] + "..."
            echo(f"FAILED {cell.describe()}: {error} (log: {d / 'log.txt'})")
        if progress is not None:
            progress.advance(r)

    if todo:
        run = _run_ray if executor == "ray" else _run_local
        run(sweep, todo, parallel, done)
    summary = SweepSummary(results, time.perf_counter() - t0)
    if progress is not None and hasattr(progress, "stop"):
        progress.stop()  # the bar's last state before the summary line
    echo(
        f"sweep {sweep.name}: {summary.count('ok')} ok, {len(summary.failed)} failed, "
        f"{summary.count('skipped')} skipped (done before) in {summary.wall_s:.0f} s"
    )
    return summary


def _run_local(sweep: Sweep, todo: list[Cell], parallel: int, done) -> None:
    axes = sweep.spec.sweep
    running = _Running()

    def execute(c: Cell) -> dict:
        d = _prepare(sweep, c)
        _write_cell(sweep, c, d, status="running")
        return run_cell_process(str(d), axes.cpus_per_cell, axes.timeout, running)

    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="cell")
    futures = {pool.submit(execute, c): c for c in todo}
    pending = set(futures)
    try:
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for f in finished:
                done(futures[f], sweep.cell_dir(futures[f]), f.result())
    except BaseException:  # KeyboardInterrupt, SIGTERM (see the CLI): stop the running cells
        pool.shutdown(wait=False, cancel_futures=True)
        running.kill_all()
        for f in pending:
            if not f.cancelled() and f.exception() is None:
                c = futures[f]
                _finish(sweep, c, sweep.cell_dir(c), {**f.result(), "interrupted": True})
        raise
    pool.shutdown(wait=True)


def _run_ray(sweep: Sweep, todo: list[Cell], parallel: int, done) -> None:
    import ray

    axes = sweep.spec.sweep
    address = os.environ.get("RAY_ADDRESS")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
    ray.init(
        address=address,
        num_cpus=None if address else math.ceil(parallel * axes.cpus_per_cell),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        task = ray.remote(num_cpus=axes.cpus_per_cell, max_retries=0)(run_cell_process)
        refs = {}
        for c in todo:
            d = _prepare(sweep, c)
            refs[task.remote(str(d), axes.cpus_per_cell, axes.timeout)] = (c, d)
        pending = list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                c, d = refs[ref]
                try:
                    res = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - the task itself died
                    res = {"returncode": -1, "wall_s": 0.0, "error": f"Ray task failed: {err}"}
                done(c, d, res)
    finally:
        ray.shutdown()
