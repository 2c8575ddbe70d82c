"""PPGNN's client half: one Flower supernode holding many users draws its users' privacy levels,
maps their features to ``[-1, 1]`` with the public feature domain, runs the feature mechanism
for each user at its own level and releases the report, the labels of its training/validation
users (the paper's setting; optionally through randomized response) and the graph structure it
knows (the server knows the structure in the paper's threat model). Test labels never leave
the clients: accuracy is counted there (:func:`count_correct`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...config import ConfigError, PPGNNConfig
from ...data import ClientGraph
from ...mechanisms import randomized_response, to_unit_range
from .privacy import build_mechanism


def with_client_levels(client: ClientGraph, cfg: PPGNNConfig, generator) -> ClientGraph:
    """``client`` with its users' privacy levels drawn on the client
    (:func:`fedgraph.data.draw_privacy_levels` from ``cfg.budgets`` and ``cfg.shares``, in an
    order from the client's own ``generator``): the server learns a level only through ESW's
    release (issue 28, fault 2). A copy; the cached partition is not modified."""
    from dataclasses import replace

    from ...data import draw_privacy_levels

    return replace(
        client, levels=draw_privacy_levels(client.num_nodes, cfg.budgets, cfg.shares, generator)
    )


def client_report(
    client: ClientGraph,
    cfg: PPGNNConfig,
    feature_domain,
    num_classes: int,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """Everything one client releases for PPGNN, as named tensors (ids are global).

    Keys: ``node_ids [n]``, ``mech.<name>`` (the mechanism's report), ``labelled_ids``,
    ``labels``, ``is_train`` (training and validation users), ``edge_index [2, e]`` (local
    and boundary edges, global ids; :func:`report_edges`). Raw features, levels and test labels never appear.

    Runs on the CPU whatever ``cfg.device``: the mechanism is an elementwise perturbation of
    this client's own users' features drawn from the CPU ``generator`` (the client's own,
    :func:`fedgraph.randomness.client_generator`; a seeded one is reproducible,
    the same draws on every machine) and its output goes straight into the Flower message,
    while the heavy computation (FlexProp and the GNN) is server side and already on
    ``cfg.device`` (:func:`server_fit`).

    Raises:
        ConfigError: if the dataset has no public feature domain, or the client is empty.
    """
    if feature_domain is None:
        raise ConfigError(
            f"dataset: {cfg.dataset!r} has no public feature domain; LDP feature mechanisms "
            "need one (features with a known range, e.g. binary bag-of-words)"
        )
    if client.num_nodes == 0:
        raise ConfigError(f"client {client.client_id} holds no users")
    x = to_unit_range(client.x, *feature_domain)
    report = build_mechanism(cfg).perturb(x, client.levels, generator)
    labelled = client.train_mask | client.val_mask
    labels = client.y[labelled]
    if cfg.label_epsilon > 0:
        labels = randomized_response(labels, num_classes, cfg.label_epsilon, generator)
    edges = report_edges(client)
    return {
        "node_ids": client.node_ids,
        **{f"mech.{k}": v for k, v in report.items()},
        "labelled_ids": client.node_ids[labelled],
        "labels": labels,
        "is_train": client.train_mask[labelled],
        "edge_index": edges,
    }


def report_edges(client: ClientGraph) -> Tensor:
    """The edges a client knows in global ids, ``[2, e]``: its local edges then its boundary
    edges, written once into one buffer (no ``cat`` of gathered copies), as int32 when every
    id fits (half the message; the server's
    :func:`~fedgraph.methods.ppgnn.server.assemble` reads any integer dtype)."""
    local, bnd = client.edge_index, client.boundary_edge_index
    e, eb = local.size(1), bnd.size(1)
    top = max(
        int(client.node_ids.max()) if client.node_ids.numel() else 0, int(bnd[1].max()) if eb else 0
    )
    dtype = torch.int32 if top < 2**31 else torch.long
    out = torch.empty(2, e + eb, dtype=dtype)
    ids = client.node_ids.to(dtype)
    for row in (0, 1):
        torch.index_select(ids, 0, local[row], out=out[row, :e])
    torch.index_select(ids, 0, bnd[0], out=out[0, e:])
    out[1, e:] = bnd[1]
    return out


def client_query(
    client: ClientGraph,
    cfg: PPGNNConfig,
    feature_domain,
    num_classes: int,
    generator: Callable[[str], object],
) -> dict[str, Tensor]:
    """One ``query.ppgnn`` on a client: its users' levels (:func:`with_client_levels`, drawn
    from ``generator("ppgnn:levels")``), then its release (:func:`client_report`, drawn from
    ``generator("ppgnn")``); ``generator``: ``purpose -> generator``, the client's own
    (:func:`fedgraph.randomness.client_generator` bound to this client).

    Returns:
        :func:`client_report`'s named tensors.

    Raises:
        as :func:`client_report`.
    """
    graph = with_client_levels(client, cfg, generator("ppgnn:levels"))
    return client_report(graph, cfg, feature_domain, num_classes, generator("ppgnn"))


def count_correct(client: ClientGraph, node_ids: Tensor, predictions: Tensor) -> dict[str, int]:
    """Client side of evaluation: compare the server's predictions with the true labels.

    Returns ``{"<split>_correct": .., "<split>_total": ..}`` for train, val and test.

    Raises:
        ValueError: if ``node_ids`` are not exactly this client's users.
    """
    if node_ids.shape != client.node_ids.shape or not bool((node_ids == client.node_ids).all()):
        raise ValueError("predictions do not match this client's users")
    out = {}
    for split in ("train", "val", "test"):
        mask = getattr(client, f"{split}_mask")
        out[f"{split}_correct"] = int((predictions[mask] == client.y[mask]).sum())
        out[f"{split}_total"] = int(mask.sum())
    return out


__all__ = ["with_client_levels", "client_report", "report_edges", "client_query", "count_correct"]
