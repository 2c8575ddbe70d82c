"""The GNN backbones: fedgraph's GraphSAGE (projection before aggregation) is PyG's GraphSAGE."""

import pytest
import torch
from torch_geometric.nn.models import GraphSAGE
from torch_geometric.utils import erdos_renyi_graph

from fedgraph.nn.models import adjacency_for, make_backbone


@pytest.mark.parametrize("graph_form", ["edge_index", "csr"])
def test_sage_projecting_first_is_pyg_graphsage(graph_form):
    """Same parameters from the same seed, same logits and gradients (float rounding), on
    wide inputs (where it projects first) and on a graph with an isolated node."""
    n, d = 300, 120
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    ei = erdos_renyi_graph(n, 0.02)
    ei = ei[:, (ei[0] != 7) & (ei[1] != 7)]  # node 7 has no neighbours
    graph = ei if graph_form == "edge_index" else adjacency_for("sage", ei, n)
    torch.manual_seed(0)
    ours = make_backbone("sage", d, 5, 16, 2, 0.0)
    torch.manual_seed(0)
    pyg = GraphSAGE(
        in_channels=d, hidden_channels=16, num_layers=2, out_channels=5, dropout=0.0, act="selu"
    )
    assert ours.state_dict().keys() == pyg.state_dict().keys()
    assert all(torch.equal(v, pyg.state_dict()[k]) for k, v in ours.state_dict().items())
    a, b = ours(x, graph), pyg(x, graph)
    assert torch.allclose(a, b, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), pyg.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), name
    # the first layer projects first (16 < 120); a perturbed weight changes the output
    with torch.no_grad():
        ours.convs[0].lin_l.weight[0, 0] += 1.0
    assert not torch.allclose(ours(x, graph), b, atol=1e-5)
