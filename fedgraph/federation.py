"""The client's view of the data every method's Flower apps share, and the preflight checks
run before any client starts (the server's messaging with clients: :mod:`fedgraph.messaging`).

Data: the dataset is split, given privacy levels and partitioned with the run's seed once, by
the first supernode that asks, into the partition cache (:mod:`fedgraph.partition_cache`);
every supernode then reads only its own :class:`~fedgraph.data.ClientGraph` (one deterministic
partition, each client takes its part).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: ``fedgraph run`` imports this module
    from torch import Tensor  # before Ray starts (fedgraph.simulations.cli)

from .config import DataConfig

#: the dataset facts that are public by construction: the node universe (the node-id
#: directory), and the schema's feature and class counts (issue 28: nothing else about the
#: whole graph may leave a client)
SCHEMA_FIELDS = ("name", "num_nodes", "num_features", "num_classes")


@dataclass(frozen=True)
class ClientView:
    """One client's part of the federation and the public facts about the dataset.

    ``statistics`` is the simulation's ground truth about the whole graph
    (:func:`fedgraph.data.dataset_statistics`: edge and class counts included). A deployed
    client would not know it, so it never enters a message: what a client may send about the
    dataset is :attr:`schema`."""

    graph: object  # fedgraph.data.ClientGraph
    feature_domain: tuple[float, float] | None
    statistics: dict
    num_clients: int
    #: the global test mask ``[N]`` (GAP's inductive inference: both ends of a cross-client
    #: edge must be classified). Public: a random split is a seeded permutation of the public
    #: node count (``split``, ``seed``), ``planetoid`` the published masks.
    test_mask: Tensor | None = None

    @property
    def schema(self) -> dict:
        """The public facts a client may send (:data:`SCHEMA_FIELDS`): the dataset's name,
        the size of the public node universe and the schema's feature and class counts;
        identical on neighbouring graphs (``tests/test_neighbouring_inputs.py``)."""
        return {k: self.statistics.get(k) for k in SCHEMA_FIELDS}


def _data_key(cfg: DataConfig) -> str:
    return json.dumps({k: getattr(cfg, k) for k in DataConfig.model_fields}, sort_keys=True)


def load_graph(cfg: DataConfig):
    """:func:`fedgraph.data.load_graph_locked` (kept here: its old home)."""
    from .data import load_graph_locked

    return load_graph_locked(cfg)


def load_federated(cfg: DataConfig, budgets=None, shares=None, data=None):
    """Load (:func:`load_graph`, unless ``data`` is the loaded graph), split, assign levels
    and partition; returns ``(data, clients)``.

    ``budgets``: the levels of a plain (one-process) reference run, seeded by ``cfg.seed``
    (:func:`fedgraph.data.assign_privacy_levels`). A federated run never passes them: its
    clients draw their users' levels with their own randomness
    (:func:`fedgraph.data.draw_privacy_levels`), so levels are not a function of the public
    run config."""
    from .data import apply_split, assign_privacy_levels, partition

    data = apply_split(load_graph(cfg) if data is None else data, cfg.split, cfg.seed)
    if budgets is not None:
        data.levels = assign_privacy_levels(data.num_nodes, budgets, shares, seed=cfg.seed)
    clients = partition(data, cfg.num_clients, cfg.partitioner, cfg.seed, alpha=cfg.alpha)
    return data, clients


def _compute_views(cfg: DataConfig, budgets, shares, data=None) -> list[ClientView]:
    """Every client's :class:`ClientView` (one split and partition of the whole graph)."""
    from .data import dataset_statistics

    data, clients = load_federated(
        cfg, list(budgets) if budgets else None, list(shares) if shares else None, data
    )
    stats = dataset_statistics(data)
    test_mask = getattr(data, "test_mask", None)
    return [
        ClientView(c, getattr(data, "feature_domain", None), stats, len(clients), test_mask)
        for c in clients
    ]


