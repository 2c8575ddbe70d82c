"""Where the built-in datasets' files are, and what is said when they are missing, without
torch or PyG: the loaders (:mod:`fedgraph.data`) raise these messages, and ``fedgraph run``
checks the same files before Ray starts (:func:`missing_files`,
:func:`fedgraph.config.check_dataset_files`), so that a missing dataset is named in well under
a second, not after Ray's start-up (13-19 s on 2 cores).

The data root is the explicit ``root`` (the run config's ``data-root``), else the environment
variable ``FEDGRAPH_DATA``, else the user cache (:func:`resolve_root`); the layout under it is
described in :mod:`fedgraph.data.datasets`. Cora is bundled with the package and needs no
file; ``synthetic-sbm:...`` is generated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

PathLike = str | Path

#: the environment variable naming the data root
ENV_DATA = "FEDGRAPH_DATA"

#: Planetoid datasets: name -> PyG's folder name (``planetoid/<folder>/raw/ind.<name>.<file>``)
PLANETOID_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

#: the other datasets PyG reads: name -> (folder under the root, the files of its ``raw/``)
PYG_RAW = {
    "facebook-pagepage": (Path("musae") / "FacebookPagePage", ("facebook.npz",)),
    "lastfm-asia": (Path("lastfm"), ("lastfm_asia.npz",)),
    "reddit": (Path("reddit"), ("reddit_data.npz", "reddit_graph.npz")),
}

#: OGB's release of ogbn-products (the zip holds ``products/``; the ``ogb`` package renames it
#: ``ogbn_products/``, the folder name looked for here).
OGBN_PRODUCTS_URL = "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip"
OGBN_PRODUCTS_DIR = "ogbn_products"
OGBN_RAW = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")
OGBN_SPLIT = Path("split") / "sales_ranking"
OGBN_SPLIT_FILES = ("train.csv.gz", "valid.csv.gz", "test.csv.gz")
#: what a missing ogbn-products file's message adds
OGBN_DOWNLOAD = f" ogbn-products downloads from {OGBN_PRODUCTS_URL} (1.4 GB)."

#: the plain files of the ``files`` dataset (a folder named by ``data-root``)
GRAPH_FILES = ("edges.csv", "features.csv", "labels.csv")


def user_cache_dir() -> Path:
    r"""Returns the user cache folder of the project.

    ``$XDG_CACHE_HOME/fedgraph`` if ``XDG_CACHE_HOME`` is set, else
    ``~/.cache/fedgraph``. The folder is not created.
    """
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedgraph"


def resolve_root(root: PathLike | None = None) -> Path:
    r"""Resolves the data root folder.

    Args:
        root (str or Path, optional): Explicit root. (default: :obj:`None`)

    Returns:
        Path: ``root`` if given, else ``$FEDGRAPH_DATA`` if set, else
        :func:`user_cache_dir`.
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_DATA)
    if env:
        return Path(env).expanduser()
    return user_cache_dir()


def raw_files_message(name: str, paths: Sequence[Path], extra: str = "") -> str:
    """The message of a built-in dataset whose raw files ``paths`` are missing."""
    listed = ", ".join(str(p) for p in paths)
    return (
        f"Raw files of dataset '{name}' not found (looked for: {listed}). "
        f"Place them there, point the {ENV_DATA} environment variable or the "
        f"'root' argument (run config: data-root) at a folder with the layout described in "
        f"fedgraph.data.datasets, or download them once when online with "
        f"fedgraph.data.load_dataset('{name}', root, download=True).{extra}"
    )


def ogbn_files(dataset_dir: Path) -> list[Path]:
    """The files ogbn-products is read from under its folder (OGB's layout)."""
    return [dataset_dir / "raw" / f for f in OGBN_RAW] + [
        dataset_dir / OGBN_SPLIT / f for f in OGBN_SPLIT_FILES
    ]


