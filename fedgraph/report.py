"""Run reports: one JSON per run, written atomically, and a short printed table."""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

_CONSOLE = Console(stderr=True, highlight=False)


def default_run_name(
    label: str, dataset: str, seed: int, when: float | None = None, pid: int | None = None
) -> str:
    """The report name of a run without ``run-name``, the same under ``fedgraph run`` and
    ``flwr run``: ``<label>-<dataset>-seed<seed>-<YYYYmmdd-HHMMSS>-<pid>`` (``label``: the
    strategy's method, under both, whatever preset file the config came from; the dataset is
    not repeated when the label ends with it: ``gap-cora-seed0-20261201-101500-4242``). The process id keeps two runs started
    in the same second apart."""
    stem = label if label.endswith(f"-{dataset}") or label == dataset else f"{label}-{dataset}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return f"{stem}-seed{seed}-{stamp}-{os.getpid() if pid is None else pid}"


def write_json_atomic(path: str | Path, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` via a temporary file and ``os.replace`` (atomic)."""
    return write_bytes_atomic(
        path, json.dumps(strict_json(obj), indent=2, allow_nan=False, default=_jsonable).encode()
    )


def strict_json(obj):
    """``obj`` with every non-finite float replaced so that the JSON is strict (RFC 8259 has no
    NaN or Infinity): NaN -> ``null`` (no value), +-inf -> the strings ``"inf"`` / ``"-inf"``
    (an epsilon of a release without noise; ``float("inf")`` reads it back). Tensors and
    arrays become lists first."""
    if isinstance(obj, float) or type(obj).__name__ in ("float32", "float64", "float16"):
        v = float(obj)
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else v
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return strict_json(obj.tolist())
    return obj


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (atomic): a reader
    sees the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


#: seconds between two progress lines where stderr is not a terminal (a log: ``flwr run``,
#: CI); on a terminal the phase's spinner shows every update
PROGRESS_EVERY_S = 15.0


@dataclass
class _Phase:
    """The running phase's progress: named counters shown after its name."""

    label: str
    status: object | None  # rich Status (terminal) or None
    rounds: int | None = None  # of a Flower strategy's training, when the phase runs one
    round: int = 0
    started: float = field(default_factory=time.monotonic)
    counters: dict = field(default_factory=dict)
    printed: float = 0.0
    exchange: float = 0.0  # seconds spent waiting on clients' replies (:func:`exchanged`)

    def text(self) -> str:
        return " ".join(
            [
                f"{self.label} ...",
                ", ".join(
                    f"round {v}" if k == "round" else f"{v} {k}" for k, v in self.counters.items()
                ),
            ]
        ).rstrip()


#: the phase running now (innermost), if any
_PHASE: list[_Phase] = []


def progress(what: str, done: int, total: int | None = None) -> None:
    """Report how far the running phase (:meth:`RunReport.phase`) is: ``done`` (of
    ``total``) ``what`` (``"clients"``: replies arrived, ``"round"``, ``"queries answered"``).
    On a terminal the phase's spinner shows it; elsewhere (``flwr run``'s log, CI) one line at
    most every :data:`PROGRESS_EVERY_S` seconds, none in a phase's first seconds. Without a
    running phase (or with :attr:`RunReport.progress` off): nothing."""
    if not _PHASE or _PHASE[-1].status is None:
        return
    phase = _PHASE[-1]
    phase.counters[what] = f"{done}/{total}" if total is not None else f"{done}"
    if _CONSOLE.is_terminal:
        phase.status.update(phase.text())
        return
    _log_line(phase)


def _log_line(phase: _Phase) -> None:
    """Where stderr is not a terminal: one progress line of ``phase`` if none was printed in
    the last :data:`PROGRESS_EVERY_S` seconds (nor since it started)."""
    now = time.monotonic()
    if now - max(phase.started, phase.printed) >= PROGRESS_EVERY_S:
        phase.printed = now
        _CONSOLE.print(
            f"{phase.text()} ({now - phase.started:.0f} s)", markup=False, soft_wrap=True
        )


@contextmanager
def _heartbeat(phase: _Phase, tick: float = 1.0):
    """Where stderr is not a terminal (a log file, ``flwr run``'s log): a background thread
    that prints a line of ``phase`` every :data:`PROGRESS_EVERY_S` seconds in which nothing
    called :func:`progress`, so that a long phase without clients (a server's training,
    PPGNN's calibration) shows life too; nothing on a terminal (the spinner runs)."""
    if phase.status is None or _CONSOLE.is_terminal:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(tick):
            _log_line(phase)

    thread = threading.Thread(target=beat, daemon=True, name="fedgraph-progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def exchanged(seconds: float) -> None:
    """The server waited ``seconds`` on one exchange with its clients (a grid's
    ``send_and_receive``: transport and the clients' handlers); summed per phase into the
    report's ``exchange_s``, so that a phase's wall time minus it is the server's own work."""
    if _PHASE:
        _PHASE[-1].exchange += seconds


def progress_round() -> None:
    """A training round of the running phase started (its replies follow): ``round r/R``."""
    if _PHASE:
        _PHASE[-1].round += 1
        progress("round", _PHASE[-1].round, _PHASE[-1].rounds)


GROUND_TRUTH_NOTE = (
    "the simulation's ground truth about the whole graph, computed by the harness that loaded "
    "it (never sent by a client, not a release, outside every guarantee): for the "
    "experimenter, not part of what the server learned"
)


def ground_truth(statistics: dict) -> dict:
    """The report's ``ground_truth`` part: ``statistics`` (the whole graph's
    :func:`fedgraph.data.dataset_statistics`) with the majority-class rate over every label,
    and a note saying what it is. What was released is the rest of the report: ``dataset``
    (the public schema: name, node universe, feature and class counts), ``privacy``,
    ``accuracy`` (evaluation counts) and the per-client plans."""
    counts = statistics.get("class_counts") or []
    majority = max(counts) / sum(counts) if counts and sum(counts) else None
    return {"note": GROUND_TRUTH_NOTE, "dataset": dict(statistics), "majority_class": majority}


def majority_class(report: dict):
    """A majority-class rate of a report, for a sanity threshold: the test split's own
    (``accuracy.majority_class``: PrivGNN's public test nodes), else the whole graph's
    (``ground_truth``, reports since issue 28). What a user is shown, the table's note and the
    sweep plots, uses :func:`test_majority_class` only."""
    acc = report.get("accuracy", {}).get("majority_class")
    return acc if acc is not None else (report.get("ground_truth") or {}).get("majority_class")


def test_majority_class(report: dict):
    """The one rule for "below the majority class" (the table's note, ``fedgraph report``'s
    CSV column and plot line): the majority-class rate of the test split itself
    (``accuracy.majority_class``, where the report has one: PrivGNN's public test nodes), else
    ``None``. The whole graph's rate (``ground_truth.majority_class``) differs from a split's:
    GAP on Cora, test 0.2783 against the whole graph's 0.302, is not below its test split's."""
    value = (report.get("accuracy") or {}).get("majority_class")
    return value if isinstance(value, float) else None


def _memory_sampler():
    """A started :class:`~fedgraph.procstats.TreeSampler` of this process's tree, or ``None``
    without psutil."""
    from .procstats import TreeSampler, have_psutil

    if not have_psutil():
        return None
    return TreeSampler(os.getpid(), interval=0.5).start()


@dataclass
class RunReport:
    """Collects a run's config, statistics, accuracy, privacy and timings."""

    method: str
    config: dict
    status: str = "running"
    error: str | None = None
    dataset: dict = field(default_factory=dict)
    accuracy: dict = field(default_factory=dict)
    privacy: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    cpu_timings: dict = field(default_factory=dict)
    exchange_timings: dict = field(default_factory=dict)
    memory_peaks: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    #: print a progress line when each phase starts and ends (to stderr, with rich)
    progress: bool = True

    @contextmanager
    def phase(self, name: str, rounds: int | None = None):
        """Time a phase (wall seconds) into ``timings[name]``; with :attr:`progress`, show a
        spinner while it runs, with what :func:`progress` reports (clients done / total,
        round r of ``rounds``, queries answered), and one line with its time when it ends;
        ``exchange_timings[name]``: the seconds of it spent waiting on clients (:func:`exchanged`);
        ``memory_peaks[name]``: the peak RSS (MiB) of this process and its descendants in it
        (:class:`~fedgraph.procstats.TreeSampler`, sampled every 0.5 s and at the phase's
        start and end; with Ray started here, its workers are descendants)."""
        t, cpu = time.perf_counter(), time.process_time()
        sampler = _memory_sampler()
        ok, interrupted = False, False
        status = _CONSOLE.status(f"{self.method}: {name} ...") if self.progress else nullcontext()
        outer = _PHASE[:]
        running = _Phase(f"{self.method}: {name}", status if self.progress else None, rounds)
        _PHASE[:] = [running]
        try:
            with status, _heartbeat(running):
                yield
            ok = True
        except BaseException as err:
            from .errors import RunInterrupted

            interrupted = isinstance(err, (RunInterrupted, KeyboardInterrupt))
            raise
        finally:
            _PHASE[:] = outer
            self.timings[name] = round(time.perf_counter() - t, 3)
            # CPU seconds of the server's process (all its threads) in the phase: beside the
            # wall time, it tells work from waiting (on clients, or for a loaded machine's CPU).
            self.cpu_timings[name] = round(time.process_time() - cpu, 3)
            self.exchange_timings[name] = round(running.exchange, 3)
            if sampler is not None:
                sampler.stop()
                sampler.sample()
                self.memory_peaks[name] = round(sampler.peak_rss / 2**20, 1)
            if self.progress:
                mark = (
                    "[green]done[/]"
                    if ok
                    else "[yellow]interrupted[/]"
                    if interrupted
                    else "[red]failed[/]"
                )
                _CONSOLE.print(f"{self.method}: {name} {mark} in {self.timings[name]:.1f} s")

    def to_dict(self) -> dict:
        return {
            "fedgraph_report": 1,
            "method": self.method,
            "status": self.status,
            "error": self.error,
            "config": self.config,
            "dataset": self.dataset,
            "accuracy": self.accuracy,
            "privacy": self.privacy,
            "timings_s": {**self.timings, "total": round(time.time() - self.started, 3)},
            "server_cpu_s": dict(self.cpu_timings),
            "exchange_s": dict(self.exchange_timings),
            "peak_rss_mib": dict(self.memory_peaks),
            "host": _host(),
            **self.extra,
        }

    def write(self, folder: str | Path, name: str) -> Path:
        return write_json_atomic(Path(folder) / f"{name}.json", self.to_dict())


def _host() -> dict:
    """The machine and the process that ran the server: Python, architecture, CPUs this
    process may use, torch's thread counts and the thread settings of its environment (a
    server step's speed depends on them: ``flwr run`` starts the ServerApp in a process of
    its own, with the SuperLink's environment); under Flower's simulation engine, whether its
    message polls were replaced by wake-ups (``fedgraph.simulations.wakeups``) and, under ``fedgraph
    run``, how many client actors were prestarted while it imported
    (``fedgraph.simulations.early_ray``)."""
    import os
    import sys

    out = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        out["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["cpus"] = os.cpu_count()
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = torch.get_num_threads()
        out["torch_interop_threads"] = torch.get_num_interop_threads()
    out["env"] = {
        k: os.environ[k]
        for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "THP_MEM_ALLOC_ENABLE")
        if k in os.environ
    }
    wakeups = sys.modules.get("fedgraph.simulations.wakeups")
    if wakeups is not None:
        out["flower_wakeups"] = wakeups.installed()
    heartbeat = sys.modules.get("fedgraph.simulations.task_heartbeat")
    if heartbeat is not None and heartbeat.stats() is not None:  # flwr run's task process
        out["task_heartbeats"] = heartbeat.stats()
    early_ray = sys.modules.get("fedgraph.simulations.early_ray")
    if early_ray is not None:
        out["prestarted_actors"] = early_ray.TAKEN["count"]
        # where the clients' large tensors wait between messages (simulations.client_state)
        out["client_state"] = (
            "actor memory"
            if early_ray.TAKEN.get("sole") and early_ray.TAKEN["count"] == 1
            else "object store"
        )
    return out


#: an epsilon above this bounds nothing (e^100 > 1e43: any output may become 1e43 times more
#: likely); ``inf`` (no noise, said plainly) is not warned about
MEANINGFUL_EPSILON = 100.0
_EPSILON_KEYS = ("client_epsilons", "budgets", "epsilon", "label_epsilon")


def epsilon_warning(config: dict) -> str | None:
    """A ``WARNING`` line where a run config (``client-epsilons``, ``budgets``, ``epsilon``,
    ``label-epsilon``, in either spelling, as numbers, lists or ``"1,4"`` text) asks for a
    finite epsilon above :data:`MEANINGFUL_EPSILON` (``client-epsilons=1e300`` ran without a
    word), else ``None``."""
    values = []
    for key, v in config.items():
        if str(key).replace("-", "_") not in _EPSILON_KEYS:
            continue
        for item in (
            v.replace(";", ",").split(",")
            if isinstance(v, str)
            else v
            if isinstance(v, (list, tuple))
            else [v]
        ):
            try:
                values.append(float(item))
            except (TypeError, ValueError):
                pass
    big = [x for x in values if math.isfinite(x) and x > MEANINGFUL_EPSILON]
    if not big:
        return None
    return (
        f"WARNING: epsilon {max(big):g} is above any meaningful value (> "
        f"{MEANINGFUL_EPSILON:g}: e^epsilon bounds nothing), so this run is not private in "
        f"any useful sense; say 'inf' for no noise, or keep epsilons to a few tens at most"
    )


def method_title(report: dict) -> str:
    """The method a report's table is titled with: its ``method``, and for PPGNN's baselines
    which one ran (``ppgnn (LPGNN: multi-bit + kprop)``, ``ppgnn (BASE: no denoiser)``): the
    LPGNN preset's table was titled plain ``ppgnn``."""
    method, cfg = report.get("method", "?"), report.get("config") or {}
    if method == "ppgnn":
        mechanism, denoiser = cfg.get("mechanism"), cfg.get("denoiser")
        if mechanism == "multi-bit" and denoiser == "kprop":
            return "ppgnn (LPGNN: multi-bit + kprop)"
        if denoiser == "none":
            return f"ppgnn (BASE: {mechanism}, no denoiser)"
    return method


def format_table(report: dict) -> str:
    """A short human-readable summary of a report dict."""
    dataset = report["dataset"].get("name") or report.get("config", {}).get("dataset", "?")
    lines = [
        f"fedgraph {method_title(report)} on {dataset}: "
        f"status {report['status']}" + (" (NOT DP: see below)" if report.get("status_note") else "")
    ]
    if report.get("status_note"):  # a mode chosen knowing it has no finite epsilon
        lines.append(f"  {report['status_note']}")
    if report.get("error"):
        lines.append(f"  error: {report['error']}")
    acc = report.get("accuracy", {})
    if acc:
        lines.append(
            "  accuracy  "
            + "  ".join(
                f"{k} {v:.4f}" for k, v in acc.items() if isinstance(v, float) and not math.isnan(v)
            )
        )
    privacy = report.get("privacy", {})
    subjects = privacy.get("per_subject", {})
    width = max([10, *(len(s) for s in subjects)])
    for subject, row in subjects.items():
        extra = f" (budget {row['budget']:g})" if "budget" in row else ""
        if row.get("not_dp"):  # chosen (strategies.base.check_budgets_kept), not an overspend
            extra += " NOT DP"
        elif row.get("over_budget"):
            extra += " OVER BUDGET"
        claimed = row.get("claimed") or {}
        if isinstance(claimed.get("epsilon"), (int, float)):
            extra += (
                f" (not DP; {', '.join(claimed['by'])} claim "
                f"{claimed['epsilon']:.4g}, which does not hold)"
            )
        delta = f", delta {row['delta']:g}" if row.get("delta") else ""
        releases = ", ".join(
            r["release"] + (f" ({r['reason']})" if "reason" in r else "") for r in row["releases"]
        )
        lines.append(
            f"  {subject:<{width}} epsilon {row['epsilon']:.4g}{delta}{extra}  [{releases}]"
        )
    own = privacy.get("client_ledgers") or {}
    if own:  # each client's own ledger (fedgraph.client_authority) beside the server's
        differ = [s for s, r in own.items() if not r.get("agree")]
        if differ:
            lines.append(
                "  WARNING: the clients' own ledgers disagree with the server's: "
                + ", ".join(
                    f"{s} (client {own[s].get('client')!s:.6}, server {own[s].get('server')!s:.6})"
                    for s in differ
                )
                + " (privacy.client_ledgers)"
            )
        else:
            lines.append(
                f"  clients' own ledgers: all {len(own)} subjects agree with the "
                "server's (privacy.client_ledgers)"
            )
    silent = privacy.get("released_nothing")
    if silent:  # clients with no ledger subject: they spent nothing, and taught nothing
        lines.append(
            f"  {', '.join(silent)}: released nothing (epsilon 0; "
            f"{privacy.get('released_nothing_why', 'no release')})"
        )
    undirected = privacy.get("undirected_edge_epsilon")
    if undirected:  # edge-unit = directed: a friendship is both directed halves
        lines.append(
            f"  edge-unit directed: an undirected edge (both halves) costs epsilon up "
            f"to {max(undirected.values()):.4g} per client "
            f"(privacy.undirected_edge_epsilon)"
        )
    # delta >= 1/n lets a mechanism publish some unit's data outright; n: a client's average
    # node count where the guarantees are per client's data (subjects client-<i>), else the
    # nodes (per-user LDP), a lenient floor either way
    deltas = [row["delta"] for row in subjects.values() if row.get("delta")]
    nodes = report.get("ground_truth", {}).get("dataset", {}).get("num_nodes") or report.get(
        "dataset", {}
    ).get("num_nodes")
    per_client = any(str(s).startswith("client-") for s in subjects)
    clients = (report.get("config", {}).get("num_clients") or 1) if per_client else 1
    if deltas and nodes and max(deltas) >= clients / nodes:
        unit = "a client's average number of nodes" if per_client else "the users"
        lines.append(
            f"  WARNING: delta {max(deltas):g} is not below 1 / {nodes / clients:.0f} "
            f"({unit}): with delta >= 1/n an (epsilon, delta) guarantee allows "
            f"publishing some unit's data outright; use delta well below 1/n"
        )
    # only a majority rate of the test split itself (PrivGNN's public test nodes): the whole
    # graph's rate differs from a split's, and the note would be false
    majority = test_majority_class(report)
    test = acc.get("test")
    if isinstance(majority, float) and isinstance(test, float) and test < majority:
        lines.append(
            f"  note: test accuracy {test:.4f} is below the majority-class rate "
            f"{majority:.4f}: the model does worse than always guessing the largest "
            f"class"
        )
    meaningless = epsilon_warning(report.get("config") or {})
    if meaningless:
        lines.append(f"  {meaningless}")
    collusion = privacy.get("collusion")
    if collusion and collusion.get("epsilon"):  # secure aggregation's weak point, stated
        worst = max(collusion["epsilon"].values())
        lines.append(
            f"  secure aggregation: against a server colluding with all other "
            f"clients, epsilon up to {worst:.4g} per client (own noise share only; "
            f"privacy.collusion)"
        )
    if privacy.get("noise_source") == "mt19937":
        lines.append(
            "  WARNING: noise-source mt19937 is not a CSPRNG: these epsilons do not hold "
            "against a server that recovers the generator's state from released "
            "pure-noise values (privacy.noise_source_detail)"
        )
    note = privacy.get("inference_note")
    if note:
        lines.append(f"  note: {note}")
    t = report.get("timings_s", {})
    if t:
        lines.append("  time (s)  " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()))
    mem = report.get("peak_rss_mib", {})
    if mem:
        lines.append(
            "  peak memory (MiB, process tree)  "
            + "  ".join(f"{k} {v:.0f}" for k, v in mem.items())
        )
    return "\n".join(lines)
