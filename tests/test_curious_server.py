"""The curious server (issue 13, fault 1): given everything it receives (the run config, its own
messages, the clients' replies), it tries to rebuild a client's noise with every construction
it could know of and must fail, for every method's client release and every noise source.

The adversary here is stronger than the server: it also knows the client's private data, so it
can rerun the client's exact computation (``fedgraph.methods``) with each candidate generator.
Knowing the noise is the same as reproducing the release from the data, so "no candidate
reproduces the release" means "no candidate recovers the noise". Before the fix the client
seeded ``crc32(f"{seed}:{pid}:...")`` from the run config's seed: the replay was exact (the
GAP rows' residual norms were ``[0, 0, 0, 0, 1]``: the noise-free sums).

This file runs on the code before the fix too (``-k default``): the new module is optional.
"""

import copy
import json
import zlib

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedgraph.config import parse_run_config
from fedgraph.federation import client_view
from fedgraph.messaging import tensors

try:  # the fix; absent on the old code
    from fedgraph import randomness
except ImportError:  # pragma: no cover - only on the code before the fix
    randomness = None

SECRET = "curious-server-test-secret-1f3a"
PID = 1

GAP = {
    "method": "gap",
    "dataset": "cora",
    "num-clients": 2,
    "client-epsilons": "1",
    "hops": 1,
    "encoder-dim": 8,
    "hidden": 8,
    "seed": 3,
}
PROGAP = {
    "method": "progap",
    "dataset": "cora",
    "num-clients": 2,
    "client-epsilons": "1",
    "depth": 1,
    "hidden": 8,
    "accountant": "rdp",
    "seed": 3,
}
PPGNN = {"method": "ppgnn", "dataset": "cora", "num-clients": 2, "label-epsilon": 0.5, "seed": 3}
PRIVGNN = {
    "method": "privgnn",
    "dataset": "cora",
    "num-clients": 2,
    "num-queries": 4,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 20,
    "teacher-epochs": 3,
    "teacher-hidden": 8,
    "teacher-batch-size": 4,
    "projection-dim": 16,
    "neighbourhood-size": 10,
    "client-epsilons": "inf",
    "seed": 3,
}

#: "default": no noise-source key, i.e. ``secure`` (on the old code: what ran there)
SOURCES = ["default", "secret", "secure", "mt19937"]


@pytest.fixture(autouse=True)
def _identity(monkeypatch):
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _config(base: dict, source: str, monkeypatch):
    if source == "secret":
        monkeypatch.setenv("FEDGRAPH_NOISE_SECRET", SECRET)
    return parse_run_config(base if source == "default" else {**base, "noise-source": source})


def _context() -> Context:
    return Context(
        run_id=1,
        node_id=PID + 1,
        node_config={"partition-id": PID},
        state=RecordDict(),
        run_config={},
    )


def _own(cfg, ctx: Context) -> Context:
    """``ctx`` with the client's own run config (its budget: issue 60), the message's."""
    ctx.run_config = cfg.model_dump()
    return ctx


def _message(cfg, message_type: str, **records) -> Message:
    content = RecordDict(
        {"config": ConfigRecord({"json": json.dumps(cfg.model_dump())}), **records}
    )
    return Message(content=content, dst_node_id=PID + 1, message_type=message_type)


def _guesses(cfg, purpose: str):
    """Every generator the server can build from what it holds: the old crc32 construction,
    torch seeded with the run's seed, the partition id or both, the global RNG seeded as the
    server seeds its own (``torch.manual_seed(seed)``: generator ``None``), and the new
    construction keyed with anything from the run config in place of the client's secret."""
    seed = cfg.seed
    old = f"{seed}:{PID}:{purpose}"  # the construction before the fix
    out = {f"torch seed {s}": torch.Generator().manual_seed(s) for s in {seed, PID, 0}}
    out[f"crc32({old!r})"] = torch.Generator().manual_seed(zlib.crc32(old.encode()))
    out["global RNG after torch.manual_seed(seed)"] = None
    if hasattr(cfg, "noise_source"):  # the construction of the run's noise source, wrong root key
        digest = randomness.run_digest(cfg)
        make = (
            randomness.SecureRandom
            if cfg.noise_source in ("secure", "secret")
            else randomness.torch_generator
        )
        for guess in (b"", str(seed).encode(), json.dumps(cfg.model_dump()).encode()):
            key = randomness.derive_key(guess, digest, PID, purpose)
            out[f"{make.__name__} keyed from {guess[:12]!r}"] = make(key)
    return out


