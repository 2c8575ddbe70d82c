"""Federated PrivGNN: config errors, budgets and refusals, what leaves a client, a Flower run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedgraph.config import ConfigError, PrivGNNConfig, parse_run_config
from fedgraph.methods import privgnn as pf
from fedgraph.methods import privgnn as pg

ROOT = Path(__file__).parents[1]


def transcript_until(log, node, request) -> str:
    """The transcript ``node`` held when it answered ``request`` (``log``: the grid's ``(node,
    request, reply)`` in order): what its noise key binds besides its data (issue 60)."""
    from fedgraph.simulations.client_guard import transcript_of

    mine = [m for n, m, _ in log if n == node]
    return transcript_of(mine[: next(i for i, m in enumerate(mine) if m is request) + 1])


#: tiny and fast: Cora (bundled), small teachers on a 16-dim public PCA
SMALL = {
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
}


# --------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("lam", 0.0, "greater than 0"),
        ("lam", "nan", "finite"),
        ("lam", float("inf"), "finite"),
        ("gamma", 0.0, "greater than 0"),
        ("gamma", 1.5, "less than or equal to 1"),
        ("client-epsilons", "0,1", "allowed: (0, inf]"),
        ("client-epsilons", "1,,2", "empty entry"),
        ("query-policy", "greedy", "'random' or 'entropy'"),
        ("answer-mode", "logits", "'posterior', 'vote'"),
        ("num-queries", 0, "greater than or equal to 1"),
        ("public-fraction", 1.0, "less than 1"),
        ("delta", 1.0, "must lie in [1e-12, 1)"),
        ("partitioner", "nope", "allowed:"),
        ("no-such-key", 1, "unknown key; allowed keys:"),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(key, value, expect):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": "privgnn", key: value})
    assert key in str(err.value) and expect in str(err.value), str(err.value)


def test_strategy_name_selects_the_config_and_pyproject_keys_validate():
    import tomllib

    from fedgraph.simulations.server_app import validate_run_config
    from fedgraph.strategies import PrivGNNStrategy

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    # flwr run passes every declared key (PPGNN's method default) plus the user's strategy
    # (num-clients = 0 there: the ServerApp sets it from the grid first)
    strategy, cfg = validate_run_config({**declared, "strategy": "privgnn", "num-clients": 5})
    assert strategy is PrivGNNStrategy and isinstance(cfg, PrivGNNConfig)
    assert cfg.lam == declared["lam"] and cfg.num_queries == declared["num-queries"]
    cfg = parse_run_config({"method": "privgnn", "client-epsilons": "1,inf"})
    assert [cfg.client_epsilon(i) for i in range(3)] == [1.0, float("inf"), 1.0]


# --------------------------------------------------------------------- budgets, refusals
def test_answer_limit_is_the_largest_count_within_the_target():
    lam, rate, delta = 1.0, 0.3, 1e-4
    e2, e3 = (pg.privgnn_epsilon(q, rate, lam, delta, "pld") for q in (2, 3))
    target = (e2 + e3) / 2
    assert pf.answer_limit(target, delta, rate, lam, wanted=10) == 2
    assert pf.answer_limit(target, delta, rate, lam, wanted=1) == 1
    assert pf.answer_limit(float("inf"), delta, rate, lam, wanted=7) == 7
    assert pf.answer_limit(1e-3, delta, rate, lam, wanted=5) == 0


def test_client_answers_stop_at_its_budget_and_the_server_keeps_the_rest():
    e2, e3 = (pg.privgnn_epsilon(q, 0.3, 1.0, 1e-4, "pld") for q in (2, 3))
    cfg = parse_run_config({**SMALL, "client-epsilons": f"{(e2 + e3) / 2},inf"})
    public, stats = pf.public_graph(cfg)
    C = stats["num_classes"]
    gen = torch.Generator().manual_seed(0)
    qidx = pg.select_queries(public, 3, generator=gen)
    arrays = pf.make_queries(public, qidx, cfg, gen)
    g = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    # round 1: client 0 answers the first 2 of 3 and refuses the last; client 1 answers all
    r0 = pf.client_answer(cfg, 0, arrays, 0, g())
    r1 = pf.client_answer(cfg, 1, arrays, 0, g())
    assert r0.answers.shape == (2, C) and r1.answers.shape == (3, C)
    assert (r0.meta["answered"], r0.meta["refused"], r0.meta["limit"]) == (2, 1, 2)
    assert r1.meta["refused"] == 0
    # round 2: client 0 has nothing left and refuses everything
    again = pf.client_answer(cfg, 0, arrays, r0.meta["answered_total"], g())
    assert again.answers.shape == (0, C) and again.meta["refused"] == 3
    # the server sums what it has: query 2 from client 1 alone; a query nobody answered drops
    agg = pf.aggregate_partial([r0.answers, r1.answers], 3, C)
    assert agg.kept.tolist() == [True, True, True] and agg.votes.tolist() == [2, 2, 1]
    expect = torch.cat([r0.answers + r1.answers[:2], r1.answers[2:]]).argmax(-1)
    assert torch.equal(agg.labels, expect)
    agg = pf.aggregate_partial([r0.answers, again.answers], 3, C)
    assert agg.kept.tolist() == [True, True, False] and agg.labels.numel() == 2
    assert torch.equal(agg.labels, r0.answers.argmax(-1))


def test_queries_travel_exactly():
    """The sparse encoding of the public neighbourhoods is lossless."""
    cfg = parse_run_config(SMALL)
    public, _ = pf.public_graph(cfg)
    gen = torch.Generator().manual_seed(0)
    qidx = pg.select_queries(public, 4, generator=gen)
    hoods = pg.query_neighbourhoods(public, qidx, 2, 10, torch.Generator().manual_seed(0))
    arrays = pf.encode_queries(hoods)
    assert "x" not in arrays and arrays["x_value"].numel() < hoods.x.numel() / 10
    back, proj = pf.decode_queries(arrays)
    assert proj is None and torch.equal(back.x, hoods.x.float())
    assert torch.equal(back.query_x, public.x[qidx])
    sub = pf.first_queries(back, 2)
    assert sub.center.numel() == 2 and int(sub.edge_index.max()) < int(back.ptr[2])


# ------------------------------------------------- the strategy with the real client handler
class InProcessGrid:
    """Flower's ``grid`` in-process: each message goes to the real ClientApp handler of its
    type with a per-node Context; every request and reply is kept for inspection."""

    def __init__(self, num_clients, monkeypatch, run_config=None):
        from fedgraph.identity import ensure_simulation_secret
        from fedgraph.simulations import client_app

        ensure_simulation_secret()  # as a launcher: the clients' identity keys (secagg)
        self.handlers = {
            "query.privgnn": client_app.privgnn_query,
            "query.privgnn_keys": client_app.privgnn_keys,
        }
        self.contexts = {
            n: Context(
                run_id=1,
                node_id=n,
                node_config={"partition-id": n - 1},
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for n in range(1, num_clients + 1)
        }
        self.monkeypatch, self.log = monkeypatch, []
        for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
            monkeypatch.setattr(TaskIdentity, attr, value)

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for m in messages:
            node = m.metadata.dst_node_id
            self.monkeypatch.setattr(TaskIdentity, "_node_id", node)  # the reply's source
            replies.append(self.handlers[m.metadata.message_type](m, self.contexts[node]))
            self.log.append((node, m, replies[-1]))
        self.monkeypatch.setattr(TaskIdentity, "_node_id", 0)
        return replies


def _run_strategy(run_config, tmp_path, monkeypatch):
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(
        {**run_config, "output-dir": str(tmp_path), "run-name": "run"}
    )
    grid = InProcessGrid(cfg.num_clients, monkeypatch, cfg.model_dump())  # clients' own config
    report = strategy_cls(cfg).start(grid)
    return cfg, grid, report


def test_strategy_copes_with_refusals_and_records_each_client(tmp_path, monkeypatch):
    """Two rounds (entropy policy): client 0's budget covers 2 answers, client 1's none; the
    server trains on the queries client 0 answered, drops the others, and the ledger and the
    report hold each client's count."""
    e2, e3 = (pg.privgnn_epsilon(q, 0.3, 1.0, 1e-4, "pld") for q in (2, 3))
    cfg, grid, report = _run_strategy(
        {**SMALL, "client-epsilons": f"{(e2 + e3) / 2},1e-3", "query-policy": "entropy"},
        tmp_path,
        monkeypatch,
    )
    assert report["status"] == "ok"
    clients = report["clients"]
    assert clients["client-0"] == {
        "epsilon_target": pytest.approx((e2 + e3) / 2),
        "asked": 6,
        "answered": 2,
        "refused": 4,
        "limit": 2,
    }
    assert clients["client-1"]["answered"] == 0 and clients["client-1"]["refused"] == 6
    q = report["queries"]
    assert [r["policy"] for r in q["rounds"]] == ["random", "entropy"]
    assert (q["asked"], q["kept"], q["dropped"]) == (6, 2, 4)
    per = report["privacy"]["per_subject"]
    assert list(per) == ["client-0"]  # client 1 released nothing
    assert per["client-0"]["epsilon"] == pytest.approx(e2, rel=1e-6)
    assert per["client-0"]["epsilon"] <= per["client-0"]["rdp"]["epsilon"]
    assert per["client-0"]["cross_check"]["agrees"]
    assert 0.0 <= report["accuracy"]["test"] <= 1.0
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "ok"
    # every message went through the real client handler: 2 rounds x 2 clients
    assert len(grid.log) == 4


