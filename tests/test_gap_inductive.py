"""Federated GAP with inductive inference: the edge split, a whole run, its privacy and what
leaves a client (issue #3 item 3)."""

import math

import pytest
import torch

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods.gap.client_pma import client_edges, graph_nodes

CORA = {
    "method": "gap",
    "dataset": "cora",
    "min-class-size": 1,
    "num-clients": 3,
    "partitioner": "louvain",
    "encoder-rounds": 5,
    "classifier-rounds": 10,
    "local-epochs": 10,
    "client-epsilons": "4",
}


def test_bad_inference_names_the_key_and_allowed_values():
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": "gap", "inference": "bogus"})
    msg = str(err.value)
    assert "inference:" in msg and "'transductive'" in msg and "'inductive'" in msg
    assert parse_run_config({"method": "gap"}).inference == "transductive"
    assert parse_run_config({"method": "gap", "inference": "inductive"}).inference == "inductive"


def _global(view, local, boundary):
    """A client's PMA edges in global ids, ``[2, e]``."""
    ids = view.graph.node_ids
    return torch.cat([ids[local], torch.stack([ids[boundary[0]], boundary[1]])], dim=1)


@pytest.mark.parametrize("level", ["edge", "node"])
def test_edge_split_training_and_held_out_graphs(level):
    """No training-graph edge touches a test node, no held-out edge a non-test node, local and
    cross-client edges alike; at edge level, every client's choice together gives exactly the
    global graph's edges within each part (the clients agree on the cross-client edges)."""
    from fedgraph.federation import client_view, load_federated

    cfg = parse_run_config({**CORA, "level": level, "max-degree": 5})
    data, _ = load_federated(cfg)
    views = [client_view(cfg, i) for i in range(cfg.num_clients)]
    test = data.test_mask
    assert all(torch.equal(v.test_mask, test) for v in views)
    for graph, inside in (("train", ~test), ("test", test)):
        in_graph = graph_nodes(views[0].test_mask, graph)
        assert torch.equal(in_graph, inside)
        parts, crossing = [], 0
        for v in views:
            local, boundary = client_edges(v.graph, cfg, torch.Generator().manual_seed(0), in_graph)
            crossing += boundary.shape[1]
            e = _global(v, local, boundary)
            assert bool(inside[e].all()), f"a {graph}-graph edge leaves the {graph} graph"
            parts.append(e)
        assert crossing > 0  # cross-client edges are in the check
        union = torch.cat(parts, dim=1)
        if level == "edge":
            want = data.edge_index[:, inside[data.edge_index[0]] & inside[data.edge_index[1]]]
            key = lambda e: set((e[0] * data.num_nodes + e[1]).tolist())  # noqa: E731
            assert key(union) == key(want) and union.shape[1] == want.shape[1]
    with pytest.raises(ValueError, match="graph must be one of"):
        graph_nodes(test, "val")


def _pma_releases(log):
    """``(node, graph, hop, partial sums)`` of every PMA reply in a LocalGrid's log: what
    leaves a client."""
    from fedgraph.messaging import tensors

    return [
        (
            int(m.metadata.dst_node_id),
            str(m.content["pma"]["graph"]),
            int(m.content["pma"]["hop"]),
            tensors(r.content["partial_sums"]),
        )
        for m, r in log
        if m.metadata.message_type == "query.gap_pma" and not r.has_error()
    ]


def _run(tmp_path, name, **overrides):
    from fedgraph.federation import preflight
    from fedgraph.simulations.local import LocalGrid
    from fedgraph.simulations.server_app import validate_run_config

    strategy_cls, cfg = validate_run_config(
        {**CORA, **overrides, "output-dir": str(tmp_path), "run-name": name}
    )
    stats = preflight(cfg)
    grid = LocalGrid(cfg.num_clients, record=True)
    report = strategy_cls(cfg).start(grid, ground_truth=stats)
    if cfg.variant == "gap-inf":  # no noise: every client listed with epsilon inf, not dropped
        subjects = report["privacy"]["per_subject"]
        assert subjects and all(math.isinf(row["epsilon"]) for row in subjects.values())
    return report, _pma_releases(grid.log)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gap-inductive")
    return {
        "inductive": _run(tmp, "inductive", inference="inductive"),
        "transductive": _run(tmp, "transductive"),
        "clean": _run(tmp, "clean", inference="inductive", variant="gap-inf"),
    }


def test_inductive_run_accuracy_and_epsilon(runs):
    ind, _ = runs["inductive"]
    tra, _ = runs["transductive"]
    assert ind["status"] == "ok"
    assert ind["config"]["inference"] == "inductive"
    assert ind["privacy"]["inference"] == "inductive"
    assert "compose in parallel" in ind["privacy"]["inference_note"]
    assert "PMA on the held-out graph (clients, via server)" in ind["timings_s"]
    assert "inference_note" not in tra["privacy"]
    assert ind["accuracy"]["test"] > ind["ground_truth"]["majority_class"] + 0.2
    per_i, per_t = ind["privacy"]["per_subject"], tra["privacy"]["per_subject"]
    for c in range(CORA["num-clients"]):
        s = f"client-{c}"
        assert per_i[s]["epsilon"] == pytest.approx(per_t[s]["epsilon"], abs=1e-9)
        # The held-out run, in parallel with the training graph's: no more than the client's.
        assert per_i[f"{s} (held-out graph)"]["epsilon"] <= per_i[s]["epsilon"] + 1e-9
        assert per_i[s]["epsilon"] == pytest.approx(4.0, rel=0.01)


def test_released_partial_sums_are_noised_in_both_inductive_pma_runs(runs):
    """Every row a client releases, in the training graph's PMA and the held-out graph's,
    carries N(0, sigma^2) noise: against the same run without noise (gap-inf: the encoder is
    the same at edge level, so hop 1's clean sums are the same), the residual of hop 1 has std
    sigma and no row is clean. The released ids are the remote nodes of the current graph."""
    ind, noisy = runs["inductive"]
    _, clean = runs["clean"]
    sigma = ind["clients"]["client-0"]["sigma"]
    assert sigma > 0 and all(c["sigma"] == sigma for c in ind["clients"].values())
    clean_of = {(n, g, k): out for n, g, k, out in clean}
    from fedgraph.federation import client_view

    views = {n: client_view(parse_run_config(CORA), n - 1) for n, _, _, _ in noisy}
    test = next(iter(views.values())).test_mask
    seen = set()
    resid = []
    for n, graph, k, out in noisy:
        if k > ind["config"]["hops"]:
            assert out["ids"].numel() == 0
            continue
        seen.add(graph)
        others = torch.ones(test.numel(), dtype=torch.bool)
        others[views[n].graph.node_ids] = False
        want = others & (test if graph == "test" else ~test)
        assert torch.equal(out["ids"], want.nonzero().flatten())
        assert out["ids"].numel() > 0
        if k == 1:
            ref = clean_of[(n, graph, k)]
            assert torch.equal(ref["ids"], out["ids"])
            diff = out["sums"] - ref["sums"]
            assert not bool((diff.abs().sum(1) == 0).any()), "a released row is clean"
            resid.append(diff.flatten())
    assert seen == {"train", "test"}
    r = torch.cat(resid).double()
    assert r.numel() > 10_000
    assert abs(float(r.std()) / sigma - 1) < 0.05
