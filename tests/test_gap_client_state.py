"""GAP's client state between PMA hops goes in and out of :func:`fedgraph.methods.gap.client.
pma_step` explicitly: what to keep after each hop, the stacked hops after the last, and a
refusal when a later hop finds no state."""
import pytest
import torch

from fedgraph.config import parse_run_config
from fedgraph.data import partition
from fedgraph.data.synthetic import sbm_graph
from fedgraph.federation import ClientView
from fedgraph.methods.gap.client import PMARequest, pma_hop, pma_state_key, pma_step


def _client(hops=2):
    cfg = parse_run_config({"method": "gap", "num-clients": 2, "hops": hops, "encoder-dim": 4,
                            "partitioner": "random"})
    data = sbm_graph(120, 6.0, num_classes=3, num_features=8, seed=0)
    data.train_mask = torch.rand(120, generator=torch.Generator().manual_seed(0)) < 0.5
    data.val_mask = data.test_mask = ~data.train_mask
    client = partition(data, 2, "random", 0)[0]
    stats = {"name": "sbm", "num_nodes": 120, "num_features": 8, "num_classes": 3}
    return cfg, ClientView(client, (0.0, 1.0), stats, 2, None), client


def _gen(purpose):
    return torch.Generator().manual_seed(len(purpose))


def test_pma_step_keeps_the_state_then_the_stacked_hops_as_pma_hop_computes_them():
    cfg, view, client = _client()
    torch.manual_seed(0)
    step = pma_step(cfg, 0, view, PMARequest(1), None, _gen)
    torch.manual_seed(0)
    state, release = pma_hop(cfg, 0, view, PMARequest(1), None, _gen)
    assert step.hops is None and set(step.pending) == {"hop0", "local_sums"}
    assert all(torch.equal(step.pending[k], state.tensors[k]) for k in state.tensors)
    assert torch.equal(step.release["sums"], release["sums"])
    kept = step.pending
    for hop in (2, 3):
        inc = {"ids": client.node_ids[:3], "sums": torch.ones(3, 4)}
        step = pma_step(cfg, 0, view, PMARequest(hop, incoming=inc), kept, _gen)
        kept = step.pending
    assert kept is None and step.hops.shape == (client.num_nodes, cfg.hops + 1, 4)
    assert step.release["ids"].numel() == 0
    assert pma_state_key("test") != pma_state_key("all")


def test_a_later_hop_without_state_is_refused():
    cfg, view, client = _client()
    inc = {"ids": client.node_ids[:1], "sums": torch.ones(1, 4)}
    with pytest.raises(ValueError, match="kept no state of hop 1"):
        pma_step(cfg, 0, view, PMARequest(2, incoming=inc), None, _gen)
