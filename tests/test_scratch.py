"""fedgraph.utils.scratch: blocks shared by the computations of one process (issue 31), and
their users: EdgeSum's values and a GAP client's release block."""

import gc
import threading

import pytest
import torch

from fedgraph.methods.gap.client_pma import release_buffer
from fedgraph.utils.scratch import shared_block, shared_ones
from fedgraph.utils.sparse import EdgeSum


def test_shared_ones_are_ones_and_one_block_for_every_caller():
    a = shared_ones(1000)
    b = shared_ones(10)
    assert a.shape == (1000,) and b.shape == (10,)
    assert bool((a == 1).all()) and bool((b == 1).all())
    assert a.data_ptr() == b.data_ptr()  # the same memory
    c = shared_ones(10, torch.float64)  # another dtype: its own block
    assert c.dtype == torch.float64 and c.data_ptr() != a.data_ptr()
    assert shared_ones(0).shape == (0,)


def test_a_larger_request_makes_a_larger_block_and_the_old_views_stay_valid():
    small = shared_ones(100)
    big = shared_ones(10**6)
    assert big.data_ptr() != small.data_ptr() and bool((small == 1).all())
    assert shared_ones(50).data_ptr() == big.data_ptr()  # the larger one now


def test_a_block_lives_as_long_as_a_view_and_is_remade_after():
    first = shared_block("test.lifetime", 1000, 4)
    ptr = first.data_ptr()
    assert shared_block("test.lifetime", 10, 4).data_ptr() == ptr
    del first
    gc.collect()
    again = shared_block("test.lifetime", 1000, 4)  # made anew: same shape, fresh block
    assert again.shape == (1000, 4) and again.is_contiguous()


def test_shared_block_per_name_cols_and_thread():
    a = shared_block("test.a", 300, 8)
    assert a.shape == (300, 8) and a.is_contiguous()
    assert shared_block("test.a", 200, 8).data_ptr() == a.data_ptr()
    assert shared_block("test.b", 200, 8).data_ptr() != a.data_ptr()
    assert shared_block("test.a", 200, 4).data_ptr() != a.data_ptr()
    other = {}
    t = threading.Thread(target=lambda: other.update(b=shared_block("test.a", 200, 8)))
    t.start()
    t.join()
    assert other["b"].data_ptr() != a.data_ptr()  # another thread never shares a's rows


@pytest.mark.parametrize(
    "call",
    [lambda: shared_ones(-1), lambda: shared_block("x", -1, 2), lambda: shared_block("x", 2, -1)],
)
def test_negative_sizes_are_refused(call):
    with pytest.raises(ValueError, match=">= 0"):
        call()


def test_edge_sums_sharing_ones_compute_their_own_products():
    """Two sums over different edge lists share the process's ones and each still computes
    A^T h exactly (the values are never written)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(50, 3, generator=gen, dtype=torch.float64)
    results = []
    for e in (400, 90):
        src = torch.randint(0, 50, (e,), generator=gen)
        dst = torch.sort(torch.randint(0, 20, (e,), generator=gen)).values
        op = EdgeSum(src, dst, 50, num_rows=20)
        dense = torch.zeros(20, 50, dtype=torch.float64)
        dense.index_put_((dst, src), torch.ones(e, dtype=torch.float64), accumulate=True)
        results.append((op, dense))
    for op, dense in results:
        torch.testing.assert_close(op(h), dense @ h)
    values = [op._matrix(torch.float64, "cpu").values() for op, _ in results]
    assert values[0].data_ptr() == values[1].data_ptr()
    assert bool((values[0] == 1).all())


def test_release_buffers_of_two_clients_share_the_process_block():
    like = torch.zeros(1, 16)
    a, b = {}, {}
    first = release_buffer(a, 7500, like)
    second = release_buffer(b, 7300, like)
    assert first.shape == (7500, 16) and second.shape == (7300, 16)
    assert first.data_ptr() == second.data_ptr()
    assert release_buffer(a, 7500, like) is first  # kept for the client's next hops


@pytest.mark.parametrize("sorted_edges", [True, False])
def test_a_release_in_the_shared_block_holds_nothing_of_the_previous_clients(
    sorted_edges, monkeypatch
):
    """The release block is shared by the clients a process runs in turn: every row of a
    client's release is its own (noisy) sum, zero-edge rows included, never what another
    client wrote there before (checked with a sentinel, in blocked products too)."""
    from fedgraph.methods.gap.client_pma import pma_partial_sums
    from fedgraph.utils import sparse

    monkeypatch.setattr(sparse, "ROW_BLOCK_ELEMENTS", 8)  # several row blocks per product
    gen = torch.Generator().manual_seed(1)
    n, num_nodes, d = 6, 40, 4
    h = torch.randn(n, d, generator=gen)
    local = torch.randint(0, n, (2, 10), generator=gen)
    remote_ids = torch.arange(n, num_nodes)  # every node held elsewhere
    dst = torch.tensor([7, 7, 12, 30]) if sorted_edges else torch.tensor([30, 7, 12, 7])
    boundary = torch.stack([torch.tensor([0, 1, 2, 3]), dst])
    previous = release_buffer({}, num_nodes + 5, h)  # another client's, larger
    previous.fill_(999.0)
    mine = release_buffer({}, remote_ids.numel(), h)
    assert mine.data_ptr() == previous.data_ptr()
    _, ids, sums = pma_partial_sums(
        h, local, boundary, 0.0, gen, remote_ids=remote_ids, remote_out=mine
    )
    assert not bool((sums == 999.0).any())
    expected = torch.zeros(remote_ids.numel(), d)
    expected.index_add_(0, boundary[1] - n, h[boundary[0]])
    torch.testing.assert_close(sums, expected)
