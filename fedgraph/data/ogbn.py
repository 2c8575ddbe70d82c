"""ogbn-products from OGB's own raw layout, read with numpy (no ``ogb`` package), with OGB's
sales-ranking split in the masks and a cache of the normalised tensors
(:func:`load_ogbn_products`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

# OGB's release and layout (without torch: ``fedgraph run`` checks the files before it starts)
from ..dataset_files import OGBN_DOWNLOAD, OGBN_PRODUCTS_URL  # noqa: F401 (re-exported)
from ..dataset_files import OGBN_PRODUCTS_DIR as _OGBN_PRODUCTS_DIR
from ..dataset_files import OGBN_SPLIT as _OGBN_SPLIT
from ..dataset_files import OGBN_SPLIT_FILES as _OGBN_SPLIT_FILES
from ..dataset_files import ogbn_files as _ogbn_files
from .normal_form import finalize
from .paths import user_cache_dir
from .raw_folders import is_writable_dir, not_found

#: Bump when the cached tensors change meaning.
_OGBN_CACHE_VERSION = 1


def _read_csv_gz(path: Path, dtype) -> np.ndarray:
    """A headerless OGB ``.csv.gz`` as a 2-d array; a malformed row names the file."""
    try:
        return np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def _download_ogbn_products(dataset_dir: Path) -> None:
    """Downloads OGB's ``products.zip`` (1.4 GB) and unpacks it as ``dataset_dir``."""
    from torch_geometric.data import download_url, extract_zip

    parent = dataset_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    zip_path = download_url(OGBN_PRODUCTS_URL, str(parent))
    extract_zip(zip_path, str(parent))
    os.unlink(zip_path)
    extracted = parent / "products"
    if dataset_dir.exists():  # partial earlier attempt: replaced by the fresh release
        shutil.rmtree(dataset_dir)
    os.replace(extracted, dataset_dir)


def _ogbn_cache_path(dataset_dir: Path) -> Path:
    """Where the normalised tensors are cached: ``<dataset>/processed/`` when writable, else
    ``<user cache>/processed-copies/<hash of the dataset folder>/ogbn_products/processed/``."""
    processed = dataset_dir / "processed"
    if is_writable_dir(dataset_dir) and (not processed.exists() or is_writable_dir(processed)):
        return processed / "fedgraph.pt"
    key = hashlib.sha1(str(dataset_dir.resolve()).encode()).hexdigest()
    return (
        user_cache_dir()
        / "processed-copies"
        / key[:12]
        / _OGBN_PRODUCTS_DIR
        / "processed"
        / "fedgraph.pt"
    )


