"""What ``fedgraph datasets`` and ``fedgraph sweep --dry-run`` say about a dataset: why it does
not load offline (:func:`data_problem`), a Facebook100 file's size (:func:`facebook100_size`)."""

from __future__ import annotations

from pathlib import Path


def data_problem(name: str, root: str | None, min_class_size: int) -> str | None:
    """Why the dataset ``name`` does not load offline with this root (its first line), or
    ``None`` when it loads (``sweep --dry-run``; a cell of such a dataset would fail): first
    what ``fedgraph run`` refuses before it starts (a data root or ``$FEDGRAPH_DATA`` that is
    not a folder, a built-in dataset's missing files), then a load."""
    from types import SimpleNamespace

    from fedgraph.config import ConfigError, check_data_root
    from fedgraph.dataset_files import missing_files

    if str(name).lower().startswith("synthetic-sbm:"):
        return None
    try:
        check_data_root(SimpleNamespace(dataset=str(name), data_root=root or ""))
    except ConfigError as err:
        return str(err)
    missing = missing_files(str(name), root)
    if missing:
        return missing.splitlines()[0]
    from fedgraph.data import load_dataset

    try:
        load_dataset(name, root, min_class_size=min_class_size)
    except FileNotFoundError as err:
        return str(err).splitlines()[0]
    except Exception:  # noqa: BLE001 - a user loader's own needs: the run will say
        pass
    return None


def facebook100_size(path: Path) -> str:
    """Nodes and directed edges of a Facebook100 ``.mat`` (the adjacency only: cheap); the
    classes depend on ``min-class-size``."""
    import scipy.io

    try:
        adj = scipy.io.loadmat(path, variable_names=["A"])["A"]
    except Exception as err:  # noqa: BLE001 - a damaged file: say so, list the rest
        return f"unreadable: {err}"
    return (
        f"offline  nodes {adj.shape[0]:>7}  edges {adj.nnz:>9}  "
        "class-year task (classes: min-class-size)"
    )