_GRAPH_FIELDS = (
    "node_ids",
    "x",
    "y",
    "train_mask",
    "val_mask",
    "test_mask",
    "edge_index",
    "boundary_edge_index",
    "levels",
)


def _graph_payload(g) -> dict:
    """A :class:`~fedgraph.data.ClientGraph`'s tensors (:data:`_GRAPH_FIELDS`)."""
    return {k: getattr(g, k) for k in _GRAPH_FIELDS}


def _graph_from_payload(payload: dict, meta: dict):
    from .data import ClientGraph

    return ClientGraph(client_id=meta["client_id"], **payload["graph"])


def _view_payload(view: ClientView) -> dict:
    """A :class:`ClientView` as tensors and JSON (what :mod:`fedgraph.partition_cache`
    stores; ``torch.load(weights_only=True)`` reads it back)."""
    g = view.graph
    meta = {
        "client_id": g.client_id,
        "feature_domain": view.feature_domain,
        "statistics": view.statistics,
        "num_clients": view.num_clients,
    }
    return {"graph": _graph_payload(g), "test_mask": view.test_mask, "meta": json.dumps(meta)}


def _view_from_payload(payload: dict) -> ClientView:
    meta = json.loads(payload["meta"])
    domain = meta["feature_domain"]
    return ClientView(
        _graph_from_payload(payload, meta),
        None if domain is None else tuple(domain),
        meta["statistics"],
        meta["num_clients"],
        payload["test_mask"],
    )


def _check_partition_id(cfg: DataConfig, partition_id: int) -> None:
    if not 0 <= partition_id < cfg.num_clients:
        raise ValueError(
            f"partition-id {partition_id} outside [0, {cfg.num_clients}): the "
            "federation's num-supernodes must equal the run config's num-clients"
        )


class NotCached(LookupError):
    """:func:`client_view` with ``compute=False``: the partition cache cannot serve the view
    without loading the dataset."""


def _cached_payloads(
    cfg: DataConfig, pid: int, settings: dict, fill, data=None, compute: bool = True
) -> dict[int, dict]:
    """Client ``pid``'s payload from the partition cache (:mod:`fedgraph.partition_cache`),
    keyed by the graph's content, ``cfg``'s data settings and the extra ``settings``; on a
    miss ``fill(graph)`` computes every client's payload from the loaded graph (``data`` if
    given, else :func:`load_graph`) and the entry is stored. Without a cache folder, or with a
    user's partitioner: all computed. ``compute=False``: raise :class:`NotCached` instead of
    loading or computing anything. Returns partition id -> payload."""
    from . import partition_cache as pc
    from .data import PARTITIONERS

    root = pc.cache_dir()
    partitioner = PARTITIONERS.resolve(cfg.partitioner)
    loaded = [] if data is None else [data]  # the graph, once loaded here

    def graph():
        if not loaded:
            if not compute:
                raise NotCached(cfg.dataset)
            loaded.append(load_graph(cfg))
        return loaded[0]

    if root is None or getattr(partitioner, "__module__", "") != "fedgraph.data.partition":
        # a user's partitioner may depend on more than its inputs: computed here, every time
        if not compute:
            raise NotCached(cfg.dataset)
        return dict(enumerate(fill(graph())))
    source = pc.source_key(cfg.dataset, cfg.data_root, cfg.min_class_size)
    digest = pc.known_graph_digest(root, source)
    if digest is None:
        digest = pc.graph_digest(graph())
        pc.remember_graph_digest(root, source, digest)
    key_settings = {
        k: getattr(cfg, k)
        for k in (
            "dataset",
            "split",
            "partitioner",
            "num_clients",
            "alpha",
            "min_class_size",
            "seed",
        )
    }
    key_settings.update(settings)
    key = pc.entry_digest(key_settings, digest, pc.code_digest())

    def fill_entry():
        if not compute:
            raise NotCached(cfg.dataset)
        return fill(graph())

    return pc.load_part(root, key, pid, fill_entry)


