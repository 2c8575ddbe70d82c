import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from fedgraph.data import (
    KNOWN_DATASETS,
    PARTITIONERS,
    ClientGraph,
    apply_split,
    assign_privacy_levels,
    dataset_statistics,
    gap_split,
    geometric_budgets,
    level_budgets,
    load_dataset,
    partition,
    planetoid_split,
    ppgnn_split,
    random_split,
    register_partitioner,
)
from fedgraph.utils.sparse import is_dst_coalesced


def _shared_data() -> Path:
    env = os.environ.get("FEDGRAPH_TEST_DATA")
    return Path(env) if env else Path(__file__).parents[2] / "shared" / "data"


SHARED = _shared_data()
needs_shared = pytest.mark.skipif(
    not (SHARED / "planetoid").is_dir(), reason=f"{SHARED} not available"
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # One cache per test session, never the user's ~/.cache; no env leakage.
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("FEDGRAPH_DATA", raising=False)


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")  # bundled copy


def _check_format(data: Data):
    n = data.num_nodes
    assert data.x.dtype == torch.float32 and data.x.size(0) == n
    assert data.y.dtype == torch.long and data.y.shape == (n,)
    assert data.edge_index.dtype == torch.long
    assert data.is_undirected() and not data.has_self_loops()
    assert is_dst_coalesced(data.edge_index, data.num_nodes)  # by target, then source
    assert data.feature_domain == (0.0, 1.0)
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0


# ---------------------------------------------------------------- datasets
def test_cora_bundled(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path))  # empty root
    data = load_dataset("CORA")
    _check_format(data)
    assert data.name == "cora"
    stats = dataset_statistics(data)
    assert stats["num_nodes"] == 2708 and stats["num_edges"] == 10556
    assert stats["num_features"] == 1433 and stats["num_classes"] == 7
    assert sum(stats["class_counts"]) == 2708
    assert stats["avg_degree"] == pytest.approx(10556 / 2708)
    assert int(data.train_mask.sum()) == 140
    assert not any(tmp_path.iterdir())  # nothing written to the root


@needs_shared
def test_citeseer_read_only_root():
    root = SHARED / "planetoid" / "CiteSeer"
    before = sorted(p.name for p in root.iterdir())
    data = load_dataset("citeseer", root=SHARED)
    _check_format(data)
    assert (data.num_nodes, data.num_features) == (3327, 3703)
    assert dataset_statistics(data)["num_classes"] == 6
    assert data.edge_index.size(1) == 9104
    assert sorted(p.name for p in root.iterdir()) == before  # no processed/


def test_copy_when_not_writable(tmp_path, monkeypatch):
    src = Path(__file__).parents[1] / "fedgraph" / "data" / "_bundled"
    root = tmp_path / "root"
    shutil.copytree(src, root)
    ds_dir = root / "planetoid" / "Cora"
    ds_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        data = load_dataset("cora", root=root)
    finally:
        ds_dir.chmod(stat.S_IRWXU)
    assert data.num_nodes == 2708
    assert not (ds_dir / "processed").exists()
    # A writable root is used in place.
    load_dataset("cora", root=root)
    assert (ds_dir / "processed").is_dir()


@needs_shared
def test_facebook_pagepage():
    data = load_dataset("facebook-pagepage", root=SHARED)
    _check_format(data)
    assert data.num_nodes == 22470 and data.num_features == 4714
    assert dataset_statistics(data)["num_classes"] == 4


