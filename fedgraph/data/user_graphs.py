"""Graphs of the user's own: a registered loader's graph checked and normalised
(:func:`load_custom`), and the built-in ``files`` dataset (:func:`read_graph_files`: an edge
list, features and labels as plain files, or a saved ``Data``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from ..dataset_files import check_graph_files
from ..registry import spec_label
from .normal_form import check_graph, finalize

PathLike = str | Path


def load_custom(spec: str, loader, root: Path | None) -> Data:
    """Calls a user loader, checks its graph and normalises it (:func:`~fedgraph.data.normal_form.finalize`)."""
    data = loader(root)
    check_graph(data, spec)
    domain = data.get("feature_domain")
    label = data.get("name") if isinstance(data.get("name"), str) else spec_label(spec)
    out = finalize(data, label, None if domain is None else (float(domain[0]), float(domain[1])))
    if data.get("num_classes") is not None:
        out.num_classes = int(data.num_classes)
    return out


def read_graph_files(
    root: PathLike,
    feature_domain: tuple[float, float] | None = None,
) -> Data:
    r"""Reads a graph from plain files, or a saved :class:`Data`.

    ``root`` is either a ``.pt`` file holding a ``Data`` saved with
    ``torch.save(data, path)`` (loaded with ``weights_only=False``: only
    load files you made), or a folder with

    * ``edges.csv``: one edge per line, ``source,target`` (0-based node ids),
    * ``features.csv``: one line per node, ``F`` comma-separated numbers,
    * ``labels.csv``: one line per node, an integer class id in ``[0, C)``,
    * ``graph.toml`` (optional): ``feature_domain = [low, high]`` (the
      public range of the features) and ``name`` (shown in reports).

    Lines starting with ``#`` are comments.

    Args:
        root: the folder or ``.pt`` file.
        feature_domain: overrides ``graph.toml``'s.

    Returns:
        Data: ``x [N, F]`` float32, ``y [N]`` long, ``edge_index [2, E]``
        long, ``feature_domain`` (or ``None``). Not yet checked or
        normalised: :func:`load_dataset` does both.

    Raises:
        FileNotFoundError: a required file is missing (the message lists the
            layout).
    """
    root = Path(root).expanduser()
    if root.is_file() and root.suffix == ".pt":
        data = torch.load(root, weights_only=False)
        if feature_domain is not None and isinstance(data, Data):
            data.feature_domain = feature_domain
        return data
    check_graph_files(root)  # (fedgraph run checks the same before anything starts)
    meta = {}
    if (root / "graph.toml").is_file():
        import tomllib

        try:
            meta = tomllib.loads((root / "graph.toml").read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(
                f"dataset 'files': {root / 'graph.toml'}: not valid TOML ({err}); "
                "it may hold feature_domain = [low, high] and name = '...'"
            ) from None
    edges = _read_csv(
        root / "edges.csv",
        np.int64,
        2,
        "two integer node ids per line, source,target (0-based); a header line must start with '#'",
    )
    x = _read_csv(
        root / "features.csv",
        np.float32,
        2,
        "the same number of comma-separated numbers on every line, one line per node",
    )
    y = _read_csv(
        root / "labels.csv", np.int64, 1, "one integer class id per line, one line per node"
    )
    _check_rows_agree(root, edges.reshape(-1, 2), x, y)
    domain = feature_domain if feature_domain is not None else meta.get("feature_domain")
    data = Data(
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        edge_index=torch.from_numpy(edges.reshape(-1, 2).T.copy()),
        feature_domain=None if domain is None else tuple(float(v) for v in domain),
        num_nodes=int(x.shape[0]),
    )
    if isinstance(meta.get("name"), str):
        data.name = meta["name"]
    return data


def _read_csv(path: Path, dtype, ndmin: int, layout: str) -> np.ndarray:
    """``path``'s comma-separated numbers (``#`` comments), or a ``ValueError`` naming the file
    and its ``layout`` (numpy's own message says where: its rows count data lines from 0): also
    for a file with no data line, and for a NaN or infinite value (its data line and column,
    counted from 1)."""
    import warnings

    try:
        with warnings.catch_warnings():  # "input contained no data": refused below instead
            warnings.simplefilter("ignore", UserWarning)
            values = np.loadtxt(path, delimiter=",", comments="#", dtype=dtype, ndmin=ndmin)
    except ValueError as err:
        ragged = re.match(
            r"the number of columns changed from (\d+) to (\d+) at row (\d+)", str(err)
        )
        if ragged:  # numpy adds "use `usecols` ...": a hint a `files` user cannot act on
            first, now, row = ragged.groups()
            raise ValueError(
                f"dataset 'files': {path}: data line {row} (counted from 1, "
                f"comments and blank lines left out) has {now} column(s) where "
                f"the lines before it have {first}: every line needs the same "
                f"number (expected {layout})"
            ) from None
        raise ValueError(f"dataset 'files': {path}: {err} (expected {layout})") from None
    if values.size == 0:
        raise ValueError(f"dataset 'files': {path}: no data line (expected {layout})")
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        rows = values.reshape(values.shape[0], -1)
        row, col = (int(i) for i in np.argwhere(~np.isfinite(rows))[0])
        raise ValueError(
            f"dataset 'files': {path}: data line {row + 1}, column {col + 1} is "
            f"{rows[row, col]} (counting data lines and columns from 1; expected "
            f"finite numbers: {layout})"
        )
    return values


def _check_rows_agree(root: Path, edges: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """One label per feature line, and every edge's node ids among them: a ``ValueError``
    naming the files and the first offending data line (counted from 1)."""
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(
            f"dataset 'files': {root / 'labels.csv'} has {y.shape[0]} data lines "
            f"but {root / 'features.csv'} has {n}: one label per node, in the "
            f"same order"
        )
    outside = np.flatnonzero((edges < 0).any(1) | (edges >= n).any(1))
    if outside.size:
        line = int(outside[0])
        raise ValueError(
            f"dataset 'files': {root / 'edges.csv'}: data line {line + 1} "
            f"(counted from 1) has the edge {edges[line, 0]},{edges[line, 1]}; node "
            f"ids must lie in [0, {n}) ({n} nodes: the lines of features.csv, "
            f"0-based)"
        )


def files_dataset(root: Path | None) -> Data:
    """The ``files`` dataset: :func:`read_graph_files` on ``data-root``."""
    if root is None:
        raise ValueError(
            "dataset 'files' reads the folder (or .pt file) named by data-root; set data-root"
        )
    return read_graph_files(root)