def test_log_softmax_paper_mode_reports_no_finite_epsilon(tmp_path, monkeypatch):
    """answer-mode = log-softmax-paper (the authors' release: Laplace(1/lam) on log-softmax)
    is not DP: every client's epsilon is inf (strict JSON "inf", never a number), the paper's
    figure appears only as ``claimed`` with ``holds: false``, and the report says why. Before,
    the mode did not exist; a Laplace figure would have been the only epsilon."""
    _, _, report = _run_strategy(
        {**SMALL, "answer-mode": "log-softmax-paper", "client-epsilons": "inf"},
        tmp_path,
        monkeypatch,
    )
    assert report["status"] == "ok"
    text = (tmp_path / "run.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    disk = json.loads(text)
    assert disk["privacy"]["model"].startswith("NONE: not differentially private")
    assert "unbounded" in disk["privacy"]["not_dp_reason"]
    claim = pg.privgnn_epsilon(6, 0.3, 1.0, 1e-4, "pld")  # 6 answers per client
    for subject in ("client-0", "client-1"):
        row = disk["privacy"]["per_subject"][subject]
        assert row["epsilon"] == "inf" and row["accountant"] == "none"
        assert [r["event"] for r in row["releases"]] == ["none"]
        assert "log-softmax" in row["releases"][0]["reason"]
        assert row["claimed"]["holds"] is False
        assert row["claimed"]["by"] == ["Olatunji et al. (TMLR 2023)"]
        assert row["claimed"]["epsilon"] == pytest.approx(claim, rel=1e-6)


def test_log_softmax_paper_answers_are_log_probabilities_plus_laplace_of_scale_1_over_lam():
    post = torch.tensor([[0.7, 0.2, 0.1]]).repeat(20000, 1)
    out = pg.noisy_answers(post, 0.5, "log-softmax-paper", torch.Generator().manual_seed(0))
    noise = out - post.log()
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.03)
    assert float(noise.abs().mean()) == pytest.approx(1 / 0.5, rel=0.02)  # E|Lap(b)| = b