def _replay(fn, gen, seed):
    torch.manual_seed(seed)  # the global RNG as the server seeded it
    try:
        return fn(gen)
    except TypeError:  # a SecureRandom guess where the old code needs a torch.Generator
        return None


# ---------------------------------------------------------------------------------- GAP
def _gap_release(cfg):
    """Hop 1 of PMA through the real handler: the rows client ``PID`` releases for the nodes
    held by the other client, and everything needed to rerun it."""
    from fedgraph.methods.gap.client_pma import client_edges, pma_partial_sums
    from fedgraph.methods.gap.models import build_encoder
    from fedgraph.simulations import client_app

    view = client_view(cfg, PID)
    s = view.statistics
    torch.manual_seed(0)
    encoder = build_encoder(cfg, s["num_features"], s["num_classes"])
    msg = _message(
        cfg,
        "query.gap_pma",
        pma=ConfigRecord({"hop": 1, "graph": "all"}),
        encoder=ArrayRecord(encoder.state_dict()),
    )
    reply = client_app.gap_pma(msg, _own(cfg, _context()))
    out = tensors(reply.content["partial_sums"])
    from fedgraph.methods.gap.privacy import privacy_plan

    sigma = privacy_plan(cfg, cfg.client_epsilon(PID), int(view.graph.train_mask.sum())).sigma
    with torch.no_grad():
        h0 = encoder.eval().embed(view.graph.x)

    def rerun(gen):
        local, boundary = client_edges(view.graph, cfg, gen, None)
        return pma_partial_sums(h0, local, boundary, sigma, gen, remote_ids=out["ids"])[2]

    clean = pma_partial_sums(
        h0, *client_edges(view.graph, cfg, None, None), 0.0, None, remote_ids=out["ids"]
    )[2]
    return out["sums"], clean, sigma, rerun


@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_remove_gap_pma_noise(source, monkeypatch):
    cfg = _config(GAP, source, monkeypatch)
    released, clean, sigma, rerun = _gap_release(cfg)
    _assert_no_guess_removes_row_noise(cfg, source, "gap:pma1", rerun, released, clean, sigma)


def _assert_no_guess_removes_row_noise(cfg, source, purpose, rerun, released, clean, sigma):
    """No generator of :func:`_guesses` makes ``rerun`` (the client's noisy rows) give the
    noise of the ``released`` rows ``[m, e]`` (noise std ``sigma`` per entry) back: their
    noise-free rows ``clean`` stay out of reach."""
    assert sigma > 0 and released.shape == clean.shape and released.shape[0] > 100
    scale = sigma * released.shape[1] ** 0.5  # norm of a row's noise
    for name, gen in _guesses(cfg, purpose).items():
        replayed = _replay(rerun, gen, cfg.seed)
        if replayed is None:
            continue
        # the server's estimate of the noise-free rows: release - replayed noise
        residual = released - (replayed - clean)
        err = (residual - clean).norm(dim=1)
        assert float(err.median()) > 0.5 * scale, (
            f"{source}: the server removes the noise with '{name}': residual norms of the "
            f"first rows {residual[:5].norm(dim=1).tolist()} against the clean "
            f"{clean[:5].norm(dim=1).tolist()}"
        )


# ---------------------------------------------------------------------------------- PPGNN
@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_replay_ppgnn_reports(source, monkeypatch):
    from fedgraph.methods import ppgnn
    from fedgraph.simulations import client_app

    cfg = _config(PPGNN, source, monkeypatch)
    reply = client_app.ppgnn_query(_message(cfg, "query.ppgnn"), _own(cfg, _context()))
    report = tensors(reply.content["report"])
    view = client_view(cfg, PID, cfg.budgets, cfg.shares)
    random_keys = [k for k in report if k.startswith("mech.")] + ["labels"]

    def rerun(gen):
        return ppgnn.client_report(
            view.graph, cfg, view.feature_domain, view.statistics["num_classes"], gen
        )

    for name, gen in _guesses(cfg, "ppgnn").items():
        replayed = _replay(rerun, gen, cfg.seed)
        if replayed is None:
            continue
        same = sum(
            int((replayed[k] == report[k]).sum())
            for k in random_keys
            if replayed[k].shape == report[k].shape
        )  # another shape: nothing replayed
        total = sum(report[k].numel() for k in random_keys)
        # independent draws agree on part of the entries (bits, signs, levels), never on all
        assert same / total < 0.99, f"{source}: '{name}' replays {same}/{total} report entries"


