"""The partition cache (fedgraph.partition_cache): partition once, each client loads its part.

Tiny synthetic graphs (synthetic-sbm: generated, no files) and a cache folder per test."""

import os
import threading

import pytest
import torch

from fedgraph import federation
from fedgraph import partition_cache as pc
from fedgraph.config import parse_run_config

GAP = {
    "method": "gap",
    "dataset": "synthetic-sbm:300:6:1",
    "partitioner": "louvain",
    "num-clients": 4,
    "seed": 3,
}
PPGNN = {
    "method": "ppgnn",
    "dataset": "synthetic-sbm:300:6:1",
    "partitioner": "label-skew",
    "num-clients": 3,
    "budgets": "1,2,4",
    "level-shares": "0.2,0.3,0.5",
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(pc.ENV, str(tmp_path / "cache"))
    federation._client_views.cache_clear()
    yield tmp_path / "cache"
    federation._client_views.cache_clear()


def _levels(cfg):
    return (tuple(cfg.budgets), tuple(cfg.shares)) if cfg.method == "ppgnn" else (None, None)


def assert_same_view(a, b):
    ga, gb = a.graph, b.graph
    assert ga.client_id == gb.client_id
    for f in federation._GRAPH_FIELDS:
        ta, tb = getattr(ga, f), getattr(gb, f)
        assert (ta is None) == (tb is None), f
        if ta is not None:
            assert ta.dtype == tb.dtype and torch.equal(ta, tb), f
    assert a.feature_domain == b.feature_domain and type(a.feature_domain) is type(b.feature_domain)
    assert a.statistics == b.statistics and a.num_clients == b.num_clients
    assert (a.test_mask is None) == (b.test_mask is None)
    if a.test_mask is not None:
        assert torch.equal(a.test_mask, b.test_mask)


def _count_computes(monkeypatch):
    calls = []
    original = federation._compute_views

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(federation, "_compute_views", counted)
    return calls


@pytest.mark.parametrize("run", [GAP, PPGNN])
def test_a_hit_reads_only_its_part_and_equals_the_computed_views(run, cache, monkeypatch):
    cfg = parse_run_config(run)
    budgets, shares = _levels(cfg)
    expected = federation._compute_views(cfg, budgets, shares)
    calls = _count_computes(monkeypatch)
    first = federation._cached_views(cfg, 1, budgets, shares)  # miss: all computed, stored
    assert sorted(first) == list(range(cfg.num_clients)) and len(calls) == 1
    entries = [d for d in cache.iterdir() if (d / "manifest.json").exists()]
    assert len(entries) == 1
    assert sorted(p.name for p in entries[0].glob("part-*.pt")) == [
        f"part-{i}.pt" for i in range(cfg.num_clients)
    ]

    def no_load(cfg):  # a hit needs neither the graph (its files' stat is known) nor Louvain
        raise AssertionError("the graph was loaded on a hit")

    monkeypatch.setattr(federation, "load_graph", no_load)
    for pid in range(cfg.num_clients):
        hit = federation._cached_views(cfg, pid, budgets, shares)
        assert list(hit) == [pid]
        assert_same_view(hit[pid], expected[pid])
        assert_same_view(first[pid], expected[pid])
    assert len(calls) == 1
    assert federation.client_view(cfg, 2, budgets, shares) is federation.client_view(
        cfg, 2, budgets, shares
    )  # kept within the process


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 4},
        {"num-clients": 5},
        {"partitioner": "random"},
        {"split": "random-50-25-25"},
        {"dataset": "synthetic-sbm:300:6:2"},
    ],
)
def test_a_changed_setting_misses(change, cache, monkeypatch):
    cfg = parse_run_config(GAP)
    federation._cached_views(cfg, 0, None, None)
    calls = _count_computes(monkeypatch)
    other = parse_run_config({**GAP, **change})
    got = federation._cached_views(other, 0, None, None)
    assert len(calls) == 1
    assert_same_view(got[0], federation._compute_views(other, None, None)[0])
    assert len(calls) == 2  # (the reference itself)


def test_changed_graph_contents_miss(cache, monkeypatch):
    """A user loader (inputs unknown): the graph is hashed on every start, so one changed
    feature is a miss; the levels are part of the key too."""
    from fedgraph.data import register_dataset
    from fedgraph.data.datasets import DATASETS
    from fedgraph.data.synthetic import load_sbm

    graph = {"data": load_sbm("synthetic-sbm:200:5:0")}
    monkeypatch.setitem(DATASETS, "cache-test-graph", None)  # unregistered afterwards
    register_dataset("cache-test-graph", lambda root: graph["data"].clone(), replace=True)
    cfg = parse_run_config({**GAP, "dataset": "cache-test-graph", "partitioner": "random"})
    compute = federation._compute_views
    calls = _count_computes(monkeypatch)
    federation._cached_views(cfg, 0, None, None)
    federation._cached_views(cfg, 0, None, None)
    assert len(calls) == 1  # same contents: a hit
    changed = graph["data"].clone()
    changed.x[7, 0] += 1.0
    graph["data"] = changed
    view = federation._cached_views(cfg, 0, None, None)[0]
    assert len(calls) == 2
    assert_same_view(view, compute(cfg, None, None)[0])
    federation._cached_views(cfg, 0, (1.0, 2.0), (0.5, 0.5))
    assert len(calls) == 3


