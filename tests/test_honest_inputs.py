"""Inputs that used to turn a private run into a false report (issue 13, fault 7):

* tiny deltas: the accountant returns the tightest finite bound that holds, configs, ledger
  summaries and calibration reject deltas below ``DELTA_FLOOR`` and calibration runs within
  a budget;
* non-finite client replies fail the round, naming the client and the field, on every path
  where the server receives replies (``send_to_all`` and the FedAvg-family strategies);
* every mechanism and noise-adding function validates its noise scale / epsilon.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedgraph.accounting import (
    DELTA_FLOOR,
    CalibrationError,
    Gaussian,
    PldAccountant,
    PrivacyLedger,
    PrvAccountant,
    RdpAccountant,
    SubsampledGaussian,
    calibrate,
    compose,
)
from fedgraph.config import ConfigError, parse_run_config
from fedgraph.errors import ClientFailure
from fedgraph.messaging import check_finite_reply, client_label, send_to_all

TINY = 1.1e-18


# ------------------------------------------------------------------------------- tiny delta
@pytest.mark.parametrize("accountant", ["prv", "pld"])
def test_tiny_delta_gives_the_tightest_finite_bound_not_infinity(accountant):
    """At delta 1.1e-18 prv fails and PLD's tail truncation gives infinity; RDP's bound is
    finite and valid, so that is the answer, and the result says which accountant gave it."""
    events = [SubsampledGaussian(0.00033, 4.0, 1000)]
    rdp = RdpAccountant().compose(events, TINY).epsilon
    assert math.isfinite(rdp)
    assert math.isinf(PldAccountant().compose(events, TINY).epsilon)  # the trap
    c = compose(events, TINY, accountant)
    assert c.epsilon == pytest.approx(rdp, rel=1e-12)
    assert c.accountant == "rdp" and c.requested == accountant
    assert any("tightest valid upper bound: rdp" in n for n in c.notes)


@pytest.mark.parametrize("requested", [PrvAccountant, PldAccountant])
def test_composition_is_never_above_the_requested_accountant_or_rdp(requested):
    """RDP (cheap) always caps the figure; here RDP is looser, so the requested one stays."""
    events = [SubsampledGaussian(0.01, 1.0, 200), Gaussian(3.0, 2)]
    c = compose(events, 1e-6, requested.name)
    assert c.accountant == requested.name
    for acc in (requested(), RdpAccountant()):
        assert c.epsilon <= acc.compose(events, 1e-6).epsilon * (1 + 1e-12)


def test_rdp_caps_a_loose_figure():
    """A prv accountant forced to a coarse error returns a looser upper bound than RDP: the
    composition reports RDP's (valid, tighter) bound and names it."""
    events = [Gaussian(1.0, 1)]
    loose = PrvAccountant(rel_eps_error=0.5, min_eps_error=2.0)
    assert loose.compose(events, 1e-5).epsilon > RdpAccountant().compose(events, 1e-5).epsilon
    c = compose(events, 1e-5, loose)
    assert c.accountant == "rdp"
    assert c.epsilon == pytest.approx(RdpAccountant().compose(events, 1e-5).epsilon)


@pytest.mark.parametrize("method", ["gap", "ppgnn", "privgnn"])
@pytest.mark.parametrize("delta", [1e-15, 0.0, 1.0, float("nan")])
def test_run_config_rejects_a_delta_outside_the_accepted_range(method, delta):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": method, "delta": delta})
    assert "delta" in str(err.value)


@pytest.mark.parametrize("method", ["gap", "ppgnn", "privgnn"])
def test_run_config_accepts_the_floor(method):
    assert parse_run_config({"method": method, "delta": DELTA_FLOOR}).delta == DELTA_FLOOR


def test_ledger_reports_and_cross_checks_an_rdp_figure():
    """When RDP's bound is the tightest, the row names rdp and its cross-check (PLD's lower
    bound below it) agrees instead of showing '?' or a false disagreement."""
    ledger = PrivacyLedger()
    ledger.record("client-0", "pma", Gaussian(1.0, 1))
    loose = PrvAccountant(rel_eps_error=0.5, min_eps_error=2.0)
    row = ledger.summary(delta=1e-5, accountant=loose)["client-0"]
    assert row["accountant"] == "rdp"
    assert row["cross_check"]["accountant"] == "pld" and row["cross_check"]["agrees"]


def test_ledger_summary_rejects_a_tiny_delta():
    ledger = PrivacyLedger()
    ledger.record("client-0", "pma", Gaussian(2.0, 2))
    with pytest.raises(ValueError, match=r"delta must lie in \[1e-12, 1\)"):
        ledger.summary(delta=1e-15)
    row = ledger.summary(delta=1e-6)["client-0"]
    assert math.isfinite(row["epsilon"]) and row["cross_check"]["accountant"] != "?"