# ---------------------------------------------------------------------------------- PrivGNN
@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_remove_privgnn_answer_noise(source, monkeypatch):
    from test_device_clients import _queries  # the queries the strategy sends

    from fedgraph.methods import privgnn as pf
    from fedgraph.simulations import client_app

    cfg = _config(PRIVGNN, source, monkeypatch)
    arrays = _queries(cfg, 4)
    msg = _message(cfg, "query.privgnn", queries=ArrayRecord(arrays))
    answers = client_app.privgnn_query(msg, _own(cfg, _context())).content["answers"]
    answers = answers.to_torch_state_dict()["answers"]
    assert answers.shape[0] == 4
    scale = 2.0 / cfg.lam  # Laplace scale of every coordinate

    def rerun(gen):
        return pf.client_answer(cfg, PID, arrays, 0, gen).answers

    for name, gen in _guesses(cfg, "privgnn:0").items():
        replayed = _replay(rerun, gen, cfg.seed)
        if replayed is None:
            continue
        # replayed - answers = (their noise - our noise) + (their teachers - ours): the noise
        # alone has mean |.| ~ 1.5 scale; an exact replay gives 0
        err = (replayed - answers).abs().mean()
        assert float(err) > 0.3 * scale, f"{source}: '{name}' replays the answers (err {err})"


# ---------------------------------------------------------------------------------- GAP DP-SGD
@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_replay_gap_dp_sgd(source, monkeypatch):
    """Node-level GAP: the weights a client returns after a DP-SGD round (Poisson sampling and
    Gaussian noise from the client's generator) cannot be reproduced from the weights the
    server sent."""
    from fedgraph.methods.gap import local_train
    from fedgraph.methods.gap.models import build_encoder
    from fedgraph.methods.gap.privacy import privacy_plan
    from fedgraph.simulations import client_app

    cfg = _config(
        {**GAP, "level": "node", "local-epochs": 1, "client-epsilons": "8", "accountant": "rdp"},
        source,  # fast calibration; the noise is the point
        monkeypatch,
    )
    view = client_view(cfg, PID)
    s, g = view.statistics, view.graph
    torch.manual_seed(0)
    sent = build_encoder(cfg, s["num_features"], s["num_classes"]).state_dict()
    msg = Message(
        RecordDict(
            {
                "config": ConfigRecord(
                    {
                        "json": json.dumps(cfg.model_dump()),
                        "phase": "gap.encoder",
                        "server-round": 1,
                    }
                ),
                "arrays": ArrayRecord(sent),
            }
        ),
        dst_node_id=PID + 1,
        message_type="train",
    )
    back = client_app.gap_train(msg, _own(cfg, _context())).content["arrays"].to_torch_state_dict()
    dp = privacy_plan(cfg, cfg.client_epsilon(PID), int(g.train_mask.sum())).dpsgd(cfg)
    assert dp is not None and dp.noise_multiplier > 0

    def rerun(gen):
        model = build_encoder(cfg, s["num_features"], s["num_classes"])
        model.load_state_dict(sent)
        local_train(
            model,
            g.x,
            g.y,
            g.train_mask,
            cfg.local_epochs,
            cfg.dpsgd_batch_size,
            cfg.lr,
            dp,
            generator=gen,
        )
        return model.state_dict()

    _assert_no_guess_replays_dp_sgd(cfg, source, "gap:gap.encoder:1", rerun, back)


