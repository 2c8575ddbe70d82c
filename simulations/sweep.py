"""Sweep files: a grid of ``fedgraph run`` cells (methods x datasets x epsilons x
num-clients x seeds) in TOML, validated, and the cells it names
(:class:`Sweep`); :mod:`fedgraph.simulations.sweep_runner` runs them.

Sweep file::

    [sweep]
    name = "demo"
    output-dir = "runs/demo"          # relative to the current directory
    datasets = ["cora", "citeseer"]
    epsilons = [0.5, 1, 2, 4]         # `inf`: no noise (drawn as a reference line)
    num-clients = [3]
    seeds = [0, 1, 2]
    cpus-per-cell = 1                 # Ray CPUs (and torch threads) of one cell
    timeout = 1800                    # seconds per cell; a cell over it is killed and failed

    [set]                             # run-config keys for every cell
    epochs = 50

    [dataset-set."facebook100:Wisconsin87"]   # run-config keys for one dataset
    min-class-size = 1000

    [methods.lpgnn]
    label = "LPGNN (multi-bit + KProp)"
    preset = "lpgnn-cora"             # or strategy = "name" / "package.module:Class"
    epsilon-key = "epsilon"           # the run-config key the epsilon axis sets
    epsilon-levels = []               # [1, 2, 4]: key = "e,2e,4e" (PPGNN's budget set E)
    epsilons = []                     # this method's own epsilon axis (empty: the sweep's)
    dp-level = ""                     # user / edge / node / none (empty: from the config)
    epsilon-from = "axis"             # "report": the axis is a noise parameter (e.g. lam);
                                      # plot each cell at the epsilon its report spent
    set = { steps = "16" }

    [[published]]                     # a paper's number, shown beside ours by `fedgraph report`
    method = "lpgnn"
    dataset = "cora"
    epsilon = 1
    test = 83.9
    source = "LPGNN paper (Sajadmanesh and Gatica-Perez, CCS 2021)"

A cell's run config is, later entries winning: the preset, ``[set]``, the method's ``set``,
``[dataset-set.<dataset>]``, then the axes (dataset, num-clients, seed, epsilon).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PRESETS = Path(__file__).parent / "presets"
SWEEPS = Path(__file__).parent / "sweeps"
DP_LEVELS = ("user", "edge", "node", "none")


class SweepError(ValueError):
    """The sweep file is invalid; the message names the key."""


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=_dashed, populate_by_name=True
    )


class MethodSpec(_Model):
    """One method of the grid: a preset or a strategy, plus run-config keys."""

    label: str = ""
    preset: str = ""
    strategy: str = ""
    epsilon_key: str = ""
    epsilon_levels: list[float] = Field(default_factory=list)
    epsilons: list[float] = Field(default_factory=list)
    dp_level: Literal["", "user", "edge", "node", "none"] = ""
    #: ``axis``: the epsilon axis is the guarantee. ``report``: the axis sets a noise parameter
    #: (``epsilon-key = "lam"``, PrivGNN's Laplace parameter) and the plots and tables place
    #: each cell at the epsilon its report spent (largest subject, mean over seeds).
    epsilon_from: Literal["axis", "report"] = "axis"
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("preset")
    @classmethod
    def _preset_exists(cls, v: str) -> str:
        if v and preset_path(v) is None:
            names = sorted(p.stem for p in PRESETS.glob("*.toml"))
            raise ValueError(f"preset {v!r} not found; known presets: {names}")
        return v


class Published(_Model):
    """A paper's number for one cell shape (accuracy in %, as papers print it)."""

    method: str
    dataset: str
    epsilon: float | None = None
    test: float
    std: float | None = None
    source: str
    note: str = ""