def test_a_rewritten_input_file_changes_the_source_key(tmp_path):
    """Built-in datasets: the graph is not loaded on a hit while its input files keep their
    size, mtime and inode; rewriting one changes the key (then the graph is hashed again)."""
    folder = tmp_path / "facebook100"
    folder.mkdir()
    mat = folder / "Tiny1.mat"
    mat.write_bytes(b"one")
    key = pc.source_key("facebook100:Tiny1", str(tmp_path), 1)
    assert key == pc.source_key("facebook100:Tiny1", str(tmp_path), 1)
    assert key != pc.source_key("facebook100:Tiny1", str(tmp_path), 2)
    os.utime(mat, ns=(1, 1))
    key_mtime = pc.source_key("facebook100:Tiny1", str(tmp_path), 1)
    assert key_mtime != key
    mat.write_bytes(b"two")
    os.utime(mat, ns=(1, 1))
    assert pc.source_key("facebook100:Tiny1", str(tmp_path), 1) == key_mtime  # same stat...
    (folder / "tmp").write_bytes(b"two")
    os.replace(folder / "tmp", mat)  # ... a replaced file has another inode
    os.utime(mat, ns=(1, 1))
    assert pc.source_key("facebook100:Tiny1", str(tmp_path), 1) != key_mtime
    assert pc.source_key("cache-test-unknown:loader", None, 1) is None


def test_concurrent_clients_compute_once_and_all_get_their_part(cache, monkeypatch):
    cfg = parse_run_config(GAP)
    expected = federation._compute_views(cfg, None, None)
    calls = _count_computes(monkeypatch)
    results, errors = {}, []

    def client(pid):
        try:
            results[pid] = federation._cached_views(cfg, pid, None, None)[pid]
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(pid,)) for pid in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(calls) == 1
    for pid in range(4):
        assert_same_view(results[pid], expected[pid])


def test_readers_never_see_a_partly_written_entry(cache):
    """Writers rewrite the entry (temporary file + os.replace) while readers read: a reader
    gets the whole part or nothing, never a torn one."""
    cfg = parse_run_config(GAP)
    views = federation._compute_views(cfg, None, None)
    payloads = [federation._view_payload(v) for v in views]
    entry = cache / "entry"
    stop, seen, bad = threading.Event(), [], []

    def writer():
        while not stop.is_set():
            pc.write_entry(entry, payloads)

    def reader():
        while not stop.is_set():
            p = pc.read_part(entry, 2)
            if p is not None:
                try:
                    assert_same_view(federation._view_from_payload(p), views[2])
                    seen.append(1)
                except AssertionError as err:
                    bad.append(err)

    threads = [
        threading.Thread(target=writer),
        threading.Thread(target=writer),
        threading.Thread(target=reader),
    ]
    for t in threads:
        t.start()
    threading.Event().wait(2.0)
    stop.set()
    for t in threads:
        t.join(30)
    assert not bad and seen
    assert not list(entry.glob(".*.tmp"))  # no temporary file left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_damaged_entry_is_recomputed(damage, cache, monkeypatch):
    cfg = parse_run_config(GAP)
    expected = federation._compute_views(cfg, None, None)
    federation._cached_views(cfg, 0, None, None)
    entry = next(d for d in cache.iterdir() if (d / "manifest.json").exists())
    part = entry / "part-1.pt"
    blob = part.read_bytes()
    if damage == "truncate":
        part.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":  # a bit in the tensor data: torch.load alone would not notice
        part.write_bytes(blob[:-200] + bytes([blob[-200] ^ 1]) + blob[-199:])
    elif damage == "delete":
        part.unlink()
    else:
        (entry / "manifest.json").write_text("{not json")
    calls = _count_computes(monkeypatch)
    got = federation._cached_views(cfg, 1, None, None)
    assert len(calls) == 1
    assert_same_view(got[1], expected[1])
    assert_same_view(federation._cached_views(cfg, 1, None, None)[1], expected[1])  # repaired
    assert len(calls) == 1


def test_a_users_partitioner_is_not_cached(cache, monkeypatch):
    from fedgraph.data import register_partitioner

    register_partitioner("cache-test-partitioner", replace=True)(
        lambda data, num_clients, seed, **_: torch.arange(data.num_nodes) % num_clients
    )
    cfg = parse_run_config({**GAP, "partitioner": "cache-test-partitioner"})
    calls = _count_computes(monkeypatch)
    federation._cached_views(cfg, 0, None, None)
    federation._cached_views(cfg, 0, None, None)
    assert len(calls) == 2 and not (cache.exists() and list(cache.glob("*/manifest.json")))