@needs_shared
def test_facebook100_caltech(monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA", str(SHARED))
    data = load_dataset("facebook100:caltech36", min_class_size=50)
    _check_format(data)
    assert data.name == "facebook100:Caltech36"
    stats = dataset_statistics(data)
    assert min(stats["class_counts"]) >= 50
    assert stats["num_classes"] == data.class_years.numel()
    assert torch.all(data.class_years[1:] > data.class_years[:-1])
    # One-hot: at most one 1 per attribute block, so at most 5 ones per row (GAP's reference
    # columns: status, gender, major, second major, dorm; no high school).
    assert int(data.x.sum(1).max()) <= 5
    assert data.num_nodes < 769
    with pytest.raises(ValueError, match="min_class_size"):
        load_dataset("facebook100:Caltech36", min_class_size=10**6)


@needs_shared
def test_facebook100_features_are_the_gap_reference_codes_unless_asked():
    from fedgraph.data import FACEBOOK100_FEATURES, load_facebook100

    path = SHARED / "facebook100" / "Caltech36.mat"
    import scipy.io

    info = scipy.io.loadmat(str(path))["local_info"]
    default = load_facebook100(path, min_class_size=50)
    wide = load_facebook100(
        path, min_class_size=50, features=FACEBOOK100_FEATURES + ("high_school",)
    )
    kept = info[default.original_ids.numpy()]
    # one column per category present among the kept nodes, 0 (missing) excluded
    n_cat = lambda col: len(set(kept[:, col].tolist()) - {0})  # noqa: E731
    assert default.num_features == sum(n_cat(c) for c in (0, 1, 2, 3, 4))
    assert wide.num_features == default.num_features + n_cat(6)
    assert torch.equal(wide.x[:, : default.num_features], default.x)
    assert torch.equal(wide.y, default.y) and torch.equal(wide.edge_index, default.edge_index)
    assert load_facebook100(path, min_class_size=50, features="major").num_features == n_cat(2)
    for bad in (("year",), ("hometown",), ()):
        with pytest.raises(ValueError, match="'features'.*allowed: status, gender"):
            load_facebook100(path, min_class_size=50, features=bad)


def test_unknown_name():
    with pytest.raises(ValueError) as exc:
        load_dataset("imaginary")
    for name in KNOWN_DATASETS:
        assert name in str(exc.value)
    assert "facebook100:<College>" in str(exc.value)


def test_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as exc:
        load_dataset("citeseer")
    msg = str(exc.value)
    assert str(tmp_path / "planetoid" / "CiteSeer" / "raw") in msg
    assert "FEDGRAPH_DATA" in msg
    with pytest.raises(FileNotFoundError, match="FEDGRAPH_DATA"):
        load_dataset("facebook100:Nowhere12")
    with pytest.raises(FileNotFoundError, match="facebook.npz"):
        load_dataset("facebook-pagepage")


# ------------------------------------------------------------------ splits
def test_random_split(cora):
    out = random_split(cora, 0.5, 0.25, 0.25, seed=1)
    masks = torch.stack([out.train_mask, out.val_mask, out.test_mask])
    assert torch.all(masks.sum(0) == 1)  # disjoint and covering
    assert int(out.train_mask.sum()) == 1354
    again = ppgnn_split(cora, seed=1)
    assert torch.equal(again.train_mask, out.train_mask)
    other = ppgnn_split(cora, seed=2)
    assert not torch.equal(other.train_mask, out.train_mask)
    part = random_split(cora, 0.1, 0.1, 0.1, seed=0)
    assert int((part.train_mask | part.val_mask | part.test_mask).sum()) == 813
    gap = gap_split(cora, seed=0)
    assert int(gap.val_mask.sum()) == round(0.1 * 2708)
    assert torch.equal(apply_split(cora, "random-75-10-15", 0).test_mask, gap.test_mask)


def test_split_errors_and_planetoid(cora):
    with pytest.raises(ValueError, match="'val'"):
        random_split(cora, 0.5, 0.0, 0.5, seed=0)
    with pytest.raises(ValueError, match="'train'"):
        random_split(cora, 1.5, 0.1, 0.1, seed=0)
    with pytest.raises(ValueError, match="<= 1"):
        random_split(cora, 0.6, 0.3, 0.3, seed=0)
    with pytest.raises(ValueError, match="random-50-25-25"):
        apply_split(cora, "nope", 0)
    shuffled = ppgnn_split(cora, 0)
    pub = planetoid_split(shuffled)
    assert int(pub.train_mask.sum()) == 140
    assert int(pub.val_mask.sum()) == 500 and int(pub.test_mask.sum()) == 1000
    assert torch.equal(apply_split(cora, "planetoid", 0).test_mask, pub.test_mask)
    plain = Data(x=cora.x, y=cora.y, edge_index=cora.edge_index)
    with pytest.raises(ValueError, match="Planetoid"):
        planetoid_split(plain)


# --------------------------------------------------------------- partition
def _check_partition(data: Data, clients, num_clients):
    assert len(clients) == num_clients
    assert [c.client_id for c in clients] == list(range(num_clients))
    assert all(isinstance(c, ClientGraph) and c.num_nodes > 0 for c in clients)
    ids = torch.cat([c.node_ids for c in clients])
    assert torch.equal(ids.sort().values, torch.arange(data.num_nodes))
    edges = []
    for c in clients:
        assert torch.all(c.node_ids[1:] > c.node_ids[:-1])
        assert torch.equal(c.x, data.x[c.node_ids])
        assert torch.equal(c.y, data.y[c.node_ids])
        assert c.train_mask is not None and c.train_mask.numel() == c.num_nodes
        if c.edge_index.numel():
            assert int(c.edge_index.max()) < c.num_nodes
        b = c.boundary_edge_index
        if b.numel():
            assert not torch.any(torch.isin(b[1], c.node_ids))
        edges.append(c.node_ids[c.edge_index])
        edges.append(torch.stack([c.node_ids[b[0]], b[1]]))
    rebuilt = torch.cat(edges, dim=1)
    n = data.num_nodes
    key = lambda e: (e[0] * n + e[1]).sort().values  # noqa: E731
    assert torch.equal(key(rebuilt), key(data.edge_index))


@pytest.mark.parametrize("method", ["random", "louvain", "label-skew", "users"])
def test_partitioners(cora, method):
    k = 10
    a = partition(cora, k, method, seed=0)
    _check_partition(cora, a, k)
    b = partition(cora, k, method, seed=0)
    assert all(torch.equal(x.node_ids, y.node_ids) for x, y in zip(a, b))
    if method != "louvain":
        c = partition(cora, k, method, seed=1)
        assert not all(torch.equal(x.node_ids, y.node_ids) for x, y in zip(a, c))


@pytest.mark.parametrize("method", ["random", "users"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_random_partitions_are_independent_of_the_split_of_the_same_seed(cora, method, seed):
    """The run config's one ``seed`` seeds the split and the partition: a partitioner that drew
    the split's own permutation gave the first clients only training nodes and the last only
    test nodes (``users`` did, before). Every client holds about the split's shares."""
    from fedgraph.data import apply_split

    data = apply_split(cora, "random-50-25-25", seed)
    for client in partition(data, 10, method, seed=seed):
        train = float(data.train_mask[client.node_ids].float().mean())
        test = float(data.test_mask[client.node_ids].float().mean())
        assert 0.38 < train < 0.62 and 0.14 < test < 0.36, (client.client_id, train, test)


@pytest.mark.parametrize("k", [3, 20])
def test_client_edges_by_masks_equal_client_edges_by_sort(cora, k, monkeypatch):
    """build_client_graphs finds each client's edges by a mask per client (few clients) or by
    one stable sort by owner (many): the same parts, edge for edge, either way."""
    import importlib

    part_module = importlib.import_module("fedgraph.data.partition")  # the module, not the function
    assign = part_module.random_partition(cora, k, seed=1)
    monkeypatch.setattr(part_module, "MASK_CLIENTS", 10**6)
    by_mask = part_module.build_client_graphs(cora, assign, k)
    monkeypatch.setattr(part_module, "MASK_CLIENTS", 0)
    by_sort = part_module.build_client_graphs(cora, assign, k)
    _check_partition(cora, by_mask, k)
    for a, b in zip(by_mask, by_sort):
        for field in ("node_ids", "edge_index", "boundary_edge_index"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype == torch.long and torch.equal(x, y), field


@pytest.mark.parametrize("name", ["cora", "synthetic-sbm:3000:12"])
@pytest.mark.parametrize("method", ["random", "louvain", "label-skew"])
@pytest.mark.parametrize("k", [4, 20])
def test_loaded_graphs_and_their_parts_are_sorted_by_target(cora, name, method, k):
    """Every loaded graph is dst-coalesced (unique edges sorted by target, then source) and a
    client's local and boundary edges keep that order (both paths of build_client_graphs), so
    PMA's sums over them take the sparse-matmul path of sum_over_edges."""
    from fedgraph.data import apply_split
    from fedgraph.utils.sparse import is_dst_coalesced, is_sorted

    data = cora if name == "cora" else load_dataset(name)
    assert is_dst_coalesced(data.edge_index, data.num_nodes)
    data = apply_split(data, "random-50-25-25", 0)
    clients = partition(data, k, method, seed=0)
    _check_partition(data, clients, k)
    for c in clients:
        assert is_dst_coalesced(c.edge_index, c.num_nodes), c.client_id
        assert is_sorted(c.boundary_edge_index[1]), c.client_id


def test_partition_edge_cases(cora):
    sizes = [c.num_nodes for c in partition(cora, 7, "users", seed=0)]
    assert max(sizes) - min(sizes) <= 1
    clients = partition(cora, 1, "users", seed=0, users_per_client=100)
    assert len(clients) == 27 and min(c.num_nodes for c in clients) >= 100
    # Strong skew with many clients forces the empty-client repair.
    skew = partition(cora, 200, "label-skew", seed=0, alpha=0.01)
    _check_partition(cora, skew, 200)
    many = partition(cora, 1000, "louvain", seed=0)  # > #communities
    assert min(c.num_nodes for c in many) >= 1
    for bad in (0, cora.num_nodes + 1):
        with pytest.raises(ValueError, match="num_clients"):
            partition(cora, bad, "random", seed=0)
    with pytest.raises(ValueError, match="louvain"):
        partition(cora, 2, "metis", seed=0)


def test_partition_levels_and_register():
    data = Data(
        x=torch.randn(6, 2),
        y=torch.tensor([0, 1, 0, 1, 0, 1]),
        edge_index=torch.tensor([[0, 1, 1, 2, 4, 5], [1, 0, 2, 1, 5, 4]]),
    )
    data.levels = torch.tensor([1, 2, 3, 1, 2, 3])

    @register_partitioner("halves")
    def halves(data, num_clients, seed, **options):
        return (torch.arange(data.num_nodes) >= 3).long()

    try:
        clients = partition(data, 2, "halves", seed=0)
    finally:
        PARTITIONERS.pop("halves")
    assert torch.equal(clients[0].levels, torch.tensor([1, 2, 3]))
    assert clients[0].train_mask is None
    assert clients[0].edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    assert clients[1].boundary_edge_index.numel() == 0
    assert clients[1].edge_index.tolist() == [[1, 2], [2, 1]]


# ------------------------------------------------------------------ levels
def test_levels():
    budgets = geometric_budgets(0.5, 3)
    assert budgets == [0.5, 1.0, 2.0]
    lv = assign_privacy_levels(10, budgets, [0.25, 0.25, 0.5], seed=3)
    assert lv.dtype == torch.long and lv.shape == (10,)
    # exact 2.5 / 2.5 / 5 -> largest remainder, lower level on ties
    assert torch.bincount(lv, minlength=4).tolist() == [0, 3, 2, 5]
    assert torch.equal(lv, assign_privacy_levels(10, budgets, [0.25, 0.25, 0.5], seed=3))
    uni = assign_privacy_levels(1000, budgets, seed=0)
    assert torch.bincount(uni).tolist() == [0, 334, 333, 333]
    assert not torch.equal(uni, assign_privacy_levels(1000, budgets, seed=1))
    assert level_budgets(torch.tensor([1, 3]), budgets).tolist() == [0.5, 2.0]
    assert assign_privacy_levels(0, budgets).numel() == 0


def test_level_errors():
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        assign_privacy_levels(5, [0.0, 1.0])
    with pytest.raises(ValueError, match="budgets"):
        assign_privacy_levels(5, [2.0, 1.0])
    with pytest.raises(ValueError, match="budgets"):
        assign_privacy_levels(5, [1.0, float("inf")])
    with pytest.raises(ValueError, match="probabilities"):
        assign_privacy_levels(5, [1.0, 2.0], [0.5, 0.6])
    with pytest.raises(ValueError, match="probabilities"):
        assign_privacy_levels(5, [1.0, 2.0], [1.5, -0.5])
    with pytest.raises(ValueError, match="probabilities"):
        assign_privacy_levels(5, [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        geometric_budgets(-1.0, 3)
    with pytest.raises(ValueError, match="num_levels"):
        geometric_budgets(1.0, 0)


def test_truncated_raw_file_fails_clearly_and_leaves_no_empty_processed_folder(
    tmp_path, monkeypatch
):
    """Issue 17, item 5: a truncated data file used to leave an empty ``processed/`` behind."""
    import shutil
    from pathlib import Path

    import fedgraph.data.datasets as datasets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bundled = Path(datasets.__file__).parent / "_bundled" / "planetoid" / "Cora" / "raw"
    root = tmp_path / "data"
    raw = root / "planetoid" / "Cora" / "raw"
    shutil.copytree(bundled, raw)
    graph = raw / "ind.cora.graph"
    graph.write_bytes(graph.read_bytes()[:100])  # truncated
    with pytest.raises(ValueError, match="corrupt or truncated"):
        datasets.load_dataset("cora", root)
    leftovers = [
        p
        for base in (root, tmp_path / "cache")
        for p in base.rglob("processed")
        if p.is_dir() and not any(p.iterdir())
    ]
    assert not leftovers, leftovers
