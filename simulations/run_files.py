"""The run config ``fedgraph run`` reads: the bundled presets (:data:`PRESETS`), a TOML file
(its relative paths made absolute against the file's folder) and ``--set key=value``
overrides on top."""

from __future__ import annotations

import tomllib
from pathlib import Path

import typer

PRESETS = Path(__file__).parent / "presets"


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_run_config(preset: str | None, overrides: list[str]) -> dict:
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
                raise typer.BadParameter(
                    f"preset file {preset!r} not found (looked at "
                    f"{Path(preset).resolve()}); bundled presets: {names}"
                )
            import difflib

            close = difflib.get_close_matches(preset, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise typer.BadParameter(f"preset {preset!r} not found{hint}; known presets: {names}")
        try:
            cfg.update(relative_to_file(tomllib.loads(path.read_text()), path))
        except tomllib.TOMLDecodeError as err:
            raise typer.BadParameter(f"{path}: not valid TOML: {err}") from None
    for item in overrides:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        if not v.strip():  # a forgotten value must not run with the default unannounced
            raise typer.BadParameter(
                f"--set {k.strip()}=: no value; give one, or {k.strip()}='\"\"' (an empty "
                f"string: the method's default), or leave the key out"
            )
        key = k.strip()
        for other in [o for o in cfg if o.replace("_", "-") == key.replace("_", "-")]:
            del cfg[other]  # --set overrides the key however the preset spelled it
        cfg[key] = _parse_value(v.strip())
    for key in [k for k in cfg if k.replace("_", "-") == "num-clients"]:
        if cfg[key] == 0 and not isinstance(cfg[key], bool):  # pyproject's "one per supernode"
            from fedgraph.limits import MAX_CLIENTS

            raise typer.BadParameter(
                "num-clients: 0 (one client per supernode) applies under `flwr run`, whose "
                "federation sets the supernodes; `fedgraph run` starts one supernode per "
                f"client, so give the count: allowed: integers in [1, {MAX_CLIENTS}]"
            )
    return cfg


#: the project file whose ``[tool.flwr.app.config]`` holds every run-config key and its default
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def pyproject_defaults(path: Path = PYPROJECT) -> dict | None:
    """``[tool.flwr.app.config]`` of the project file: the run config ``flwr run`` starts from
    (it fuses ``--run-config`` into it); ``None`` when the file is not there (an installed
    wheel) or holds no such table."""
    try:
        return dict(tomllib.loads(path.read_text())["tool"]["flwr"]["app"]["config"])
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return None


#: keys whose value is a folder: relative ones in a TOML file are relative to that file
FOLDER_KEYS = ("data-root", "output-dir")
#: keys that may name a ``path/to/file.py:attribute`` (:func:`fedgraph.registry.is_file_spec`)
SPEC_KEYS = ("dataset", "partitioner", "mechanism", "strategy", "round-strategy")


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
