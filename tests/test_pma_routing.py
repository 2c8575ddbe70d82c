"""The server's routing of federated PMA (route_partial_sums) gives each client exactly the
rows, in the order, that the per-client loop it replaced gave."""
import pytest
import torch

from fedgraph.methods.gap_federated import route_partial_sums


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
