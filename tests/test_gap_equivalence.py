"""Federated GAP without noise follows the centralized trajectory (issue 14, item 1).

With epsilon inf, full batch and ``schedule = "fedsgd"`` (each round every client sends the
gradient of its mean training loss, the server averages them weighted by training nodes and
takes one Adam step), a federated run on any partition must compute what one client holding
the whole graph computes:

* PMA with cross-client edges gives the centralized aggregation (:func:`fedgraph.methods.gap.pma`
  on the whole graph) on every client's nodes;
* every round's averaged gradient, encoder and classifier, equals the one-client run's up to
  float error;
* the same round is selected on validation and the accuracy is the same (within 0.5 points);
* and the one-client run is centralized GAP's :func:`~fedgraph.methods.gap.fit` (same weights).

In-process (:class:`fedgraph.simulations.local.LocalGrid`: the real strategy and ClientApp handlers, no
Ray) on a small SBM graph. Faults this caught: the server drew the initial weights from the
unseeded global RNG (every run, hence every partition, started elsewhere), and the best round
was chosen on a float mean of the clients' validation accuracies, which breaks ties between
rounds differently for different partitions.
"""

import pytest
import torch

from fedgraph.federation import client_view, load_federated
from fedgraph.methods.gap import fit, pma
from fedgraph.methods.gap.models import build_classifier, build_encoder
from fedgraph.simulations import client_state
from fedgraph.simulations.local import LocalGrid
from fedgraph.simulations.server_app import validate_run_config
from fedgraph.strategies.gap import _seeded_init

ROUNDS = 15
BASE = {
    "method": "gap",
    "dataset": "synthetic-sbm:600:6",
    "client-epsilons": "inf",
    "encoder-rounds": ROUNDS,
    "classifier-rounds": ROUNDS,
    "schedule": "fedsgd",
    "hops": 2,
    "device": "cpu",
    "seed": 0,
    "lr": 0.05,
}  # the encoder's best validation round is then not its last (seed 0)


def _run(tmp_path, num_clients: int, partitioner: str, **extra):
    cls, cfg = validate_run_config(
        {
            **BASE,
            "num-clients": num_clients,
            "partitioner": partitioner,
            "output-dir": str(tmp_path),
            "run-name": f"{partitioner}-{num_clients}",
            **extra,
        }
    )
    strategy = cls(cfg)
    strategy.keep_gradients = True
    from fedgraph.federation import preflight

    grid = LocalGrid(num_clients)
    report = strategy.start(grid, ground_truth=preflight(cfg))  # the majority-class rate
    assert report["status"] == "ok", report.get("error")
    return cfg, strategy, grid, report


def _hops(cfg, grid) -> dict[int, torch.Tensor]:
    """Global node id -> its hops ``[K + 1, e]`` as the client holding it computed them."""
    out = {}
    for _node, ctx in grid.contexts.items():
        view = client_view(cfg, int(ctx.node_config["partition-id"]))
        stacked = client_state.get_tensors(ctx, "gap.hops")["hops"]
        out.update(zip(view.graph.node_ids.tolist(), stacked))
    return out


@pytest.fixture(scope="module")
def one_client(tmp_path_factory):
    torch.set_num_threads(1)
    return _run(tmp_path_factory.mktemp("one"), 1, "random")


