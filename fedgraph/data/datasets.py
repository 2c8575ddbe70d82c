r"""Loading the graphs used by the project by name.

All loaders return a single :class:`torch_geometric.data.Data` object in one
normalised form:

* ``x``: ``float32`` tensor of shape ``[N, F]`` (features are never
  normalised here: Planetoid features stay binary, one-hot stays one-hot),
* ``y``: ``long`` tensor of shape ``[N]``,
* ``edge_index``: ``long`` tensor of shape ``[2, E]``, undirected (every edge
  stored in both directions), coalesced, without self loops,
* ``feature_domain``: the *public* per-feature range ``(low, high)`` as a tuple
  of floats, e.g. ``(0.0, 1.0)`` for bag-of-words / binary / one-hot features.
  It is known a priori from the data format and never computed from the data
  values, so it can be used to rescale features without leaking information.
  ``None`` where no public bound is known (PubMed TF-IDF, LastFM Asia, Reddit,
  ogbn-products, and PyG's online 128-dimensional Facebook embedding),
* ``name``: the canonical dataset name.

Planetoid graphs additionally keep PyG's public split as ``train_mask``,
``val_mask`` and ``test_mask`` and a copy of it as ``public_train_mask``,
``public_val_mask`` and ``public_test_mask`` (used by
:func:`fedgraph.data.splits.planetoid_split`); ogbn-products keeps OGB's official
sales-ranking split the same way.

Data root
---------
The root folder is resolved as: the explicit ``root`` argument, else the
environment variable ``FEDGRAPH_DATA``, else ``$XDG_CACHE_HOME/fedgraph`` (or
``~/.cache/fedgraph``). The layout under the root is::

    planetoid/{Cora,CiteSeer,PubMed}/raw/ind.<name>.*
    musae/FacebookPagePage/raw/facebook.npz
    facebook100/<College>.mat
    lastfm/raw/lastfm_asia.npz
    reddit/raw/reddit_data.npz, reddit_graph.npz
    ogbn_products/raw/{edge,node-feat,node-label}.csv.gz
    ogbn_products/split/sales_ranking/{train,valid,test}.csv.gz   (OGB's layout)

PyG writes a ``processed/`` folder next to ``raw/``. When the dataset folder is
not writable (read-only mount, or no write permission bits, which also covers
running as root on a read-only-by-convention folder), the raw files are copied
to ``<user cache>/fedgraph/processed-copies/<hash of source>/...`` and PyG is
pointed at that copy.

Your own graph
--------------
A loader ``fn(root) -> Data`` (``root``: the run config's ``data-root`` as a
:class:`~pathlib.Path`, or ``None``) registered with :func:`register_dataset`,
or named by import path (``dataset = "mypkg.graphs:load"``), is loaded like the
built-in ones: its output is checked by :func:`check_graph` (a
:class:`~fedgraph.registry.ContractError` names the broken field) and
normalised as above. The built-in ``files`` dataset reads plain files (edge
list, features, labels; :func:`read_graph_files`) or a saved ``Data``
(``data-root`` a ``.pt`` file) without any code.

Downloads
---------
Raw files are checked *before* PyG is called, so PyG never tries to download
(and hang) offline. If they are missing, :class:`FileNotFoundError` is raised
unless ``download=True`` is passed, in which case PyG's own download is used
(into the root if writable, else into the user cache; ogbn-products: OGB's zip
through PyG's ``download_url``, see :func:`_load_ogbn_products`). Cora is bundled
with the package and is used when the root has no Cora raw files.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from ..catalog import KNOWN_DATASETS  # the built-in names (known without torch)
from ..registry import ContractError, Registry, spec_label
from .synthetic import PREFIX as SBM_PREFIX
from .synthetic import load_sbm, sbm_spec
from .paths import (_BUNDLED_ROOT, _PLANETOID_NAMES, ENV_DATA, bundled_root,  # noqa: F401
                    dataset_inputs, resolve_root, user_cache_dir)

PathLike = Union[str, Path]


_PLANETOID_FILES = ('x', 'tx', 'allx', 'y', 'ty', 'ally', 'graph', 'test.index')


#: Columns of ``local_info`` in the Facebook100 ``.mat`` files.
FACEBOOK100_COLUMNS: Tuple[str, ...] = ('status', 'gender', 'major',
                                        'second_major', 'dorm', 'year',
                                        'high_school')
_FB100_YEAR = 5
#: The feature columns of :func:`load_facebook100` by default: those of the GAP reference
#: code (sisaman/GAP, ``core/datasets/facebook.py``: ``local_info[:, :-1]`` without the year),
#: i.e. every column but the year and the high school. The high school's one-hot block is
#: most of the features (2,304 of 2,903 columns on Wisconsin87, about 8 nodes per column) and
#: costs accuracy: GAP on Wisconsin87, one client, 5 seeds, 79.5 without noise without it,
#: 76.9 with it (README, issue 14).
FACEBOOK100_FEATURES: Tuple[str, ...] = ('status', 'gender', 'major', 'second_major', 'dorm')


# --------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------


def _is_writable_dir(path: Path) -> bool:
    r"""Whether ``path`` (or, if it does not exist, its first existing
    ancestor) may be written to. Requires both :func:`os.access` (catches
    read-only mounts) and a write permission bit (so that ``root``, to whom
    :func:`os.access` always says yes, respects read-only folders)."""
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK):
        return False
    mode = p.stat().st_mode
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable_copy(src_dataset_dir: Path, rel: Path,
                   raw_files: Sequence[str]) -> Path:
    r"""Copies ``src_dataset_dir/raw/<raw_files>`` to a writable cache folder
    and returns the new dataset folder (``.../rel``). Files already copied
    with the same size are reused, so the processed cache survives."""
    key = hashlib.sha1(str(src_dataset_dir.resolve()).encode()).hexdigest()
    dst_dataset_dir = user_cache_dir() / 'processed-copies' / key[:12] / rel
    dst_raw = dst_dataset_dir / 'raw'
    dst_raw.mkdir(parents=True, exist_ok=True)
    for fname in raw_files:
        src = src_dataset_dir / 'raw' / fname
        dst = dst_raw / fname
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            tmp = dst.with_name(f'{dst.name}.tmp-{os.getpid()}')
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)  # atomic: concurrent loaders see whole files
            # A changed raw file invalidates PyG's processed cache.
            shutil.rmtree(dst_dataset_dir / 'processed', ignore_errors=True)
    return dst_dataset_dir


def _missing(dataset_dir: Path, raw_files: Sequence[str]) -> List[Path]:
    return [dataset_dir / 'raw' / f for f in raw_files
            if not (dataset_dir / 'raw' / f).is_file()]


def _not_found(name: str, paths: Sequence[Path], extra: str = '') -> None:
    listed = ', '.join(str(p) for p in paths)
    raise FileNotFoundError(
        f"Raw files of dataset '{name}' not found (looked for: {listed}). "
        f"Place them there, point the {ENV_DATA} environment variable or the "
        f"'root' argument (run config: data-root) at a folder with the layout described in "
        f"fedgraph.data.datasets, or download them once when online with "
        f"fedgraph.data.load_dataset('{name}', root, download=True).{extra}")


def _prepare_pyg_dir(name: str, dataset_dir: Path, rel: Path,
                     raw_files: Sequence[str], download: bool,
                     fallback_dir: Optional[Path] = None) -> Path:
    r"""Returns a writable dataset folder whose ``raw/`` holds ``raw_files``
    (or, if ``download`` and the files are absent, a writable folder for PyG
    to download into).

    Raises:
        FileNotFoundError: if the raw files are absent, there is no
            ``fallback_dir`` and ``download`` is :obj:`False`.
    """
    missing = _missing(dataset_dir, raw_files)
    bundled = False
    if missing and fallback_dir is not None:
        dataset_dir, missing, bundled = fallback_dir, [], True
    if missing:
        if not download:
            _not_found(name, missing)
        if _is_writable_dir(dataset_dir):
            return dataset_dir
        return user_cache_dir() / 'downloads' / rel
    # Bundled package data is never written to.
    if not bundled and _is_writable_dir(dataset_dir):
        processed = dataset_dir / 'processed'
        if not processed.exists() or _is_writable_dir(processed):
            return dataset_dir
    return _writable_copy(dataset_dir, rel, raw_files)


def _remove_empty_processed(base: Path, since: float) -> None:
    """Remove the empty ``processed`` folders a failed load created (under ``base`` and the
    user cache's writable copies) at or after ``since``: a failed load leaves nothing behind."""
    for root in (base, user_cache_dir() / 'processed-copies'):
        if not root.is_dir():
            continue
        for folder in root.rglob('processed'):
            try:
                if (folder.is_dir() and not any(folder.iterdir())
                        and folder.stat().st_mtime >= since - 1):
                    folder.rmdir()
            except OSError:
                pass


# --------------------------------------------------------------------------
# Normalisation and statistics
# --------------------------------------------------------------------------


def _finalize(data: Data, name: str,
              feature_domain: Optional[Tuple[float, float]]) -> Data:
    r"""Casts to the project's dtypes, makes the graph undirected, coalesced
    and free of self loops, and sets ``name`` and ``feature_domain``."""
    num_nodes = data.num_nodes
    out = Data(x=data.x.to(torch.float32).contiguous(),
               y=data.y.to(torch.long).view(-1))
    edge_index = data.edge_index.to(torch.long)
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = to_undirected(edge_index, num_nodes=num_nodes)
    out.edge_index = coalesce(edge_index, num_nodes=num_nodes)
    for key in ('train_mask', 'val_mask', 'test_mask'):
        if key in data and data[key] is not None:
            mask = data[key].to(torch.bool)
            if mask.dim() == 1:  # PyG's default public split
                out[key] = mask
                out['public_' + key] = mask.clone()
    out.num_nodes = num_nodes
    out.name = name
    out.feature_domain = feature_domain
    return out


def dataset_statistics(data: Data) -> Dict[str, Any]:
    r"""Summary statistics of a node-classification graph.

    Args:
        data (Data): graph with ``x [N, F]``, ``y [N]`` and
            ``edge_index [2, E]``.

    Returns:
        dict: ``name``, ``num_nodes``, ``num_edges`` (directed count, i.e. each
        undirected edge counted twice), ``num_features``, ``num_classes``,
        ``avg_degree`` (``num_edges / num_nodes``) and ``class_counts``
        (list of length ``num_classes``).
    """
    n = int(data.num_nodes)
    e = int(data.edge_index.size(1))
    y = data.y.view(-1)
    valid = y[y >= 0]
    num_classes = int(valid.max()) + 1 if valid.numel() > 0 else 0
    counts = torch.bincount(valid, minlength=num_classes).tolist()
    return {
        'name': getattr(data, 'name', None),
        'num_nodes': n,
        'num_edges': e,
        'num_features': int(data.x.size(1)) if data.x is not None else 0,
        'num_classes': num_classes,
        'avg_degree': e / n if n > 0 else 0.0,
        'class_counts': counts,
    }


# --------------------------------------------------------------------------
# Individual loaders
# --------------------------------------------------------------------------
def _load_planetoid(key: str, root: Path, download: bool) -> Data:
    from torch_geometric.datasets import Planetoid

    pyg_name = _PLANETOID_NAMES[key]
    raw_files = [f'ind.{key}.{f}' for f in _PLANETOID_FILES]
    rel = Path('planetoid') / pyg_name
    fallback = bundled_root() / rel if key == 'cora' else None
    dataset_dir = _prepare_pyg_dir(key, root / rel, rel, raw_files, download,
                                   fallback_dir=fallback)
    dataset = Planetoid(str(dataset_dir.parent), pyg_name)
    # Planetoid x is binary bag-of-words for Cora/CiteSeer; PubMed is TF-IDF.
    domain = (0.0, 1.0) if key in ('cora', 'citeseer') else None
    return _finalize(dataset[0], key, domain)


def _load_facebook_pagepage(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import FacebookPagePage

    rel = Path('musae') / 'FacebookPagePage'
    dataset_dir = _prepare_pyg_dir('facebook-pagepage', root / rel, rel,
                                   ['facebook.npz'], download)
    dataset = FacebookPagePage(str(dataset_dir))
    data = dataset[0]
    # The raw MUSAE release has 4,714 binary features; PyG's online copy has
    # a 128-dimensional real-valued embedding without a public range.
    domain = (0.0, 1.0) if data.x.size(1) == 4714 else None
    return _finalize(data, 'facebook-pagepage', domain)


def _load_lastfm(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import LastFMAsia

    rel = Path('lastfm')
    dataset_dir = _prepare_pyg_dir('lastfm-asia', root / rel, rel,
                                   ['lastfm_asia.npz'], download)
    return _finalize(LastFMAsia(str(dataset_dir))[0], 'lastfm-asia', None)


def _load_reddit(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import Reddit

    rel = Path('reddit')
    dataset_dir = _prepare_pyg_dir('reddit', root / rel, rel,
                                   ['reddit_data.npz', 'reddit_graph.npz'],
                                   download)
    return _finalize(Reddit(str(dataset_dir))[0], 'reddit', None)


#: OGB's release of ogbn-products (the zip holds ``products/``; the ``ogb`` package renames it
#: ``ogbn_products/``, the folder name looked for here).
OGBN_PRODUCTS_URL = 'http://snap.stanford.edu/ogb/data/nodeproppred/products.zip'
_OGBN_PRODUCTS_DIR = 'ogbn_products'
_OGBN_RAW = ('edge.csv.gz', 'node-feat.csv.gz', 'node-label.csv.gz')
_OGBN_SPLIT = Path('split') / 'sales_ranking'
_OGBN_SPLIT_FILES = ('train.csv.gz', 'valid.csv.gz', 'test.csv.gz')
#: Bump when the cached tensors change meaning.
_OGBN_CACHE_VERSION = 1


def _ogbn_files(dataset_dir: Path) -> List[Path]:
    return ([dataset_dir / 'raw' / f for f in _OGBN_RAW]
            + [dataset_dir / _OGBN_SPLIT / f for f in _OGBN_SPLIT_FILES])


def _read_csv_gz(path: Path, dtype) -> np.ndarray:
    """A headerless OGB ``.csv.gz`` as a 2-d array; a malformed row names the file."""
    try:
        return np.loadtxt(path, delimiter=',', dtype=dtype, ndmin=2)
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
    extracted = parent / 'products'
    if dataset_dir.exists():  # partial earlier attempt: replaced by the fresh release
        shutil.rmtree(dataset_dir)
    os.replace(extracted, dataset_dir)


def _ogbn_cache_path(dataset_dir: Path) -> Path:
    """Where the normalised tensors are cached: ``<dataset>/processed/`` when writable, else
    ``<user cache>/processed-copies/<hash of the dataset folder>/ogbn_products/processed/``."""
    processed = dataset_dir / 'processed'
    if _is_writable_dir(dataset_dir) and (not processed.exists()
                                          or _is_writable_dir(processed)):
        return processed / 'fedgraph.pt'
    key = hashlib.sha1(str(dataset_dir.resolve()).encode()).hexdigest()
    return (user_cache_dir() / 'processed-copies' / key[:12] / _OGBN_PRODUCTS_DIR
            / 'processed' / 'fedgraph.pt')


def _ogbn_stamp(files: Sequence[Path]) -> List[List[int]]:
    """Sizes and modification times of the source files: a changed file invalidates the cache."""
    return [[p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _load_ogbn_products(root: Path, download: bool) -> Data:
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
            _not_found('ogbn-products', missing,
                       f" ogbn-products downloads from {OGBN_PRODUCTS_URL} (1.4 GB).")
        if not _is_writable_dir(dataset_dir):
            dataset_dir = user_cache_dir() / 'downloads' / _OGBN_PRODUCTS_DIR
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
        if saved.get('version') == _OGBN_CACHE_VERSION and saved.get('stamp') == stamp:
            out = Data(x=saved['x'], y=saved['y'], edge_index=saved['edge_index'],
                       num_nodes=int(saved['num_nodes']))
            for key in ('train_mask', 'val_mask', 'test_mask'):
                out[key] = saved[key]
                out['public_' + key] = saved[key].clone()
            out.name = 'ogbn-products'
            out.feature_domain = None
            return out

    raw = dataset_dir / 'raw'
    x = _read_csv_gz(raw / 'node-feat.csv.gz', np.float32)
    y = _read_csv_gz(raw / 'node-label.csv.gz', np.int64)
    n = x.shape[0]
    if y.shape != (n, 1):
        raise ValueError(f"{raw / 'node-label.csv.gz'}: expected one label per node ({n} "
                         f"rows, as node-feat.csv.gz), got shape {list(y.shape)}")
    edges = _read_csv_gz(raw / 'edge.csv.gz', np.int64)
    if edges.size and (edges.shape[1] != 2 or edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"{raw / 'edge.csv.gz'}: expected 'source,target' rows with node "
                         f"ids in [0, {n})")
    data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y.reshape(-1)),
                edge_index=torch.from_numpy(np.ascontiguousarray(edges.reshape(-1, 2).T)),
                num_nodes=n)
    for key, fname in zip(('train_mask', 'val_mask', 'test_mask'), _OGBN_SPLIT_FILES):
        path = dataset_dir / _OGBN_SPLIT / fname
        idx = _read_csv_gz(path, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{path}: node ids must lie in [0, {n})")
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(idx)] = True
        data[key] = mask
    out = _finalize(data, 'ogbn-products', None)
    try:  # the cache is an optimisation: an unwritable cache folder is not an error
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f'{cache.name}.tmp-{os.getpid()}')
        torch.save({'version': _OGBN_CACHE_VERSION, 'stamp': stamp, 'x': out.x, 'y': out.y,
                    'edge_index': out.edge_index, 'num_nodes': n,
                    **{k: out[k] for k in ('train_mask', 'val_mask', 'test_mask')}}, tmp)
        os.replace(tmp, cache)  # atomic: concurrent loaders see whole files
    except OSError:
        pass
    return out


def _find_facebook100(college: str, root: Path) -> Path:
    folder = root / 'facebook100'
    exact = folder / f'{college}.mat'
    if exact.is_file():
        return exact
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() == '.mat' and p.stem.lower() == college.lower():
                return p
    raise FileNotFoundError(
        f"Facebook100 file for college '{college}' not found (looked for "
        f"{exact}, case-insensitive). Place <College>.mat under "
        f"<root>/facebook100/ and point the {ENV_DATA} environment variable "
        f"or the 'root' argument (run config: data-root) at <root>. Facebook100 has no download.")


def one_hot_attributes(attributes: np.ndarray) -> Tensor:
    r"""One-hot encodes integer categorical attributes column by column.

    Each column gets one output column per distinct *non-zero* value, in
    increasing value order; the value 0 (missing) gets no column, so a node
    with a missing attribute has all zeros in that attribute's block.

    Args:
        attributes (np.ndarray): integer array of shape ``[N, A]``.

    Returns:
        Tensor: ``float32`` tensor of shape ``[N, sum_a #categories_a]``.
    """
    attributes = np.asarray(attributes)
    n = attributes.shape[0]
    blocks = []
    for col in range(attributes.shape[1]):
        values = attributes[:, col].astype(np.int64)
        cats = np.unique(values[values != 0])
        block = np.zeros((n, cats.size), dtype=np.float32)
        present = values != 0
        block[np.nonzero(present)[0],
              np.searchsorted(cats, values[present])] = 1.0
        blocks.append(block)
    if not blocks:
        return torch.zeros((n, 0), dtype=torch.float32)
    return torch.from_numpy(np.concatenate(blocks, axis=1))


def load_facebook100(path: PathLike, min_class_size: int = 1000,
                     features: Sequence[str] = FACEBOOK100_FEATURES) -> Data:
    r"""Loads a Facebook100 college graph for class-year prediction (the
    "Facebook" task of the GAP paper, Sajadmanesh et al., USENIX Sec. 2023).

    Nodes whose year is missing (0) are dropped, then all nodes of years with
    fewer than ``min_class_size`` remaining nodes, together with their edges.
    Years are relabelled ``0..C-1`` in increasing order (``data.class_years``
    keeps the years). Features are the one-hot encoding of the ``features``
    columns of ``local_info`` (default :data:`FACEBOOK100_FEATURES`: status,
    gender, major, second major, dorm, as GAP's reference code; the high school
    is left out) over the categories present among the kept nodes, with no
    column for missing values (see :func:`one_hot_attributes`).

    Args:
        path (str or Path): the ``<College>.mat`` file (keys ``A`` and
            ``local_info``).
        min_class_size (int, optional): smallest year class kept.
            (default: :obj:`1000`)
        features (sequence of str, optional): the ``local_info`` columns to
            encode, names of :data:`FACEBOOK100_COLUMNS` other than ``year``
            (e.g. ``FACEBOOK100_FEATURES + ('high_school',)``).

    Example::

        from fedgraph.data import FACEBOOK100_FEATURES, load_facebook100
        data = load_facebook100("data/facebook100/Wisconsin87.mat")  # 599 features
        wide = load_facebook100("data/facebook100/Wisconsin87.mat",
                                features=FACEBOOK100_FEATURES + ("high_school",))  # 2,903

    (``load_dataset("facebook100:Wisconsin87", root)`` finds the file under
    ``<root>/facebook100/`` and uses the default features.)

    Returns:
        Data: ``x [N', F]`` float32, ``y [N']`` long, undirected
        ``edge_index [2, E']`` without self loops, ``feature_domain=(0, 1)``.

    Raises:
        ValueError: if ``min_class_size < 1``, a ``features`` name is not a
            column other than the year (or none is given), or no class is left.
    """
    import scipy.io
    import scipy.sparse as sp

    if min_class_size < 1:
        raise ValueError(f"'min_class_size' must be >= 1 (got {min_class_size})")
    if isinstance(features, str):  # one column name, not its letters
        features = (features,)
    allowed = [c for c in FACEBOOK100_COLUMNS if c != 'year']
    bad = [f for f in features if f not in allowed]
    if bad or not features:
        raise ValueError(f"'features': {bad or 'none given'}; allowed: {', '.join(allowed)}")
    path = Path(path)
    mat = scipy.io.loadmat(str(path))
    adj = sp.csr_matrix(mat['A'])
    info = np.asarray(mat['local_info']).astype(np.int64)

    years = info[:, _FB100_YEAR]
    uniq, counts = np.unique(years[years != 0], return_counts=True)
    kept_years = uniq[counts >= min_class_size]
    if kept_years.size == 0:
        raise ValueError(
            f"No class-year of '{path.name}' has at least min_class_size="
            f"{min_class_size} nodes (largest: {int(counts.max(initial=0))})")
    keep = np.isin(years, kept_years)  # year 0 is never in kept_years
    idx = np.nonzero(keep)[0]

    sub = adj[idx][:, idx].tocoo()
    edge_index = torch.from_numpy(np.vstack([sub.row, sub.col]).astype(np.int64))
    y = torch.from_numpy(np.searchsorted(kept_years, years[idx]).astype(np.int64))
    columns = [FACEBOOK100_COLUMNS.index(f) for f in features]
    x = one_hot_attributes(info[idx][:, columns])

    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=idx.size)
    out = _finalize(data, f'facebook100:{path.stem}', (0.0, 1.0))
    out.class_years = torch.from_numpy(kept_years.astype(np.int64))
    out.original_ids = torch.from_numpy(idx.astype(np.int64))
    return out


# --------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------
def load_dataset(name: str, root: Optional[PathLike] = None, *,
                 min_class_size: int = 1000, download: bool = False) -> Data:
    r"""Loads a dataset by name (case-insensitive).

    Args:
        name (str): one of ``cora``, ``citeseer``, ``pubmed``,
            ``facebook-pagepage``, ``lastfm-asia``, ``reddit``, ``ogbn-products``
            (OGB's raw layout, official sales-ranking split in the masks),
            ``facebook100:<College>`` (e.g. ``facebook100:wisconsin87``),
            ``synthetic-sbm:<nodes>:<avg_degree>[:<seed>]`` (a seeded sparse stochastic
            block model, :mod:`fedgraph.data.synthetic`; no files needed),
            ``files`` (``root``: a folder of plain files or a ``.pt``), a name
            registered with :func:`register_dataset` or an import path
            ``"package.module:loader"``.
        root (str or Path, optional): data root (see module docs); defaults
            to ``$FEDGRAPH_DATA`` or the user cache. (default: :obj:`None`)
        min_class_size (int, optional): Facebook100 only, smallest class-year
            kept. (default: :obj:`1000`)
        download (bool, optional): let PyG download missing raw files
            (needs internet). (default: :obj:`False`)

    Returns:
        Data: ``x [N, F]`` float32, ``y [N]`` long, ``edge_index [2, E]``
        long (undirected, coalesced, no self loops), ``feature_domain``
        (``(low, high)`` or ``None``) and ``name``.

    Raises:
        ValueError: on an unknown name (the message lists the known names).
        ContractError: a user loader's graph breaks :func:`check_graph`.
        FileNotFoundError: when the raw files are absent and ``download`` is
            :obj:`False` (the message names the paths looked for and
            ``FEDGRAPH_DATA``).
    """
    if not isinstance(name, str):
        raise TypeError(f"'name' must be a str (got {type(name).__name__})")
    key = name.strip().lower()
    base = resolve_root(root)

    if key.startswith('facebook100:'):
        college = name.strip().split(':', 1)[1].strip()
        if not college:
            raise ValueError("Expected 'facebook100:<College>', e.g. "
                             "'facebook100:Caltech36'")
        return load_facebook100(_find_facebook100(college, base),
                                min_class_size=min_class_size)
    if key.startswith(SBM_PREFIX):  # already normalised: no _finalize copy of a large graph
        return load_sbm(key)
    loaders = {'facebook-pagepage': _load_facebook_pagepage, 'lastfm-asia': _load_lastfm,
               'reddit': _load_reddit, 'ogbn-products': _load_ogbn_products}
    if key in _PLANETOID_NAMES or key in loaders:
        started = time.time()
        try:
            if key in _PLANETOID_NAMES:
                return _load_planetoid(key, base, download)
            return loaders[key](base, download)
        except (FileNotFoundError, ValueError, TypeError):
            _remove_empty_processed(base, started)
            raise
        except Exception as err:  # unreadable / truncated raw files
            _remove_empty_processed(base, started)
            raise ValueError(
                f"could not read dataset '{name}' under {base}: {type(err).__name__}: {err}. "
                "A raw file is probably corrupt or truncated: replace it (and delete the "
                "'processed' folder next to 'raw')") from err
    spec = dataset_spec(name)
    return _load_custom(spec, DATASETS.resolve(spec),
                        None if root is None else Path(root).expanduser())


# --------------------------------------------------------------------------
# Your own graph: registry, contract, plain files
# --------------------------------------------------------------------------
def _check_loader(loader, name: str) -> None:
    """Registry check: ``loader(root)`` must be callable with one argument."""
    import inspect

    if not callable(loader):
        raise ContractError(f"dataset {name!r}: the loader must be a function "
                            f"loader(root) -> Data, got {type(loader).__name__}")
    try:
        inspect.signature(loader).bind(None)
    except TypeError:
        raise ContractError(f"dataset {name!r}: the loader must accept one argument, "
                            f"loader(root) -> Data (root: data-root as a Path, or None)") from None
    except ValueError:  # builtins without a signature
        pass


#: Datasets registered by users: name -> ``loader(root) -> Data``.
DATASETS: Registry = Registry('dataset', check=_check_loader, builtin=KNOWN_DATASETS,
                              hint="See docs/extending.md, 'A dataset'.")


def load_graph_locked(cfg):
    """The whole dataset of ``cfg`` (a :class:`fedgraph.config.DataConfig`: ``dataset``,
    ``data_root``, ``min_class_size``), loaded under a file lock in the cache folder so that
    concurrent supernodes do not process the same raw files at once.

    Raises:
        FileNotFoundError, ValueError: as :func:`load_dataset`.
    """
    from filelock import FileLock

    lock_dir = user_cache_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / ".load.lock")):
        return load_dataset(cfg.dataset, cfg.data_root or None, min_class_size=cfg.min_class_size)


