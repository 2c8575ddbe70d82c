"""Who holds which PrivGNN graph in a federation (paper Sec. 3, App. F).

Every party loads the dataset and applies the same seeded :func:`~.split.privgnn_split`; the
server keeps the *public* graph (query pool and labelled test nodes, :func:`public_graph`), the
*private* graph is spread over the clients by the run's partitioner and each client keeps only
its own part (:func:`client_graph`: a :class:`~fedgraph.data.ClientGraph`, all nodes labelled).
:func:`check_config_neighbours` checks a run config against that partition before any client
starts.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from ...config import DataConfig, PrivGNNConfig
from .split import check_neighbours, privgnn_split


def data_key(cfg: PrivGNNConfig) -> str:
    """What decides the PrivGNN federation of ``cfg``: its data config and the public
    fractions (JSON)."""
    keys = list(DataConfig.model_fields) + ["public_fraction", "public_test_fraction"]
    return json.dumps({k: getattr(cfg, k) for k in keys}, sort_keys=True)


#: data key -> ``(public, clients, stats)``, the two most recent (a process's memo)
_FEDERATIONS: OrderedDict[str, tuple] = OrderedDict()


def federation(cfg: PrivGNNConfig, data=None) -> tuple:
    """``(public Data, client graphs, stats)`` of ``cfg``: the dataset (``data`` if it is
    already loaded, else :func:`~fedgraph.data.load_graph_locked`) split by
    :func:`~.split.privgnn_split` and its private half partitioned; kept per data config
    within a process (the two most recent), so a process loads and splits the dataset once."""
    key = data_key(cfg)
    if key not in _FEDERATIONS:
        _FEDERATIONS[key] = _split(key, data)
        while len(_FEDERATIONS) > 2:
            _FEDERATIONS.popitem(last=False)
    _FEDERATIONS.move_to_end(key)
    return _FEDERATIONS[key]


def _split(key: str, data=None) -> tuple:
    from ...data import dataset_statistics, partition
    from ...data import load_graph_locked as load_graph

    d = json.loads(key)
    cfg = DataConfig(**{k: v for k, v in d.items() if k in DataConfig.model_fields})
    if data is None:
        data = load_graph(cfg)
    private, public = privgnn_split(
        data,
        public_fraction=d["public_fraction"],
        public_test_fraction=d["public_test_fraction"],
        seed=cfg.seed,
    )
    clients = partition(private, cfg.num_clients, cfg.partitioner, cfg.seed, alpha=cfg.alpha)
    # What the server may state: the public graph's own statistics and the schema. The
    # private graphs' sizes, edges and labels are the simulation's ground truth (the report's
    # ground_truth, from the harness), never the server's knowledge (issue 28, fault 1).
    whole = dataset_statistics(data)
    stats = {
        "name": whole["name"],
        "num_features": whole["num_features"],
        "num_classes": whole["num_classes"],
        "public_nodes": int(public.num_nodes),
        "public_edges": int(public.edge_index.size(1)),
        "public_query_pool": int(public.train_mask.sum()),
        "public_test_nodes": int(public.test_mask.sum()),
    }
    return public, tuple(clients), stats


def public_graph(cfg: PrivGNNConfig):
    """Server side: ``(public Data, dataset statistics)``; ``public.train_mask`` is the query
    pool (labels unused except for diagnostics), ``public.test_mask`` the test nodes."""
    public, _, stats = federation(cfg)
    return public, stats


def client_graph(cfg: PrivGNNConfig, partition_id: int):
    """Client side: ``(ClientGraph of partition_id's private nodes, dataset statistics)``.

    Raises:
        ValueError: ``partition_id`` outside ``[0, num_clients)``, or more clients than
            private nodes.
    """
    if not 0 <= partition_id < cfg.num_clients:
        raise ValueError(
            f"partition-id {partition_id} outside [0, {cfg.num_clients}): the "
            "federation's num-supernodes must equal the run config's num-clients"
        )
    _, clients, stats = federation(cfg)
    return clients[partition_id], stats


def check_config_neighbours(cfg: PrivGNNConfig, data=None) -> None:
    """Before any client starts: ``num-neighbours`` fits every client's expected Poisson sample
    (:func:`~.split.check_neighbours`: ``K <= floor(gamma * n_c)`` for the ``n_c`` private
    nodes of client ``c``; the partition is computed from the public run config); in the
    ensemble mode, ``num-teachers <= n_c`` instead (:func:`~.teachers.teacher_groups`); and
    ``num-queries`` at most the public query pool (it was silently capped).

    Raises:
        fedgraph.config.ConfigError: naming ``num-neighbours`` (or ``num-teachers``), the
            smallest client and the largest valid value; or ``num-queries`` and the pool.
    """
    from ...config import ConfigError

    _, clients, stats = federation(cfg, data)
    pool = int(stats["public_query_pool"])
    if cfg.num_queries > pool:
        raise ConfigError(
            f"num-queries = {cfg.num_queries} exceeds the public query pool "
            f"({pool} unlabelled public nodes at public-fraction "
            f"{cfg.public_fraction:g}, public-test-fraction "
            f"{cfg.public_test_fraction:g}); allowed: 1 <= num-queries <= {pool}"
        )
    sizes = [
        int(c.train_mask.sum()) if getattr(c, "train_mask", None) is not None else int(c.num_nodes)
        for c in clients
    ]
    small = min(range(len(sizes)), key=sizes.__getitem__)
    if cfg.answer_mode == "ensemble":  # disjoint groups of labelled nodes, not K neighbours
        if cfg.num_teachers > sizes[small]:
            raise ConfigError(
                f"num-teachers = {cfg.num_teachers} exceeds the labelled private nodes of "
                f"client {small} ({sizes[small]}): each teacher needs its own disjoint group; "
                f"allowed: 1 <= num-teachers <= {sizes[small]}"
            )
        return
    try:
        check_neighbours(
            cfg.num_neighbours,
            sizes[small],
            cfg.gamma,
            f" for client {small} ({sizes[small]} private nodes)",
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


__all__ = ["public_graph", "client_graph", "check_config_neighbours"]