def test_off_computes_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv(pc.ENV, "off")
    cfg = parse_run_config(GAP)
    calls = _count_computes(monkeypatch)
    assert sorted(federation._cached_views(cfg, 0, None, None)) == [0, 1, 2, 3]
    assert len(calls) == 1 and pc.cache_dir() is None


def test_prune_keeps_the_most_recently_used(tmp_path):
    for i in range(5):
        (tmp_path / f"e{i}").mkdir()
        (tmp_path / f"e{i}" / "part-0.pt").write_bytes(b"x" * 100)
        (tmp_path / f"e{i}" / "manifest.json").write_text("{}")
        os.utime(tmp_path / f"e{i}" / "manifest.json", (100 + i, 100 + i))
        (tmp_path / f"e{i}.lock").write_text("")
    pc.prune(tmp_path, max_bytes=250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3", "e3.lock", "e4", "e4.lock"]
    pc.prune(tmp_path, max_bytes=0)  # the newest stays whatever its size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e4", "e4.lock"]


def test_the_code_digest_follows_the_source_not_the_path(monkeypatch, tmp_path):
    import inspect

    digest = pc.code_digest()
    copy = tmp_path / "splits.py"
    copy.write_text(inspect.getsource(__import__("fedgraph.data.splits", fromlist=["x"])))
    real = pc._source_file

    def moved(name):
        return copy if name == "fedgraph.data.splits" else real(name)

    monkeypatch.setattr(pc, "_source_file", moved)
    assert pc.code_digest() == digest  # another checkout of the same code
    copy.write_text(copy.read_text() + "\n# changed\n")
    assert pc.code_digest() != digest


def test_preflight_loads_the_dataset_once_on_a_miss_and_not_at_all_on_a_hit(
    cache, monkeypatch, tmp_path
):
    """A cold preflight loads the graph once (its check of the clients reuses it); a warm
    one, in a fresh process (no views in memory), reads the parts and loads nothing."""
    from fedgraph import data as fdata

    loads = []
    original = fdata.load_dataset

    def counted(*a, **k):
        loads.append(1)
        return original(*a, **k)

    monkeypatch.setattr(fdata, "load_dataset", counted)
    monkeypatch.setattr(federation, "load_dataset", counted, raising=False)
    from fedgraph.data import datasets

    monkeypatch.setattr(datasets, "load_dataset", counted)
    cfg = parse_run_config({**GAP, "output-dir": str(tmp_path / "out")})
    cold = federation.preflight(cfg)
    assert len(loads) == 1
    federation._client_views.cache_clear()  # as a new process
    warm = federation.preflight(cfg)
    assert len(loads) == 1 and warm == cold
    federation._client_views.cache_clear()
    with pytest.raises(federation.NotCached):  # another seed: not in the cache
        federation.client_view(parse_run_config({**GAP, "seed": 4}), 0, compute=False)
    assert len(loads) == 1


PRIVGNN = {
    "method": "privgnn",
    "dataset": "synthetic-sbm:400:6:1",
    "partitioner": "random",
    "num-clients": 3,
    "num-neighbours": 5,
    "num-queries": 8,
    "seed": 2,
}


def test_privgnn_preflight_loads_once_and_clients_read_their_part(cache, monkeypatch, tmp_path):
    """PrivGNN: the preflight loads the dataset once (its neighbour check and the cache fill
    share it) and writes every client's private part; a client process (memos cleared) then
    reads its part without loading the dataset, equal to the in-process split's."""
    from fedgraph import data as fdata
    from fedgraph.data import datasets
    from fedgraph.methods.privgnn import client_graph
    from fedgraph.methods.privgnn import graphs as pg

    loads = []
    original = datasets.load_dataset

    def counted(*a, **k):
        loads.append(1)
        return original(*a, **k)

    for module in (fdata, datasets):
        monkeypatch.setattr(module, "load_dataset", counted)
    pg._FEDERATIONS.clear()
    cfg = parse_run_config({**PRIVGNN, "output-dir": str(tmp_path / "out")})
    federation.preflight(cfg)
    assert len(loads) == 1
    assert len(list(cache.glob("*/part-*.pt"))) == cfg.num_clients
    expected = [client_graph(cfg, pid) for pid in range(cfg.num_clients)]  # the memo: no load
    assert len(loads) == 1
    federation._client_views.cache_clear()  # as a new process
    pg._FEDERATIONS.clear()
    for pid in range(cfg.num_clients):
        graph, stats = federation.privgnn_client_graph(cfg, pid)
        want, want_stats = expected[pid]
        assert stats == want_stats
        for field in ("node_ids", "x", "y", "train_mask", "edge_index", "boundary_edge_index"):
            assert torch.equal(getattr(graph, field), getattr(want, field)), field
    assert len(loads) == 1
    other = parse_run_config({**PRIVGNN, "public-fraction": 0.4})  # another split: a miss
    federation.privgnn_client_graph(other, 0)
    assert len(loads) == 2
    pg._FEDERATIONS.clear()