def test_calibrate_gap_with_a_tiny_delta_fails_fast_and_clearly():
    """Used not to return in 400 s; now a clear ValueError in well under a minute (run in a
    child process that is killed at the deadline, so the old code fails the test instead of
    hanging the suite)."""
    code = (
        "from fedgraph.methods.gap import calibrate_gap, dpsgd_schedule\n"
        "s = dpsgd_schedule(1000, 256, 100)\n"
        "try:\n"
        "    calibrate_gap(4.0, 1e-15, num_hops=2, level='node', encoder_schedule=s,\n"
        "                  classifier_schedule=s, accountant='prv')\n"
        "except ValueError as err:\n"
        "    print('ValueError:', err)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("calibrate_gap(delta=1e-15) did not finish within 60 s")
    assert "ValueError: delta must lie in [1e-12, 1)" in out.stdout, out.stderr[-2000:]


def _gaussian(z):
    return [Gaussian(z, 4)]


def test_calibration_stops_at_its_evaluation_budget_naming_the_target():
    with pytest.raises(
        CalibrationError,
        match=r"target_epsilon=1, delta=1e-05 did not finish: stopped after 3 accountant evaluations",
    ):
        calibrate(1.0, 1e-5, _gaussian, accountant="prv", max_evaluations=3)
    # the budget is generous enough for an ordinary search
    assert calibrate(1.0, 1e-5, _gaussian, accountant="prv") > 0


def test_calibration_stops_at_its_time_budget():
    def slow(z):
        time.sleep(0.05)
        return _gaussian(z)

    start = time.monotonic()
    with pytest.raises(CalibrationError, match="delta=1e-05"):
        calibrate(1.0, 1e-5, slow, accountant="rdp", time_budget_s=0.2)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "kwargs", [{"max_evaluations": 0}, {"time_budget_s": 0.0}, {"time_budget_s": float("nan")}]
)
def test_calibration_budget_arguments_are_checked(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        calibrate(1.0, 1e-5, _gaussian, **kwargs)


# ------------------------------------------------------------------- non-finite client replies
def _meta(pid):
    return ConfigRecord({"worker": json.dumps({"partition_id": pid})})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "field,make",
    [
        ("partial_sums['0']", lambda v: {"partial_sums": ArrayRecord([np.array([[1.0, v]])])}),
        (
            "answers['answers']",
            lambda v: {"answers": ArrayRecord({"answers": torch.tensor([[0.5, v]])})},
        ),
        ("metrics['train-loss']", lambda v: {"metrics": MetricRecord({"train-loss": v})}),
        ("metrics['losses']", lambda v: {"metrics": MetricRecord({"losses": [1.0, v]})}),
    ],
)
def test_check_finite_reply_names_the_field(bad, field, make):
    content = RecordDict({**make(bad), "meta": _meta(1)} if "meta" not in make(bad) else make(bad))
    with pytest.raises(ClientFailure) as err:
        check_finite_reply(content, client_label(5, content), "query.x")
    assert field in str(err.value) and "node 5" in str(err.value)


def test_check_finite_reply_rejects_nan_metadata():
    content = RecordDict({"meta": ConfigRecord({"scale": float("nan"), "ok": float("inf")})})
    with pytest.raises(ClientFailure, match=r"node 3 replied .* in meta\['scale'\]"):
        check_finite_reply(content, "node 3")


def test_check_finite_reply_accepts_finite_and_integer_fields():
    content = RecordDict(
        {
            "report": ArrayRecord(
                {"sign": torch.tensor([1, -1], dtype=torch.int8), "x": torch.tensor([0.5, -2.0])}
            ),
            "metrics": MetricRecord({"num-examples": 3, "loss": 0.1}),
            "meta": _meta(0),
        }
    )
    check_finite_reply(content, "node 1")
    assert client_label(1, content) == "node 1 (partition 0)"
    check_finite_reply(
        RecordDict({"meta": ConfigRecord({"epsilon_target": float("inf")})}), "node 1"
    )


def test_check_finite_reply_accepts_finite_values_whose_sum_overflows():
    # the check's one pass is a float64 sum: finite values may overflow it, and are finite
    big = np.full(4, np.finfo(np.float64).max)
    check_finite_reply(RecordDict({"partial_sums": ArrayRecord([big]), "meta": _meta(0)}), "node 1")
    big[2] = np.nan
    with pytest.raises(ClientFailure, match="partial_sums"):
        check_finite_reply(RecordDict({"partial_sums": ArrayRecord([big])}), "node 1")
    halves = np.array([1.0 + 1j, complex(np.inf, 0)])
    with pytest.raises(ClientFailure):
        check_finite_reply(RecordDict({"partial_sums": ArrayRecord([halves])}), "node 1")


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=np.int64),
        np.asfortranarray(np.ones((3, 2))),
        np.zeros((0, 16), dtype=np.float32),
        np.float64(2.5),
    ],
)
def test_read_only_tensors_equal_the_copies_and_share_the_message_bytes(array):
    from fedgraph.messaging import array_view, read_only_tensors, tensors

    rec = ArrayRecord([np.asarray(array)])
    (name,) = rec.keys()
    view, copy = read_only_tensors(rec)[name], tensors(rec)[name]
    assert view.dtype == copy.dtype and torch.equal(view, copy)
    a = array_view(rec[name])
    if not np.isfortran(np.asarray(array)):  # a read-only view of the message's bytes
        assert not a.flags.writeable and (not a.flags.owndata or not a.size)


