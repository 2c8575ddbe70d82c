"""Sweep results: one CSV (mean and std per cell over seeds), privacy-utility plots (PNG) and a
markdown page, from the cell folders that ``fedgraph sweep`` wrote.

A *row* is one run (one seed); a *group* is a cell of the grid without its seed: (method,
dataset, DP level, epsilon, num-clients). Means and standard deviations are over the seeds
whose run is ``ok``; the standard deviation is the sample one (``ddof = 1``), empty for a
single seed. Accuracies are fractions in the CSV and percentages in plots and markdown.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fedgraph.report import test_majority_class, write_bytes_atomic

from .sweep import Published

SPLITS = ("train", "val", "test")
DP_TITLES = {
    "user": "user-level LDP (node features)",
    "edge": "edge-level DP",
    "node": "node-level DP",
    "none": "no privacy",
}
EPS_UNITS = {
    "user": "epsilon (per user)",
    "edge": "epsilon (per edge)",
    "node": "epsilon (per node)",
}
CSV_COLUMNS = (
    [
        "method",
        "label",
        "dataset",
        "dp_level",
        "epsilon",
        "axis_value",
        "num_clients",
        "seeds",
        "failed",
    ]
    + [f"{s}_{m}" for s in SPLITS for m in ("mean", "std")]
    + [
        "majority_class",
        "epsilon_spent_min",
        "epsilon_spent_max",
        "run_time_s_mean",
        "run_time_s_std",
        "cell_wall_s_mean",
        "cell_wall_s_std",
    ]
)


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def _epsilons_spent(report: dict) -> list[float]:
    return [
        float(row["epsilon"])
        for row in report.get("privacy", {}).get("per_subject", {}).values()
        if "epsilon" in row
    ]


def _read_object(path: Path) -> tuple[dict | None, str | None]:
    """``(the JSON object in path, None)``, or ``(None, why it holds none)``."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return None, f"{type(err).__name__}: {err}"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, None


def collect(dirs: Iterable[str | Path]) -> list[dict]:
    """One row per cell folder (a ``cell.json``) under each of ``dirs``. A damaged
    ``cell.json`` (the sweep reruns that cell) is left out, and a damaged ``report.json``
    makes its cell a failed one, each with a line on stderr naming the file."""
    import sys

    rows = []
    for base in dirs:
        for cell_json in sorted(Path(base).glob("**/cells/*/cell.json")):
            cell, why = _read_object(cell_json)
            if cell is None:
                print(
                    f"fedgraph report: left out {cell_json}: not a cell record ({why}); "
                    f"`fedgraph sweep` runs that cell again",
                    file=sys.stderr,
                )
                continue
            row = {**cell, "dir": str(cell_json.parent)}
            report_path = cell_json.parent / "report.json"
            report, why = _read_object(report_path) if report_path.exists() else ({}, None)
            if report is None:
                print(
                    f"fedgraph report: {report_path}: not a run report ({why}); its cell "
                    f"counts as failed",
                    file=sys.stderr,
                )
                row.update(status="failed", error=f"report.json unreadable: {why}")
                report = {}
            if report.get("status") == "ok":  # the report decides (as for the sweep's skip)
                row["status"] = "ok"
                acc = report.get("accuracy", {})
                row.update(
                    {s: acc.get(s) for s in SPLITS},
                    majority_class=test_majority_class(report),
                    epsilon_spent=_epsilons_spent(report),
                    run_time_s=report.get("timings_s", {}).get("total"),
                )
            rows.append(row)
    return rows