class SweepAxes(_Model):
    name: str = ""
    description: str = ""
    output_dir: str = ""
    datasets: list[str] = Field(min_length=1)
    epsilons: list[float] = Field(default_factory=list)
    num_clients: list[int] = Field(default_factory=lambda: [10], min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    cpus_per_cell: float = Field(1.0, gt=0)
    timeout: float = Field(3600.0, gt=0)
    executor: Literal["auto", "local", "ray"] = "auto"


class SweepFile(_Model):
    sweep: SweepAxes
    set: dict[str, Any] = Field(default_factory=dict)
    dataset_set: dict[str, dict[str, Any]] = Field(default_factory=dict)
    methods: dict[str, MethodSpec] = Field(min_length=1)
    published: list[Published] = Field(default_factory=list)

    @field_validator("methods")
    @classmethod
    def _names(cls, v: dict[str, MethodSpec]) -> dict[str, MethodSpec]:
        bad = [k for k in v if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", k) or "__" in k]
        if bad:
            raise ValueError(f"method names must be [A-Za-z0-9._-] without '__': {bad}")
        return v


def preset_path(name: str) -> Path | None:
    """A preset name in ``simulations/presets`` or a TOML path; None if neither exists."""
    for p in (Path(name), PRESETS / f"{name}.toml"):
        if p.is_file():
            return p
    return None


def sweep_path(name: str) -> Path:
    """A sweep file path, or a name in ``simulations/sweeps``."""
    for p in (Path(name), SWEEPS / f"{name}.toml"):
        if p.is_file():
            return p
    names = sorted(p.stem for p in SWEEPS.glob("*.toml"))
    raise SweepError(f"sweep file {name!r} not found; bundled sweeps: {names}")


def _fmt(x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x:g}"


def slug(text: str) -> str:
    """A folder-name-safe form of a dataset name (``facebook100:Wisconsin87`` ->
    ``facebook100-Wisconsin87``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    method: str
    label: str
    dataset: str
    epsilon: float | None  # None: the method has no epsilon axis
    num_clients: int
    seed: int
    dp_level: str
    run_config: dict = field(hash=False, compare=False)
    epsilon_from: str = "axis"
    #: the keys this cell's method was given for itself (its preset, its ``set``, its
    #: epsilon key), not the sweep-wide ``[set]`` and ``[dataset-set]`` every method shares
    own_keys: frozenset = field(default=frozenset(), hash=False, compare=False)

    @property
    def name(self) -> str:
        return (
            f"{self.method}__{slug(self.dataset)}__eps{_fmt(self.epsilon)}__"
            f"clients{self.num_clients}__seed{self.seed}"
        )

    def describe(self) -> str:
        return (
            f"{self.method} {self.dataset} eps={_fmt(self.epsilon)} "
            f"clients={self.num_clients} seed={self.seed}"
        )

    def params(self) -> dict:
        return {
            "method": self.method,
            "label": self.label,
            "dataset": self.dataset,
            "epsilon": self.epsilon,
            "num_clients": self.num_clients,
            "seed": self.seed,
            "dp_level": self.dp_level,
            "epsilon_from": self.epsilon_from,
        }


@dataclass
class Sweep:
    """A parsed sweep file."""

    path: Path
    spec: SweepFile
    output_dir: Path

    @property
    def name(self) -> str:
        return self.spec.sweep.name or self.path.stem

    def cells(self) -> list[Cell]:
        """The grid, in a stable order: method, dataset, num-clients, epsilon, seed."""
        s = self.spec
        out = []
        for mname, m in s.methods.items():
            base: dict = {}
            if m.preset:
                base.update(tomllib.loads(preset_path(m.preset).read_text()))
            own = set(base) | set(m.set) | ({m.epsilon_key} if m.epsilon_key else set())
            base.update(s.set)
            base.update(m.set)
            if m.strategy:
                base["strategy"] = m.strategy
            epsilons: list[float | None] = list(m.epsilons or s.sweep.epsilons)
            if not m.epsilon_key:
                epsilons = [None]
            if not epsilons:
                raise SweepError(
                    f"methods.{mname}: epsilon-key {m.epsilon_key!r} is set but "
                    "neither the method nor [sweep] lists epsilons"
                )
            for dataset in s.sweep.datasets:
                for n in s.sweep.num_clients:
                    for eps in epsilons:
                        for seed in s.sweep.seeds:
                            cfg = {
                                **base,
                                **s.dataset_set.get(dataset, {}),
                                "dataset": dataset,
                                "num-clients": n,
                                "seed": seed,
                            }
                            if eps is not None:
                                cfg[m.epsilon_key] = _epsilon_value(eps, m.epsilon_levels)
                            level = m.dp_level or _infer_dp_level(cfg, eps)
                            if level is None:
                                raise SweepError(
                                    f"methods.{mname}: set dp-level (user, edge "
                                    "or node): the plots' unit of epsilon"
                                )
                            out.append(
                                Cell(
                                    mname,
                                    m.label or mname,
                                    dataset,
                                    eps,
                                    n,
                                    seed,
                                    level,
                                    cfg,
                                    m.epsilon_from,
                                    frozenset(own),
                                )
                            )
        names = [c.name for c in out]
        if len(set(names)) != len(names):
            raise SweepError("two cells share a name (duplicate values on an axis?)")
        return out

    def cell_dir(self, cell: Cell) -> Path:
        return self.output_dir / "cells" / cell.name


def _epsilon_value(eps: float, levels: list[float]):
    if levels:
        return ",".join(f"{eps * lv:g}" for lv in levels)
    return eps


def _infer_dp_level(cfg: dict, eps: float | None) -> str | None:
    """The DP level a cell's epsilon is about, from its config; None if not known. GAP's MLP
    variant and edge-level ProGAP of depth 0 read no edge: ``none``."""
    if eps is None or math.isinf(eps):
        return "none"
    method = cfg.get("method") or cfg.get("strategy") or "ppgnn"
    if method == "gap":
        return "none" if cfg.get("variant") == "mlp" else str(cfg.get("level", "edge"))
    if method == "progap":
        level = str(cfg.get("level", "edge"))
        return "none" if level == "edge" and int(cfg.get("depth", 5)) == 0 else level
    return {"ppgnn": "user", "privgnn": "node"}.get(method)


def _allowed_keys(error: dict) -> str:
    """For an unknown key of a table (pydantic's ``extra_forbidden``), the table's keys."""
    if error["type"] != "extra_forbidden":
        return ""
    loc = error["loc"]
    model = {1: SweepFile}.get(len(loc)) or {
        "sweep": SweepAxes,
        "methods": MethodSpec,
        "published": Published,
    }.get(str(loc[0]))
    if model is None:
        return ""
    keys = sorted(f.alias or name for name, f in model.model_fields.items())
    return f" (allowed: {', '.join(keys)})"


def load_sweep(path: str | Path, output_dir: str | None = None) -> Sweep:
    """Parse and validate a sweep file.

    Raises:
        SweepError: the file is missing, not TOML, a key is unknown or out of range, or the
            output folder (``output_dir`` or the file's ``output-dir``) is a file.
    """
    p = sweep_path(str(path))
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{p}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:
        raise SweepError(
            f"{p}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as err:
        lines = [
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" + _allowed_keys(e)
            for e in err.errors()
        ]
        raise SweepError(f"{p}: invalid sweep file:\n  " + "\n  ".join(lines)) from None
    out = Path(output_dir or spec.sweep.output_dir or Path("runs") / (spec.sweep.name or p.stem))
    sweep = Sweep(p, spec, out.expanduser().resolve())
    if sweep.output_dir.exists() and not sweep.output_dir.is_dir():
        raise SweepError(
            f"{'--output-dir' if output_dir else 'output-dir'}: "
            f"{sweep.output_dir} is a file, not a folder (the sweep writes its "
            "cells under it: name a folder, or one that does not exist yet)"
        )
    try:
        cells = sweep.cells()  # raises SweepError on an inconsistent grid
        _check_run_config_keys(cells, spec)
        _check_run_config_values(cells)
    except SweepError as err:  # named with the file, as the errors above
        raise SweepError(f"{p}: {err}") from None
    return sweep


def _check_run_config_values(cells: list[Cell]) -> None:
    """Refuse, before any cell runs, a cell whose run config its run would refuse (an
    epsilon <= 0, a level out of range):
    :func:`fedgraph.simulations.server_app.validate_run_config`, the check of ``fedgraph run``;
    and a key of another method given to this method itself (its preset, ``set`` or epsilon
    key; the sweep-wide ``[set]`` is shared by methods that need different keys). A user's
    strategy (an import path, or a name an installed package publishes) is left to its cells'
    runs, which import it where they run; a dataset's missing files too."""
    from fedgraph.config import ConfigError, reject_keys_of_other_methods
    from fedgraph.config.parse import METHOD_CONFIGS
    from fedgraph.registry import has_entry_point, unknown_name_error
    from fedgraph.simulations.server_app import validate_run_config

    errors: dict[str, list[str]] = {}
    for cell in cells:
        strategy = str(cell.run_config.get("strategy", "") or "")
        if strategy and strategy not in METHOD_CONFIGS:
            # a name no installed package publishes cannot be imported by any cell either
            if ":" not in strategy and not has_entry_point("strategy", strategy):
                text = str(unknown_name_error("strategy", strategy, list(METHOD_CONFIGS)))
                errors.setdefault(text, []).append(cell.name)
            continue
        try:  # a key given to this method only (not the shared [set]) that it would ignore
            reject_keys_of_other_methods(
                {
                    k: v
                    for k, v in cell.run_config.items()
                    if k in cell.own_keys or k in ("method", "strategy")
                }
            )
            validate_run_config(cell.run_config)
        except ConfigError as err:
            text = str(err).removeprefix("invalid run config:").strip()
            errors.setdefault(text, []).append(cell.name)
    if errors:
        lines = [
            f"{names[0]}"
            + (f" (and {len(names) - 1} more cells)" if len(names) > 1 else "")
            + f": {text}"
            for text, names in errors.items()
        ]
        raise SweepError(
            "invalid sweep file: a cell's run config is refused by its method "
            "(no cell ran):\n  " + "\n  ".join(lines)
        )


def _check_run_config_keys(cells: list[Cell], spec: SweepFile) -> None:
    """Refuse a run-config key no method declares (a typo such as ``encoder-round``) before
    any cell runs: it would fail every cell. Values are checked by each cell's run, which may
    also find its data missing (a ``no data`` cell). An unknown key is named with the table
    that set it (``[set]``, ``[dataset-set.<d>]``, ``methods.<m>.set``,
    ``methods.<m>.epsilon-key``; else the method whose cells hold it)."""
    from fedgraph.config.parse import METHOD_CONFIGS, did_you_mean

    known = {"strategy"} | {
        k.replace("_", "-") for m in METHOD_CONFIGS.values() for k in m.model_fields
    }
    tables = [("[set]", spec.set)]
    tables += [(f"[dataset-set.{d}]", t) for d, t in spec.dataset_set.items()]
    for name, m in spec.methods.items():
        tables += [
            (f"methods.{name}.set", m.set),
            (f"methods.{name}.epsilon-key", {m.epsilon_key: None} if m.epsilon_key else {}),
        ]
    tables += [(f"methods.{cell.method}", cell.run_config) for cell in cells]
    bad = {}
    for where, table in tables:
        for key in table:
            if str(key).replace("_", "-") not in known:
                bad.setdefault(key, where)
    if bad:
        lines = [
            f"{where}: {key}: unknown run-config key"
            + did_you_mean(str(key).replace("_", "-"), sorted(known))
            + f"; allowed: {', '.join(sorted(known))}"
            for key, where in bad.items()
        ]
        raise SweepError("invalid sweep file:\n  " + "\n  ".join(lines))