class _ReplyGrid:
    """A grid answering every message with a fixed reply content (by destination node)."""

    def __init__(self, replies):
        from flwr.supercore.task_identity import TaskIdentity

        for attr, value in (("run_id", 1), ("node_id", 0), ("task_id", 0)):
            if getattr(TaskIdentity, f"_{attr}") is None:
                setattr(TaskIdentity, attr, value)
        self.replies = replies

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Message

        out = []
        for m in messages:
            out.append(Message(self.replies[m.metadata.dst_node_id], reply_to=m))
        return out


def test_send_to_all_fails_the_round_on_a_nan_reply():
    good = RecordDict({"partial_sums": ArrayRecord({"s": torch.ones(2, 3)}), "meta": _meta(0)})
    bad = RecordDict(
        {"partial_sums": ArrayRecord({"s": torch.full((2, 3), float("nan"))}), "meta": _meta(1)}
    )
    grid = _ReplyGrid({1: good, 2: bad})
    with pytest.raises(
        ClientFailure,
        match=r"query.gap_pma: node 2 \(partition 1\).*"
        r"partial_sums\['s'\]",
    ):
        send_to_all(grid, "query.gap_pma", {1: RecordDict(), 2: RecordDict()}, 10)
    assert set(
        send_to_all(
            _ReplyGrid({1: good, 2: good}), "query.gap_pma", {1: RecordDict(), 2: RecordDict()}, 10
        )
    ) == {1, 2}


# End to end: each method's real strategy and ClientApp in one process; one client's reply of a
# given type is corrupted on its way to the server.
GAP = {
    "method": "gap",
    "dataset": "cora",
    "min-class-size": 1,
    "num-clients": 2,
    "partitioner": "louvain",
    "encoder-rounds": 1,
    "classifier-rounds": 1,
    "local-epochs": 1,
    "client-epsilons": "4",
}
PRIVGNN = {
    "method": "privgnn",
    "dataset": "cora",
    "num-clients": 2,
    "num-queries": 6,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 20,
    "teacher-epochs": 5,
    "teacher-hidden": 8,
    "teacher-batch-size": 8,
    "projection-dim": 16,
    "epochs": 20,
    "hidden": 8,
    "neighbourhood-size": 10,
    "client-epsilons": "inf",
}
PPGNN = {
    "method": "ppgnn",
    "dataset": "cora",
    "num-clients": 2,
    "mechanism": "laplace",
    "epsilon": 1.0,
    "epochs": 5,
}


def _corrupting(message_type, record, value):
    """A LocalGrid ``tamper``: the first float array (or metric) of the reply of node 2 to
    ``message_type`` in record ``record`` is replaced by ``value`` everywhere; counts in
    ``.corrupted``."""

    def tamper(m, r):
        if (
            m.metadata.message_type == message_type
            and m.metadata.dst_node_id == 2
            and not r.has_error()
        ):
            rec = r.content[record]
            if isinstance(rec, MetricRecord):
                rec[next(iter(rec))] = value
            else:
                arrays = rec.to_torch_state_dict()
                key = next(k for k, a in arrays.items() if a.is_floating_point())
                arrays[key] = torch.full_like(arrays[key], value)
                r.content[record] = ArrayRecord(arrays)
            tamper.corrupted += 1
        return r

    tamper.corrupted = 0
    return tamper


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize(
    "run_config,message_type,record",
    [
        (GAP, "query.gap_pma", "partial_sums"),
        (GAP, "train", "arrays"),
        (GAP, "train", "metrics"),
        (PRIVGNN, "query.privgnn", "answers"),
        (PPGNN, "query.ppgnn", "report"),
    ],
    ids=[
        "gap-partial-sums",
        "gap-trained-arrays",
        "gap-train-metrics",
        "privgnn-answers",
        "ppgnn-report",
    ],
)
def test_a_non_finite_reply_fails_the_run_naming_the_client(
    tmp_path, value, run_config, message_type, record
):
    from fedgraph.federation import preflight
    from fedgraph.simulations.local import LocalGrid
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(
        {**run_config, "output-dir": str(tmp_path), "run-name": "run"}
    )
    preflight(cfg)
    tamper = _corrupting(message_type, record, value)
    with pytest.raises(ClientFailure) as err:
        strategy_cls(cfg).start(LocalGrid(cfg.num_clients, tamper=tamper))
    assert tamper.corrupted >= 1
    msg = str(err.value)
    assert "node 2" in msg and "non-finite" in msg and f"{record}[" in msg
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"