def _cached_views(
    cfg: DataConfig, pid: int, budgets, shares, data=None, compute: bool = True
) -> dict[int, ClientView]:
    """Client ``pid``'s view from the partition cache (:func:`_cached_payloads`); on a miss
    every client's, computed (from ``data``, the loaded graph, if given) and stored."""
    payloads = _cached_payloads(
        cfg,
        pid,
        {"budgets": budgets, "shares": shares},
        lambda graph: [_view_payload(v) for v in _compute_views(cfg, budgets, shares, graph)],
        data,
        compute,
    )
    return {i: _view_from_payload(p) for i, p in payloads.items()}


def privgnn_client_graph(cfg, partition_id: int, data=None):
    """PrivGNN client ``partition_id``'s private graph and the dataset statistics,
    ``(ClientGraph, stats)`` as :func:`fedgraph.methods.privgnn.client_graph` returns them,
    read from the partition cache (every client's part is split and partitioned once, by the
    preflight or the first client to ask; a client process then reads only its own part, not
    the whole dataset); kept within a process. ``data``: the dataset, already loaded, for a
    miss.

    Raises:
        ValueError: ``partition_id`` outside ``[0, num_clients)``.
    """
    from .methods.privgnn import graphs as pg

    _check_partition_id(cfg, partition_id)
    parts = _client_views(pg.data_key(cfg), None, None)
    if partition_id not in parts:

        def fill(graph):
            _, clients, stats = pg.federation(cfg, graph)
            return [
                {
                    "graph": _graph_payload(c),
                    "meta": json.dumps({"client_id": c.client_id, "statistics": stats}),
                }
                for c in clients
            ]

        payloads = _cached_payloads(
            cfg,
            partition_id,
            {
                "method": "privgnn",
                "public_fraction": cfg.public_fraction,
                "public_test_fraction": cfg.public_test_fraction,
            },
            fill,
            data,
        )
        for i, p in payloads.items():
            meta = json.loads(p["meta"])
            parts[i] = (_graph_from_payload(p, meta), meta["statistics"])
    return parts[partition_id]


@lru_cache(maxsize=4)
def _client_views(key: str, budgets: tuple | None, shares: tuple | None) -> dict:
    """partition id -> :class:`ClientView` of one data config, filled as clients ask."""
    return {}


def client_view(
    cfg: DataConfig, partition_id: int, budgets=None, shares=None, data=None, compute: bool = True
) -> ClientView:
    """This supernode's :class:`ClientView`: read from the partition cache
    (:mod:`fedgraph.partition_cache`: the whole graph is split and partitioned once, by the
    first client to ask, and each client reads only its own part), then kept per data config
    within a process. ``data``: the dataset, already loaded (:func:`load_graph`), for a
    miss; ``compute=False``: raise :class:`NotCached` rather than load or partition.

    Raises:
        ValueError: if ``partition_id`` is not a valid client index for ``cfg.num_clients``.
    """
    _check_partition_id(cfg, partition_id)
    budgets = tuple(budgets) if budgets else None
    shares = tuple(shares) if shares else None
    views = _client_views(_data_key(cfg), budgets, shares)
    if partition_id not in views:
        views.update(_cached_views(cfg, partition_id, budgets, shares, data, compute))
    return views[partition_id]


def check_feature_budgets(cfg, mech) -> None:
    """Refuse a feature mechanism that would spend more than a level's budget on a user's
    features (basic composition of what ``mech.privacy_spent(level)`` declares), before any
    data is perturbed. The configuration already refuses a built-in uniform mechanism's
    ``epsilon`` above the smallest budget; this holds any mechanism, a user's included, to
    the same rule, with ``label-epsilon`` (spent on the same user's label) counted beside it.

    Raises:
        fedgraph.config.ConfigError: naming ``mechanism``, the level, the spend and the budget.
    """
    from .config import ConfigError

    label = cfg.label_epsilon
    for level, budget in enumerate(cfg.budgets, start=1):
        spent = float(sum(mech.privacy_spent(level).values()))
        if spent + label > budget * (1 + 1e-9):
            on_labels = f" and {label:g} on its label (label-epsilon)" if label else ""
            raise ConfigError(
                f"mechanism: {cfg.mechanism!r} spends epsilon {spent:g} on a level-{level} "
                f"user's features{on_labels}, above that level's budget {budget:g} (budgets "
                f"{', '.join(f'{b:g}' for b in cfg.budgets)}); allowed: a spend of at most "
                f"each level's budget{' less label-epsilon' if label else ''}"
            )