def test_strategy_fails_loudly_when_nobody_answers(tmp_path, monkeypatch):
    with pytest.raises(
        RuntimeError, match="no query was labelled .*raise client-epsilons or lower lam"
    ):
        _run_strategy({**SMALL, "client-epsilons": "1e-3"}, tmp_path, monkeypatch)
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["status"] == "failed" and report["queries"]["dropped"] == 6


def test_what_leaves_a_client_is_only_noised_answers(tmp_path, monkeypatch):
    """Inspect the reply messages: one array, ``[m, C]`` answers, each equal to the teacher's
    clean posterior plus fresh Laplace noise of scale 2/lam (recomputed from the client's secret,
    ``noise-source = secret``), never the clean value; the metadata are counts fixed by public
    parameters."""
    from fedgraph.randomness import SECRET_ENV, client_generator

    monkeypatch.setenv(SECRET_ENV, "test-secret-privgnn")
    cfg, grid, _ = _run_strategy(
        {**SMALL, "client-epsilons": "inf", "noise-source": "secret"}, tmp_path, monkeypatch
    )
    public, stats = pf.public_graph(cfg)
    for node, request, reply in grid.log:
        pid = node - 1
        assert set(reply.content.keys()) == {"answers", "meta", "ledger"}
        arrays = reply.content["answers"].to_torch_state_dict()
        assert list(arrays) == ["answers"]
        answers = arrays["answers"]
        assert answers.shape == (cfg.num_queries, stats["num_classes"])
        meta = dict(reply.content["meta"])
        assert set(meta) == {
            "partition_id",
            "asked",
            "answered",
            "refused",
            "limit",
            "answered_total",
            "epsilon_target",
        }
        assert meta["limit"] == meta["asked"] == cfg.num_queries  # inf target
        # recompute: same secret, same queries -> the clean posteriors, then the noise
        hoods, proj = pf.decode_queries(request.content["queries"].to_torch_state_dict())
        graph, _ = pf.client_graph(cfg, pid)
        ctx = Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
        gen = client_generator(
            cfg, ctx, pid, "privgnn:0", data=graph, inputs=transcript_until(grid.log, node, request)
        )
        clean = pg.teacher_posteriors(
            graph,
            hoods.query_x,
            rate=cfg.gamma,
            k=cfg.num_neighbours,
            num_classes=stats["num_classes"],
            teacher=pf.teacher_config(cfg),
            neighbourhoods=hoods,
            projection=proj,
            generator=gen,
        )
        noise = pg.laplace_noise(clean.shape, 2.0 / cfg.lam, gen)
        assert torch.allclose(answers, clean + noise, atol=1e-5)
        assert bool(((answers - clean).abs() > 1e-6).all()), "a released coordinate is clean"
        assert torch.allclose(clean.sum(-1), torch.ones(len(clean)), atol=1e-5)


