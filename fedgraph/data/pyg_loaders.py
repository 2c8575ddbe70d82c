"""The built-in datasets PyG reads: Planetoid (Cora, CiteSeer, PubMed; Cora bundled with the
package), MUSAE's Facebook page-page, LastFM Asia and Reddit, from their raw files under the
data root (layout: :mod:`fedgraph.data.datasets`), normalised by
:func:`~fedgraph.data.normal_form.finalize`.
"""

from __future__ import annotations

from pathlib import Path

from torch_geometric.data import Data

from ..dataset_files import PLANETOID_NAMES, PYG_RAW, planetoid_files
from .normal_form import finalize
from .paths import bundled_root
from .raw_folders import prepare_pyg_dir


def load_planetoid(key: str, root: Path, download: bool) -> Data:
    from torch_geometric.datasets import Planetoid

    pyg_name = PLANETOID_NAMES[key]
    rel = Path("planetoid") / pyg_name
    fallback = bundled_root() / rel if key == "cora" else None
    dataset_dir = prepare_pyg_dir(
        key, root / rel, rel, planetoid_files(key), download, fallback_dir=fallback
    )
    dataset = Planetoid(str(dataset_dir.parent), pyg_name)
    # Planetoid x is binary bag-of-words for Cora/CiteSeer; PubMed is TF-IDF.
    domain = (0.0, 1.0) if key in ("cora", "citeseer") else None
    return finalize(dataset[0], key, domain)


def load_facebook_pagepage(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import FacebookPagePage

    dataset_dir = _pyg_dir("facebook-pagepage", root, download)
    dataset = FacebookPagePage(str(dataset_dir))
    data = dataset[0]
    # The raw MUSAE release has 4,714 binary features; PyG's online copy has
    # a 128-dimensional real-valued embedding without a public range.
    domain = (0.0, 1.0) if data.x.size(1) == 4714 else None
    return finalize(data, "facebook-pagepage", domain)


def load_lastfm(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import LastFMAsia

    dataset_dir = _pyg_dir("lastfm-asia", root, download)
    return finalize(LastFMAsia(str(dataset_dir))[0], "lastfm-asia", None)


def load_reddit(root: Path, download: bool) -> Data:
    from torch_geometric.datasets import Reddit

    dataset_dir = _pyg_dir("reddit", root, download)
    return finalize(Reddit(str(dataset_dir))[0], "reddit", None)


def _pyg_dir(key: str, root: Path, download: bool) -> Path:
    """:func:`prepare_pyg_dir` for a dataset of :data:`fedgraph.dataset_files.PYG_RAW`."""
    rel, raw_files = PYG_RAW[key]
    return prepare_pyg_dir(key, root / rel, rel, raw_files, download)