def _ogbn_stamp(files: Sequence[Path]) -> list[list[int]]:
    """Sizes and modification times of the source files: a changed file invalidates the cache."""
    return [[p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def load_ogbn_products(root: Path, download: bool) -> Data:
    r"""ogbn-products (Hu et al., *Open Graph Benchmark*, NeurIPS 2020): the Amazon
    co-purchasing network. Nodes are products, an edge joins two products bought together,
    features are 100-dimensional PCA-reduced bag-of-words of the product descriptions
    (real-valued: ``feature_domain`` is ``None``), the label is one of 47 top-level
    categories. ``train_mask``/``val_mask``/``test_mask`` (and the ``public_*`` copies that
    ``split = "planetoid"`` uses) hold OGB's official *sales-ranking* split: the top 8% of
    products by sales rank train, the next 2% validate, the rest (90%) test.

    .. list-table:: STATS (as published by OGB; not loaded here)
        :header-rows: 1

        * - nodes
          - undirected edges
          - features
          - classes
        * - 2,449,029
          - 61,859,140
          - 100
          - 47

    Layout under the root (OGB's own, as the ``ogb`` package leaves it, so an existing
    ``ogb`` download is read in place)::

        ogbn_products/raw/{edge,node-feat,node-label}.csv.gz
        ogbn_products/split/sales_ranking/{train,valid,test}.csv.gz

    Why not the ``ogb`` package: its latest release (1.3.6) fails to load its own processed
    file under torch >= 2.6 (``torch.load``'s ``weights_only`` default), asks for keyboard
    input (``input()``) when a folder lacks its ``RELEASE_v1.txt`` and before any download
    over 1 GB (products.zip is 1.4 GB), checks PyPI for updates in a thread started on import,
    and needs pandas and scikit-learn. The files are plain headerless CSV, so they are read
    with numpy here, no extra dependency (numpy's C parser took 0.3 s for 3 million edge
    rows and 0.7 s for 100,000 rows of 100 features on one core here; the full 1.4 GB
    release was not tried offline).
    ``download=True`` fetches :data:`OGBN_PRODUCTS_URL` with PyG's ``download_url`` and
    ``extract_zip``. The normalised graph is cached as ``processed/fedgraph.pt`` next to
    ``raw/`` (in the user cache when the folder is read-only) and re-read from there; a
    changed source file invalidates it.
    """
    dataset_dir = root / _OGBN_PRODUCTS_DIR
    files = _ogbn_files(dataset_dir)
    missing = [p for p in files if not p.is_file()]
    if missing:
        if not download:
            not_found("ogbn-products", missing, OGBN_DOWNLOAD)
        if not is_writable_dir(dataset_dir):
            dataset_dir = user_cache_dir() / "downloads" / _OGBN_PRODUCTS_DIR
            files = _ogbn_files(dataset_dir)
        if not all(p.is_file() for p in files):
            _download_ogbn_products(dataset_dir)

    cache = _ogbn_cache_path(dataset_dir)
    stamp = _ogbn_stamp(files)
    if cache.is_file():
        try:
            saved = torch.load(cache, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged cache is rebuilt from the source files
            saved = {}
        if saved.get("version") == _OGBN_CACHE_VERSION and saved.get("stamp") == stamp:
            out = Data(
                x=saved["x"],
                y=saved["y"],
                edge_index=saved["edge_index"],
                num_nodes=int(saved["num_nodes"]),
            )
            for key in ("train_mask", "val_mask", "test_mask"):
                out[key] = saved[key]
                out["public_" + key] = saved[key].clone()
            out.name = "ogbn-products"
            out.feature_domain = None
            return out

    raw = dataset_dir / "raw"
    x = _read_csv_gz(raw / "node-feat.csv.gz", np.float32)
    y = _read_csv_gz(raw / "node-label.csv.gz", np.int64)
    n = x.shape[0]
    if y.shape != (n, 1):
        raise ValueError(
            f"{raw / 'node-label.csv.gz'}: expected one label per node ({n} "
            f"rows, as node-feat.csv.gz), got shape {list(y.shape)}"
        )
    edges = _read_csv_gz(raw / "edge.csv.gz", np.int64)
    if edges.size and (edges.shape[1] != 2 or edges.min() < 0 or edges.max() >= n):
        raise ValueError(
            f"{raw / 'edge.csv.gz'}: expected 'source,target' rows with node ids in [0, {n})"
        )
    data = Data(
        x=torch.from_numpy(x),
        y=torch.from_numpy(y.reshape(-1)),
        edge_index=torch.from_numpy(np.ascontiguousarray(edges.reshape(-1, 2).T)),
        num_nodes=n,
    )
    for key, fname in zip(("train_mask", "val_mask", "test_mask"), _OGBN_SPLIT_FILES):
        path = dataset_dir / _OGBN_SPLIT / fname
        idx = _read_csv_gz(path, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{path}: node ids must lie in [0, {n})")
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(idx)] = True
        data[key] = mask
    out = finalize(data, "ogbn-products", None)
    try:  # the cache is an optimisation: an unwritable cache folder is not an error
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
        torch.save(
            {
                "version": _OGBN_CACHE_VERSION,
                "stamp": stamp,
                "x": out.x,
                "y": out.y,
                "edge_index": out.edge_index,
                "num_nodes": n,
                **{k: out[k] for k in ("train_mask", "val_mask", "test_mask")},
            },
            tmp,
        )
        os.replace(tmp, cache)  # atomic: concurrent loaders see whole files
    except OSError:
        pass
    return out
