"""Issue 31: the memory-relevant properties of PPGNN's server path (bounded, copy-free edge
handling), each against the straightforward implementation it replaced."""

import pytest
import torch
from torch_geometric.utils import add_remaining_self_loops, scatter, to_torch_csr_tensor

from fedgraph.nn import adjacency_for, weighted_propagation
from fedgraph.utils.sparse import dst_csr, is_dst_coalesced, unique_edges


def _edges(n=60, e=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g)  # duplicates and self loops included


def _reference_propagation(x, edge_index, steps, w, self_loops):
    """The pre-issue-31 implementation: per-edge coefficients in a coalesced COO -> CSR Pi."""
    n = x.size(0)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    if self_loops:
        edge_index, _ = add_remaining_self_loops(edge_index, num_nodes=n)
    else:
        lonely = torch.ones(n, dtype=torch.bool)
        lonely[edge_index[1]] = False
        ids = lonely.nonzero().view(-1)
        edge_index = torch.cat([edge_index, torch.stack([ids, ids])], dim=1)
    src, dst = edge_index
    ww = torch.ones(src.numel(), dtype=x.dtype) if w is None else w.to(x.dtype)[src]
    norm = scatter(ww, dst, dim=0, dim_size=n, reduce="sum")
    pi = torch.sparse_coo_tensor(torch.stack([dst, src]), ww / norm[dst], (n, n)).coalesce()
    h = x
    for _ in range(steps):
        h = pi @ h
    return h


def test_unique_edges_is_torch_unique_in_dst_order_and_reads_int32_parts():
    n = 60
    a, b = _edges(n, 400, 1), _edges(n, 300, 2)
    got = unique_edges([a.int(), b], n)
    want = torch.unique(torch.cat([a, b], 1), dim=1)
    assert got.dtype == torch.long and is_dst_coalesced(got, n)
    assert got.size(1) == want.size(1)
    assert set(map(tuple, got.t().tolist())) == set(map(tuple, want.t().tolist()))
    # chunked decoding (tiny chunks) gives the same edges
    assert torch.equal(unique_edges([a.int(), b], n, chunk=7), got)


@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("weights", [False, True])
def test_propagation_equals_the_coefficient_matrix_version(self_loops, weights):
    n = 60
    ei = _edges(n)  # unsorted, with duplicates and self loops; some nodes have no in-edge
    ei = ei[:, ei[1] % 7 != 3]
    x = torch.randn(n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    w = torch.rand(n, dtype=torch.float64) + 0.5 if weights else None
    want = _reference_propagation(x, ei, 4, w, self_loops)
    assert torch.allclose(weighted_propagation(x, ei, 4, w, self_loops), want)
    # the server's dst-coalesced edges (no duplicates) give the reference's result too
    uniq = unique_edges([ei], n)
    assert torch.allclose(
        weighted_propagation(x, uniq, 4, w, self_loops),
        _reference_propagation(x, uniq, 4, w, self_loops),
    )
    # float32 stays float32 (no float64 copies of the features)
    assert weighted_propagation(x.float(), uniq, 2, w, self_loops).dtype == torch.float32


def test_csr_of_dst_coalesced_edges_shares_the_edge_list():
    n = 60
    ei = unique_edges([_edges(n)], n)
    adj = dst_csr(ei, n)
    assert adj.col_indices().data_ptr() == ei[0].data_ptr()  # a view, not a copy
    assert adj.values().dtype == torch.float32
    sage = adjacency_for("sage", ei, n)
    assert sage.col_indices().data_ptr() == ei[0].data_ptr()
    pyg = to_torch_csr_tensor(ei.flip(0), size=(n, n))
    assert torch.equal(sage.to_dense(), pyg.to_dense())
    assert torch.equal(sage.crow_indices(), pyg.crow_indices())
    # an unsorted edge list still gets PyG's coalesced matrix
    raw = _edges(n)
    assert torch.equal(
        adjacency_for("sage", raw, n).to_dense(),
        to_torch_csr_tensor(raw.flip(0), size=(n, n)).to_dense(),
    )


def test_client_report_edges_are_int32_and_the_server_edges_int64():
    from fedgraph.config import parse_run_config
    from fedgraph.federation import load_federated
    from fedgraph.methods import ppgnn

    cfg = parse_run_config(
        {
            "dataset": "synthetic-sbm:300:4",
            "num-clients": 3,
            "seed": 0,
            "budgets": "1,2,4",
            "mechanism": "ppm",
        }
    )
    data, clients = load_federated(cfg, cfg.budgets, cfg.shares)
    c = int(data.y.max()) + 1
    reps = [
        ppgnn.client_report(k, cfg, data.feature_domain, c, torch.Generator().manual_seed(0))
        for k in clients
    ]
    for k, rep in zip(clients, reps):
        old = torch.cat(
            [
                k.node_ids[k.edge_index],
                torch.stack([k.node_ids[k.boundary_edge_index[0]], k.boundary_edge_index[1]]),
            ],
            dim=1,
        )
        assert rep["edge_index"].dtype == torch.int32
        assert torch.equal(rep["edge_index"].long(), old)
    *_, edge_index = ppgnn.assemble(
        reps, ppgnn.build_mechanism(cfg), data.num_nodes, data.num_features
    )
    want = torch.unique(torch.cat([r["edge_index"].long() for r in reps], 1), dim=1)
    assert edge_index.dtype == torch.long and is_dst_coalesced(edge_index, data.num_nodes)
    assert set(map(tuple, edge_index.t().tolist())) == set(map(tuple, want.t().tolist()))
