"""What the reference pages are generated from, shared by the docs build and tests/test_docs.py.

Nothing here is a hand-written list of keys, fields, commands or modules:

- run-config keys: every key ``pyproject.toml`` declares under ``[tool.flwr.app.config]`` and
  every field of every model in :data:`fedgraph.config.METHOD_CONFIGS` (type, default per
  method, allowed values, description);
- report fields: the flattened field paths of real small runs, one per method, made at build
  time with :func:`fedgraph.simulations.local.run_local` (explanations: ``report_fields.toml``);
- the CLI: the ``--help`` of every command of :data:`fedgraph.simulations.cli.cli`;
- the messages between server and clients: :data:`fedgraph.protocol.MESSAGES`;
- the API: every module found by walking the packages.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PACKAGES = ("fedgraph", "strategies", "simulations")


# ---------------------------------------------------------------- run-config keys
def pyproject_config() -> dict:
    """``[tool.flwr.app.config]``: the keys ``flwr run`` accepts, with their declared values."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def pyproject_comments() -> dict[str, str]:
    """The comment after each key's line in ``[tool.flwr.app.config]`` (often: what ``""`` means)."""
    out, inside = {}, False
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            inside = line.strip() == "[tool.flwr.app.config]"
            continue
        m = re.match(r'^([a-z0-9-]+)\s*=\s*(".*?"|[^#]*?)\s*#\s*(.*)$', line) if inside else None
        if m:
            out[m.group(1)] = m.group(3).strip()
    return out


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "str" if all(isinstance(a, str) for a in typing.get_args(annotation)) else "literal"
    if origin in (list, tuple, set, frozenset):
        return f"list of {' | '.join(_type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)}"
    if origin is not None:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " | ".join(_type_name(a) for a in args)
        return f"{inner} (optional)" if type(None) in typing.get_args(annotation) else inner
    return getattr(annotation, "__name__", str(annotation))


def _allowed(field) -> str:
    ann = field.annotation
    args = [ann] + [a for a in typing.get_args(ann) if a is not type(None)]
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            return ", ".join(f"`{v}`" for v in typing.get_args(a))
    bounds = []
    for meta in field.metadata:
        for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(meta, name, None)
            if v is not None:
                bounds.append(f"{sym} {v}")
    return ", ".join(bounds)


def config_keys() -> list[dict]:
    """One row per run-config key (``-`` spelling), sorted as ``pyproject.toml`` declares them,
    then the keys only a model has: type, default per method, allowed values, the methods that
    use it, the models' descriptions and the pyproject comment."""
    from fedgraph.config import METHOD_CONFIGS

    declared = pyproject_config()
    comments = pyproject_comments()
    names = list(declared)
    for model in METHOD_CONFIGS.values():
        names += [
            n.replace("_", "-")
            for n in model.model_fields
            if n.replace("_", "-") not in names and n != "method"
        ]
    rows = []
    for key in names:
        field_name = key.replace("-", "_")
        per_method, types, descriptions = {}, [], []
        allowed: dict[str, list[str]] = {}  # allowed values -> the methods with them
        for method, model in METHOD_CONFIGS.items():
            f = model.model_fields.get(field_name)
            if f is None:
                continue
            per_method[method] = f.get_default(call_default_factory=True)
            t, a = _type_name(f.annotation), _allowed(f)
            if t not in types:
                types.append(t)
            if a:
                allowed.setdefault(a, []).append(method)
            if f.description and f.description not in descriptions:
                descriptions.append(f.description)
        if key == "method":
            per_method = {m: m for m in METHOD_CONFIGS}
            allowed = {", ".join(f"`{m}`" for m in METHOD_CONFIGS): []}
            types = ["str"]
        kind = {
            "dataset": "dataset",
            "partitioner": "partitioner",
            "mechanism": "mechanism",
            "strategy": "strategy",
        }.get(key)
        if kind:
            from fedgraph import catalog

            k = catalog.KINDS[kind]
            names = ", ".join(f"`{n}`" for n in (*k.builtin, *k.registered))
            allowed = {
                f"{names}, a registered name, or `package.module:Name` / "
                f"`path/to/file.py:Name` ([extending](../extending.md))": []
            }
            types = types or ["str"]
        allowed_text = [
            a if len(allowed) == 1 or not ms else f"{', '.join(ms)}: {a}"
            for a, ms in allowed.items()
        ]
        rows.append(
            {
                "key": key,
                "declared": key in declared,
                "pyproject_default": declared.get(key),
                "comment": comments.get(key, ""),
                "defaults": per_method,
                "types": types,
                "allowed": allowed_text,
                "descriptions": descriptions,
                "methods": list(per_method) if key != "strategy" else ["all"],
            }
        )
    return rows