def register_dataset(name: str, loader=None, *, replace: bool = False):
    r"""Registers ``loader(root) -> Data`` under ``name`` (usable as a decorator)::

        @register_dataset('my-graph')
        def my_graph(root):   # root: data-root as a Path, or None
            return Data(x=..., y=..., edge_index=..., feature_domain=(0.0, 1.0))

    The graph it returns must pass :func:`check_graph`; :func:`load_dataset`
    then normalises it like a built-in one.

    Raises:
        ValueError: ``name`` is a built-in dataset, or taken (pass ``replace=True``).
        ContractError: ``loader`` is not callable with one argument.
    """
    if name.strip().lower() in _builtin_names():
        raise ValueError(f"dataset {name!r} is built in; choose another name")
    return DATASETS.register(name, loader, replace=replace)


def _builtin_names() -> Tuple[str, ...]:
    return tuple(k for k in KNOWN_DATASETS if ':' not in k)


def known_datasets() -> List[str]:
    """Built-in dataset names followed by the registered ones."""
    return list(KNOWN_DATASETS) + sorted(DATASETS)


def dataset_spec(name: str) -> str:
    """The canonical spelling of a dataset name, checked without loading.

    Built-in names are lower-cased, ``facebook100:<College>`` keeps the
    college, registered names and import paths are resolved (the module is
    imported, the loader's signature checked; a relative ``file.py`` path is
    made absolute).

    Raises:
        ValueError: unknown name (the message lists the known ones) or an
            import path that does not resolve.
        ContractError: the loader is not callable with one argument.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"dataset: expected a name, got {name!r}")
    name = name.strip()
    key = name.lower()
    if key in _builtin_names():
        return key
    if key.startswith('facebook100:'):
        return name
    if key.startswith(SBM_PREFIX):
        return sbm_spec(key)
    if name not in DATASETS and key in DATASETS:
        name = key
    return DATASETS.check_name(name)


def check_graph(data: Data, name: str = 'dataset') -> None:
    r"""Checks that a loader's graph is what the pipeline needs.

    Required: ``x`` a finite float tensor ``[N, F]`` with ``N >= 2`` and
    ``F >= 1``; ``y`` an integer tensor ``[N]`` with labels in
    ``[0, num_classes)`` (``num_classes``: the attribute if set, else
    ``max(y) + 1``, and then every class must have a node), at least two
    classes; ``edge_index`` an integer tensor
    ``[2, E]`` with node ids in ``[0, N)`` (directed or undirected: it is made
    undirected afterwards). Optional: ``feature_domain`` ``None`` or
    ``(low, high)`` with ``low < high`` and every feature inside (a public
    range: LDP feature mechanisms need it); ``train_mask``/``val_mask``/
    ``test_mask`` boolean ``[N]`` (the ``planetoid`` split uses them).

    Raises:
        ContractError: naming ``name``, the field and what was wrong.
    """
    def bad(msg: str):
        raise ContractError(f"dataset {name!r}: {msg}")

    if not isinstance(data, Data):
        bad(f"the loader must return a torch_geometric.data.Data, got {type(data).__name__}")
    x, y, ei = data.get('x'), data.get('y'), data.get('edge_index')
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        bad("x must be a float tensor [num_nodes, num_features], got "
            f"{_describe(x)}")
    n, f = x.shape
    if n < 2 or f < 1:
        bad(f"x has shape [{n}, {f}]; need at least 2 nodes and 1 feature")
    if not bool(torch.isfinite(x).all()):
        bad("x has NaN or infinite values")
    if not isinstance(y, Tensor) or y.is_floating_point() or y.is_complex() \
            or y.dtype == torch.bool or y.view(-1).numel() != n or y.dim() > 2:
        bad(f"y must be an integer tensor [{n}] (one class id per node), got {_describe(y)}")
    y = y.view(-1)
    num_classes = data.get('num_classes')
    limit = int(num_classes) if num_classes is not None else int(y.max()) + 1
    if int(y.min()) < 0 or int(y.max()) >= limit:
        bad(f"labels must lie in [0, {limit}) (num_classes = {limit}), got values in "
            f"[{int(y.min())}, {int(y.max())}]")
    present = torch.unique(y)
    if int(present.numel()) < 2:
        bad("y has a single class; node classification needs at least 2")
    if num_classes is None and int(present.numel()) != limit:
        missing = sorted(set(range(limit)) - set(present.tolist()))
        bad(f"class ids must be 0..C-1 with every class present; classes {missing[:10]} have "
            "no node (1-based labels? relabel with torch.unique(y, return_inverse=True)[1], "
            "or set data.num_classes if some classes are truly empty)")
    if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.shape[0] != 2 \
            or ei.is_floating_point() or ei.dtype == torch.bool:
        bad(f"edge_index must be an integer tensor [2, num_edges], got {_describe(ei)}")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        bad(f"edge_index has node ids in [{int(ei.min())}, {int(ei.max())}], outside "
            f"[0, {n}) (num_nodes = x.shape[0])")
    if data.get('num_nodes') is not None and data.num_nodes != n:
        bad(f"num_nodes = {data.num_nodes} but x has {n} rows")
    domain = data.get('feature_domain')
    if domain is not None:
        try:
            low, high = (float(v) for v in domain)
        except (TypeError, ValueError):
            bad(f"feature_domain must be None or (low, high), got {domain!r}")
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            bad(f"feature_domain must satisfy low < high (finite), got {domain!r}")
        if float(x.min()) < low or float(x.max()) > high:
            bad(f"features lie in [{float(x.min()):g}, {float(x.max()):g}], outside the "
                f"declared feature_domain ({low:g}, {high:g}); declare the public range "
                "of the data format (not the data's own min/max), or None")
    for key in ('train_mask', 'val_mask', 'test_mask'):
        mask = data.get(key)
        if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool
                                 or tuple(mask.shape) != (n,)):
            bad(f"{key} must be a bool tensor [{n}], got {_describe(mask)}")


def _describe(t) -> str:
    if isinstance(t, Tensor):
        return f"{t.dtype} tensor of shape {list(t.shape)}"
    return 'None (missing)' if t is None else type(t).__name__


def _load_custom(spec: str, loader, root: Optional[Path]) -> Data:
    """Calls a user loader, checks its graph and normalises it (:func:`_finalize`)."""
    data = loader(root)
    check_graph(data, spec)
    domain = data.get('feature_domain')
    label = data.get('name') if isinstance(data.get('name'), str) else spec_label(spec)
    out = _finalize(data, label, None if domain is None else
                    (float(domain[0]), float(domain[1])))
    if data.get('num_classes') is not None:
        out.num_classes = int(data.num_classes)
    return out


def read_graph_files(root: PathLike, feature_domain: Optional[Tuple[float, float]] = None,
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
    if root.is_file() and root.suffix == '.pt':
        data = torch.load(root, weights_only=False)
        if feature_domain is not None and isinstance(data, Data):
            data.feature_domain = feature_domain
        return data
    need = ['edges.csv', 'features.csv', 'labels.csv']
    missing = [f for f in need if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"dataset 'files': {', '.join(str(root / f) for f in missing)} not found; "
            "data-root must be a .pt file (torch.save of a Data) or a folder with edges.csv "
            "(source,target per line), features.csv (one row per node), labels.csv (one "
            "class id per line) and optionally graph.toml (feature_domain = [low, high])")
    meta = {}
    if (root / 'graph.toml').is_file():
        import tomllib

        meta = tomllib.loads((root / 'graph.toml').read_text())
    edges = np.loadtxt(root / 'edges.csv', delimiter=',', comments='#', dtype=np.int64, ndmin=2)
    x = np.loadtxt(root / 'features.csv', delimiter=',', comments='#', dtype=np.float32, ndmin=2)
    y = np.loadtxt(root / 'labels.csv', delimiter=',', comments='#', dtype=np.int64, ndmin=1)
    domain = feature_domain if feature_domain is not None else meta.get('feature_domain')
    data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y),
                edge_index=torch.from_numpy(edges.reshape(-1, 2).T.copy()),
                feature_domain=None if domain is None else tuple(float(v) for v in domain),
                num_nodes=int(x.shape[0]))
    if isinstance(meta.get('name'), str):
        data.name = meta['name']
    return data


def _files(root: Optional[Path]) -> Data:
    """The ``files`` dataset: :func:`read_graph_files` on ``data-root``."""
    if root is None:
        raise ValueError("dataset 'files' reads the folder (or .pt file) named by data-root; "
                         "set data-root")
    return read_graph_files(root)


DATASETS.register('files', _files)
