"""The server's step of federated PMA (sum_partial_sums) gives each client, per node it holds,
the sum of the rows the per-client routing loop it replaced gave (what pma_finish added)."""

import pytest
import torch

from fedgraph.methods.gap.server import sum_partial_sums


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
    return [
        (torch.cat(a), torch.cat(b))
        if a
        else (torch.zeros(0, dtype=torch.long), torch.zeros(0, dim))
        for a, b in routed
    ]


@pytest.mark.parametrize("num_nodes,num_clients,seed", [(50, 3, 0), (500, 7, 1), (40, 6, 2)])
def test_per_node_sums_equal_the_routed_rows_added_up(num_nodes, num_clients, seed):
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
    released = [
        (i[owner[i] != num_clients - 1], s[owner[i] != num_clients - 1]) for i, s in released
    ]
    got = sum_partial_sums(released, owner, num_clients)
    want = loop_routing(released, owner, num_clients, dim)
    assert len(got) == num_clients
    for i, ((gi, gs), (wi, ws)) in enumerate(zip(got, want)):
        assert (
            gi.dtype == torch.long and gs.dtype == torch.float32 and gs.shape == (gi.numel(), dim)
        )
        assert torch.equal(gi, torch.unique(wi))  # one row per node that received any, sorted
        assert bool((owner[gi] == i).all())
        # what pma_finish computed from the routed rows: their sum per node
        expect = torch.zeros(num_nodes, dim).index_add_(0, wi, ws)[gi]
        assert torch.allclose(gs, expect, atol=1e-6)
    assert got[-1][0].numel() == 0 and got[-1][1].shape == (0, dim)


def test_pma_finish_of_the_sums_equals_finish_of_the_rows():
    """The owner's hop from the server's sums equals its hop from the routed rows (up to float
    rounding): the message shrinks, the aggregation does not change."""
    from fedgraph.methods.gap.client_pma import pma_finish

    g = torch.Generator().manual_seed(3)
    owner = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    released = []
    for c in range(3):
        ids = (owner != c).nonzero().flatten()
        released.append((ids, torch.randn(ids.numel(), 4, generator=g)))
    summed = sum_partial_sums(released, owner, 3)
    rows = loop_routing(released, owner, 3, 4)
    for i in range(3):
        node_ids = (owner == i).nonzero().flatten()
        local = torch.randn(node_ids.numel(), 4, generator=g)
        assert torch.allclose(
            pma_finish(local, node_ids, *summed[i]),
            pma_finish(local, node_ids, *rows[i]),
            atol=1e-6,
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_positions_equal_searchsorted(seed):
    """The inverse-table lookup that replaced searchsorted in pma_partial_sums/pma_finish gives
    the same positions, and -1 for ids that are not there (both callers then raise)."""
    from fedgraph.utils.sparse import index_in

    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(1000, generator=g)[:300].sort().values
    query = ids[torch.randint(0, 300, (5000,), generator=g)]
    pos = index_in(ids, query)
    assert pos.dtype == torch.long  # index_add_ is slow with int32 indices
    assert torch.equal(pos, torch.searchsorted(ids, query))
    missing = torch.tensor(
        [int(ids.max()) + 5, *[i for i in range(1000) if i not in set(ids.tolist())][:3]]
    )
    assert bool((index_in(ids, missing) == -1).all())
    assert index_in(ids, query[:0]).numel() == 0


def test_partial_sums_and_finish_refuse_unknown_ids():
    from fedgraph.methods.gap.client_pma import pma_finish, pma_partial_sums

    h = torch.randn(3, 4)
    local = torch.tensor([[0, 1], [1, 2]])
    boundary = torch.tensor([[0, 2], [7, 9]])  # remote targets 7 and 9
    with pytest.raises(ValueError, match="every boundary target"):
        pma_partial_sums(
            h,
            local,
            boundary,
            1.0,
            torch.Generator().manual_seed(0),
            remote_ids=torch.tensor([5, 7, 8]),
        )
    ls, ids, sums = pma_partial_sums(
        h, local, boundary, 0.0, torch.Generator(), remote_ids=torch.tensor([5, 7, 8, 9])
    )
    assert torch.equal(sums[1], h[0]) and torch.equal(sums[3], h[2]) and not sums[0].any()
    with pytest.raises(ValueError, match="does not hold"):
        pma_finish(ls, torch.tensor([0, 1, 2]), torch.tensor([1, 4]), torch.zeros(2, 4))
