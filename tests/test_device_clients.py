"""Device-aware clients (#6): PrivGNN's teachers run on ``resolve_device(cfg.device)``, their
random draws come from the seeded CPU generator, and what goes into the Flower message is a CPU
tensor. CI has no GPU: the CPU path (``cpu`` and ``auto``) is what runs there; the CUDA
comparisons run only where a GPU is visible."""

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch_geometric.data import Data

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods import privgnn as pf
from fedgraph.methods import privgnn as pg

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
    "client-epsilons": "inf",
}

has_gpu = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not has_gpu, reason="no GPU visible (CI): CPU path only")


def _queries(cfg, n=5):
    """The message tensors of ``n`` queries with a public PCA (as the strategy sends them)."""
    public, _ = pf.public_graph(cfg)
    gen = torch.Generator().manual_seed(0)
    qidx = pg.select_queries(public, n, generator=gen)
    proj = pg.public_projection(public.x, cfg.projection_dim, cfg.seed)
    return pf.make_queries(public, qidx, cfg, gen, proj)


def _answer(device: str, arrays, pid: int = 0):
    cfg = parse_run_config({**SMALL, "device": device})
    return pf.client_answer(cfg, pid, arrays, 0, torch.Generator().manual_seed(7))


def test_privgnn_answers_identical_on_cpu_and_auto():
    arrays = _queries(parse_run_config(SMALL))
    cpu, auto = _answer("cpu", arrays), _answer("auto", arrays)
    assert cpu.answers.device.type == "cpu" and auto.answers.device.type == "cpu"
    assert cpu.answers.shape == (5, 7) and cpu.meta == auto.meta
    if not has_gpu:  # auto is the CPU here: bit for bit the same answers
        assert torch.equal(cpu.answers, auto.answers)
    # the seed decides everything: a rerun is identical, another seed is not
    assert torch.equal(_answer("cpu", arrays).answers, cpu.answers)
    other = pf.client_answer(
        parse_run_config(SMALL), 0, arrays, 0, torch.Generator().manual_seed(8)
    )
    assert not torch.equal(other.answers, cpu.answers)


def _message(cfg, arrays) -> Message:
    content = RecordDict(
        {
            "config": ConfigRecord({"json": json.dumps(cfg.model_dump())}),
            "queries": ArrayRecord(arrays),
        }
    )
    return Message(content=content, dst_node_id=1, message_type="query.privgnn")


def test_privgnn_handler_puts_cpu_answers_in_the_message(monkeypatch):
    """Through the real ClientApp handler: the reply's ArrayRecord holds the client_answer
    result for the client's generator (``noise-source = secret``: reproducible from the
    client's secret), for ``cpu`` and ``auto`` alike."""
    from fedgraph.randomness import SECRET_ENV, client_generator
    from fedgraph.simulations import client_app
    from fedgraph.simulations.client_guard import TRANSCRIPT_STATE

    def transcript(ctx):  # the key binds the client's transcript (issue 60)
        return str(ctx.state[TRANSCRIPT_STATE]["digest"])

    monkeypatch.setenv(SECRET_ENV, "test-secret-device-clients")
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    arrays = _queries(parse_run_config(SMALL), 3)
    got = {}
    for device in ("cpu", "auto"):
        cfg = parse_run_config({**SMALL, "device": device, "noise-source": "secret"})
        ctx = Context(
            run_id=1,
            node_id=1,
            node_config={"partition-id": 1},
            state=RecordDict(),
            run_config=cfg.model_dump(),
        )  # the client's own config
        reply = client_app.privgnn_query(_message(cfg, arrays), ctx)
        answers = reply.content["answers"].to_torch_state_dict()["answers"]
        assert answers.device.type == "cpu" and answers.shape == (3, 7)
        expect = pf.client_answer(
            cfg,
            1,
            arrays,
            0,
            client_generator(
                cfg, ctx, 1, "privgnn:0", data=pf.client_graph(cfg, 1)[0], inputs=transcript(ctx)
            ),
        )
        assert torch.equal(answers, expect.answers)
        assert reply.content["meta"]["answered"] == 3
        got[device] = answers
    if not has_gpu:
        assert torch.equal(got["cpu"], got["auto"])


@pytest.mark.skipif(has_gpu, reason="a GPU is visible: device='cuda' is valid here")
def test_privgnn_cuda_without_gpu_is_a_config_error_naming_device():
    arrays = _queries(parse_run_config(SMALL), 2)
    with pytest.raises(ConfigError) as err:
        _answer("cuda", arrays)
    msg = str(err.value)
    assert msg.startswith("device:") and "no GPU" in msg and "'auto' or 'cpu'" in msg


def _continuous_private(n=60, f=6, c=3, seed=0):
    """Real-valued features (no distance ties, so retrieval picks the same nodes anywhere)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g)
    src = torch.randint(0, n, (200,), generator=g)
    dst = torch.randint(0, n, (200,), generator=g)
    return Data(
        x=x,
        y=torch.randint(0, c, (n,), generator=g),
        edge_index=torch.stack([src, dst]),
        num_nodes=n,
    )


def _answer_queries(device, private, query_x):
    teacher = pg.TeacherConfig(hidden=8, epochs=5, batch_size=4)
    return pg.answer_queries(
        private,
        query_x,
        rate=0.5,
        k=10,
        lam=1.0,
        num_classes=3,
        teacher=teacher,
        generator=torch.Generator().manual_seed(3),
        device=device,
    )


def test_answer_queries_device_argument_cpu():
    """``device`` given explicitly (the CPU here): same as the default, CPU output."""
    private = _continuous_private()
    qx = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    a, b = _answer_queries(None, private, qx), _answer_queries(torch.device("cpu"), private, qx)
    assert a.device.type == "cpu" and torch.equal(a, b)


@needs_gpu
def test_answer_queries_cuda_matches_cpu():
    """Same draws on both devices: the answers agree up to float arithmetic."""
    private = _continuous_private()
    qx = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    cpu, cuda = _answer_queries("cpu", private, qx), _answer_queries("cuda", private, qx)
    assert cuda.device.type == "cpu"
    torch.testing.assert_close(cuda, cpu, atol=1e-4, rtol=1e-4)


@needs_gpu
def test_privgnn_client_answer_cuda_gives_cpu_answers():
    """On Cora the retrieval can break distance ties differently on a GPU, so only the shape,
    the counts and the place of the answers are compared."""
    arrays = _queries(parse_run_config(SMALL))
    cpu, cuda = _answer("cpu", arrays), _answer("cuda", arrays)
    assert cuda.answers.device.type == "cpu" and cuda.answers.shape == cpu.answers.shape
    assert cuda.meta == cpu.meta and bool(torch.isfinite(cuda.answers).all())