def _value(v) -> str:
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, (list, tuple)):
        return "`" + ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "`"
    return f"`{v}`"


def config_page() -> str:
    notes = tomllib.loads((HERE / "config_notes.toml").read_text())
    rows = config_keys()
    out = [
        "# Run-config keys",
        "",
        "<!-- Generated at build time by docs/_gen/refs.py from fedgraph.config's pydantic "
        "models and pyproject.toml's [tool.flwr.app.config]; do not edit. -->",
        "",
        "Every key `flwr run .` and `fedgraph run` accept. Set one with "
        '`flwr run . --run-config "key=value"`, `fedgraph run --set key=value` or in a '
        "TOML file ([presets](presets.md)). **flwr run default** is what `pyproject.toml` "
        "declares (`\"\"`: the run's method's own default); **default per method** is the "
        "pydantic model's. A key of another method is ignored by `flwr run` and refused by "
        "`fedgraph run` (exit 2).",
        "",
        "| key | used by | type | flwr run default |",
        "|---|---|---|---|",
    ]
    out += [
        f"| [`{r['key']}`](#{_anchor(r['key'])}) | {', '.join(r['methods'])} | "
        f"{' / '.join(r['types']) or 'str'} | "
        f"{_value(r['pyproject_default']) if r['declared'] else '(not declared)'} |"
        for r in rows
    ]
    out.append("")
    for r in rows:
        out += [f"## `{r['key']}`", ""]
        if not r["declared"]:
            out += [
                '!!! warning "Not declared in pyproject.toml"',
                "    `flwr run` refuses this key; only the model knows it.",
                "",
            ]
        out += [
            "| | |",
            "|---|---|",
            f"| used by | {', '.join(r['methods'])} |",
            f"| type | {' / '.join(r['types']) or 'str'} |",
        ]
        if r["declared"]:
            out.append(f"| flwr run default | {_value(r['pyproject_default'])} |")
        if r["defaults"] and r["key"] != "method":
            same = len({repr(v) for v in r["defaults"].values()}) == 1
            out.append(
                "| default per method | "
                + (
                    _value(next(iter(r["defaults"].values())))
                    if same
                    else "; ".join(f"{m} {_value(v)}" for m, v in r["defaults"].items())
                )
                + " |"
            )
        if r["allowed"]:
            out.append(f"| allowed | {'; '.join(r['allowed'])} |")
        if r["comment"]:
            out.append(f"| pyproject note | {r['comment']} |")
        out.append("")
        for d in r["descriptions"]:
            out += [d.replace("|", "\\|"), ""]
        note = notes.get(r["key"])
        if note:
            out += [note.strip(), ""]
    return "\n".join(out) + "\n"


def _anchor(key: str) -> str:
    """The anchor python-markdown's toc gives the heading ``## `key```."""
    return re.sub(r"[^\w-]", "", key.lower())


def undocumented_keys() -> list[str]:
    """Keys with neither a model description nor a note in ``config_notes.toml``."""
    notes = tomllib.loads((HERE / "config_notes.toml").read_text())
    return [r["key"] for r in config_keys() if not r["descriptions"] and r["key"] not in notes]


