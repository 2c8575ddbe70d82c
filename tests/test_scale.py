"""Scale-out pieces that run on the CPU: device selection, chunked per-hop aggregation, the
size of what travels in a Flower message."""

import pytest
import torch

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.device import resolve_device
from fedgraph.utils.graph import scatter_sum_chunked


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_picks_cpu_without_gpu(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_picks_cuda_when_ray_gave_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_gpu_is_a_config_error_naming_the_key(no_gpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"^device: 'cuda' was asked.*client-resources-num-gpus"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="^device: unknown"):
        resolve_device("tpu")


def test_device_key_is_validated_for_every_method():
    for method in ("gap", "ppgnn", "privgnn"):
        assert parse_run_config({"method": method, "device": "cuda"}).device == "cuda"
        assert parse_run_config({"method": method}).device == "auto"
    with pytest.raises(ConfigError, match="device"):
        parse_run_config({"method": "gap", "device": "gpu"})


def test_preflight_refuses_cuda_without_gpu(no_gpu, tmp_path, monkeypatch):
    from fedgraph.federation import preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = parse_run_config(
        {
            "method": "gap",
            "device": "cuda",
            "dataset": "synthetic-sbm:200:4",
            "num-clients": 2,
            "output-dir": str(tmp_path),
        }
    )
    with pytest.raises(ConfigError, match="^device: 'cuda'"):
        preflight(cfg)


def test_gap_run_auto_is_cpu_and_equals_cpu(no_gpu, tmp_path, monkeypatch):
    """Bit-identical runs: the clients' noise from one secret (``noise-source = secret``;
    ``device`` does not change the noise)."""
    from fedgraph.randomness import SECRET_ENV
    from fedgraph.simulations.local import run_local

    monkeypatch.setenv(SECRET_ENV, "test-secret-scale")
    base = {
        "method": "gap",
        "dataset": "synthetic-sbm:400:6",
        "num-clients": 2,
        "partitioner": "random",
        "encoder-rounds": 1,
        "classifier-rounds": 2,
        "local-epochs": 2,
        "output-dir": str(tmp_path),
        "noise-source": "secret",
    }
    a = run_local({**base, "device": "auto", "run-name": "auto"})
    b = run_local({**base, "device": "cpu", "run-name": "cpu"})
    assert a["status"] == "ok" and a["accuracy"] == b["accuracy"]
    # The report says where each client ran (no Ray in run_local: no Ray node id).
    assert sorted(a["workers"]) == ["client-0", "client-1"]
    assert all(w["device"] == "cpu" and w["ray_node_id"] is None for w in a["workers"].values())


@pytest.mark.parametrize("max_elements", [1, 7, 64, 10_000])
def test_scatter_sum_chunked_equals_index_add(max_elements):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 4, generator=g, dtype=torch.float64)
    src, dst = torch.randint(50, (2, 300), generator=g)
    want = torch.zeros(30, 4, dtype=torch.float64).index_add_(0, dst % 30, h[src])
    got = scatter_sum_chunked(h, src, dst % 30, 30, max_elements)
    assert torch.allclose(got, want)


def test_pma_partial_sums_chunked_like_unchunked():
    from fedgraph.methods.gap.client_pma import pma_partial_sums

    g = torch.Generator().manual_seed(1)
    h = torch.randn(40, 3, generator=g)
    local = torch.randint(40, (2, 200), generator=g)
    boundary = torch.stack(
        [torch.randint(40, (60,), generator=g), 100 + torch.randint(20, (60,), generator=g)]
    )
    outs = [
        pma_partial_sums(h, local, boundary, 0.5, torch.Generator().manual_seed(2), max_elements=m)
        for m in (3, 2**24)
    ]
    for a, b in zip(*outs):
        assert torch.allclose(a.double(), b.double(), atol=1e-5)


def test_large_arrays_travel_in_chunks_under_the_grpc_limit():
    # Flower 1.42 sends an Array as 5 MiB ArrayChunks (FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE), each
    # its own object, far below the gRPC limit: a hop's partial sums of a large graph
    # (here 1e6 x 16 float32, 64 MB) need no chunking of ours.
    from flwr.app import ArrayRecord
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.supercore.grpc import GRPC_MAX_MESSAGE_LENGTH

    rec = ArrayRecord({"sums": torch.randn(1_000_000, 16)})
    arr = next(iter(rec.values()))
    chunks = arr.slice_array()
    assert len(chunks) >= 64_000_000 // FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    assert max(len(c.deflate()) for _, c in chunks) <= FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + 1024
    assert len(arr.deflate()) < GRPC_MAX_MESSAGE_LENGTH // 1000  # the head: metadata only
