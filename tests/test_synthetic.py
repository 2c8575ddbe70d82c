"""The seeded sparse SBM dataset ``synthetic-sbm:<nodes>:<avg_degree>[:<seed>]``."""

import pytest
import torch
from torch_geometric.utils import coalesce, is_undirected

from fedgraph.data import check_graph, dataset_spec, dataset_statistics, load_dataset
from fedgraph.data.synthetic import SBM_HOMOPHILY, homophily_of, parse_sbm_name, sbm_graph


def test_same_seed_same_graph_other_seed_other_graph():
    a, b = load_dataset("synthetic-sbm:3000:12"), load_dataset("synthetic-sbm:3000:12:0")
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    assert torch.equal(a.y, b.y)
    c = load_dataset("synthetic-sbm:3000:12:1")
    assert not torch.equal(a.edge_index, c.edge_index)
    assert not torch.equal(a.y, c.y)


@pytest.mark.parametrize("nodes,degree", [(2000, 10), (20000, 50), (500, 3)])
def test_degree_homophily_and_simple_graph(nodes, degree):
    d = load_dataset(f"synthetic-sbm:{nodes}:{degree}")
    s = dataset_statistics(d)
    # Exactly round(N * d / 2) undirected edges: every one stored in both directions.
    assert s["num_edges"] == 2 * round(nodes * degree / 2)
    assert abs(s["avg_degree"] - degree) < 1e-9
    ei = d.edge_index
    assert bool((ei[0] != ei[1]).all())  # no self loops
    assert torch.equal(coalesce(ei, num_nodes=nodes, sort_by_row=False), ei)  # by target, unique
    assert is_undirected(ei, num_nodes=nodes)
    assert abs(homophily_of(ei, d.y) - SBM_HOMOPHILY) < 0.03
    assert s["num_classes"] == 5 and max(s["class_counts"]) - min(s["class_counts"]) <= 1
    check_graph(d, "sbm")  # the loader contract, feature_domain included


def test_features_binary_and_class_dependent():
    d = load_dataset("synthetic-sbm:5000:8")
    assert d.feature_domain == (0.0, 1.0)
    assert set(d.x.unique().tolist()) <= {0.0, 1.0}
    means = torch.stack([d.x[d.y == c].mean(0) for c in range(5)])  # [C, F]
    block = torch.arange(32) * 5 // 32  # feature f belongs to class block f * C // F
    own = means[block, torch.arange(32)]  # P(x_f = 1) in the class owning f
    other = means[(block + 1) % 5, torch.arange(32)]
    assert bool((own > 0.4).all()) and bool((other < 0.2).all())


def test_memory_is_sparse():
    # 200k nodes: a dense N x N float matrix would be 160 GB; the SBM takes a few seconds.
    d = sbm_graph(200_000, 4, seed=3)
    assert d.edge_index.shape == (2, 800_000)


@pytest.mark.parametrize(
    "bad",
    [
        "synthetic-sbm:100",
        "synthetic-sbm:abc:4",
        "synthetic-sbm:5:2",
        "synthetic-sbm:100:0",
        "synthetic-sbm:100:200",
        "synthetic-sbm:100:4:-1",
    ],
)
def test_bad_names(bad):
    with pytest.raises(ValueError, match=r"synthetic-sbm:<nodes>:<avg_degree>"):
        parse_sbm_name(bad)
    with pytest.raises(ValueError):
        dataset_spec(bad)


def test_spec_is_canonical():
    assert dataset_spec("Synthetic-SBM:2_000:10.0") == "synthetic-sbm:2000:10:0"


def test_classes_independent_of_a_split_with_the_same_seed():
    from fedgraph.data import apply_split

    d = apply_split(load_dataset("synthetic-sbm:2000:10"), "random-75-10-15", 0)
    for mask in (d.train_mask, d.val_mask, d.test_mask):
        counts = torch.bincount(d.y[mask], minlength=5).double()
        assert bool((counts / counts.sum() > 0.1).all()), counts  # every class in every part