def _assert_no_guess_replays_dp_sgd(cfg, source, purpose, rerun, back):
    """No generator of :func:`_guesses` makes ``rerun`` (a DP-SGD round from the weights
    sent) return the weights ``back`` the client sent."""
    for name, gen in _guesses(cfg, purpose).items():
        replayed = _replay(rerun, gen, cfg.seed)
        if replayed is None:
            continue
        diff = max(float((replayed[k] - back[k]).abs().max()) for k in back)
        # Adam moves each weight by ~lr per step: other noise, other steps
        assert diff > 0.1 * cfg.lr, f"{source}: '{name}' replays the DP-SGD round ({diff})"


# ---------------------------------------------------------------------------------- ProGAP
def _progap_model(cfg, view):
    from fedgraph.methods.progap.client import build_model

    torch.manual_seed(0)
    return build_model(cfg, view.schema["num_features"], view.schema["num_classes"])


@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_remove_progap_aggregation_noise(source, monkeypatch):
    """ProGAP's first aggregation through the real handler (step ``release``: the rows client
    ``PID`` sends for the other client's nodes) cannot be rerun without its noise."""
    from fedgraph.methods.gap.client_pma import client_edges, pma_partial_sums
    from fedgraph.methods.progap.client import client_plan
    from fedgraph.methods.progap.privacy import gap_edges_config
    from fedgraph.nn.gap import normalize_rows
    from fedgraph.simulations import client_app

    cfg = _config(PROGAP, source, monkeypatch)
    view = client_view(cfg, PID)
    model = _progap_model(cfg, view)
    msg = _message(
        cfg,
        "query.progap_aggregate",
        arrays=ArrayRecord(model.state_dict()),
        agg=ConfigRecord({"stage": 1, "step": "release"}),
    )
    released = tensors(
        client_app.progap_aggregate(msg, _own(cfg, _context())).content["partial_sums"]
    )
    sigma = client_plan(cfg, PID, view).sigma
    model.set_stage(0)
    with torch.no_grad():
        h = normalize_rows(model.eval().embed(view.graph.x))
    edges = gap_edges_config(cfg)

    def rerun(gen):
        local, boundary = client_edges(view.graph, edges, gen)
        return pma_partial_sums(h, local, boundary, sigma, gen, remote_ids=released["ids"])[2]

    clean = pma_partial_sums(
        h, *client_edges(view.graph, edges, None), 0.0, None, remote_ids=released["ids"]
    )[2]
    _assert_no_guess_removes_row_noise(
        cfg, source, "progap:aggregation1", rerun, released["sums"], clean, sigma
    )


@pytest.mark.parametrize("source", SOURCES)
def test_server_cannot_replay_progap_dp_sgd(source, monkeypatch):
    """Node-level ProGAP: a stage-0 DP-SGD round's weights (Poisson sampling and Gaussian
    noise from the client's generator) cannot be reproduced from the weights sent."""
    from fedgraph.methods.gap import local_train
    from fedgraph.methods.progap.client import client_plan
    from fedgraph.simulations import client_app

    cfg = _config(
        {**PROGAP, "level": "node", "epochs": 1, "client-epsilons": "8", "batch-size": 4096},
        source,  # full batches: one noised step, fast
        monkeypatch,
    )
    view = client_view(cfg, PID)
    g = view.graph
    initial = _progap_model(cfg, view)
    sent = initial.state_dict()
    msg = Message(
        content=RecordDict(
            {
                "config": ConfigRecord(
                    {"json": json.dumps(cfg.model_dump()), "stage": 0, "server-round": 1}
                ),
                "arrays": ArrayRecord(sent),
            }
        ),
        dst_node_id=PID + 1,
        message_type="train.progap_stage",
    )
    back = (
        client_app.progap_train(msg, _own(cfg, _context())).content["arrays"].to_torch_state_dict()
    )
    dp = client_plan(cfg, PID, view).dpsgd(cfg.max_grad_norm)
    assert dp is not None and dp.noise_multiplier > 0

    def rerun(gen):
        model = copy.deepcopy(initial)  # the weights sent, no draw from the global RNG
        model.set_stage(0)
        local_train(
            model,
            g.x,
            g.y,
            g.train_mask,
            cfg.local_epochs,
            cfg.dpsgd_batch_size,
            cfg.lr,
            dp,
            generator=gen,
            num_public=int(g.train_mask.sum()),
        )
        return model.state_dict()

    _assert_no_guess_replays_dp_sgd(cfg, source, "progap:train:0:1", rerun, back)
