"""Pairwise-masked secure aggregation (fedgraph.secure_aggregation; SecAgg, Bonawitz et al.
2017): the sums the server recovers, what it sees of one client, and a missing reply."""

import numpy as np
import pytest
from scipy import stats

from fedgraph import secure_aggregation as sa


def _federation(n, num_nodes=300, dim=8, seed=0):
    """``n`` clients' keys, an ownership map (every client owns nodes) and each client's rows:
    one per node it does not own, values over many magnitudes."""
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, n, num_nodes)
    owner[:n] = np.arange(n)
    keys = [sa.generate_key_pair() for _ in range(n)]
    rows = {}
    for c in range(n):
        ids = np.flatnonzero(owner != c)
        scale = 10.0 ** rng.integers(-3, 6, (ids.size, 1))
        rows[c] = (ids, rng.standard_normal((ids.size, dim)) * scale)
    return owner, keys, rows


def _mask_all(owner, keys, rows, context="test run=1 graph=all hop=1"):
    public = [pk for _, pk in keys]
    return {
        c: (ids, sa.mask_rows(x, ids, owner, c, keys[c][0], public, context))
        for c, (ids, x) in rows.items()
    }


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_recovered_sums_equal_the_plaintext_sums_up_to_the_quantization_bound(n):
    """Every node's row comes from the n - 1 clients other than its owner; the server's sum of
    the masked rows, dequantized, is the plaintext sum within (n - 1) 2^-25 per element."""
    owner, keys, rows = _federation(n)
    ids, sums = sa.unmask_sum(_mask_all(owner, keys, rows), owner, n)
    assert ids.tolist() == list(range(owner.size))  # every node has n - 1 contributors
    exact = np.zeros_like(sums)
    for _c, (rid, x) in rows.items():
        exact[rid] += x
    err = np.abs(sums - exact)
    bound = sa.quantization_error_bound(n - 1)
    assert bound == (n - 1) * 2.0**-25
    # float64 rounding of the exact sum of values up to ~1e6: below 1e-9
    assert err.max() <= bound + 1e-9
    assert err.max() > 0  # quantized, not a float sum passed through


def test_two_clients_have_nothing_to_mask():
    """n = 2: each node's row has one contributor; no pair shares it, so the "masked" row is
    the quantized row itself (the sum the server must learn is that row)."""
    owner, keys, rows = _federation(2)
    masked = _mask_all(owner, keys, rows)
    for c, (_ids, x) in rows.items():
        assert np.array_equal(masked[c][1], sa.quantize(x, 1))


def test_quantization_error_is_far_below_gap_noise():
    """The bound for up to 1000 clients against the noise std of GAP at epsilon 64 (edge
    level, K = 2, delta 1e-7: sigma 0.19; a summed row's std is sigma_max >= that)."""
    from fedgraph.methods.gap import calibrate_gap

    sigma = calibrate_gap(
        64.0,
        1e-7,
        num_hops=2,
        level="edge",
        encoder_schedule=None,
        classifier_schedule=None,
        accountant="analytic",
    )
    assert sa.quantization_error_bound(9) / sigma < 2e-6
    assert sa.quantization_error_bound(999) / sigma < 2e-4


def test_clip_keeps_the_ring_sum_from_wrapping_and_nan_is_refused():
    b = sa.clip_bound(9)
    q = sa.quantize(np.array([[1e30, -1e30, b / 2]]), 9)
    assert sa.dequantize(q).tolist()[0] == [b, -b, b / 2]
    total = np.zeros(3, np.uint64)
    for _ in range(9):  # nine contributors at the clip bound: no wrap-around
        total += q[0]
    assert sa.dequantize(total).tolist() == [9 * b, -9 * b, 4.5 * b]
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="not finite"):
            sa.quantize(np.array([[0.0, bad]]), 2)
    with pytest.raises(ValueError, match="contributors"):
        sa.clip_bound(0)


def _uniform_high_bits(words: np.ndarray) -> float:
    """Chi-square p-value of the top 8 bits of ``uint64`` words against uniform."""
    counts = np.bincount((words.ravel() >> np.uint64(56)).astype(np.int64), minlength=256)
    return stats.chisquare(counts).pvalue