def preflight(cfg) -> dict:
    """Check, before any client starts, what would otherwise fail on every client: the
    output folder is writable, the dataset loads (a user loader's graph passes
    :func:`fedgraph.data.check_graph`), a feature mechanism declares its privacy loss for
    every level and passes a dry run on random features
    (:func:`fedgraph.mechanisms.check_mechanism`: no raw features in its report, estimates
    of the right shape), ``num_clients`` fits the graph, PrivGNN's ``num-neighbours`` fits
    every client's expected Poisson sample, every GAP and ProGAP client's epsilon is reachable
    and some PrivGNN client can afford an answer (:func:`check_epsilons_reachable`).

    Returns:
        the dataset statistics.
    Raises:
        fedgraph.config.ConfigError: naming the key (output-dir, dataset/data-root, mechanism,
            partitioner: it raised or returned no valid assignment, num-clients,
            num-neighbours, client-epsilons, device: ``cuda`` asked on a machine without a GPU
            when no Ray cluster is named by ``RAY_ADDRESS``).
    """
    from .config import ConfigError
    from .data.partition import PartitionerError

    try:
        return _preflight(cfg)
    except PartitionerError as err:  # (its cause, if any, is the user's code: kept)
        raise ConfigError(f"partitioner: {err}") from err.__cause__


def _preflight(cfg) -> dict:
    """:func:`preflight`'s checks."""
    from .config import ConfigError, check_data_root, check_output_dir
    from .data.paths import user_cache_dir

    check_output_dir(cfg)
    from filelock import FileLock

    check_data_root(cfg)
    user_cache_dir().mkdir(parents=True, exist_ok=True)
    # Where the partition cache holds every client's part (a built-in dataset whose input
    # files are unchanged: :mod:`fedgraph.partition_cache`), the checks read the parts
    # instead of loading the whole graph (seconds: 2.7 s for a 1e5-node synthetic graph).
    data, views = None, _views_without_loading(cfg)
    if views is not None:
        stats, domain = views[0].statistics, views[0].feature_domain
    else:
        from .data import dataset_statistics, load_dataset

        try:
            with FileLock(str(user_cache_dir() / ".load.lock")):
                data = load_dataset(
                    cfg.dataset, cfg.data_root or None, min_class_size=cfg.min_class_size
                )
        except (FileNotFoundError, ValueError) as err:
            raise ConfigError(f"dataset/data-root: {err}") from None
        except Exception as err:  # noqa: BLE001 - a user loader's own failure: bad input too
            raise ConfigError(
                f"dataset: loading {cfg.dataset!r} failed: {type(err).__name__}: {err}"
            ) from err
        stats, domain = dataset_statistics(data), getattr(data, "feature_domain", None)
    if getattr(cfg, "mechanism", None) is not None and domain is None:
        raise ConfigError(
            f"dataset: {cfg.dataset!r} has no public feature domain, and PPGNN's "
            "local feature mechanisms need one (the range every feature lies "
            "in): set feature_domain on the graph (a files dataset: "
            "feature_domain = [low, high] in its graph.toml)"
        )
    if getattr(cfg, "mechanism", None) is not None:  # PPGNN: what the mechanism declares
        from .mechanisms import check_mechanism
        from .methods.ppgnn import build_mechanism
        from .registry import ContractError

        try:
            mech = build_mechanism(cfg)
            # Dry run on random features: catches a report that carries the raw features and
            # an estimate of the wrong shape before any real data is perturbed.
            check_mechanism(mech, num_levels=len(getattr(cfg, "budgets", [1])))
        except (ValueError, ContractError) as err:  # (a cause is the user's code: kept)
            raise ConfigError(f"mechanism: {err}") from err.__cause__
        check_feature_budgets(cfg, mech)
    if getattr(cfg, "device", "auto") == "cuda" and not os.environ.get("RAY_ADDRESS"):
        # One machine: the clients' GPUs are this machine's. (On a cluster, set by RAY_ADDRESS,
        # the GPUs may be on other nodes: each client checks its own device instead.)
        from .device import resolve_device

        resolve_device("cuda")  # ConfigError naming the key 'device'
    if cfg.num_clients > stats["num_nodes"]:
        raise ConfigError(
            f"num-clients: must lie in [1, {stats['num_nodes']}] for dataset "
            f"{cfg.dataset!r} (one node at least per client), got {cfg.num_clients}"
        )
    check_nonempty(cfg, data)
    check_epsilons_reachable(cfg, data)
    if getattr(cfg, "method", None) == "privgnn":  # K within every client's expected sample
        from .methods.privgnn import check_config_neighbours

        check_config_neighbours(cfg, data)
        # every client's private part into the partition cache, from the graph loaded here:
        # the client processes read their part instead of loading the whole dataset
        privgnn_client_graph(cfg, 0, data)
    return stats