# ---------------------------------------------------------------------- real Flower run
def test_flower_run_student_beats_majority_at_a_generous_lambda(tmp_path):
    """`fedgraph run privgnn-cora` (Ray simulation engine), 2 clients, 80 queries, lam = 10
    (Laplace scale 0.2): the pseudo-labels beat the majority class by 5 points (misaligned
    answers would be at chance, 1/7) and so does the student, by any margin (over ten secrets
    its test accuracy ranged 0.37-0.49 against a majority of 0.33: which 54% of the labels are
    wrong moves it, and a float-rounding change in the teachers redraws that); client 1's tiny
    budget makes it refuse every query and the run still succeeds on client 0's answers."""
    out = tmp_path / "runs"
    (tmp_path / "empty").mkdir()  # a root without Cora's files (a missing one is refused)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FEDGRAPH_DATA": str(tmp_path / "empty"),
        "OMP_NUM_THREADS": "1",
        "FEDGRAPH_NOISE_SECRET": "e2e-privgnn-secret",
    }  # reproducible draws: an accuracy bar
    sets = {
        "noise-source": "'secret'",
        "num-clients": 2,
        "num-queries": 80,
        "lam": 10.0,
        "client-epsilons": "'inf,1e-3'",
        "teacher-epochs": 50,
        "epochs": 100,
        "output-dir": f"'{out}'",
        "run-name": "'e2e'",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedgraph.simulations.cli",
            "run",
            "privgnn-cora",
            "--num-cpus",
            "2",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "e2e.json").read_text())
    assert report["status"] == "ok" and report["ground_truth"]["dataset"]["num_nodes"] == 2708
    acc = report["accuracy"]
    assert acc["pseudo_label"] > acc["majority_class"] + 0.05, acc
    assert acc["test"] > acc["majority_class"], acc
    assert report["clients"]["client-0"]["answered"] == 80
    assert report["clients"]["client-1"]["refused"] == 80
    assert report["queries"]["kept"] == 80
    assert list(report["privacy"]["per_subject"]) == ["client-0"]
    assert "client-0" in res.stdout and "epsilon" in res.stdout