def find_facebook100(college: str, root: Path) -> Path:
    """The ``.mat`` file of a Facebook100 college under ``root/facebook100`` (its name in any
    case).

    Raises:
        FileNotFoundError: there is none (the message lists the colleges that are there).
    """
    folder = root / "facebook100"
    exact = folder / f"{college}.mat"
    if exact.is_file():
        return exact
    present = []
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() == ".mat" and p.stem.lower() == college.lower():
                return p
            if p.suffix.lower() == ".mat":
                present.append(p.stem)
    there = (
        f"colleges present there: {', '.join(present)}" if present else "no college file is there"
    )
    raise FileNotFoundError(
        f"Facebook100 file for college '{college}' not found (looked for "
        f"{exact}, case-insensitive; {there}). Place <College>.mat under "
        f"<root>/facebook100/ and point the {ENV_DATA} environment variable "
        f"or the 'root' argument (run config: data-root) at <root>. Facebook100 has no download."
    )


def check_graph_files(root: Path) -> None:
    """For the ``files`` dataset: the folder ``root`` holds every file of :data:`GRAPH_FILES`.

    Raises:
        FileNotFoundError: one is missing (the message lists the layout).
    """
    missing = [f for f in GRAPH_FILES if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"dataset 'files': {', '.join(str(root / f) for f in missing)} not found; "
            "data-root must be a .pt file (torch.save of a Data) or a folder with edges.csv "
            "(two node ids per line, e.g. 0,1; a header must start with #), features.csv "
            "(one row per node), labels.csv (one class id per line) and optionally graph.toml "
            "(feature_domain = [low, high])"
        )


def missing_raw_files(dataset_dir: Path, raw_files: Sequence[str]) -> list[Path]:
    """The files of ``raw_files`` that ``dataset_dir/raw`` lacks."""
    return [dataset_dir / "raw" / f for f in raw_files if not (dataset_dir / "raw" / f).is_file()]


def _check_raw(name: str, dataset_dir: Path, raw_files: Sequence[str]) -> None:
    missing = missing_raw_files(dataset_dir, raw_files)
    if missing:
        raise FileNotFoundError(raw_files_message(name, missing))


def check_files(name: str, root: PathLike | None = None) -> None:
    """Raise what the loader of the built-in dataset ``name`` raises when its files are not
    under the data root (:func:`resolve_root` of ``root``), without loading it. Nothing for
    Cora (bundled), ``synthetic-sbm:...`` (generated) and a user's loader (only it knows).

    Raises:
        FileNotFoundError: the loader's message (the paths looked for).
    """
    key = str(name).strip().lower()
    base = resolve_root(root)
    if key.startswith("facebook100:") and key.split(":", 1)[1].strip():
        find_facebook100(str(name).strip().split(":", 1)[1].strip(), base)
    elif key == "files" and root:
        path = Path(root).expanduser()
        if not (path.is_file() and path.suffix == ".pt"):
            check_graph_files(path)
    elif key in PLANETOID_NAMES and key != "cora":
        _check_raw(key, base / "planetoid" / PLANETOID_NAMES[key], planetoid_files(key))
    elif key in PYG_RAW:
        _check_raw(key, base / PYG_RAW[key][0], PYG_RAW[key][1])
    elif key == "ogbn-products":
        missing = [p for p in ogbn_files(base / OGBN_PRODUCTS_DIR) if not p.is_file()]
        if missing:
            raise FileNotFoundError(raw_files_message(key, missing, OGBN_DOWNLOAD))


def missing_files(name: str, root: PathLike | None = None) -> str | None:
    """:func:`check_files`'s message, or ``None`` when nothing is missing."""
    try:
        check_files(name, root)
    except FileNotFoundError as err:
        return str(err)
    return None


def planetoid_files(key: str) -> list[str]:
    """The raw files of the Planetoid dataset ``key`` (``ind.<key>.x``, ...)."""
    return [f"ind.{key}.{f}" for f in PLANETOID_FILES]
