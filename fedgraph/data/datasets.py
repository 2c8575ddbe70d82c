r"""Loading the graphs used by the project by name.

All loaders return a single :class:`torch_geometric.data.Data` object in one
normalised form:

* ``x``: ``float32`` tensor of shape ``[N, F]`` (features are never
  normalised here: Planetoid features stay binary, one-hot stays one-hot),
* ``y``: ``long`` tensor of shape ``[N]``,
* ``edge_index``: ``long`` tensor of shape ``[2, E]``, undirected (every edge
  stored in both directions), dst-coalesced (sorted by target, then source), without self loops,
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
not writable, the raw files are copied to the user cache first
(:mod:`fedgraph.data.raw_folders`).

Your own graph
--------------
A loader ``fn(root) -> Data`` (``root``: the run config's ``data-root`` as a
:class:`~pathlib.Path`, or ``None``) registered with :func:`register_dataset`,
or named by import path (``dataset = "mypkg.graphs:load"``), is loaded like the
built-in ones: its output is checked by :func:`~fedgraph.data.normal_form.check_graph` (a
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
through PyG's ``download_url``, see :func:`fedgraph.data.ogbn.load_ogbn_products`).
Cora is bundled with the package and is used when the root has no Cora raw files.

Where the code is
-----------------
This module looks datasets up by name (:func:`load_dataset`, :func:`dataset_spec`,
the :data:`DATASETS` registry). The loaders: :mod:`~fedgraph.data.pyg_loaders`
(Planetoid, page-page, LastFM, Reddit), :mod:`~fedgraph.data.ogbn`,
:mod:`~fedgraph.data.facebook100`, :mod:`~fedgraph.data.synthetic`,
:mod:`~fedgraph.data.user_graphs` (registered loaders, ``files``); the raw files'
folders: :mod:`~fedgraph.data.paths`, :mod:`~fedgraph.data.raw_folders`; the
normalised form and its check: :mod:`~fedgraph.data.normal_form`.
"""

from __future__ import annotations

import time
from pathlib import Path

from torch_geometric.data import Data

from ..catalog import KNOWN_DATASETS  # the built-in names (known without torch)
from ..registry import ContractError, Registry
from .facebook100 import find_facebook100, load_facebook100
from .ogbn import load_ogbn_products
from .paths import _PLANETOID_NAMES, resolve_root, user_cache_dir
from .pyg_loaders import load_facebook_pagepage, load_lastfm, load_planetoid, load_reddit
from .raw_folders import remove_empty_processed
from .synthetic import PREFIX as SBM_PREFIX
from .synthetic import load_sbm, sbm_spec
from .user_graphs import files_dataset, load_custom

PathLike = str | Path


def load_dataset(
    name: str, root: PathLike | None = None, *, min_class_size: int = 1000, download: bool = False
) -> Data:
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
        long (undirected, dst-coalesced: sorted by target then source, no self loops), ``feature_domain``
        (``(low, high)`` or ``None``) and ``name``.

    Raises:
        ValueError: on an unknown name (the message lists the known names).
        ContractError: a user loader's graph breaks :func:`~fedgraph.data.normal_form.check_graph`.
        FileNotFoundError: when the raw files are absent and ``download`` is
            :obj:`False` (the message names the paths looked for and
            ``FEDGRAPH_DATA``).
    """
    if not isinstance(name, str):
        raise TypeError(f"'name' must be a str (got {type(name).__name__})")
    key = name.strip().lower()
    base = resolve_root(root)

    if key.startswith("facebook100:"):
        college = name.strip().split(":", 1)[1].strip()
        if not college:
            raise ValueError("Expected 'facebook100:<College>', e.g. 'facebook100:Caltech36'")
        return load_facebook100(find_facebook100(college, base), min_class_size=min_class_size)
    if key.startswith(SBM_PREFIX):  # already normalised: no finalize copy of a large graph
        return load_sbm(key)
    loaders = {
        "facebook-pagepage": load_facebook_pagepage,
        "lastfm-asia": load_lastfm,
        "reddit": load_reddit,
        "ogbn-products": load_ogbn_products,
    }
    if key in _PLANETOID_NAMES or key in loaders:
        started = time.time()
        try:
            if key in _PLANETOID_NAMES:
                return load_planetoid(key, base, download)
            return loaders[key](base, download)
        except (FileNotFoundError, ValueError, TypeError):
            remove_empty_processed(base, started)
            raise
        except Exception as err:  # unreadable / truncated raw files
            remove_empty_processed(base, started)
            raise ValueError(
                f"could not read dataset '{name}' under {base}: {type(err).__name__}: {err}. "
                "A raw file is probably corrupt or truncated: replace it (and delete the "
                "'processed' folder next to 'raw')"
            ) from err
    spec = dataset_spec(name)
    return load_custom(
        spec, DATASETS.resolve(spec), None if root is None else Path(root).expanduser()
    )


# --------------------------------------------------------------------------
# The registry of user datasets and the names it knows
# --------------------------------------------------------------------------
def _check_loader(loader, name: str) -> None:
    """Registry check: ``loader(root)`` must be callable with one argument."""
    import inspect

    if not callable(loader):
        raise ContractError(
            f"dataset {name!r}: the loader must be a function "
            f"loader(root) -> Data, got {type(loader).__name__}"
        )
    try:
        inspect.signature(loader).bind(None)
    except TypeError:
        raise ContractError(
            f"dataset {name!r}: the loader must accept one argument, "
            f"loader(root) -> Data (root: data-root as a Path, or None)"
        ) from None
    except ValueError:  # builtins without a signature
        pass


#: Datasets registered by users: name -> ``loader(root) -> Data``.
DATASETS: Registry = Registry(
    "dataset",
    check=_check_loader,
    builtin=KNOWN_DATASETS,
    hint="See docs/extending.md, 'A dataset'.",
)


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

    The graph it returns must pass :func:`~fedgraph.data.normal_form.check_graph`; :func:`load_dataset`
    then normalises it like a built-in one.

    Raises:
        ValueError: ``name`` is a built-in dataset, or taken (pass ``replace=True``).
        ContractError: ``loader`` is not callable with one argument.
    """
    if name.strip().lower() in _builtin_names():
        raise ValueError(f"dataset {name!r} is built in; choose another name")
    return DATASETS.register(name, loader, replace=replace)


def _builtin_names() -> tuple[str, ...]:
    return tuple(k for k in KNOWN_DATASETS if ":" not in k)


def known_datasets() -> list[str]:
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
    if key.startswith("facebook100:"):
        return name
    if key.startswith(SBM_PREFIX):
        return sbm_spec(key)
    if name not in DATASETS and key in DATASETS:
        name = key
    return DATASETS.check_name(name)


DATASETS.register("files", files_dataset)