#: the splits each method's clients need nodes of (the others only need the global split).
_CLIENT_SPLITS = {"gap": ("train",), "ppgnn": ()}


def _views_without_loading(cfg) -> list[ClientView] | None:
    """Every client's view of ``cfg`` read from the partition cache, or ``None`` when that
    needs the dataset loaded (a miss, a user's loader or partitioner, no cache; methods
    without client views: PrivGNN)."""
    method = getattr(cfg, "method", None)
    if method not in _CLIENT_SPLITS:
        return None
    try:
        return [client_view(cfg, pid, compute=False) for pid in range(cfg.num_clients)]
    except NotCached:
        return None


#: methods whose clients calibrate their noise to their own target epsilon at setup, from the
#: public config and their public count of training nodes (``<method>.privacy.epsilon_floor``)
_CALIBRATED = ("gap", "progap")
#: what else lowers a calibrated method's floor, in its own keys
_FEWER = {
    ("gap", "edge"): "fewer hops",
    ("gap", "node"): "fewer hops, encoder-rounds, classifier-rounds or local-epochs",
    ("progap", "edge"): "a smaller depth",
    ("progap", "node"): "a smaller depth, fewer epochs or local-epochs",
}


def check_epsilons_reachable(cfg, data=None) -> None:
    """Every GAP or ProGAP client's target epsilon (``client-epsilons``, per client for the
    whole run) can be met: it is at least what the client's releases spend at the largest
    noise multiplier its calibration searches (``<method>.privacy.epsilon_floor``, one
    accountant evaluation per distinct training-node count; at edge level the same for
    every client). Otherwise each client would fail at setup. PrivGNN: some client's target
    affords one answer, else no query could be labelled. PPGNN: nothing to check.

    Raises:
        fedgraph.config.ConfigError: naming ``client-epsilons``, the client, its target and the
            smallest epsilon allowed, and what else lowers it.
    """
    import importlib

    from .config import ConfigError

    method = getattr(cfg, "method", None)
    if method == "privgnn":
        _check_an_answer_is_affordable(cfg)
    if method not in _CALIBRATED:
        return
    floor_of = importlib.import_module(f".methods.{method}.privacy", __package__).epsilon_floor
    floors: dict[int, float] = {}
    for pid in range(cfg.num_clients):
        epsilon = cfg.client_epsilon(pid)
        if math.isinf(epsilon):
            continue
        n = int(client_view(cfg, pid, data=data).graph.train_mask.sum())
        if n not in floors:
            floors[n] = floor_of(cfg, n)
        if epsilon < floors[n]:
            raise ConfigError(
                f"client-epsilons: client {pid}'s target epsilon {epsilon:g} cannot be met: "
                f"even at the largest noise multiplier its calibration searches, its releases "
                f"spend epsilon {floors[n]:.4g} (delta {cfg.delta:g}, {method} at "
                f"{cfg.level} level); allowed: epsilon >= {floors[n]:.4g} (or 'inf'), or a "
                f"larger delta, or {_FEWER[method, cfg.level]}"
            )