@pytest.mark.parametrize(
    "partitioner,num_clients", [("random", 2), ("louvain", 3), ("label-skew", 5)]
)
def test_federated_gap_without_noise_follows_the_one_client_run(
    one_client, tmp_path, partitioner, num_clients
):
    cfg1, st1, grid1, rep1 = one_client
    cfg, st, grid, rep = _run(tmp_path, num_clients, partitioner)
    data, clients = load_federated(cfg)
    assert len(clients) == num_clients
    assert sum(int(c.boundary_edge_index.size(1)) for c in clients) > 0  # cross-client edges

    # PMA across clients = the centralized aggregation of the assembled hop 0
    hops, hops1 = _hops(cfg, grid), _hops(cfg1, grid1)
    ids = sorted(hops)
    assert ids == list(range(data.num_nodes))
    fed = torch.stack([hops[i] for i in ids])
    central = torch.stack(pma(fed[:, 0], data.edge_index, cfg.hops, 0.0), dim=1)
    torch.testing.assert_close(fed, central, rtol=0, atol=1e-5)
    torch.testing.assert_close(fed, torch.stack([hops1[i] for i in ids]), rtol=0, atol=1e-5)

    # every round's averaged gradient, both modules
    for module in ("encoder", "classifier"):
        g, g1 = st.gradients[module], st1.gradients[module]
        assert len(g) == len(g1) == ROUNDS
        for r, (a, b) in enumerate(zip(g, g1), 1):
            assert a.keys() == b.keys()
            for k in a:
                torch.testing.assert_close(
                    a[k], b[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{module} round {r} {k}: {m}"
                )

    # the same rounds selected, the same accuracy
    assert rep["training"]["selected_round"] == rep1["training"]["selected_round"]
    assert rep["training"]["encoder_selected_round"] == rep1["training"]["encoder_selected_round"]
    for split in ("train", "val", "test"):
        assert abs(rep["accuracy"][split] - rep1["accuracy"][split]) <= 0.005, split


def test_one_client_fedsgd_is_centralized_gap(one_client):
    """The one-client federated run = centralized GAP's fit: the encoder and the classifier
    each with selection on validation (edge level), PMA between them; the same initial weights
    (the run's seed), so the same final weights and the same selected rounds."""
    enc_round = _check_centralized(*one_client)
    assert enc_round < ROUNDS  # so a run that kept the last encoder round would fail


def test_one_client_fedsgd_with_batch_norm_is_centralized_gap(tmp_path):
    """``batch-norm = true`` (the reference code's batch norms): one client trains with the
    whole training set's statistics and evaluates with the running statistics the server
    keeps (sent back by the client as buffers), as centralized GAP does."""
    run = _run(tmp_path, 1, "random", **{"batch-norm": True})
    _check_centralized(*run)


def test_batch_norm_with_several_clients_runs_fedsgd_and_fedavg(tmp_path):
    """Several clients with batch norm (each normalizes with its own training nodes while
    training; the server keeps the running statistics' train-node-weighted mean, in the
    buffers' dtypes): both schedules run and learn."""
    for schedule in ("fedsgd", "fedavg"):
        _, _, _, rep = _run(
            tmp_path, 3, "louvain", **{"batch-norm": True, "schedule": schedule, "local-epochs": 2}
        )
        assert rep["accuracy"]["test"] > 2 * rep["ground_truth"]["majority_class"], schedule


def _check_centralized(cfg, st, grid, rep):
    data, _ = load_federated(cfg)
    nf, nc = data.x.size(1), int(data.y.max()) + 1
    enc = _seeded_init(build_encoder, cfg, nf, nc)
    enc_res = fit(
        enc,
        data.x,
        data.y,
        data.train_mask,
        data.val_mask,
        epochs=ROUNDS,
        lr=cfg.lr,
        select_on_val=True,
    )
    x = torch.stack(pma(enc.embed(data.x), data.edge_index, cfg.hops, 0.0), dim=1)
    clf = _seeded_init(build_classifier, cfg, nf, nc)
    res = fit(
        clf, x, data.y, data.train_mask, data.val_mask, epochs=ROUNDS, lr=cfg.lr, select_on_val=True
    )
    hops = _hops(cfg, grid)
    torch.testing.assert_close(
        torch.stack([hops[i] for i in range(data.num_nodes)]), x, rtol=0, atol=1e-5
    )
    assert rep["training"]["encoder_selected_round"] == enc_res.best_epoch
    assert rep["training"]["selected_round"] == res.best_epoch
    acc = float((clf(x[data.test_mask]).argmax(-1) == data.y[data.test_mask]).float().mean())
    assert rep["accuracy"]["test"] == pytest.approx(acc, abs=1e-6)
    return enc_res.best_epoch


def test_fedsgd_refuses_what_would_change_the_trajectory():
    from fedgraph.config import ConfigError, parse_run_config

    for bad, field in (
        ({"level": "node"}, "schedule"),
        ({"server-optimizer": "fedadam"}, "schedule"),
        ({"batch-size": 64}, "schedule"),
    ):
        with pytest.raises(ConfigError, match=field):
            parse_run_config({**BASE, **bad})
