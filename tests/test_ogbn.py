"""ogbn-products: the loader of OGB's raw layout, on a tiny fake release written in a tmp dir
(no download, no ``ogb`` package)."""

import gzip
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from fedgraph.data import KNOWN_DATASETS, apply_split, dataset_spec, load_dataset
from fedgraph.data import ogbn as ds
from fedgraph.utils.sparse import is_dst_coalesced

#: 7 nodes, 3 features, 3 classes; every edge stored once (as OGB does), one of them also
#: reversed and one self loop, which the loader must fold away
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (1, 4), (4, 1), (6, 6)]
FEATS = [[0.5 * i - 1.0, float(i) ** 2, -0.25 * i] for i in range(7)]
LABELS = [0, 1, 2, 0, 1, 2, 0]
SPLIT = {"train": [0, 1, 2], "valid": [3], "test": [4, 5, 6]}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache-ogbn"))
    monkeypatch.delenv("FEDGRAPH_DATA", raising=False)


def _write(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(",".join(str(v) for v in (r if isinstance(r, (list, tuple)) else [r])) + "\n")


def fake_release(folder: Path) -> Path:
    """OGB's products layout (as in products.zip, plus the files the loader does not read)."""
    _write(folder / "raw" / "edge.csv.gz", EDGES)
    _write(folder / "raw" / "node-feat.csv.gz", FEATS)
    _write(folder / "raw" / "node-label.csv.gz", LABELS)
    _write(folder / "raw" / "num-node-list.csv.gz", [len(FEATS)])
    _write(folder / "raw" / "num-edge-list.csv.gz", [len(EDGES)])
    for part, ids in SPLIT.items():
        _write(folder / "split" / "sales_ranking" / f"{part}.csv.gz", ids)
    (folder / "RELEASE_v1.txt").write_text("ogbn-products v1\n")
    return folder


@pytest.fixture
def root(tmp_path):
    fake_release(tmp_path / "ogbn_products")
    return tmp_path


def test_listed_and_spelled():
    assert "ogbn-products" in KNOWN_DATASETS
    assert dataset_spec("OGBN-Products") == "ogbn-products"


def test_shapes_labels_and_undirected_edges(root):
    data = load_dataset("ogbn-products", root)
    assert data.name == "ogbn-products" and data.get("feature_domain") is None
    assert data.x.dtype == torch.float32 and data.x.shape == (7, 3)
    assert torch.allclose(data.x, torch.tensor(FEATS))
    assert data.y.dtype == torch.long and data.y.tolist() == LABELS
    assert data.num_nodes == 7
    assert (
        data.is_undirected()
        and not data.has_self_loops()
        and is_dst_coalesced(data.edge_index, data.num_nodes)
    )  # finalize: by target, then source
    pairs = {tuple(e) for e in data.edge_index.T.tolist()}
    expect = {(a, b) for a, b in EDGES if a != b} | {(b, a) for a, b in EDGES if a != b}
    assert pairs == expect and data.edge_index.shape == (2, 14)


def test_official_split_in_masks_and_usual_splits(root):
    data = load_dataset("ogbn-products", root)
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert data[key].dtype == torch.bool
        assert data[key].nonzero().view(-1).tolist() == SPLIT[part]
        assert torch.equal(data["public_" + key], data[key])
    official = apply_split(data, "planetoid")  # the dataset's public split
    assert official.train_mask.nonzero().view(-1).tolist() == SPLIT["train"]
    rand = apply_split(data, "random-50-25-25", seed=0)
    total = rand.train_mask.long() + rand.val_mask.long() + rand.test_mask.long()
    assert bool((total == 1).all())


def test_root_resolution_and_cache(root, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA", str(root))
    first = load_dataset("ogbn-products")  # root from FEDGRAPH_DATA
    cache = root / "ogbn_products" / "processed" / "fedgraph.pt"
    assert cache.is_file()
    again = load_dataset("ogbn-products")  # from the cache
    assert torch.equal(again.edge_index, first.edge_index) and torch.equal(again.x, first.x)
    assert torch.equal(again.test_mask, first.test_mask) and again.get("feature_domain") is None
    # a changed source file invalidates the cache
    _write(root / "ogbn_products" / "raw" / "node-label.csv.gz", [2, 1, 0, 0, 1, 2, 0])
    os.utime(root / "ogbn_products" / "raw" / "node-label.csv.gz", ns=(1, 1))
    assert load_dataset("ogbn-products").y.tolist()[:3] == [2, 1, 0]
    # a damaged cache is rebuilt, not an error
    cache.write_bytes(b"not a torch file")
    assert load_dataset("ogbn-products").y.tolist()[:3] == [2, 1, 0]


def test_read_only_root_caches_in_the_user_cache(root):
    folder = root / "ogbn_products"
    modes = {}
    for p in [folder, *folder.rglob("*")]:
        modes[p] = p.stat().st_mode
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        data = load_dataset("ogbn-products", root)
        assert data.x.shape == (7, 3)
        assert not (folder / "processed").exists()
        copies = ds.user_cache_dir() / "processed-copies"
        assert list(copies.glob("*/ogbn_products/processed/fedgraph.pt"))
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_missing_files_offline_say_where_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("ogbn-products")
    msg = str(err.value)
    assert "'ogbn-products'" in msg and "FEDGRAPH_DATA" in msg and "download=True" in msg
    assert str(tmp_path / "ogbn_products" / "raw" / "edge.csv.gz") in msg
    assert ds.OGBN_PRODUCTS_URL in msg
    # one split file missing is enough to refuse, and it is named
    fake_release(tmp_path / "ogbn_products")
    (tmp_path / "ogbn_products" / "split" / "sales_ranking" / "valid.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="valid.csv.gz"):
        load_dataset("ogbn-products", tmp_path)


def test_bad_rows_are_a_clear_error(root):
    _write(root / "ogbn_products" / "raw" / "edge.csv.gz", [(0, 1), (1, 70)])
    with pytest.raises(ValueError, match=r"edge\.csv\.gz.*\[0, 7\)"):
        load_dataset("ogbn-products", root)


def test_download_unpacks_ogbs_zip(tmp_path, monkeypatch):
    """``download=True`` with PyG's download_url replaced by a local copy of a fake zip."""
    import torch_geometric.data as pyg_data

    staging = fake_release(tmp_path / "staging" / "products")
    zip_src = tmp_path / "products.zip"
    with zipfile.ZipFile(zip_src, "w") as z:
        for p in staging.rglob("*"):
            z.write(p, p.relative_to(staging.parent))
    fetched = []

    def fake_download(url, folder, log=True, filename=None):
        fetched.append(url)
        dst = Path(folder) / "products.zip"
        shutil.copyfile(zip_src, dst)
        return str(dst)

    monkeypatch.setattr(pyg_data, "download_url", fake_download)
    root = tmp_path / "root"
    data = load_dataset("ogbn-products", root, download=True)
    assert fetched == [ds.OGBN_PRODUCTS_URL] and data.x.shape == (7, 3)
    assert (root / "ogbn_products" / "RELEASE_v1.txt").is_file()
    assert not (root / "products.zip").exists() and not (root / "products").exists()
    load_dataset("ogbn-products", root)  # offline afterwards
