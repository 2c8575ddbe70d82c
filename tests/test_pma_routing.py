"""The server's routing of federated PMA (route_partial_sums) gives each client exactly the
rows, in the order, that the per-client loop it replaced gave."""
import pytest
import torch

from fedgraph.methods.gap.server import route_partial_sums


def loop_routing(released, owner, num_clients, dim):
    """The strategy's routing before vectorization (strategies/gap.py, GAPStrategy._pma)."""
    routed = [([], []) for _ in range(num_clients)]
    for ids, sums in released:
        dst_owner = owner[ids]
        for i in range(num_clients):
            sel = dst_owner == i
            if bool(sel.any()):
                routed[i][0].append(ids[sel])
                routed[i][1].append(sums[sel])
    return [(torch.cat(a), torch.cat(b)) if a else
            (torch.zeros(0, dtype=torch.long), torch.zeros(0, dim)) for a, b in routed]


@pytest.mark.parametrize("num_nodes,num_clients,seed", [(50, 3, 0), (500, 7, 1), (40, 6, 2)])
def test_routing_equals_the_per_client_loop(num_nodes, num_clients, seed):
    g = torch.Generator().manual_seed(seed)
    dim = 5
    owner = torch.randint(0, num_clients, (num_nodes,), generator=g)
    owner[:3] = -1  # rows of an unowned node are dropped by both
    released = []
    for c in range(num_clients):
        others = (owner != c).nonzero().flatten()
        ids = others[torch.rand(others.numel(), generator=g) < 0.7]
        if c == 1:
            ids = ids[:0]  # a client with no remote row
        released.append((ids, torch.randn(ids.numel(), dim, generator=g)))
    # one client gets no row at all
    released = [(i[owner[i] != num_clients - 1], s[owner[i] != num_clients - 1])
                for i, s in released]
    got = route_partial_sums(released, owner, num_clients)
    want = loop_routing(released, owner, num_clients, dim)
    assert len(got) == num_clients
    for (gi, gs), (wi, ws) in zip(got, want):
        assert gi.dtype == wi.dtype and gs.dtype == ws.dtype
        assert gi.shape == wi.shape and gs.shape == ws.shape
        assert torch.equal(gi, wi) and torch.equal(gs, ws)  # same rows, same order
    assert got[-1][0].numel() == 0 and got[-1][1].shape == (0, dim)
    for i, (ids, _) in enumerate(got):
        assert bool((owner[ids] == i).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_positions_equal_searchsorted(seed):
    """The inverse-table lookup that replaced searchsorted in pma_partial_sums/pma_finish gives
    the same positions, and -1 for ids that are not there (both callers then raise)."""
    from fedgraph.methods.gap.client_pma import _positions

    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(1000, generator=g)[:300].sort().values
    query = ids[torch.randint(0, 300, (5000,), generator=g)]
    assert torch.equal(_positions(ids, query), torch.searchsorted(ids, query))
    missing = torch.tensor([int(ids.max()) + 5, *[i for i in range(1000) if i not in set(ids.tolist())][:3]])
    assert bool((_positions(ids, missing) == -1).all())
    assert _positions(ids, query[:0]).numel() == 0


def test_partial_sums_and_finish_refuse_unknown_ids():
    from fedgraph.methods.gap.client_pma import pma_finish, pma_partial_sums

    h = torch.randn(3, 4)
    local = torch.tensor([[0, 1], [1, 2]])
    boundary = torch.tensor([[0, 2], [7, 9]])  # remote targets 7 and 9
    with pytest.raises(ValueError, match="every boundary target"):
        pma_partial_sums(h, local, boundary, 1.0, torch.Generator().manual_seed(0),
                         remote_ids=torch.tensor([5, 7, 8]))
    ls, ids, sums = pma_partial_sums(h, local, boundary, 0.0, torch.Generator(),
                                     remote_ids=torch.tensor([5, 7, 8, 9]))
    assert torch.equal(sums[1], h[0]) and torch.equal(sums[3], h[2]) and not sums[0].any()
    with pytest.raises(ValueError, match="does not hold"):
        pma_finish(ls, torch.tensor([0, 1, 2]), torch.tensor([1, 4]), torch.zeros(2, 4))