def _group_key(row: dict) -> tuple:
    return (row["method"], row["dataset"], row["dp_level"], row["epsilon"], row["num_clients"])


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean and std per group (cell without seed) over the seeds whose run is ok."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[_group_key(r)].append(r)
    out = []
    for key, rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("test") is not None]
        g = dict(zip(("method", "dataset", "dp_level", "epsilon", "num_clients"), key))
        g.update(
            label=rs[0].get("label") or key[0],
            seeds=len(ok),
            failed=len(rs) - len(ok),
            errors=sorted({r.get("error") or r.get("status", "?") for r in rs if r not in ok}),
        )
        for s in SPLITS:
            g[f"{s}_mean"], g[f"{s}_std"] = _mean_std([r[s] for r in ok])
        g["majority_class"], _ = _mean_std([r["majority_class"] for r in ok])
        spent = [e for r in ok for e in r["epsilon_spent"]]
        g["epsilon_spent_min"] = min(spent) if spent else None
        g["epsilon_spent_max"] = max(spent) if spent else None
        g["axis_value"] = key[3]
        if rs[0].get("epsilon_from") == "report" and ok:
            # the axis set a noise parameter: place the group at the epsilon it spent
            # (largest subject of each run, mean over the seeds)
            g["epsilon"] = float(f"{statistics.fmean(max(r['epsilon_spent']) for r in ok):.3g}")
        g["run_time_s_mean"], g["run_time_s_std"] = _mean_std([r["run_time_s"] for r in ok])
        g["cell_wall_s_mean"], g["cell_wall_s_std"] = _mean_std([r.get("wall_s") for r in ok])
        out.append(g)
    method_order = {}
    for r in rows:
        method_order.setdefault(r["method"], len(method_order))
    out.sort(
        key=lambda g: (
            g["dataset"],
            g["dp_level"],
            method_order[g["method"]],
            g["num_clients"],
            _eps_sort(g["epsilon"]),
        )
    )
    return out


def _eps_sort(e: float | None) -> float:
    return math.inf if e is None else e


