"""The names of fedgraph's own extensions (datasets, partitioners, feature mechanisms,
strategies), importable without torch.

``fedgraph run`` validates the run config before it imports torch, PyG, Flower or Ray
(seconds each), so that a config error is reported at once. The registries
(:class:`fedgraph.registry.Registry`) live in modules that import torch; this module knows the
names those modules register on import, so a config naming one of them, or naming an unknown
name, is checked without importing them. Everything else (an import path, an entry point, a
name registered at run time) goes to the registry as before: :func:`check_name` answers
``None`` and the caller asks the registry.

``tests/test_fast_config.py`` checks that these lists equal what the registries hold after
import, and that the messages are the same either way.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

#: Built-in datasets (descriptions with ``<...>`` stand for a family of names), in the order
#: ``fedgraph datasets`` and the unknown-name message list them.
KNOWN_DATASETS: tuple[str, ...] = (
    "cora",
    "citeseer",
    "pubmed",
    "facebook-pagepage",
    "lastfm-asia",
    "reddit",
    "ogbn-products",
    "facebook100:<College>",
    "synthetic-sbm:<nodes>:<avg_degree>",
)


@dataclass(frozen=True)
class Kind:
    """One registry: where it lives and what fedgraph puts in it on import."""

    kind: str
    #: the module defining the registry and ``attr`` its name there
    module: str
    attr: str
    #: listed unquoted first in the unknown-name message (:attr:`Registry.builtin`)
    builtin: tuple[str, ...]
    #: the names the module registers when it is imported
    registered: tuple[str, ...]
    hint: str


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind(
            "dataset",
            "fedgraph.data.datasets",
            "DATASETS",
            KNOWN_DATASETS,
            ("files",),
            "See docs/extending.md, 'A dataset'.",
        ),
        Kind(
            "partitioner",
            "fedgraph.data.partition",
            "PARTITIONERS",
            (),
            ("label-skew", "louvain", "random", "users"),
            "See docs/extending.md, 'A partitioner'.",
        ),
        Kind(
            "mechanism",
            "fedgraph.mechanisms.feature",
            "FEATURE_MECHANISMS",
            (),
            ("gaussian", "laplace", "multi-bit", "one-bit", "ppm"),
            "See docs/extending.md, 'A feature mechanism'.",
        ),
        Kind(
            "strategy",
            "fedgraph.strategies.base",
            "STRATEGIES",
            (),
            ("gap", "ppgnn", "privgnn", "progap"),
            "See docs/extending.md, 'A strategy'.",
        ),
    )
}


def check_name(kind: str, spec: object) -> str | None:
    """Check ``spec`` against the registry of ``kind`` without importing it, where that
    answers the question.

    Returns:
        ``spec`` (stripped) when it is a name fedgraph registers itself; ``None`` when only the
        registry can tell: the registry's module is already imported (it may hold names
        registered at run time, or a replaced built-in), or ``spec`` is not a plain string
        name, is an import path (``":"``), or an entry point of an installed package.
    Raises:
        ValueError: ``spec`` is a name nothing provides; the message is the one
            :meth:`fedgraph.registry.Registry.resolve` gives.
    """
    from .registry import has_entry_point, unknown_name_error

    k = KINDS[kind]
    if k.module in sys.modules or not isinstance(spec, str) or not spec.strip():
        return None
    spec = spec.strip()
    if spec in k.registered:
        return spec
    if ":" in spec:
        _check_import_path(kind, spec)
        return None
    if has_entry_point(kind, spec):
        return None
    raise unknown_name_error(
        kind, spec, [*k.builtin, *sorted(k.registered)], k.hint, quoted_from=len(k.builtin)
    )


def _check_import_path(kind: str, spec: str) -> None:
    """Without importing anything: the file of ``"path/to/file.py:attr"`` exists, and the
    top-level package of ``"package.module:attr"`` is on ``sys.path`` or in the working
    directory (where :func:`fedgraph.registry.import_object` also looks).

    Raises:
        ValueError: worded as :func:`fedgraph.registry.import_object` words it.
    """
    import importlib.util
    import os
    from pathlib import Path

    from .registry import split_spec

    module = split_spec(spec)[0]
    if not module:
        return  # import_object names the malformed path
    if module.endswith(".py"):
        file = Path(module).expanduser().resolve()
        if not file.is_file():
            raise ValueError(
                f"{kind}: cannot import {spec!r}: no file {file} (a relative path "
                f"is taken from the working directory {os.getcwd()})"
            )
        return
    top = module.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = True  # let the import itself say what is wrong
    if (
        not found
        and not (Path(os.getcwd()) / top).exists()
        and not (Path(os.getcwd()) / f"{top}.py").exists()
    ):
        raise ValueError(
            f"{kind}: cannot import {spec!r}: ModuleNotFoundError: No module named {top!r}"
        )


def dataset_spec(name: object) -> str | None:
    """:func:`fedgraph.data.dataset_spec` where it needs no import: a built-in name
    (lower-cased), ``facebook100:<College>``, an unknown name (raises ``ValueError``);
    ``synthetic-sbm:...`` (:func:`fedgraph.data.synthetic.sbm_spec`); ``None`` for the rest
    (import paths, registered names)."""
    if "fedgraph.data.datasets" in sys.modules or not isinstance(name, str) or not name.strip():
        return None
    key = name.strip().lower()
    if key in KNOWN_DATASETS and ":" not in key:
        return key
    if key.startswith("facebook100:"):
        return name.strip()
    if key in KINDS["dataset"].registered:
        return key
    if key.startswith("synthetic-sbm:"):
        return sbm_spec(key)  # parsed, not built: no torch
    return check_name("dataset", name)


#: Nodes of the built-in datasets whose graph does not depend on the run config (as
#: :func:`fedgraph.data.load_dataset` returns them; ``tests/test_fast_config.py`` checks them
#: against the loaders where the files are present), for config errors before any import.
NUM_NODES: dict[str, int] = {"cora": 2708, "citeseer": 3327, "facebook-pagepage": 22470}


def known_num_nodes(spec: str) -> int | None:
    """The node count of the dataset ``spec`` (a canonical name) when it is known without
    loading it: :data:`NUM_NODES`, ``synthetic-sbm:<nodes>:...``; else ``None``."""
    if spec in NUM_NODES:
        return NUM_NODES[spec]
    if spec.startswith(SBM_PREFIX):
        return parse_sbm_name(spec)[0]
    return None


#: Number of classes of the synthetic SBM (equal sizes up to one node).
SBM_CLASSES = 5
#: Dataset names of the synthetic SBM start with this.
SBM_PREFIX = "synthetic-sbm:"


def parse_sbm_name(name: str) -> tuple[int, float, int]:
    r"""``'synthetic-sbm:<nodes>:<avg_degree>[:<seed>]'`` -> ``(nodes, avg_degree, seed)``.

    Raises:
        ValueError: not of that form, ``nodes < 2 * SBM_CLASSES``, ``avg_degree`` not in
            ``(0, nodes - 1]`` or ``seed < 0`` (the message shows the expected form).
    """
    form = (
        "expected 'synthetic-sbm:<nodes>:<avg_degree>[:<seed>]', e.g. "
        "'synthetic-sbm:2000:10' (nodes an integer >= 10, avg_degree > 0: directed "
        "edges per node, seed an integer >= 0, default 0)"
    )
    parts = name.strip().split(":")
    if parts[0].strip().lower() != SBM_PREFIX[:-1] or len(parts) not in (3, 4):
        raise ValueError(f"dataset {name!r}: {form}")
    try:
        nodes = int(parts[1].replace("_", ""))
        degree = float(parts[2])
        seed = int(parts[3]) if len(parts) == 4 else 0
    except ValueError:
        raise ValueError(f"dataset {name!r}: {form}") from None
    if nodes < 2 * SBM_CLASSES:
        raise ValueError(
            f"dataset {name!r}: {form}; nodes must be >= {2 * SBM_CLASSES}, got {nodes}"
        )
    if not (0 < degree <= nodes - 1) or not math.isfinite(degree):
        raise ValueError(
            f"dataset {name!r}: {form}; avg_degree must lie in (0, nodes - 1] = "
            f"(0, {nodes - 1}], got {parts[2].strip()}"
        )
    if seed < 0:
        raise ValueError(f"dataset {name!r}: {form}; seed must be >= 0, got {seed}")
    return nodes, degree, seed


def sbm_spec(name: str) -> str:
    """Canonical spelling ``synthetic-sbm:<nodes>:<avg_degree>:<seed>`` (checked, not built)."""
    nodes, degree, seed = parse_sbm_name(name)
    return f"{SBM_PREFIX}{nodes}:{degree:g}:{seed}"