# ---------------------------------------------------------------- report fields
#: small settings of each method (a key a method's model lacks is dropped)
SMALL = {
    "num-clients": 2,
    "epochs": 5,
    "steps": "2",
    "encoder-rounds": 2,
    "classifier-rounds": 2,
    "num-queries": 5,
    "teacher-epochs": 5,
    "num-neighbours": 10,
}

#: parts of a path that are names of runtime things, with the placeholder shown
PLACEHOLDERS = [
    (r"^(privacy\.per_subject)\.[^.]+", r"\1.<subject>"),
    (r"^(privacy\.client_ledgers)\.[^.]+", r"\1.<subject>"),
    (r"^(privacy\.collusion)\.client-[^.]+", r"\1.<client>"),
    (r"^(workers|clients)\.client-[^.]+", r"\1.<client>"),
    (r"^(levels)\.level-[^.]+", r"\1.<level>"),
    (r"^(timings_s|server_cpu_s|exchange_s|peak_rss_mib)\.(?!total$)[^.]+$", r"\1.<phase>"),
    (r"^(host\.env)\.[^.]+$", r"\1.<variable>"),
    (r"^(config)\..+$", r"\1.<key>"),
]


def sample_reports(out_dir: str | Path, methods=None) -> dict[str, dict]:
    """One real small report per method (``fedgraph.simulations.local.run_local``: the real strategy,
    ClientApp handlers, ledger and report, in one process), bundled Cora, 2 clients."""
    import contextlib
    import io
    import os

    from fedgraph.config import METHOD_CONFIGS
    from fedgraph.simulations.local import run_local

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    reports = {}
    for method in methods or METHOD_CONFIGS:
        fields = METHOD_CONFIGS[method].model_fields
        cfg = {k: v for k, v in SMALL.items() if k.replace("-", "_") in fields}
        cfg.update(
            {
                "method": method,
                "dataset": "cora",
                "output-dir": str(out_dir),
                "run-name": f"docs-{method}",
            }
        )
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            reports[method] = run_local(cfg)
    return reports