# ------------------------------------------------------------------- noise scales and epsilons
def _pma_partial_sums(**kw):
    from fedgraph.methods.gap.client_pma import pma_partial_sums

    h = torch.ones(3, 2)
    local = torch.tensor([[0, 1], [1, 2]])
    boundary = torch.tensor([[0], [7]])
    args = {"sigma": 1.0, **kw}
    return pma_partial_sums(h, local, boundary, generator=torch.Generator(), **args)


def _cases():
    """``(name, argument, call(value), zero allowed)`` for every mechanism and every
    noise-adding function of fedgraph.methods."""
    from fedgraph import mechanisms as M
    from fedgraph.methods import gap as G
    from fedgraph.methods import privgnn as P

    x = torch.zeros(4, 3)
    lv = torch.tensor([1, 2, 1, 2])
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    y = torch.tensor([0, 1, 0, 1])
    return [
        ("pma_partial_sums", "sigma", lambda v: _pma_partial_sums(sigma=v), True),
        ("pma_partial_sums", "remote_sigma", lambda v: _pma_partial_sums(remote_sigma=v), False),
        ("gap.perturb", "sigma", lambda v: G.perturb(x, v), True),
        ("gap.pma", "sigma", lambda v: G.pma(x, ei, 2, v), True),
        ("gap.sage_dp_features", "sigma", lambda v: G.sage_dp_features(x, ei, 4, v), True),
        ("gap.DPSGD", "noise_multiplier", lambda v: G.DPSGD(v), False),
        (
            "gap.train_sage_dp",
            "noise_multiplier",
            lambda v: G.train_sage_dp(
                torch.nn.Linear(3, 2),
                x,
                y,
                torch.ones(4, dtype=torch.bool),
                epochs=1,
                batch_size=None,
                noise_multiplier=v,
                max_grad_norm=1.0,
            ),
            False,
        ),
        ("privgnn.laplace_noise", "scale", lambda v: P.laplace_noise((2, 3), v), False),
        ("privgnn.noisy_answers", "lam", lambda v: P.noisy_answers(torch.ones(2, 3) / 3, v), False),
        ("mechanisms.laplace", "epsilon", lambda v: M.laplace(x, v), False),
        ("mechanisms.gaussian", "epsilon", lambda v: M.gaussian(x, v, 1e-5), False),
        ("mechanisms.gaussian", "delta", lambda v: M.gaussian(x, 1.0, v), False),
        ("mechanisms.one_bit", "epsilon", lambda v: M.one_bit(x, v), False),
        ("mechanisms.local_randomizer", "epsilon", lambda v: M.local_randomizer(x, v), False),
        ("mechanisms.multi_bit", "epsilon", lambda v: M.multi_bit(x, v), False),
        ("mechanisms.esw", "epsilon", lambda v: M.esw(lv, v, 2, 0), False),
        (
            "mechanisms.randomized_response",
            "epsilon",
            lambda v: M.randomized_response(y, 2, v),
            False,
        ),
        *[
            (
                f"mechanisms.make_mechanism({name!r})",
                "epsilon",
                lambda v, name=name: M.make_mechanism(name, budgets=[1.0], epsilon=v),
                False,
            )
            for name in ("laplace", "gaussian", "one-bit", "multi-bit")
        ],
        (
            "mechanisms.make_mechanism('ppm')",
            "budgets",
            lambda v: M.make_mechanism("ppm", budgets=[v, 5.0]),
            False,
        ),
    ]


_CASES = _cases()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
@pytest.mark.parametrize("case", _CASES, ids=[f"{c[0]}-{c[1]}" for c in _CASES])
def test_every_noise_function_validates_its_scale(case, bad):
    name, arg, call, zero_ok = case
    if bad == 0.0 and zero_ok:
        call(bad)  # documented "no noise" (GAP-inf), recorded as unprotected
        return
    if arg == "delta" and bad == float("inf"):
        bad = 2.0
    with pytest.raises(ValueError) as err:
        call(bad)
    msg = str(err.value)
    assert arg.split("_")[0] in msg or arg in msg, f"{name}: {msg}"


def test_pma_partial_sums_noise_is_really_added():
    """The faults' example: sigma nan or -1 used to return the exact noise-free sums."""
    clean, _, clean_remote = _pma_partial_sums(sigma=0.0)
    noisy, _, noisy_remote = _pma_partial_sums(sigma=1.0)
    assert not torch.equal(clean, noisy) and not torch.equal(clean_remote, noisy_remote)
