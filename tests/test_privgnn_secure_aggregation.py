"""PrivGNN's ensemble mode with secure aggregation (issue 15: distributed noise across
clients): rows without an owner in the masking protocol, each client's noise share, what the
server receives (masked, uniform) and what it learns (the sum), the shared answer limit, the
ledger's events (those of the sum) and the collusion figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as sps
from test_privgnn_ensemble import ENSEMBLE, assert_ledger_row, replay_clean_votes
from test_privgnn_federated import _run_strategy, transcript_until

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods import privgnn as pf
from fedgraph.methods import privgnn as pg
from fedgraph.secure_aggregation import (
    generate_key_pair,
    mask_rows,
    quantization_error_bound,
    unmask_sum,
)

SECURE = {**ENSEMBLE, "secure-aggregation": True}


def _keys(n):
    pairs = [generate_key_pair() for _ in range(n)]
    return [sk for sk, _ in pairs], [pk for _, pk in pairs]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_rows_without_owner_sum_over_every_client(n):
    """owner = -1: all n clients contribute each row; the masks cancel over all of them, and
    a missing client's masks do not cancel (the round fails, no silent wrong sum)."""
    sks, pks = _keys(n)
    rng = np.random.default_rng(0)
    rows = rng.normal(scale=30.0, size=(n, 7, 4))
    owner = np.full(7, -1)
    masked = {
        i: (np.arange(7), mask_rows(rows[i], np.arange(7), owner, i, sks[i], pks, "t"))
        for i in range(n)
    }
    ids, sums = unmask_sum(masked, owner, n)
    assert ids.tolist() == list(range(7))
    assert np.abs(sums - rows.sum(0)).max() <= quantization_error_bound(n)
    del masked[n - 1]
    with pytest.raises(ValueError, match=f"of the {n} contributions"):
        unmask_sum(masked, owner, n)


def test_noise_shares_sum_to_the_accounted_noise():
    """shares = n: each client's draw has std sigma / sqrt n (KS against the normal), so the
    sum of n clients' noise has std sigma, the std the ledger's events describe."""
    votes = torch.zeros(20000, 3)
    draws = [
        pg.noisy_votes(votes, 6.0, None, torch.Generator().manual_seed(s), shares=4)
        for s in range(4)
    ]
    share = draws[0].flatten().numpy()
    assert sps.kstest(share / (6.0 / 2.0), "norm").pvalue > 1e-3
    total = torch.stack(draws).sum(0).flatten().numpy()
    assert sps.kstest(total / 6.0, "norm").pvalue > 1e-3
    with pytest.raises(ValueError, match="shares must be >= 1"):
        pg.noisy_votes(votes, 6.0, shares=0)


def test_collusion_epsilon_is_that_of_one_share():
    e_sum = pg.ensemble_epsilon(10, 4.0, None, 1e-5)
    e_col = pg.ensemble_collusion_epsilon(10, 4.0, None, 1e-5, 4)
    assert e_col == pytest.approx(pg.ensemble_epsilon(10, 2.0, None, 1e-5))
    assert e_col > e_sum
    assert pg.ensemble_collusion_epsilon(10, 4.0, None, 1e-5, 1) == pytest.approx(e_sum)


@pytest.mark.parametrize(
    "over,expect",
    [
        ({"answer-mode": "posterior"}, "answer-mode = 'ensemble'"),
        ({"num-clients": 1}, "num-clients >= 2"),
    ],
)
def test_bad_configs_name_the_key(over, expect):
    with pytest.raises(ConfigError, match="secure-aggregation") as err:
        parse_run_config({**SECURE, **over})
    assert expect in str(err.value)


def test_every_client_answers_the_smallest_limit():
    e3 = pg.ensemble_epsilon(3, 3.0, 5.0, 1e-4)
    cfg = parse_run_config({**SECURE, "client-epsilons": f"{e3 * 1.01},inf"})
    assert [pf.client_limit(cfg, p, 6) for p in (0, 1)] == [3, 3]
    plain = parse_run_config({**ENSEMBLE, "client-epsilons": f"{e3 * 1.01},inf"})
    assert [pf.client_limit(plain, p, 6) for p in (0, 1)] == [3, 6]


def test_client_refuses_to_release_unmasked_histograms():
    cfg = parse_run_config(SECURE)
    with pytest.raises(ValueError, match="refusing to release unmasked histograms"):
        pf.client_answer(cfg, 0, {}, 0, None, secagg=None)