def test_the_servers_view_of_a_client_does_not_depend_on_its_data():
    """Same keys, two very different inputs (all zeros; large structured values): client 0's
    masked rows are uniform on Z / 2^64 for both (chi-square on the top 8 bits, KS on the
    whole word), and so is what the server is missing (masked minus quantized input)."""
    n, num_nodes, dim = 3, 3000, 16
    rng = np.random.default_rng(1)
    owner = rng.integers(1, n, num_nodes)  # client 0 owns nothing: it sends every row
    keys = [sa.generate_key_pair() for _ in range(n)]
    public = [pk for _, pk in keys]
    ids = np.arange(num_nodes)
    inputs = {
        "zeros": np.zeros((num_nodes, dim)),
        "structured": np.arange(num_nodes * dim, dtype=float).reshape(num_nodes, dim) * 1e3,
    }
    for name, x in inputs.items():
        masked = sa.mask_rows(x, ids, owner, 0, keys[0][0], public, "ctx")
        assert _uniform_high_bits(masked) > 1e-6, name
        assert stats.kstest(masked.ravel() / 2.0**64, "uniform").pvalue > 1e-6, name
        assert _uniform_high_bits(masked - sa.quantize(x, n - 1)) > 1e-6, name
    # the plaintext itself is far from uniform: the test can tell
    assert _uniform_high_bits(sa.quantize(inputs["structured"], n - 1)) < 1e-10


def test_masks_need_a_private_key_and_are_fresh_per_context():
    """The server holds only public keys: any key it can compute (its own key pair against the
    clients' public keys) gives masks unrelated to the pair's; a different context (hop, graph,
    run) gives a different mask, the same context the same one on both sides of the pair."""
    keys = [sa.generate_key_pair() for _ in range(3)]
    public = [pk for _, pk in keys]
    k01 = sa.pairwise_keys(keys[0][0], public, 0, "hop=1")[1]
    assert sa.pairwise_keys(keys[1][0], public, 1, "hop=1")[0] == k01  # both ends agree
    assert sa.pairwise_keys(keys[0][0], public, 0, "hop=2")[1] != k01
    server_sk, server_pk = sa.generate_key_pair()  # the server's best: its own key pair
    guess = sa.pairwise_keys(server_sk, [server_pk, public[1], public[2]], 0, "hop=1")[1]
    true_mask, guessed = sa.mask_stream(k01, 2000, 16), sa.mask_stream(guess, 2000, 16)
    assert _uniform_high_bits(true_mask - guessed) > 1e-6  # the guess removes nothing
    with pytest.raises(ValueError, match="not this client's key"):
        sa.pairwise_keys(server_sk, public, 0, "hop=1")


def test_a_missing_reply_fails_the_sum_naming_the_cause():
    """No dropout recovery: with one client's rows missing, the masks of its pairs stay in the
    sum; the server refuses to return it."""
    owner, keys, rows = _federation(4)
    masked = _mask_all(owner, keys, rows)
    del masked[2]
    with pytest.raises(ValueError, match="no dropout recovery"):
        sa.unmask_sum(masked, owner, 4)


def test_bad_inputs_are_refused():
    owner, keys, rows = _federation(3)
    public = [pk for _, pk in keys]
    ids, x = rows[0]
    with pytest.raises(ValueError, match="its own nodes"):
        sa.mask_rows(x[:1], np.flatnonzero(owner == 0)[:1], owner, 0, keys[0][0], public, "c")
    with pytest.raises(ValueError, match="distinct"):
        sa.mask_rows(x[:2], ids[[0, 0]], owner, 0, keys[0][0], public, "c")
    with pytest.raises(ValueError, match="distinct 32-byte"):
        sa.pairwise_keys(keys[0][0], [public[0], public[0], public[2]], 0, "c")
    with pytest.raises(ValueError, match="own node"):
        sa.unmask_sum({0: (np.flatnonzero(owner == 0)[:1], np.zeros((1, 8), np.uint64))}, owner, 3)