def flatten(obj, prefix: str = "") -> list[str]:
    """Field paths of a report: ``a.b`` for dict keys, ``a[].b`` inside lists of dicts."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out += [p] + flatten(v, p) if isinstance(v, (dict, list)) else [p]
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for x in obj:
            out += flatten(x, prefix + "[]")
    return out


def canonical(path: str) -> str:
    for pat, rep in PLACEHOLDERS:
        path = re.sub(pat, rep, path)
    return path


def report_fields(reports: dict[str, dict]) -> dict[str, list[str]]:
    """Canonical field path -> the methods whose sample report has it, in first-seen order."""
    seen: dict[str, list[str]] = {}
    for method, rep in reports.items():
        for p in flatten(rep):
            c = canonical(p)
            if not c.startswith("config.") or c == "config.<key>":
                seen.setdefault(c, [])
                if method not in seen[c]:
                    seen[c].append(method)
    return seen


def field_notes() -> dict[str, str]:
    return tomllib.loads((HERE / "report_fields.toml").read_text())["fields"]


def unexplained_fields(reports: dict[str, dict]) -> list[str]:
    notes = field_notes()
    return [f for f in report_fields(reports) if f not in notes]


def report_page(reports: dict[str, dict]) -> str:
    notes = field_notes()
    seen = report_fields(reports)
    missing = [f for f in seen if f not in notes]
    if missing:
        raise SystemExit(
            "report fields without an explanation in docs/_gen/report_fields.toml: "
            + ", ".join(missing)
        )
    out = [
        "# Report fields",
        "",
        "<!-- Generated at build time by docs/_gen/refs.py from real small runs; do not edit. -->",
        "",
        "Every run writes one JSON report (strict JSON: a missing value is `null`, an "
        'unbounded epsilon the string `"inf"`) to `<output-dir>/<run-name>.json`. The '
        "fields below are those of real runs made while this page was built (one per method, "
        f"bundled Cora, 2 clients, small budgets: {', '.join(f'`{m}`' for m in reports)}), "
        "then fields that appear only with some settings. Placeholders: `<subject>` a "
        "privacy subject (`client-0`, `level-1`, `level-1 (level)`, ...), `<client>` "
        "`client-<partition id>`, `<level>` `level-<tau>`, `<phase>` a phase's name, "
        "`<key>` a [run-config key](config.md). `a[].b`: field `b` of each item of list `a`.",
        "",
        "The report's two parts (see [the server's view](../explanations/threat-model.md)): "
        "what was released (`dataset`, `privacy`, `accuracy`, `clients`, ...) and "
        "`ground_truth`, computed by the harness, never by a client for the server.",
        "",
        "| field | methods | meaning |",
        "|---|---|---|",
    ]
    for f, methods in seen.items():
        out.append(f"| `{f}` | {', '.join(methods)} | {_cell(notes[f])} |")
    extra = [f for f in notes if f not in seen]
    if extra:
        out += [
            "",
            "## Fields that appear only with some settings",
            "",
            "| field | meaning |",
            "|---|---|",
        ]
        out += [f"| `{f}` | {_cell(notes[f])} |" for f in extra]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# ---------------------------------------------------------------- CLI
def cli_commands() -> dict[str, str]:
    """Command name -> its ``--help`` text (``fedgraph`` itself under ``""``)."""
    import os

    import typer.main
    from typer.testing import CliRunner

    from fedgraph.simulations.cli import cli

    env = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    os.environ.update(env)
    runner = CliRunner()
    out = {}
    names = [""] + sorted(typer.main.get_command(cli).commands)
    for name in names:
        res = runner.invoke(
            cli, [name, "--help"] if name else ["--help"], env=env, prog_name="fedgraph"
        )
        if res.exit_code != 0:
            raise SystemExit(f"fedgraph {name} --help failed: {res.output}")
        out[name] = res.output
    return out


def cli_page() -> str:
    out = [
        "# The `fedgraph` command",
        "",
        "<!-- Generated at build time by docs/_gen/refs.py (each command's --help); do not edit. -->",
        "",
        "`fedgraph` is installed with the package (`fedgraph.simulations.cli:main`). "
        "Exit codes: 0 ok, 1 a failed run, 2 an invalid configuration or input found before "
        "anything starts, 130 interrupted (Ctrl-C), 143 stopped by SIGTERM. See "
        "[`flwr run` or `fedgraph run`]"
        "(../how-to/flwr-run-vs-fedgraph-run.md).",
        "",
    ]
    for name, text in cli_commands().items():
        out += [
            f"## `fedgraph{' ' + name if name else ''}`",
            "",
            "```text",
            text.rstrip(),
            "```",
            "",
        ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- API
def modules() -> list[str]:
    """Every module of the packages, found by walking them (private modules left out)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if any(p.startswith("_") and p != "__init__" for p in parts) or "_bundled" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if pkg != "fedgraph":  # installed as fedgraph.strategies, fedgraph.simulations
                parts = ["fedgraph", *parts]
            found.append(".".join(parts))
    return found