def write_csv(groups: list[dict], path: str | Path) -> Path:
    """The groups as CSV (``CSV_COLUMNS``), written atomically."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for g in groups:
        w.writerow({k: ("" if g.get(k) is None else g[k]) for k in CSV_COLUMNS})
    return write_bytes_atomic(Path(path), buf.getvalue().encode())


# ---------------------------------------------------------------- published numbers


def load_published(paths: Iterable[str | Path]) -> list[Published]:
    """``[[published]]`` entries of sweep files (a sweep's own copy is ``DIR/sweep.toml``),
    each checked as a sweep file's entries are (:class:`fedgraph.simulations.sweep.Published`).

    Raises:
        OSError: a file cannot be read; tomllib.TOMLDecodeError: not TOML;
        ValueError: ``published`` not a list of tables, or an entry with a missing, unknown or
            mistyped field (named, with the file and the entry's index).
    """
    from pydantic import ValidationError

    out, seen = [], set()
    for p in paths:
        entries = tomllib.loads(Path(p).read_text()).get("published", [])
        if not isinstance(entries, list):
            raise ValueError(
                f"{p}: published must be a list of tables ([[published]]), got "
                f"{type(entries).__name__}"
            )
        for i, raw in enumerate(entries):
            try:
                item = Published.model_validate(raw)
            except ValidationError as err:
                why = "; ".join(
                    f"{'.'.join(str(x) for x in d['loc']) or 'entry'}: {d['msg']}"
                    for d in err.errors()
                )
                raise ValueError(f"{p}: published[{i}]: {why}") from None
            key = (item.method, item.dataset, item.epsilon, item.test)
            if key not in seen:
                seen.add(key)
                out.append(item)
    return out


# ---------------------------------------------------------------- plots


def _dataset_title(name: str) -> str:
    known = {
        "cora": "Cora",
        "citeseer": "CiteSeer",
        "pubmed": "PubMed",
        "facebook-pagepage": "Facebook page-page",
        "lastfm-asia": "LastFM Asia",
        "reddit": "Reddit",
        "ogbn-products": "ogbn-products",
    }
    if name.lower().startswith("facebook100:"):
        return f"Facebook100 {name.split(':', 1)[1]}"
    return known.get(name.lower(), name)


@dataclass
class Figure:
    dataset: str
    dp_level: str
    path: Path
    lines: list[str] = field(default_factory=list)
    #: the same figure in every format asked for (``path`` is the first)
    paths: list[Path] = field(default_factory=list)
    #: the ``[[published]]`` points drawn on it
    published: list = field(default_factory=list)


#: figure formats ``fedgraph report --format`` writes (matplotlib's names)
FORMATS = ("png", "pdf", "svg")


def unplaced_published(published: Iterable[Published], figures: list[Figure]) -> list[str]:
    """One warning per ``[[published]]`` point that no figure shows, with why: no finite
    epsilon, or no plotted curve of its method on its dataset."""
    placed = [id(p) for f in figures for p in f.published]
    out = []
    for p in published:
        if id(p) in placed:
            continue
        why = (
            "it has no finite epsilon"
            if p.epsilon is None or math.isinf(p.epsilon)
            else f"no plotted curve of method {p.method!r} on dataset {p.dataset!r}"
        )
        eps = "-" if p.epsilon is None else f"{p.epsilon:g}"
        out.append(
            f"published {p.method} on {p.dataset} at epsilon {eps} ({p.test:g}, "
            f"{p.source}) is not on any plot: {why}"
        )
    return out


def seeds_footer(seeds: list[int]) -> str:
    """The plot's footer for the seed counts of its curves, e.g. ``[1]`` -> "... over 1 seed"."""
    return f"error bars: ± 1 std over {'/'.join(map(str, seeds))} seed{'' if seeds == [1] else 's'}"


def _panel(
    ax, dataset: str, level: str, here: list[dict], refs: list[dict], published: list[Published]
) -> tuple[list[str], list[Published]]:
    """Draw the (dataset, DP level) plot of :func:`plot` on ``ax``; returns the names of its
    lines and the published points drawn."""
    from matplotlib.ticker import FixedLocator, NullLocator

    curves = [g for g in here if g["dp_level"] == level and g not in refs]
    many_n = len({g["num_clients"] for g in curves}) > 1
    series: dict[tuple, list[dict]] = defaultdict(list)
    for g in curves:
        series[(g["label"], g["num_clients"] if many_n else None)].append(g)
    xs_all = sorted({g["epsilon"] for g in curves})
    names = []
    log_x = bool(xs_all) and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 4
    for i, ((label, n), gs) in enumerate(series.items()):
        gs.sort(key=lambda g: g["epsilon"])
        name = label + (f", {n} client" + ("s" if n != 1 else "") if n is not None else "")
        # Dodge overlapping error bars a little along x (2% per line on a log axis).
        shift = 0.02 * (i - (len(series) - 1) / 2)
        xs = [g["epsilon"] * (2**shift if log_x else 1) + (0 if log_x else shift) for g in gs]
        ax.errorbar(
            xs,
            [100 * g["test_mean"] for g in gs],
            yerr=[100 * (g["test_std"] or 0.0) for g in gs],
            marker="o",
            markersize=5,
            capsize=4,
            linewidth=1.8,
            label=name,
        )
        names.append(name)
    for g in refs:
        name = g["label"] + (" (eps = inf)" if g["epsilon"] else "")
        line = ax.axhline(
            100 * g["test_mean"],
            linestyle="--",
            linewidth=1.4,
            color=f"C{len(names) % 10}",
            label=name,
        )
        if g["test_std"]:
            ax.axhspan(
                100 * (g["test_mean"] - g["test_std"]),
                100 * (g["test_mean"] + g["test_std"]),
                color=line.get_color(),
                alpha=0.12,
                linewidth=0,
            )
        names.append(name)
    pub = [
        p
        for p in published
        if p.dataset == dataset
        and p.epsilon is not None
        and not math.isinf(p.epsilon)
        and any(g["method"] == p.method for g in curves)
    ]
    # y range from what is drawn (not the majority-class rate, which would squash it)
    ys = [
        100 * (g["test_mean"] + sign * (g["test_std"] or 0))
        for g in curves + refs
        for sign in (-1, 1)
    ]
    ys += [p.test for p in pub]
    low, high = min(ys) - 3, max(ys) + 3
    ax.set_ylim(low, high)
    majority = [g["majority_class"] for g in here if g["majority_class"] is not None]
    if majority:
        m = 100 * statistics.fmean(majority)
        if low <= m <= high:
            ax.axhline(
                m, color="grey", linestyle=":", linewidth=1.2, label="majority class (test split)"
            )
        else:
            ax.text(
                0.99,
                0.02,
                f"majority class (test split): {m:.1f}%",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=8,
                color="dimgrey",
            )
    seeds = sorted({g["seeds"] for g in curves})
    ax.text(
        0.01,
        0.02,
        seeds_footer(seeds),
        transform=ax.transAxes,
        ha="left",
        va="bottom",
        fontsize=8,
        color="dimgrey",
    )
    for i, p in enumerate(pub):
        ax.plot(
            [p.epsilon],
            [p.test],
            marker="*",
            markersize=13,
            color="black",
            linestyle="none",
            label="published" if i == 0 else None,
            zorder=5,
        )
        ax.annotate(
            f"{p.source.split(' (')[0]}: {p.test:g}",
            (p.epsilon, p.test),
            textcoords="offset points",
            xytext=(8, 10),
            fontsize=8,
        )
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(xs_all))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{x:g}" for x in xs_all])
    ax.set_xlabel(
        EPS_UNITS[level]
        + (
            "; PPGNN: smallest level"
            if level == "user" and any(g["method"].startswith("ppgnn") for g in curves)
            else ""
        )
    )
    ax.set_ylabel("test accuracy (%)")
    ns = sorted({g["num_clients"] for g in here})
    clients = "" if many_n else f", {ns[0]} client{'s' if ns[0] != 1 else ''}"
    ax.set_title(f"{_dataset_title(dataset)}: {DP_TITLES[level]}{clients}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    return names, pub


def _save(fig, stem: Path, formats: list[str]) -> list[Path]:
    """Write ``fig`` as ``stem.<fmt>`` for every format (atomically); returns the paths."""
    paths = []
    for fmt in formats:
        paths.append(stem.with_name(f"{stem.name}.{fmt}"))
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
        write_bytes_atomic(paths[-1], buf.getvalue())
    return paths


def plot(
    groups: list[dict],
    out_dir: str | Path,
    published: Iterable[Published] = (),
    formats: Iterable[str] = ("png",),
    combined: bool = False,
) -> list[Figure]:
    """One figure per (dataset, DP level), in each of ``formats`` (:data:`FORMATS`): test
    accuracy (%) against epsilon, one line per method
    (and client count, if several), error bars one std over seeds. Methods without an epsilon
    axis (no noise, MLP) are horizontal reference lines on every plot of their dataset, with the
    majority-class rate; published numbers are black stars (:func:`unplaced_published`: those
    that fit no plot). ``combined``: also one figure ``combined.<fmt>`` with every plot as a
    panel (dataset ``"all"`` in the returned list, last).

    Raises:
        ValueError: a format outside :data:`FORMATS`.
    """
    formats = list(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(
            f"--format: unknown {', '.join(bad) or 'none given'}; allowed: "
            f"{', '.join(FORMATS)} (comma-separated)"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    published = list(published)
    figures, panels = [], []
    for dataset in sorted({g["dataset"] for g in groups}):
        everything = [g for g in groups if g["dataset"] == dataset]
        here = [g for g in everything if g["seeds"] > 0]
        refs = [g for g in here if g["epsilon"] is None or math.isinf(g["epsilon"])]
        for level in sorted({g["dp_level"] for g in here if g["dp_level"] in EPS_UNITS}):
            fig, ax = plt.subplots(figsize=(7.0, 4.6), dpi=150)
            names, pub = _panel(ax, dataset, level, here, refs, published)
            panels.append((dataset, level, here, refs))
            missing = [
                f"{g['label']} eps = {g['epsilon']:g} ({g['failed']} failed)"
                for g in everything
                if g["dp_level"] == level and g["seeds"] == 0
            ]
            if missing:
                fig.text(
                    0.01,
                    0.01,
                    "not plotted, every run failed: " + "; ".join(missing),
                    fontsize=7,
                    color="dimgrey",
                    wrap=True,
                )
            fig.tight_layout(rect=(0, 0.04 if missing else 0, 1, 1))
            paths = _save(fig, out_dir / f"{slug_name(dataset)}-{level}", formats)
            plt.close(fig)
            figures.append(Figure(dataset, level, paths[0], names, paths, pub))
    if combined and panels:
        cols = min(len(panels), 2)
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(7.0 * cols, 4.6 * rows), dpi=150, squeeze=False
        )
        for ax, panel in zip(axes.flat, panels):
            _panel(ax, *panel, published)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        fig.tight_layout()
        paths = _save(fig, out_dir / "combined", formats)
        plt.close(fig)
        figures.append(Figure("all", "all", paths[0], [], paths, []))
    return figures


def slug_name(text: str) -> str:
    from .sweep import slug

    return slug(text)


# ---------------------------------------------------------------- markdown


def pct(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "failed"
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")


def markdown(
    groups: list[dict],
    figures: list[Figure],
    md_path: Path,
    published: list[Published],
    command: str,
    sweeps: list[dict],
    csv_path: Path | None = None,
) -> str:
    """The results page: how it was made, per (dataset, DP level) a table (methods x epsilon,
    test accuracy mean ± std over seeds) and its plot, and the papers' numbers beside ours."""
    lines = [
        "# Results",
        "",
        "<!-- Generated by `fedgraph report`; do not edit by hand. Regenerate with the "
        "command below. -->",
        "",
        "Regenerate this page (tables, plots under `docs/img/`) from the sweep folders:",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    for s in sweeps:
        lines += [
            f"Sweep `{s['name']}` ({s['file']}): {s['cells']} runs, {s['ok']} ok, "
            f"{s['failed']} failed; mean wall time per run {s['wall']:.0f} s"
            + (f" ({s['parallel']} at a time on {s['cores']} cores)" if s.get("cores") else "")
            + (f". {s['description']}" if s.get("description") else "")
            + ":",
            "",
            "```bash",
            f"{s.get('env', '')}nice -n 10 fedgraph sweep {s['file']}",
            "```",
            "",
        ]
    if csv_path is not None:
        rel = Path(_relpath(csv_path, md_path.parent)).as_posix()
        lines += [f"All numbers (every split, epsilon spent, wall time): [{rel}]({rel}).", ""]
    lines += [
        "Test accuracy in %, mean ± sample standard deviation over the seeds. Epsilon is "
        "the privacy budget of the DP level in each heading; for PPGNN (budget set "
        "E = {e, 2e, 4e}) the column is the smallest level e.",
        "",
    ]
    by_fig = {(f.dataset, f.dp_level): f for f in figures}
    sections = sorted({(g["dataset"], g["dp_level"]) for g in groups if g["dp_level"] in EPS_UNITS})
    for dataset, level in sections:
        gs = [
            g
            for g in groups
            if g["dataset"] == dataset
            and (g["dp_level"] == level or g["epsilon"] is None or math.isinf(g["epsilon"] or 0))
        ]
        eps = sorted(
            {g["epsilon"] for g in gs if g["epsilon"] is not None and not math.isinf(g["epsilon"])}
        )
        sorted({g["num_clients"] for g in gs})
        lines += [f"## {_dataset_title(dataset)}: {DP_TITLES[level]}", ""]
        has_refs = any(g["epsilon"] is None or math.isinf(g["epsilon"]) for g in gs)
        header = (
            ["method", "clients"]
            + [f"eps = {e:g}" for e in eps]
            + (["no epsilon axis"] if has_refs else [])
            + ["wall s / run"]
        )
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows: dict[tuple, dict] = {}
        for g in gs:
            rows.setdefault((g["label"], g["method"], g["num_clients"]), {})[g["epsilon"]] = g
        for (label, _method, n), by_eps in rows.items():
            cells = [
                pct(by_eps[e]["test_mean"], by_eps[e]["test_std"]) if e in by_eps else ""
                for e in eps
            ]
            refs = [g for k, g in by_eps.items() if k is None or math.isinf(k)]
            ref = (
                pct(refs[0]["test_mean"], refs[0]["test_std"])
                + (" (eps = inf)" if refs[0]["epsilon"] else "")
                if refs
                else ""
            )
            walls = [g["cell_wall_s_mean"] for g in by_eps.values() if g["cell_wall_s_mean"]]
            wall = f"{statistics.fmean(walls):.0f}" if walls else ""
            lines.append(
                "| "
                + " | ".join([label, str(n), *cells, *([ref] if has_refs else []), wall])
                + " |"
            )
        pub = [
            p
            for p in published
            if p.dataset == dataset and any(g["method"] == p.method for g in gs)
        ]
        for p in pub:
            cells = [f"{p.test:.1f}" if p.epsilon == e else "" for e in eps]
            ref = f"{p.test:.1f}" if p.epsilon is None or math.isinf(p.epsilon) else ""
            lines.append(
                "| "
                + " | ".join(
                    [
                        f"*{p.source.split(' (')[0]} ({p.method}), published*",
                        "",
                        *cells,
                        *([ref] if has_refs else []),
                        "",
                    ]
                )
                + " |"
            )
        failed = [g for g in gs if g["failed"]]
        lines.append("")
        for g in failed:
            errors = "; ".join(e if len(e) <= 200 else e[:197] + "..." for e in g["errors"])
            lines.append(
                f"- {g['label']} eps = {g['epsilon']}: {g['failed']} failed run(s): {errors}"
            )
        if failed:
            lines.append("")
        f = by_fig.get((dataset, level))
        if f is not None:
            rel = Path(_relpath(f.path, md_path.parent))
            lines += [f"![{_dataset_title(dataset)}, {DP_TITLES[level]}]({rel.as_posix()})", ""]
    if published:
        lines += [
            "## Published numbers",
            "",
            "The papers' own figures (their setting: one graph, no federation); ours "
            "beside them where a sweep above ran the same method, dataset and epsilon.",
            "",
            "| method | dataset | epsilon | published | ours | source |",
            "|---|---|---|---|---|---|",
        ]
        for p in published:
            ours = [
                g
                for g in groups
                if g["method"] == p.method
                and g["dataset"] == p.dataset
                and g["epsilon"] == p.epsilon
            ]
            mine = (
                "; ".join(
                    f"{pct(g['test_mean'], g['test_std'])} ({g['num_clients']} clients)"
                    for g in ours
                )
                or "not run here"
            )
            eps = (
                "inf"
                if p.epsilon is not None and math.isinf(p.epsilon)
                else ("n/a" if p.epsilon is None else f"{p.epsilon:g}")
            )
            pubv = f"{p.test:.1f}" + (f" ± {p.std:.1f}" if p.std else "")
            lines.append(
                f"| {p.method} | {p.dataset} | {eps} | {pubv} | {mine} | {p.source}"
                + (f" ({p.note})" if p.note else "")
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(Path(path).resolve(), Path(start).resolve())


def sweep_summaries(dirs: Iterable[str | Path], rows: list[dict]) -> list[dict]:
    """Name, file, cell counts and mean wall time of each sweep folder."""
    out = []
    for d in dirs:
        d = Path(d)
        sweep_toml = d / "sweep.toml"
        spec = tomllib.loads(sweep_toml.read_text()) if sweep_toml.exists() else {}
        meta = json.loads((d / "sweep.json").read_text()) if (d / "sweep.json").exists() else {}
        mine = [r for r in rows if Path(r["dir"]).resolve().is_relative_to(d.resolve())]
        name = spec.get("sweep", {}).get("name") or d.name
        walls = [r["wall_s"] for r in mine if r.get("status") == "ok" and r.get("wall_s")]
        env = f"FEDGRAPH_DATA={meta['FEDGRAPH_DATA']} " if meta.get("FEDGRAPH_DATA") else ""
        out.append(
            {
                "name": name,
                "file": meta.get("source", f"simulations/sweeps/{name}.toml"),
                "env": env,
                "cores": meta.get("cores"),
                "parallel": meta.get("parallel"),
                "description": spec.get("sweep", {}).get("description", ""),
                "cells": len(mine),
                "ok": sum(r.get("status") == "ok" for r in mine),
                "failed": sum(r.get("status") != "ok" for r in mine),
                "wall": statistics.fmean(walls) if walls else 0.0,
            }
        )
    return out
