"""The sums over edges (fedgraph.utils.sparse.sum_over_edges / sum_over_edges_at): the sparse
matmul on target-sorted edges and the chunked index_add_ on unsorted ones both equal the
definition ``out[i] = sum_{e: dst[e] = i} h[src[e]]``, which is GAP's Eq. 7 and the partial
sums PMA releases; wrong row alignment here would put a node's sum on another node."""

import pytest
import torch

from fedgraph.utils.sparse import is_sorted, sum_over_edges, sum_over_edges_at


def _definition(h, src, dst, rows):
    out = torch.zeros(rows, h.size(1), dtype=h.dtype)
    for s, d in zip(src.tolist(), dst.tolist()):
        out[d] += h[s]
    return out


def _edges(seed, n_src=30, rows=40, e=500, sort=True):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, rows, (e,), generator=g)
    if sort:
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
    return src, dst, torch.randn(n_src, 5, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_sum_over_edges_is_the_definition_either_path(sort, seed):
    src, dst, h = _edges(seed, sort=sort)
    assert is_sorted(dst) == sort
    out = sum_over_edges(h, src, dst, 45, max_elements=7)  # 45 > max id: zero rows at the end
    assert out.shape == (45, 5) and out.dtype == h.dtype
    assert torch.allclose(out, _definition(h, src, dst, 45), atol=1e-12)
    assert torch.equal(out[40:], torch.zeros(5, 5, dtype=h.dtype))


def test_sum_over_edges_paths_agree_in_float32_and_keep_gradients():
    src, dst, h = _edges(3, e=5000)
    h = h.float().requires_grad_()
    fast = sum_over_edges(h, src, dst, 40)
    order = torch.randperm(src.numel(), generator=torch.Generator().manual_seed(0))
    slow = sum_over_edges(h, src[order], dst[order], 40)  # unsorted: index_add_ path
    assert torch.allclose(fast, slow, atol=1e-5)
    fast.sum().backward()
    assert torch.allclose(h.grad, torch.bincount(src, minlength=30).float()[:, None].expand(30, 5))


def test_sum_over_edges_errors_and_empty():
    h = torch.randn(3, 2)
    with pytest.raises(ValueError, match="same length"):
        sum_over_edges(h, torch.tensor([0, 1]), torch.tensor([0]), 2)
    with pytest.raises(ValueError, match="num_rows"):
        sum_over_edges(h, torch.tensor([0, 1]), torch.tensor([0, 5]), 2)
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(sum_over_edges(h, empty, empty, 4), torch.zeros(4, 2))


@pytest.mark.parametrize("sort", [True, False])
def test_sum_over_edges_at_named_rows(sort):
    """Rows named by sorted global ids (a client's remote nodes): row j is the sum into
    row_ids[j], with ids that receive no edge as zero rows; an edge into an id outside
    row_ids is refused (it would be dropped silently otherwise)."""
    src, dst, h = _edges(5, rows=40, sort=sort)
    row_ids = torch.arange(0, 90, 2)  # even ids 0..88
    dst = dst * 2  # every target even
    out = sum_over_edges_at(h, src, dst, row_ids, max_elements=9)
    full = _definition(h, src, dst, 90)
    assert torch.allclose(out, full[row_ids], atol=1e-12)
    with pytest.raises(ValueError, match="every id of dst"):
        sum_over_edges_at(h, src, dst + 1, row_ids)
    with pytest.raises(ValueError, match="sorted and distinct"):
        sum_over_edges_at(h, src, dst, row_ids.flip(0))
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(
        sum_over_edges_at(h, empty, empty, row_ids), torch.zeros(45, 5, dtype=h.dtype)
    )


@pytest.mark.parametrize("sort", [True, False])
def test_ids_out_of_range_or_of_the_wrong_type_are_refused_on_both_paths(sort):
    """The sparse matmul reads h without bounds checks: a source id past h's rows read memory
    outside h (garbage rows, or a segfault for a large id) before these checks (found by a
    fresh-user trial). Both paths refuse the same inputs with a ValueError naming the field."""
    h = torch.ones(4, 2)
    dst = torch.tensor([0, 1]) if sort else torch.tensor([1, 0])
    for bad_src, match in (
        (torch.tensor([0, 9]), "src ids must lie in"),
        (torch.tensor([0, 10**10]), "src ids must lie in"),
        (torch.tensor([0, -1]), "src ids must lie in"),
        (torch.tensor([0.0, 1.0]), "src must be a 1-D integer"),
        (torch.tensor([True, False]), "src must be a 1-D integer"),
    ):
        with pytest.raises(ValueError, match=match):
            sum_over_edges(h, bad_src, dst, 4)
        with pytest.raises(ValueError, match=match):
            sum_over_edges_at(h, bad_src, dst, torch.arange(4))
    with pytest.raises(ValueError, match=r"dst ids must lie in \[0, 2\)"):
        sum_over_edges(h, torch.tensor([0, 1]), dst * 3, 2)
    with pytest.raises(ValueError, match="dst ids must be >= 0"):
        sum_over_edges(h, torch.tensor([0, 1]), torch.tensor([-1, 0]), 2)
    with pytest.raises(ValueError, match="num_rows must be >= 0"):
        sum_over_edges(h, torch.tensor([0, 1]), dst, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_take_the_index_add_path(dtype):
    src, dst, h = _edges(7)
    out = sum_over_edges(h.to(dtype), src, dst, 40)
    assert out.dtype == dtype
    assert torch.allclose(out.double(), _definition(h.to(dtype).double(), src, dst, 40), atol=0.1)
    int32 = sum_over_edges(h, src.int(), dst.int(), 40)  # int32 ids are fine
    assert torch.allclose(int32, _definition(h, src, dst, 40), atol=1e-12)


@pytest.mark.parametrize("sort", [True, False])
def test_edge_sum_built_once_is_the_definition_at_every_product(sort):
    """EdgeSum (PMA's sums over a client's fixed edges, built at the first hop) gives the
    definition for every h it is applied to, in float32 and float64, with int32 indices on
    the sorted path, gradients to h, and its named rows (row_ids)."""
    from fedgraph.utils.sparse import EdgeSum

    src, dst, h = _edges(11, sort=sort)
    op = EdgeSum(src, dst, 30, num_rows=40, max_elements=7)
    assert op.num_edges == src.numel() and op.row_ids is None
    if sort:
        assert op._col.dtype == torch.int32 and op._crow.dtype == torch.int32
    for seed in (0, 1):
        x = torch.randn(30, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        assert torch.allclose(op(x), _definition(x, src, dst, 40), atol=1e-12)
        assert torch.allclose(op(x.float()), _definition(x, src, dst, 40).float(), atol=1e-5)
        half = op(x.to(torch.bfloat16))
        assert half.dtype == torch.bfloat16
        assert torch.allclose(
            half.double(), _definition(x.to(torch.bfloat16).double(), src, dst, 40), atol=0.2
        )
    x = h.float().requires_grad_()
    op(x).sum().backward()
    assert torch.equal(x.grad, torch.bincount(src, minlength=30).float()[:, None].expand(30, 5))
    named = EdgeSum(src, dst * 2, 30, row_ids=torch.arange(0, 90, 2))
    assert torch.equal(named.row_ids, torch.arange(0, 90, 2))
    assert torch.allclose(named(h), _definition(h, src, dst * 2, 90)[::2], atol=1e-12)
    with pytest.raises(ValueError, match=r"h must be \[30, d\]"):
        op(torch.randn(29, 5))
    with pytest.raises(ValueError, match="exactly one of num_rows and row_ids"):
        EdgeSum(src, dst, 30)
    with pytest.raises(ValueError, match="every id of dst"):
        EdgeSum(src, dst * 2 + 1, 30, row_ids=torch.arange(0, 90, 2))
    with pytest.raises(ValueError, match="every id of dst"):
        EdgeSum(src, dst, 30, row_ids=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="src ids must lie in"):
        EdgeSum(src, dst, 29, num_rows=40)


@pytest.mark.parametrize("block_elements", [5, 12, 10**9])
def test_blocked_products_and_an_output_kept_across_calls_are_the_definition(
    monkeypatch, block_elements
):
    """Issue 31: a CPU product larger than ROW_BLOCK_ELEMENTS is computed in blocks of rows
    (1 and 2 rows per block here, and one block), with blocks of no edges (rows 40..44); into
    ``out`` when given, whose earlier contents are overwritten and which is returned. The same
    floats as one sparse matmul: each row's sum is the same computation."""
    from fedgraph.utils import sparse
    from fedgraph.utils.sparse import EdgeSum

    src, dst, h = _edges(5, e=400)
    h32 = h.float()
    whole = torch.sparse.mm(EdgeSum(src, dst, 30, num_rows=45)._matrix(torch.float32, "cpu"), h32)
    monkeypatch.setattr(sparse, "ROW_BLOCK_ELEMENTS", block_elements)
    op = EdgeSum(src, dst, 30, num_rows=45)
    assert torch.equal(op(h32), whole)
    assert torch.allclose(op(h), _definition(h, src, dst, 45), atol=1e-12)
    out = torch.full((45, 5), float("nan"))
    for x in (h32, 2 * h32):  # the same block reused
        got = op(x, out=out)
        assert got is out
        assert torch.allclose(out, _definition(x.double(), src, dst, 45).float(), atol=1e-5)
    assert torch.equal(out[40:], torch.zeros(5, 5))
    named = EdgeSum(src, dst * 2, 30, row_ids=torch.arange(0, 90, 2))
    assert torch.allclose(
        named(h, out=torch.empty(45, 5, dtype=torch.float64)),
        _definition(h, src, dst * 2, 90)[::2],
        atol=1e-12,
    )
    unsorted = EdgeSum(src.flip(0), dst.flip(0), 30, num_rows=45)  # the index_add_ path
    assert torch.allclose(
        unsorted(h, out=torch.empty(45, 5, dtype=torch.float64)),
        _definition(h, src, dst, 45),
        atol=1e-12,
    )
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(
        EdgeSum(empty, empty, 30, num_rows=3)(h32, out=torch.ones(3, 5)), torch.zeros(3, 5)
    )
    x = h32.clone().requires_grad_()  # gradients: the one product, whatever the block size
    op(x).sum().backward()
    assert torch.equal(x.grad, torch.bincount(src, minlength=30).float()[:, None].expand(30, 5))


def test_an_output_of_the_wrong_kind_or_with_gradients_is_refused():
    from fedgraph.utils.sparse import EdgeSum

    src, dst, h = _edges(6)
    op = EdgeSum(src, dst, 30, num_rows=40)
    h = h.float()
    for bad, what in (
        (torch.empty(39, 5), r"got torch.float32 \(39, 5\)"),
        (torch.empty(40, 5).double(), "got torch.float64"),
        (torch.empty(5, 40).t(), "contiguous"),
    ):
        with pytest.raises(ValueError, match=what):
            op(h, out=bad)
    square = EdgeSum(src, dst % 30, 30, num_rows=30)
    with pytest.raises(ValueError, match="share memory"):
        square(h, out=h)
    with pytest.raises(ValueError, match="gradients"):
        op(h.requires_grad_(), out=torch.empty(40, 5))