def _check_an_answer_is_affordable(cfg) -> None:
    """PrivGNN: some client's target epsilon affords its first answer
    (:func:`fedgraph.methods.privgnn.privacy.client_limit` > 0; with ensemble mode and
    secure aggregation the strictest target binds every client); otherwise no query is
    labelled and the run fails after every teacher has trained. Public parameters only. An
    unset ensemble ``sigma-votes`` is calibrated by the strategy to the strictest target
    instead (which names ``client-epsilons`` where no std up to 1e6 meets it)."""
    from .config import ConfigError
    from .methods.privgnn.privacy import client_limit, one_answer_epsilon

    ensemble = cfg.answer_mode == "ensemble"
    if ensemble and cfg.sigma_votes is None:
        return
    if any(client_limit(cfg, pid, 1) for pid in range(cfg.num_clients)):
        return
    cost = one_answer_epsilon(cfg)
    targets = [cfg.client_epsilon(pid) for pid in range(cfg.num_clients)]
    shared = ensemble and cfg.secure_aggregation  # client_limit: the strictest binds everyone
    binding = min(targets) if shared else max(targets)
    which = (
        "the strictest target (with secure-aggregation every client answers as many as it allows)"
        if shared
        else "the largest target"
    )
    knobs = "a larger sigma-votes or sigma-threshold" if ensemble else "a smaller lam"
    raise ConfigError(
        f"client-epsilons: no client can answer a single query: {which} is epsilon "
        f"{binding:g}, and one {'released histogram' if ensemble else 'answer'} spends "
        f"epsilon {cost:.4g} (delta {cfg.delta:g}); allowed: epsilon >= {cost:.4g} (or 'inf'), "
        f"or {knobs}, or a larger delta"
    )


def check_nonempty(cfg, data=None) -> None:
    """Every split of the whole graph holds a node, every client holds a node, and every client
    holds a node of each split its method trains on (GAP: ``train``), so that no accuracy is
    NaN and no client trains on nothing. Runs where the simulation knows the whole graph
    (:func:`preflight`), before any client starts (which fills the partition cache: the
    clients then only read their parts); PrivGNN's splits are checked by its own setup (public
    and private graphs).

    Raises:
        fedgraph.config.ConfigError: naming the split (and the client) that is empty and what
            to change (``split``, ``num-clients``, ``partitioner``).
    """
    from .config import ConfigError

    method = getattr(cfg, "method", None)
    if method not in _CLIENT_SPLITS:
        return
    views = [client_view(cfg, pid, data=data) for pid in range(cfg.num_clients)]
    for split in ("train", "val", "test"):
        if sum(int(getattr(v.graph, f"{split}_mask").sum()) for v in views) == 0:
            raise ConfigError(
                f"split: the {split} split of dataset {cfg.dataset!r} is empty under split "
                f"{cfg.split!r} ({views[0].statistics['num_nodes']} nodes): use a larger graph "
                "or another split"
            )
    for pid, v in enumerate(views):
        if v.graph.num_nodes == 0:
            raise ConfigError(
                f"num-clients: client {pid} holds no node under partitioner "
                f"{cfg.partitioner!r}: use fewer clients (num-clients = "
                f"{cfg.num_clients}) or another partitioner"
            )
        for split in _CLIENT_SPLITS[method]:
            if int(getattr(v.graph, f"{split}_mask").sum()) == 0:
                raise ConfigError(
                    f"num-clients: client {pid} holds no {split} node (split {cfg.split!r}, "
                    f"partitioner {cfg.partitioner!r}, {cfg.num_clients} clients): method "
                    f"{method!r} trains on every client; use fewer clients or another "
                    "partitioner"
                )
