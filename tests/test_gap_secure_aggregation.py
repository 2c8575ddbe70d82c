"""Federated GAP with secure aggregation (``secure-aggregation = true``): every client adds a
share sigma_max / sqrt(n - 1) of the noise to its remote rows; the summed row that the server
and the owner see has std sigma_max, at least every client's own sigma."""
import math

import pytest
import torch

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods.gap_federated import (check_remote_sigma, pma_partial_sums, remote_noise,
                                            secure_remote_sigma)
from fedgraph.nn.gap import normalize_rows
from strategies.gap import _sum_rows


def test_share_is_sigma_max_over_sqrt_n_minus_1():
    assert secure_remote_sigma([1.0, 3.0, 2.0], 10) == pytest.approx(3.0 / 3.0)
    assert secure_remote_sigma([2.0], 1) == 2.0  # one client: no remote rows
    assert secure_remote_sigma([0.0, 0.0], 2) == 0.0  # nobody adds noise (epsilon inf)
    with pytest.raises(ValueError):
        secure_remote_sigma([], 3)


def test_the_summed_row_is_at_least_as_noisy_as_every_clients_plan():
    """n - 1 clients with zero signal release a node's row; the sum's std is sigma_max."""
    sigmas, n = [0.7, 1.9, 1.2, 0.4, 1.9, 1.0], 6
    share = secure_remote_sigma(sigmas, n)
    rows, dim = 4000, 16
    total = torch.zeros(rows, dim)
    for c in range(n - 1):
        h = torch.zeros(1, dim)  # no edge to these nodes: pure noise
        _, _, remote = pma_partial_sums(h, torch.zeros(2, 0, dtype=torch.long),
                                        torch.zeros(2, 0, dtype=torch.long), sigmas[c],
                                        torch.Generator().manual_seed(c),
                                        remote_ids=torch.arange(rows), remote_sigma=share)
        total += remote
    # std of 64,000 draws: relative standard error ~0.3 %; 2 % is > 6 standard errors
    assert float(total.std()) == pytest.approx(max(sigmas), rel=0.02)
    assert float(total.std()) >= max(sigmas) * 0.98


def test_remote_and_local_rows_get_their_own_noise():
    g = torch.Generator().manual_seed(0)
    n, e = 3000, 16
    h = normalize_rows(torch.randn(n, e, generator=g))
    empty = torch.zeros(2, 0, dtype=torch.long)
    local, ids, remote = pma_partial_sums(h, empty, empty, 2.0, torch.Generator().manual_seed(1),
                                          remote_ids=torch.arange(10_000, 13_000),
                                          remote_sigma=0.5)
    assert float(local.std()) == pytest.approx(2.0, rel=0.03)  # own nodes: own sigma
    assert float(remote.std()) == pytest.approx(0.5, rel=0.03)  # remote rows: the share
    # remote_sigma None (no secure aggregation) draws exactly what it drew before
    a = pma_partial_sums(h, empty, empty, 2.0, torch.Generator().manual_seed(1),
                         remote_ids=torch.arange(10_000, 13_000))
    b = pma_partial_sums(h, empty, empty, 2.0, torch.Generator().manual_seed(1),
                         remote_ids=torch.arange(10_000, 13_000), remote_sigma=2.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_client_refuses_a_share_below_its_own_sigma():
    check_remote_sigma(1.0 / math.sqrt(4), 1.0, 4)  # 4 contributors: exactly enough
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(0.49, 1.0, 4)
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(float("nan"), 1.0, 4)
    check_remote_sigma(2.0, 1.0, 1)  # sigma_max on remote rows (undirected edges)
    with pytest.raises(ValueError, match="refusing to release"):
        check_remote_sigma(0.9, 1.0, 1)


def _gap(**kw):
    return parse_run_config({"method": "gap", "num-clients": 5, **kw})


def test_remote_noise_per_mode():
    sigmas = [1.0, 2.0, 4.0, 1.0, 1.0]
    assert remote_noise(_gap(**{"edge-unit": "directed"}), sigmas) is None  # each own sigma
    assert remote_noise(_gap(**{"edge-unit": "undirected"}), [1.5] * 5) is None  # equal sigmas
    assert remote_noise(_gap(**{"edge-unit": "undirected"}), sigmas) == (4.0, 1)
    assert remote_noise(_gap(**{"secure-aggregation": True}), sigmas) == (2.0, 4)
    assert remote_noise(_gap(**{"cross-client-edges": False}), sigmas) is None
    assert remote_noise(_gap(**{"secure-aggregation": True, "num-clients": 1}), [2.0]) is None


def test_undirected_cross_client_edge_keeps_every_clients_guarantee():
    """An undirected edge {u, v} across clients c (sigma_c) and i (sigma_i) is released in c's
    row for v and i's row for u. Each client calibrated for two halves at its own sigma
    (effective noise multiplier sigma / sqrt 2 at sensitivity 1 per half). With remote_noise's
    sigma_max on both halves, the pair's effective noise, 1 / sqrt(sum 1 / s^2), is at least
    both clients' planned sigma / sqrt 2; with each client's own sigma it is not."""
    sigmas = [1.0, 3.0]
    def effective(halves):
        return 1 / math.sqrt(sum(1 / s ** 2 for s in halves))
    own = effective(sigmas)  # default before the fix: c's half at 1.0, i's half at 3.0
    assert own < sigmas[1] / math.sqrt(2)  # the client with sigma 3 gets less than it planned
    std, _ = remote_noise(_gap(**{"edge-unit": "undirected", "num-clients": 2}), sigmas)
    assert all(effective([std, std]) >= s / math.sqrt(2) - 1e-12 for s in sigmas)


def test_the_server_sums_rows_per_node():
    inc = {"ids": torch.tensor([5, 2, 5, 9, 2]),
           "sums": torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])}
    out = _sum_rows(inc)
    assert out["ids"].tolist() == [2, 5, 9]
    assert out["sums"].flatten().tolist() == [7.0, 4.0, 4.0]


def test_secure_aggregation_without_remote_rows_is_a_config_error():
    assert parse_run_config({"method": "gap", "secure-aggregation": True}).secure_aggregation
    for extra in ({"cross-client-edges": False}, {"variant": "mlp"}):
        with pytest.raises(ConfigError, match="secure-aggregation: has no effect"):
            parse_run_config({"method": "gap", "secure-aggregation": True, **extra})