def test_secure_run_server_sees_only_masked_rows_and_learns_the_sum(tmp_path, monkeypatch):
    """In-process run, 2 clients: a key exchange, then every reply is int64 ring elements
    (masked: no reply is close to the client's noisy histograms, and the bits look uniform);
    unmasked, the sum equals the clients' noisy histograms summed (recomputed from their
    secrets, each with a 1/2 share of the variance); the ledger records the sum's Gaussian
    events per client; the report states the collusion figure."""
    from fedgraph.randomness import SECRET_ENV

    monkeypatch.setenv(SECRET_ENV, "test-secret-secagg")
    cfg, grid, report = _run_strategy(
        {**SECURE, "client-epsilons": "inf", "noise-source": "secret", "student-holdout": 0.0},
        tmp_path,
        monkeypatch,
    )
    assert report["status"] == "ok"
    assert "holdout" not in report["accuracy"]  # no held-out slice: no holdout figure
    kinds = [m.metadata.message_type for _, m, _ in grid.log]
    assert kinds == ["query.privgnn_keys"] * 2 + ["query.privgnn"] * 2
    public, stats = pf.public_graph(cfg)
    C = stats["num_classes"]
    masked, noisy = {}, []
    for node, request, reply in grid.log[2:]:
        out = reply.content["answers"].to_torch_state_dict()["answers"]
        assert out.dtype == torch.int64 and out.shape == (cfg.num_queries, 2 * C)
        idx = int(request.content["secagg"]["index"])
        masked[idx] = out
        clean, gen = replay_clean_votes(
            cfg, node, request, C, inputs=transcript_until(grid.log, node, request)
        )
        mine = pg.noisy_votes(clean, 3.0, 5.0, gen, shares=2)
        noisy.append(mine)
        # what the server got is not the client's histogram (nor near it)
        as_real = out.double() / 2**24
        assert float((as_real - mine.double()).abs().min()) > 1e3
    bits = np.concatenate([m.numpy().view(np.uint64).ravel() for m in masked.values()])
    top = (bits >> np.uint64(60)).astype(int)  # 16 equally likely values if uniform
    assert sps.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-4
    total = pf.unmask_histograms(masked, 2)
    assert torch.allclose(total, noisy[0] + noisy[1], atol=1e-5)
    disk = json.loads((tmp_path / "run.json").read_text())
    for subject in ("client-0", "client-1"):
        assert_ledger_row(disk["privacy"]["per_subject"][subject])  # the sum's events
        assert disk["privacy"]["collusion"]["epsilon"][subject] == pytest.approx(
            pg.ensemble_epsilon(6, 3.0 / math.sqrt(2), 5.0 / math.sqrt(2), 1e-4), rel=1e-6
        )
    assert "secure aggregation" in disk["privacy"]["aggregation"]
    from fedgraph.report import format_table

    worst = max(disk["privacy"]["collusion"]["epsilon"].values())
    assert f"colluding with all other clients, epsilon up to {worst:.4g}" in format_table(report)
    with pytest.raises(ValueError, match="different numbers of queries"):
        pf.unmask_histograms({0: masked[0], 1: masked[1][:3]}, 2)
    with pytest.raises(ValueError, match="contributions"):
        pf.unmask_histograms({0: masked[0]}, 2)


def test_student_without_holdout_trains_on_every_label():
    """student-holdout = 0: all pseudo-labels are trained on (none held out), and no holdout
    accuracy is claimed; 0.5 holds out half."""
    from test_privgnn_federated import SMALL

    cfg = parse_run_config(SMALL)
    public, _ = pf.public_graph(cfg)
    q = public.train_mask.nonzero().view(-1)[:20]
    kw = dict(hidden=8, epochs=5, seed=0)
    full = pg.train_student(public, q, public.y[q], holdout_fraction=0.0, **kw)
    assert math.isnan(full.holdout_accuracy)
    half = pg.train_student(public, q, public.y[q], holdout_fraction=0.5, **kw)
    assert not math.isnan(half.holdout_accuracy)
    with pytest.raises(ConfigError, match="student-holdout"):
        parse_run_config({**SMALL, "student-holdout": 1.0})


def test_failed_secure_run_reports_collusion_and_says_why(tmp_path, monkeypatch):
    """A run whose threshold check keeps no query fails (exit 1 in fedgraph run) with a
    message about the threshold, not lam; the histograms did leave the clients, so the report
    on disk has their epsilon, the threshold copy under its own name, and the collusion
    figure (it used to be added only at the end of a successful run)."""
    with pytest.raises(RuntimeError, match=r"threshold check kept none.*lower threshold"):
        _run_strategy(
            {**SECURE, "client-epsilons": "inf", "threshold": 1000.0}, tmp_path, monkeypatch
        )
    disk = json.loads((tmp_path / "run.json").read_text())
    assert disk["status"] == "failed"
    for subject in ("client-0", "client-1"):
        names = [r["release"] for r in disk["privacy"]["per_subject"][subject]["releases"]]
        assert names == ["noisy vote histograms", "noisy vote histograms (threshold copy)"]
        assert disk["privacy"]["collusion"]["epsilon"][subject] == pytest.approx(
            pg.ensemble_collusion_epsilon(6, 3.0, 5.0, 1e-4, 2), rel=1e-6
        )


@pytest.mark.parametrize(
    "over,expect",
    [
        ({"sigma-votes": 0.5}, "greater than or equal to 1"),
        ({"sigma-threshold": 0.5}, "or a finite std >= 1"),
    ],
)
def test_noise_below_one_vote_is_refused(over, expect):
    """sigma-votes 0.01 was accepted and made every client's PLD allocate 301 GiB."""
    with pytest.raises(ConfigError, match=expect):
        parse_run_config({**ENSEMBLE, **over})