# ---------------------------------------------------------------- presets
def presets_page() -> str:
    out = [
        "# Presets",
        "",
        "<!-- Generated at build time by docs/_gen/refs.py from simulations/presets/*.toml. -->",
        "",
        "A preset is a run-config TOML file under `simulations/presets/`: "
        "`fedgraph run NAME` or `flwr run . --run-config simulations/presets/NAME.toml`. "
        "Keys it leaves out take their [defaults](config.md).",
        "",
    ]
    for f in sorted((ROOT / "simulations" / "presets").glob("*.toml")):
        text = f.read_text()
        lead = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
        out += [
            f"## `{f.stem}`",
            "",
            " ".join(lead),
            "",
            "```toml",
            "\n".join(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")),
            "```",
            "",
        ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the messages
_METHOD_TITLES = {"ppgnn": "PPGNN", "gap": "GAP", "privgnn": "PrivGNN", "progap": "ProGAP"}


def _field_rows(record) -> list[str]:
    """One table row per field of ``record`` (the record's own row first)."""
    cond = "" if record.required else f" (only {record.when})"
    extra = f"; names among the request's `{record.names_within}`" if record.names_within else ""
    extra += "".join(f"; exactly one of {', '.join(f'`{k}`' for k in g)}" for g in record.one_of)
    rows = [f"| `{record.name}` | {record.kind} | | | | {_cell(record.meaning + cond + extra)} |"]
    for f in record.fields:
        meaning = f.meaning + ("" if f.required else f" (optional: {f.when})")
        if f.json_keys:
            meaning += "; JSON keys: " + ", ".join(f"`{k.name}` ({k.meaning})" for k in f.json_keys)
        shape = f"`{f.shape}`" if f.shape else ""
        rows.append(f"| | | `{f.name}` | {f.type} | {shape} | {_cell(meaning)} |")
    return rows


def _content_table(content) -> list[str]:
    out = [
        "| record | kind | key / tensor | type / dtype | shape | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for r in content.records:
        out += _field_rows(r)
    for g in content.one_of:
        out += ["", "Exactly one of the records " + ", ".join(f"`{n}`" for n in g) + "."]
    return out


def _code(text: str) -> str:
    """``text`` as inline code when it is one dotted name; prose (spaces, its own code spans)
    as it is, with its leading dotted name as code."""
    if "`" in text:
        return text
    head, sep, rest = text.partition(" ")
    return f"`{head}`" + (f" {rest}" if sep else "")


def protocol_page() -> str:
    """The message types the ClientApp answers and their records, from
    :data:`fedgraph.protocol.MESSAGES`."""
    from fedgraph.protocol import MESSAGES, methods

    out = [
        "# Messages between server and clients",
        "",
        "<!-- Generated at build time by docs/_gen/refs.py from fedgraph/protocol.py; "
        "do not edit. -->",
        "",
        "Every message type the ClientApp (`fedgraph.simulations.client_app`) answers, with "
        "the records the server sends and the records the client replies with. The source "
        "is [`fedgraph.protocol`](api/fedgraph/protocol.md), plain data a strategy or a "
        "test can import; `tests/test_protocol.py` checks that the ClientApp routes exactly "
        "these types and that real runs of every method send and answer exactly these "
        "records and keys. What each reply field is for privacy (noised and accounted, "
        "public, or an evaluation output): "
        "[What leaves a client](../explanations/client-releases.md).",
        "",
        'Every message carries the run config as `config["json"]`. Types: a '
        "ConfigRecord's or MetricRecord's Python value type; an ArrayRecord's tensor "
        "dtype (`any`: the model's own) and shape, in symbols: `n` the client's nodes, `N` "
        "the node universe, `m` rows released, `e`/`h` embedding widths, `C` classes. A "
        "key with `*` is a pattern (a model's state dict, a mechanism's report). Optional "
        "keys and records say when they are there.",
        "",
        "| message type | method | the client |",
        "|---|---|---|",
    ]
    for m in MESSAGES.values():
        out.append(f"| [`{m.type}`](#{_anchor(m.type)}) | `{m.method}` | {_cell(m.summary)} |")
    for method in methods():
        out += ["", f"## {_METHOD_TITLES.get(method, method)}"]
        for m in (m for m in MESSAGES.values() if m.method == method):
            out += [
                "",
                f"### `{m.type}`",
                "",
                _cell(m.summary[:1].upper() + m.summary[1:]) + ".",
                "",
                f"Sent by {_code(m.sender)}; answered by {_code(m.handler)}.",
                "",
                "The server sends:",
                "",
                *_content_table(m.sends),
                "",
                "The client replies:",
                "",
                *_content_table(m.replies),
            ]
    return "\n".join(out) + "\n"
