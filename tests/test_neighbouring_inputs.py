"""Neighbouring inputs (issue 28): "public" is checked, not declared.

The real client handlers (:mod:`fedgraph.simulations.client_app`, through the real strategies on
:class:`fedgraph.simulations.local.LocalGrid`) run on a graph ``D`` and on a worst-case neighbour ``D'``
(one protected unit changed), with the clients' noise injected identically on both sides
(``noise-source = "secret"``, one secret, the data digest of the key held fixed, deterministic
secure-aggregation keys). Every field of every reply is recorded on both sides and paired
message by message (message kind, client, occurrence), and the harness asserts, per field,
what its table says it is (:func:`category`: the allow-list refined by :data:`REFINE`):

``public``
    a function of the public run config, the node directory and the schema only: identical on
    ``D`` and ``D'``, in every message, however the transcript went before it (ints, strings
    and bytes exactly; float arrays exactly too: on one torch thread, with Python's ``random``
    seeded for Flower's node sampling, two runs are bitwise equal, see :func:`one_thread` and
    :func:`test_identical_inputs_give_identical_transcripts`).
``noised``
    a ledgered release (the ledger of the ``D`` run must hold it): where the transcript before
    it was identical, it moves by at most the sensitivity its ledger entry used (GAP: the
    client's plan, ``meta.plan.sensitivity``, per reply and jointly over the clients of one
    hop; ProGAP: the same for each stage's aggregation, a PMA hop of another input; PrivGNN:
    2 in L1 per posterior, sqrt 2 in L2 per vote histogram copy; PPGNN: only the changed
    user's rows). Where no bound can be read off a whole run (DP-SGD's weights) the
    table says why and which test covers it.
``post``
    post-processing of earlier releases (named): may differ only after one of them differed.
``evaluation``
    outside the guarantee (the report's accuracy), declared.

A field the table does not list fails, whatever the two sides hold.

Two transcripts per neighbour:

* **live**: the whole strategy on ``D`` and on ``D'``. Once a noised release differs, the
  server's later requests differ too: a noised field is checked against its bound only while
  every request its client received was the same on both sides (edge level: PMA's first hop,
  the encoder reading no edge), public fields throughout.
* **replay**: the ``D'`` clients answer exactly the requests the server sent on ``D``
  (adaptive composition: each release is the mechanism on ``D'`` given the transcript so far),
  so every noised field is checked against its sensitivity, every hop and round; and a client
  whose data the neighbour does not touch must reply identically in every field. The
  neighbours are built so that the conditioning holds for GAP's multi-hop PMA too: a changed
  edge crosses clients and the changed node has only cross-client edges, so no client's
  unreleased local rows (the other output of the same Gaussian mechanism) change.

The table is derived from the allow-list of ``tests/test_client_releases.py`` (:data:`ALLOWED`,
which says what may leave a client at all): this file splits its ``public`` entries honestly
into ``public`` and ``post`` and gives each ``noised`` entry its bound (:data:`REFINE`); a
refinement of a field the allow-list does not list fails
(:func:`test_the_table_refines_the_allow_list`).

The premise of the replay's multi-hop checks is itself checked: every client's private hops
1..K are the same on ``D`` and ``D'`` (:func:`_private_hops_unchanged`). It would not hold for
an edge inside one client, nor for a node whose in-neighbours have more than ``max-degree``
out-edges (removing it frees a slot in their sampled out-edges: the caveat stated in
:mod:`fedgraph.utils.graph`); there hop k >= 2 is checked by ``tests/test_gap_neighbours.py``
given hop k-1, and here only hop 1 and the public fields would be.

Single-hop sensitivity with the clients' own functions (hop k given hop k-1, random graphs):
``tests/test_gap_neighbours.py``; PrivGNN's answers: ``tests/test_privgnn*.py``; this file is
the whole-transcript complement.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace

import numpy as np
import pytest
import torch
from test_client_releases import ALLOWED, reply_fields
from test_client_releases import message_kind as kind_of
from torch_geometric.data import Data

NAME = "neighbour-harness-graph"  # the registered dataset: D, then D' under the same name
N, F, C = 240, 12, 4  # nodes, binary features, classes of the synthetic graph
#: a private node with many in-neighbours at other clients (and so a high degree: above the
#: node-level out-degree bound D below)
NODE_NEIGHBOURS = 12
MAX_DEGREE = 5  # node-level GAP's D; every other node has degree <= 4 (no edge sampling)
SEED = 0

BASE = {"dataset": NAME, "noise-source": "secret", "seed": SEED, "partitioner": "random"}
# sizes as tests/test_client_releases.py (few rounds, small models)
GAP = {
    **BASE,
    "method": "gap",
    "num-clients": 2,
    "encoder-rounds": 1,
    "classifier-rounds": 2,
    "local-epochs": 1,
    "schedule": "fedavg",
    "hops": 2,
    "client-epsilons": "4,2",
    "delta": 1e-5,
}
GAP_NODE = {
    **GAP,
    "level": "node",
    "max-degree": MAX_DEGREE,
    "batch-size": 256,
    "accountant": "rdp",
}
THREE = {"num-clients": 3, "client-epsilons": "4,2,8"}
PPGNN = {**BASE, "method": "ppgnn", "num-clients": 2, "epochs": 5, "partitioner": "users"}
PRIVGNN = {
    **BASE,
    "method": "privgnn",
    "num-clients": 2,
    "num-queries": 6,
    "lam": 1.0,
    "gamma": 0.3,
    "delta": 1e-4,
    "num-neighbours": 10,
    "teacher-epochs": 5,
    "teacher-hidden": 8,
    "teacher-batch-size": 8,
    "projection-dim": 8,
    "epochs": 5,
    "hidden": 8,
    "neighbourhood-size": 10,
}
PRIVGNN_ENSEMBLE = {
    **PRIVGNN,
    "answer-mode": "ensemble",
    "num-teachers": 4,
    "sigma-votes": 3.0,
    "sigma-threshold": 2.0,
}
# depth 2: the second aggregation reads the first (the replay's multi-stage premise)
PROGAP = {
    **BASE,
    "method": "progap",
    "num-clients": 2,
    "depth": 2,
    "epochs": 2,
    "hidden": 8,
    "client-epsilons": "4,2",
    "delta": 1e-5,
    "accountant": "rdp",
}
PROGAP_NODE = {
    **PROGAP,
    "level": "node",
    "depth": 1,
    "epochs": 1,
    "max-degree": MAX_DEGREE,
    "batch-size": 4096,
}  # full-batch DP-SGD: calibration in milliseconds

TOL = 1e-5  # slack on a sensitivity bound (float32 rows; 2^-24 fixed point under secure agg.)


# =============================================================================== the table
def _noised(release, bound, why):
    """``release``: the ledger's release (a prefix; ``None``: the allow-list's name)."""
    return ("noised", release, bound, why)


def _post(of, why):
    return ("post", tuple(of), why)


PMA_BOUND = (
    "pma-rows",
    "L2 change of the client's rows <= its plan's sensitivity, and over "
    "all clients' rows of one hop (the sums a node's owner receives, under "
    "secure aggregation) <= the sensitivity",
)
DPSGD_UNCHECKED = (
    None,
    "DP-SGD's weights after several clipped, noised steps: no bound in "
    "weight space follows from one run (the steps after the first see "
    "different weights); Opacus's per-step clipping and the public "
    "normaliser are checked in tests/test_client_releases.py "
    "(test_opacus_normaliser_and_schedule_come_from_the_public_count)",
)
POST_PMA_EDGE = _post(
    ["pma"],
    "edge level: a function of PMA's noisy rows (the client's own "
    "noisy local rows included), features and labels; the unit (an "
    "edge) enters only through PMA",
)
POST_AGGREGATION_EDGE = _post(
    ["aggregation"],
    "edge level: a function of the aggregations' "
    "noisy rows (the client's own noisy local rows "
    "included), features and labels; stage 0 reads "
    "no edge",
)
LEVELS = ("edge", "node")

#: how the harness reads ALLOWED: (method, kind, field, level) -> category. ``level``: GAP
#: and ProGAP ``edge`` / ``node``; PPGNN ``paper`` (labels given to the server) / ``rr``
#: (label-epsilon > 0); PrivGNN ``None`` / ``ensemble``. A field of ALLOWED not listed here
#: keeps its kind.
REFINE = {
    ("gap", "train[gap.encoder]", "arrays.*", "node"): _noised("encoder dp-sgd", *DPSGD_UNCHECKED),
    ("gap", "train[gap.classifier]", "arrays.*", "node"): _noised(
        "classifier dp-sgd", *DPSGD_UNCHECKED
    ),
    ("gap", "train[gap.classifier]", "arrays.*", "edge"): POST_PMA_EDGE,
    ("gap", "train[gap.classifier]", "metrics.train-loss", "edge"): POST_PMA_EDGE,
    ("gap", "train[gap.classifier]", "metrics.val-accuracy", "edge"): POST_PMA_EDGE,
    ("gap", "train[gap.classifier]", "metrics.val-loss", "edge"): POST_PMA_EDGE,
    ("gap", "evaluate[gap.classifier]", "metrics.val-accuracy", "edge"): POST_PMA_EDGE,
    ("gap", "evaluate[gap.classifier]", "metrics.val-loss", "edge"): POST_PMA_EDGE,
    ("gap", "query.gap_pma", "partial_sums.sums", "edge"): _noised("pma", *PMA_BOUND),
    ("gap", "query.gap_pma", "partial_sums.sums", "node"): _noised("pma", *PMA_BOUND),
    ("gap", "query.gap_pma", "partial_sums.masked", "edge"): _noised("pma", *PMA_BOUND),
    ("gap", "query.gap_pma", "partial_sums.masked", "node"): _noised("pma", *PMA_BOUND),
    # (the ledger's releases are the mechanism's own names: esw, mlr, multi-bit, laplace, ...)
    ("ppgnn", "query.ppgnn", "report.mech.*", "paper"): _noised(
        None,
        "one-user",
        "each user's report is LDP (PPM: its level through ESW, its "
        "features through MLR): only the changed user's rows may differ",
    ),
    ("ppgnn", "query.ppgnn", "report.mech.*", "rr"): _noised(
        None,
        "one-user",
        "each user's report is LDP (PPM: its level through ESW, its "
        "features through MLR): only the changed user's rows may differ",
    ),
    ("ppgnn", "query.ppgnn", "report.labels", "rr"): _noised(
        "labels (randomized response)",
        "one-user",
        "randomized response per label: only the changed user's label may differ",
    ),
    ("progap", "train.progap_stage", "arrays.*", "node"): _noised("stage dp-sgd", *DPSGD_UNCHECKED),
    **{
        ("progap", kind, f, "edge"): POST_AGGREGATION_EDGE
        for kind, fields in (
            ("train.progap_stage", ("arrays.*", "metrics.train-loss")),
            ("train.progap_stage", ("metrics.val-accuracy", "metrics.val-loss")),
            ("evaluate.progap_stage", ("metrics.val-accuracy", "metrics.val-loss")),
        )
        for f in fields
    },
    **{
        ("progap", "query.progap_aggregate[release]", f"partial_sums.{f}", level): _noised(
            "aggregation", *PMA_BOUND
        )
        for f in ("sums", "masked")
        for level in LEVELS
    },
    ("privgnn", "query.privgnn", "answers.answers", None): _noised(
        None,
        "posterior-l1",
        "a probability vector (or one-hot vote) per query: L1 change <= 2 "
        "(the Laplace mechanism's sensitivity, noise multiplier 1/lam)",
    ),
    ("privgnn", "query.privgnn", "answers.answers", "ensemble"): _noised(
        None,
        "votes-l2",
        "one node is in one teacher's induced subgraph: one vote per query "
        "moves, L2 change <= sqrt 2 per histogram copy (the Gaussian events' "
        "sensitivity); masked: the ring difference, the masks being equal",
    ),
}


def _allowed(method, kind, fld, level):
    """ALLOWED's entry for a field (exact, else ``record.*`` / ``record.key.*``), resolved for
    ``level``; ``None`` if not listed."""
    table = ALLOWED[method].get(kind, {})
    parts = fld.split(".")
    for key in (fld, parts[0] + ".*", ".".join(parts[:2]) + ".*"):
        if key in table:
            entry = table[key]
            if isinstance(entry, dict):  # per level
                entry = entry.get(level)
            return key, entry
    return None, None


def category(method, kind, fld, level):
    """What the harness checks of ``fld``: ``("public", why)``, a :func:`_noised` or
    :func:`_post` tuple, ``("evaluation", why)``, or ``None`` (undeclared: fails)."""
    key, entry = _allowed(method, kind, fld, level)
    if entry is None:
        return None
    refined = REFINE.get((method, kind, key, level))
    if refined is not None:
        if refined[0] == "noised" and refined[1] is None:  # the allow-list's release
            refined = ("noised", entry[1]) + refined[2:]
        return refined
    if entry[0] == "noised":  # listed noised without a bound: say so (the table test fails)
        return _noised(entry[1], None, "no bound declared")
    return entry


# ============================================================================ the graphs
def base_graph() -> Data:
    """``N`` nodes, ``F`` binary features (public domain [0, 1]), ``C`` classes; a ring and a
    random matching: every node has degree <= 3 (below node-level GAP's bound, so no edge
    sampling), seeded."""
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(N, F, generator=g) < 0.3).float()
    y = torch.randint(0, C, (N,), generator=g)
    y[:C] = torch.arange(C)  # every class present
    ring = torch.stack([torch.arange(N), (torch.arange(N) + 1) % N])
    perm = torch.randperm(N, generator=g)
    match = torch.stack([perm[: N // 2], perm[N // 2 :]])
    return Data(
        x=x,
        y=y,
        edge_index=_undirected(torch.cat([ring, match], 1)),
        num_nodes=N,
        feature_domain=(0.0, 1.0),
    )


def _undirected(ei):
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    ei, _ = remove_self_loops(ei)
    return coalesce(to_undirected(ei, num_nodes=N), num_nodes=N)


def _with_edges(data, add=(), drop_node=None, drop_edges=()):
    out = data.clone()
    ei = out.edge_index
    if drop_node is not None:
        ei = ei[:, (ei[0] != drop_node) & (ei[1] != drop_node)]
    for u, v in drop_edges:
        ei = ei[:, ~(((ei[0] == u) & (ei[1] == v)) | ((ei[0] == v) & (ei[1] == u)))]
    if add:
        ei = torch.cat([ei, torch.tensor(add, dtype=torch.long).t()], 1)
    out.edge_index = _undirected(ei)
    return out


def _owners(config, data) -> tuple[torch.Tensor, Data]:
    """Client index of every node (the partition of ``D``, which ``D'`` shares: ``random`` and
    ``users`` depend on the seed and the node count only) and the split graph."""
    from fedgraph.config import parse_run_config
    from fedgraph.data import apply_split, partition

    cfg = parse_run_config({**config, "dataset": "cora"})  # (the split settings only)
    split = apply_split(data.clone(), cfg.split, cfg.seed)
    owner = torch.full((N,), -1, dtype=torch.long)
    for c in partition(split, cfg.num_clients, cfg.partitioner, cfg.seed):
        owner[c.node_ids] = c.client_id
    return owner, split


@dataclass
class Neighbour:
    """``D`` and ``D'``, what changed and which clients hold the changed data."""

    name: str
    d: Data
    d2: Data
    touched: set  # partition ids whose own data differ (sources of changed edges, the node's
    #               owner, the owners of its in-neighbours)
    drop_half: tuple | None = None  # directed unit: D' lacks only this half u -> v (applied
    #                                 after loading: a loader's graph is made undirected)
    user: int | None = None  # PPGNN: the changed user's global id
    level_of: int | None = None  # PPGNN: the user whose privacy level differs in D'


def _pick(candidates, count=1, avoid=()):
    out = [int(i) for i in candidates if int(i) not in avoid][:count]
    assert len(out) == count, "the synthetic graph has too few candidate nodes"
    return out


def cross_client_edge(config, unit="undirected", graph="train") -> Neighbour:
    """An edge ``u - v`` between clients 0 and 1 that ``D`` has and ``D'`` lacks (both halves;
    ``directed``: only ``u -> v``); ``graph = "test"``: both ends test nodes (the held-out
    graph of inductive inference), else training nodes."""
    data = base_graph()
    owner, split = _owners(config, data)
    mask = split.test_mask if graph == "test" else split.train_mask
    u = _pick(((owner == 0) & mask).nonzero().flatten())[0]
    adjacent = set(data.edge_index[1][data.edge_index[0] == u].tolist())
    v = _pick(((owner == 1) & mask).nonzero().flatten(), avoid=adjacent)[0]
    d = _with_edges(data, add=[(u, v)])
    if unit == "directed":
        return Neighbour(
            f"a cross-client edge's half {u} -> {v} (clients 0 -> 1)", d, d, {0}, drop_half=(u, v)
        )
    return Neighbour(
        f"a cross-client edge {u} - {v} (clients 0, 1)",
        d,
        _with_edges(d, drop_edges=[(u, v)]),
        {0, 1},
    )


def boundary_node(config) -> Neighbour:
    """A training node ``w`` of client 0 whose only edges are :data:`NODE_NEIGHBOURS` to
    train/val nodes at the other clients (a high degree: above ``max-degree``); in ``D'`` it is
    isolated, with other features and another label (its id stays: the universe is public)."""
    data = base_graph()
    owner, split = _owners(config, data)
    w = _pick(((owner == 0) & split.train_mask).nonzero().flatten())[0]
    others = ((owner != 0) & ~split.test_mask).nonzero().flatten()
    # spread over the other clients: alternate between them
    by_client = [others[owner[others] == c].tolist() for c in sorted(set(owner[others].tolist()))]
    picks = [n for group in zip(*by_client) for n in group][:NODE_NEIGHBOURS]
    assert len(picks) == NODE_NEIGHBOURS
    d = _with_edges(_with_edges(data, drop_node=w), add=[(w, p) for p in picks])
    d2 = _with_edges(d, drop_node=w)
    d2.x = d2.x.clone()
    d2.x[w] = 1 - d2.x[w]
    d2.y = d2.y.clone()
    d2.y[w] = (d2.y[w] + 1) % C
    return Neighbour(
        f"node {w} of client 0 with {NODE_NEIGHBOURS} in-neighbours at other "
        f"clients, isolated with other features and label",
        d,
        d2,
        {0} | set(owner[picks].tolist()),
    )


def privgnn_node(config, index=0) -> Neighbour:
    """The ``index``-th private node of client 0, given edges to private nodes of both
    clients; in ``D'`` isolated, with other features and another label."""
    from fedgraph.config import parse_run_config
    from fedgraph.data import partition
    from fedgraph.methods.privgnn import privgnn_split

    cfg = parse_run_config({**config, "dataset": "cora"})  # (the split settings only)
    data = base_graph()
    private, _ = privgnn_split(
        data.clone(),
        public_fraction=cfg.public_fraction,
        public_test_fraction=cfg.public_test_fraction,
        seed=cfg.seed,
    )
    owner = torch.full((N,), -1, dtype=torch.long)
    for c in partition(private, cfg.num_clients, cfg.partitioner, cfg.seed):
        owner[private.node_ids[c.node_ids]] = c.client_id
    w = _pick((owner == 0).nonzero().flatten(), index + 1)[index]
    picks = _pick((owner == 0).nonzero().flatten(), 4, avoid={w}) + _pick(
        (owner == 1).nonzero().flatten(), 4
    )
    d = _with_edges(_with_edges(data, drop_node=w), add=[(w, p) for p in picks])
    d2 = _with_edges(d, drop_node=w)
    d2.x, d2.y = d2.x.clone(), d2.y.clone()
    d2.x[w] = 1 - d2.x[w]
    d2.y[w] = (d2.y[w] + 1) % C
    return Neighbour(
        f"private node {w} of client 0 (edges at both clients), isolated with "
        "other features and label",
        d,
        d2,
        {0},
    )


def ppgnn_user(config, what, index=0) -> Neighbour:
    """The ``index``-th training user ``j`` of client 0: ``features`` flipped, ``label``
    changed, or its ``level`` (drawn on the client: changed after the draw, see
    :func:`_level_hook`)."""
    data = base_graph()
    owner, split = _owners(config, data)
    j = _pick(((owner == 0) & split.train_mask).nonzero().flatten(), index + 1)[index]
    d2 = data.clone()
    if what == "features":
        d2.x = d2.x.clone()
        d2.x[j] = 1 - d2.x[j]
    elif what == "label":
        d2.y = d2.y.clone()
        d2.y[j] = (d2.y[j] + 1) % C
    return Neighbour(
        f"user {j}'s {what} (client 0)",
        data,
        d2,
        {0},
        user=j,
        level_of=j if what == "level" else None,
    )


# ============================================================================== running
@pytest.fixture
def one_thread():
    """Torch on one thread (restored after): the runs are bitwise reproducible (PyTorch's
    multithreaded reductions differ at 1e-7 between identical runs) and ten times faster on a
    shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def harness(monkeypatch, tmp_path, one_thread):
    """Identical noise on both sides: ``noise-source = "secret"`` with one secret, the data
    digest of the release keys held fixed (``fedgraph.randomness.client_data_digest``, which
    would otherwise give ``D'`` independent noise), and secure aggregation's X25519 key pairs
    drawn from a counter reset at every run instead of the OS. No partition cache: every run
    partitions the graph it is given."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    import fedgraph.randomness
    import fedgraph.secure_aggregation as sa
    from fedgraph.data.datasets import DATASETS

    monkeypatch.setitem(DATASETS, NAME, None)  # the test graph is unregistered afterwards
    monkeypatch.setenv("FEDGRAPH_NOISE_SECRET", "neighbouring-inputs-harness")
    monkeypatch.setenv("FEDGRAPH_PARTITION_CACHE", "off")
    monkeypatch.setattr(
        fedgraph.randomness, "client_data_digest", lambda *a, **k: "fixed", raising=False
    )
    counter = [0]

    def key_pair():
        counter[0] += 1
        sk = X25519PrivateKey.from_private_bytes(
            hashlib.sha256(f"harness key {counter[0]}".encode()).digest()
        )
        return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()

    monkeypatch.setattr(sa, "generate_key_pair", key_pair)
    return Harness(monkeypatch, tmp_path, counter)


def _clear_caches():
    """The in-process caches of the clients' views (keyed by the dataset's name: ``D`` and
    ``D'`` share it)."""
    import fedgraph.federation as fed
    from fedgraph.methods.privgnn import graphs as pf

    fed._client_views.cache_clear()
    pf._FEDERATIONS.clear()


@dataclass
class Run:
    config: dict
    cfg: object
    log: list  # (request, reply) in the order the server saw them
    releases: set  # the ledger's release names
    strategy: object
    grid: object = None  # the LocalGrid (the clients' contexts after the run)


def _snapshots(client_app, sent: list):
    """``client_app`` keeping a copy of every request as the client received it: the server
    reuses a round's config record and sets ``server-round`` in place, so the requests that
    ``LocalGrid``'s log holds show the last round's value by the end of a run (a replay of
    them would draw another round's noise)."""

    def app(message, context):
        sent.append(copy.deepcopy(message))
        return client_app(message, context)

    return app


class Harness:
    def __init__(self, monkeypatch, tmp_path, counter):
        self.monkeypatch, self.tmp_path, self.counter = monkeypatch, tmp_path, counter
        self.loads = 0  # calls of the registered loader since the last reset

    def _loaded(self):
        """The clients (or PrivGNN's shared federation) loaded the graph given: no stale view
        of the other side came from a cache."""
        assert self.loads > 0, "the clients did not load the graph (a cache kept D's views?)"

    def use(self, data, drop_half=None, level_of=None):
        """Make ``data`` the registered dataset (``drop_half``: and remove that directed half
        from what the clients load; ``level_of``: and move that user to the next privacy
        level after the client drew the levels)."""
        import fedgraph.federation as fed
        from fedgraph.data import register_dataset

        def loader(root):
            self.loads += 1
            return data.clone()

        register_dataset(NAME, loader, replace=True)
        real = getattr(fed.load_graph, "harness_real", fed.load_graph)
        self.monkeypatch.setattr(fed, "load_graph", real)
        if drop_half is not None:  # what every client (and PrivGNN's server) loads
            u, v = drop_half

            def load_graph(cfg):
                g = real(cfg)
                ei = g.edge_index
                g.edge_index = ei[:, ~((ei[0] == u) & (ei[1] == v))]
                return g

            load_graph.harness_real = real
            self.monkeypatch.setattr(fed, "load_graph", load_graph)
        _level_hook(self.monkeypatch, level_of)
        _clear_caches()
        self.counter[0] = 0
        torch.manual_seed(0)
        random.seed(0)  # Flower samples a round's nodes with Python's random: the same order
        #                 on both sides, so the server sums the replies in the same order

    def run(self, config, data, tamper=None, **change) -> Run:
        """The whole strategy on ``data`` (the ServerApp's steps: validate, preflight, run;
        the report's composition is skipped: its PLD cross-check is most of a run's time and
        reads nothing the clients sent)."""
        from fedgraph.federation import preflight
        from fedgraph.simulations.local import LocalGrid
        from fedgraph.simulations.server_app import validate_run_config

        self.use(data, **change)
        strategy_cls, cfg = validate_run_config({**config, "output-dir": str(self.tmp_path)})
        preflight(cfg)
        _clear_caches()  # preflight's views were computed from the undirected graph
        self.loads = 0
        strategy = strategy_cls(cfg)
        strategy.check_config()
        torch.manual_seed(cfg.seed)
        grid = LocalGrid(cfg.num_clients, tamper=tamper, record=True)
        grid.provision({**config, "output-dir": str(self.tmp_path)})  # the clients' own config
        grid.client_app = _snapshots(grid.client_app, sent := [])
        strategy.run(grid)
        self._loaded()
        assert len(sent) == len(grid.log)
        releases = {e.release for rows in strategy.ledger.entries.values() for e in rows}
        return Run(
            config, cfg, [(m, r) for m, (_, r) in zip(sent, grid.log)], releases, strategy, grid
        )

    def replay(self, run: Run, data, tamper=None, **change) -> list:
        """``D'``'s clients answering the requests of ``run`` (the server's messages on ``D``),
        in the same order, each with its own state: ``[(request, reply)]``."""
        from fedgraph.simulations.local import LocalGrid

        self.use(data, **change)
        grid = self.replay_grid = LocalGrid(run.cfg.num_clients)
        grid.provision({**run.config, "output-dir": str(self.tmp_path)})  # their own config
        out = []
        for m, _ in run.log:
            reply = grid.client_app(m, grid.contexts[m.metadata.dst_node_id])
            if tamper is not None:
                reply = tamper(m, reply)
            out.append((m, reply))
        self._loaded()
        return out


def _level_hook(monkeypatch, user):
    """PPGNN's levels are drawn on the client (``fedgraph.methods.ppgnn.with_client_levels``):
    in ``D'`` the level of ``user`` (a global id) is moved to the next level."""
    from fedgraph.methods.ppgnn import client as ppgnn

    real = getattr(ppgnn, "with_client_levels", None)
    if real is None:
        return
    real = getattr(real, "harness_real", real)
    if user is None:
        monkeypatch.setattr(ppgnn, "with_client_levels", real)
        return

    def with_client_levels(client, cfg, *args, **kwargs):
        out = real(client, cfg, *args, **kwargs)
        at = (out.node_ids == user).nonzero().flatten()
        if at.numel():
            levels = out.levels.clone()
            levels[at] = levels[at] % len(cfg.budgets) + 1
            out = dc_replace(out, levels=levels)
        return out

    with_client_levels.harness_real = real
    monkeypatch.setattr(ppgnn, "with_client_levels", with_client_levels)


# ============================================================================ comparing
def level_of(run: Run):
    cfg = run.cfg
    if cfg.method in ("gap", "progap"):
        return cfg.level
    if cfg.method == "ppgnn":
        return "rr" if cfg.label_epsilon > 0 else "paper"
    return "ensemble" if cfg.answer_mode == "ensemble" else None


def _value(v):
    """A reply field as something comparable: a numpy array for arrays, else the value."""
    if hasattr(v, "numpy"):
        return np.asarray(v.numpy())
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return v


def same(a, b) -> bool:
    a, b = _value(a), _value(b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=True)
        )
    return type(a) is type(b) and a == b


def describe(a, b) -> str:
    a, b = _value(a), _value(b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return f"{int((d > 0).sum())} of {d.size} entries differ, max |diff| {d.max():.4g}"
    text = f"{a!r} vs {b!r}"
    return text if len(text) < 400 else text[:400] + "..."


def _request_same(m1, m2) -> bool:
    """Whether two requests carry the same content (every record, every value)."""
    if set(m1.content.keys()) != set(m2.content.keys()):
        return False
    for name in m1.content.keys():
        r1, r2 = m1.content[name], m2.content[name]
        if set(r1.keys()) != set(r2.keys()):
            return False
        if not all(same(r1[k], r2[k]) for k in r1.keys()):
            return False
    return True


def _paired(log_d, log_d2):
    """``log_d`` in its order with the matching message of ``log_d2``: the same kind, the same
    client, the same occurrence (Flower's FedAvg sends a round's messages in any order)."""

    def keyed(log):
        seen, out = defaultdict(int), {}
        for m, r in log:
            k = (kind_of(m), m.metadata.dst_node_id)
            out[k + (seen[k],)] = (m, r)
            seen[k] += 1
        return out

    k1, k2 = keyed(log_d), keyed(log_d2)
    assert list(sorted(k1)) == list(sorted(k2)), (
        f"the transcripts on D and D' hold different messages: {sorted(set(k1) ^ set(k2))[:10]}"
    )
    return [(k, k1[k], k2[k]) for k in k1]


@dataclass
class Findings:
    """What the comparison found (``problems``: assertion messages; ``differed``: the fields
    that differed, ``kind:field``; ``checked``: noised fields checked against a bound)."""

    problems: list = field(default_factory=list)
    differed: list = field(default_factory=list)
    checked: list = field(default_factory=list)
    differed_at: list = field(default_factory=list)  # (request on D, field)
    #: ``kind:field`` -> the changes found over their bound (GAP: also ``joint``, a hop's rows)
    ratios: dict = field(default_factory=lambda: defaultdict(list))
    first_difference: tuple | None = None  # (index in D's log, kind, field)


def compare(run: Run, log_d2, neighbour: Neighbour, mode: str) -> Findings:
    """Check ``run`` (on ``D``) against ``log_d2`` (``D'``: live, or replayed on ``run``'s
    requests) field by field, by :func:`category`."""
    method, level = run.cfg.method, level_of(run)
    out = Findings()
    plans = {}  # node -> GAP or ProGAP plan (D's setup replies)
    for m, r in run.log:
        if (
            m.metadata.message_type in ("query.gap_setup", "query.progap_setup")
            and not r.has_error()
        ):
            plans[m.metadata.dst_node_id] = json.loads(r.content["meta"]["plan"])
    out.problems += _ledger_uses_the_plans(run, plans)
    differed_releases = set()  # noised releases that differed so far (post may follow them)
    # live: a client's reply is the mechanism given its inputs; conditioned on the same
    # transcript where every request this client received so far is the same on both sides
    requests_same = defaultdict(lambda: True)
    hops = defaultdict(list)  # (graph, hop) -> [(node, ids, delta rows)] for the joint bound
    for index, (key, (m1, r1), (m2, r2)) in enumerate(_paired(run.log, log_d2)):
        kind, node = key[0], key[1]
        pid = node - 1
        where = f"{method} {kind} (client {pid}, message {key[2]})"
        assert not r1.has_error() and not r2.has_error(), (where, r1, r2)
        if not _request_same(m1, m2):
            requests_same[node] = False
        conditioned = requests_same[node]  # (replay: the same requests by construction)
        f1, f2 = reply_fields(r1), reply_fields(r2)
        if set(f1) != set(f2):
            out.problems.append(
                f"{where}: the replies on D and D' have different fields "
                f"({sorted(set(f1) ^ set(f2))}) on {neighbour.name}"
            )
        for fld in sorted(set(f1) | set(f2)):
            entry = category(method, kind, fld, level)
            if entry is None:
                out.problems.append(
                    f"{where}: {fld} leaves the client and is not declared "
                    f"(public, noised, post or evaluation) for level {level}"
                )
                continue
            if fld not in f1 or fld not in f2:
                continue
            a, b = f1[fld], f2[fld]
            is_same = same(a, b)
            if not is_same:
                out.differed.append(f"{kind}:{fld}")
                out.differed_at.append((m1, fld))
                if out.first_difference is None:
                    out.first_difference = (index, kind, fld)
            if mode == "replay" and pid not in neighbour.touched and not is_same:
                out.problems.append(
                    f"{where}: {fld} differs on {neighbour.name} although this "
                    f"client's data are the same on D and D' "
                    f"({describe(a, b)})"
                )
                continue
            cat = entry[0]
            if cat == "public" and not is_same:
                out.problems.append(
                    f"{where}: {fld} is declared public ({entry[1]}) but "
                    f"differs on {neighbour.name} ({mode}): {describe(a, b)}"
                )
            elif cat == "post" and not is_same and not differed_releases & set(entry[1]):
                # (exact release names: the held-out graph's PMA is not the training graph's)
                out.problems.append(
                    f"{where}: {fld} is post-processing of {list(entry[1])} but "
                    f"differs before any of them did, on {neighbour.name} "
                    f"({mode}): {describe(a, b)}"
                )
            elif cat == "noised":
                release, bound = _release(entry[1], m1), entry[2]
                if release != "*" and not any(r.startswith(release) for r in run.releases):
                    out.problems.append(
                        f"{where}: {fld} is declared noised ({release!r}) but "
                        f"the ledger has no such release: {sorted(run.releases)}"
                    )
                if not is_same:
                    differed_releases.add(release)
                if conditioned and bound is not None:
                    msg = _check_bound(
                        bound,
                        run,
                        m1,
                        r1,
                        r2,
                        fld,
                        a,
                        b,
                        plans.get(node),
                        neighbour,
                        hops,
                        out.ratios[f"{kind}:{fld}"],
                    )
                    out.checked.append(f"{kind}:{fld}")
                    if msg:
                        out.problems.append(
                            f"{where}: {fld} moves by more than the "
                            f"sensitivity on {neighbour.name} ({mode}): {msg}"
                        )
    for (graph, hop), rows in hops.items():  # the joint bound of one PMA hop (aggregation)
        msg = _joint_pma(rows, plans, run.cfg, out.ratios["joint"])
        if msg:
            out.problems.append(
                f"{method} {AGGREGATION[method][0]} (graph {graph}, hop {hop}): "
                f"the rows "
                f"of all clients move by more than the sensitivity on "
                f"{neighbour.name} ({mode}): {msg}"
            )
    return out


#: method -> (the aggregation's request type, the ledger's release, the plan's count of them)
AGGREGATION = {
    "gap": ("query.gap_pma", "pma", "hops"),
    "progap": ("query.progap_aggregate", "aggregation", "depth"),
}


def _ledger_uses_the_plans(run: Run, plans: dict) -> list:
    """GAP and ProGAP: the sensitivity the PMA (aggregation) bound uses is the one the
    ledger's entries were computed with: each client's ``pma`` (``aggregation``) events are
    Gaussian mechanisms of its plan's noise multiplier, and the plan's noise std is that
    multiplier times the plan's sensitivity."""
    problems = []
    for _node, plan in plans.items():
        _, release, count = AGGREGATION[run.cfg.method]
        subject = f"client-{plan['partition_id']}"
        z, sens = float(plan["noise_multiplier"]), float(plan["sensitivity"])
        if not math.isclose(float(plan["sigma"]), z * sens, rel_tol=1e-9):
            problems.append(f"{subject}: plan sigma {plan['sigma']} != {z} x {sens}")
        pma = [
            e for e in run.strategy.ledger.entries.get(subject, []) if e.release.startswith(release)
        ]
        if z > 0 and plan[count] and not pma:
            problems.append(f"{subject}: no {release} release in the ledger")
        for e in pma:
            if not math.isclose(float(e.event.noise_multiplier), z, rel_tol=1e-9):
                problems.append(
                    f"{subject}: ledger {e.release} {e.event} is not the plan's "
                    f"noise multiplier {z}"
                )
    return problems


def _release(name, m) -> str:
    """The ledger's name of a noised field's release in request ``m``: GAP's PMA on the
    held-out graph (inductive inference) is recorded apart, as ``pma (held-out graph)``."""
    if (
        m.metadata.message_type == "query.gap_pma"
        and "graph" in m.content["pma"]
        and str(m.content["pma"]["graph"]) == "test"
    ):
        return f"{name} (held-out graph)"
    return name


def _ring_difference(a, b):
    """Secure aggregation's masked rows (``int64`` bits of ``uint64`` ring elements) on D and
    D' with the same masks: the difference of the noisy rows (fixed point, 2^-FRAC_BITS)."""
    from fedgraph.secure_aggregation import FRAC_BITS

    diff = b.astype(np.int64).view(np.uint64) - a.astype(np.int64).view(np.uint64)
    return diff.view(np.int64).astype(np.float64) / 2.0**FRAC_BITS


def _hop(m) -> tuple[str, int]:
    """``(graph, hop)`` of a GAP PMA request; ProGAP: ``("all", stage)`` of an aggregation."""
    if m.metadata.message_type == "query.progap_aggregate":
        return "all", int(m.content["agg"]["stage"])
    pma = m.content["pma"]
    return (str(pma["graph"]) if "graph" in pma else "all"), int(pma["hop"])


def _check_bound(bound, run, m, r1, r2, fld, a, b, plan, neighbour, hops, ratios) -> str | None:
    """``None`` if the noised field is within its sensitivity, else what was found; the
    change over the bound is appended to ``ratios``."""
    a, b = _value(a), _value(b)
    if bound == "pma-rows":
        ids = _value(reply_fields(r1)["partial_sums.ids"])
        delta = (
            _ring_difference(a, b)
            if fld.endswith("masked")
            else b.astype(np.float64) - a.astype(np.float64)
        )
        hops[_hop(m)].append((m.metadata.dst_node_id, ids, delta))
        norm, sens = float(np.linalg.norm(delta)), float(plan["sensitivity"])
        ratios.append(norm / sens)
        return (
            None
            if norm <= sens * (1 + TOL) + TOL
            else f"L2 change {norm:.6g} > the plan's sensitivity {sens:.6g}"
        )
    if bound == "posterior-l1":
        if b.dtype == np.int64:  # secure-aggregation masked answers are ensemble-only
            return "integer answers in a posterior mode"
        worst = float(np.abs(b - a).sum(axis=1).max()) if a.size else 0.0
        ratios.append(worst / 2)
        return None if worst <= 2 + TOL else f"L1 change of one answer {worst:.6g} > 2"
    if bound == "votes-l2":
        delta = _ring_difference(a, b) if a.dtype == np.int64 else (b - a).astype(np.float64)
        copies = 2 if run.cfg.sigma_threshold else 1  # the threshold copy first, then votes
        worst = 0.0
        for part in np.split(delta, copies, axis=1) if delta.size else []:
            worst = max(worst, float(np.linalg.norm(part, axis=1).max()))
        ratios.append(worst / math.sqrt(2))
        return (
            None
            if worst <= math.sqrt(2) * (1 + TOL) + TOL
            else f"L2 change of one vote histogram {worst:.6g} > sqrt 2"
        )
    if bound == "one-user":
        f1 = {k: _value(v) for k, v in reply_fields(r1).items()}
        f2 = {k: _value(v) for k, v in reply_fields(r2).items()}
        bad = sorted(users_changed(f1, f2, fld) - {neighbour.user})
        return None if not bad else f"the reports of other users differ: {bad[:10]}"
    raise AssertionError(f"unknown bound {bound!r}")


def users_changed(f1: dict, f2: dict, fld: str) -> set:
    """PPGNN: the users (global ids) whose part of report field ``fld`` differs between two
    reports (``report.<key>`` -> numpy array). A tensor with a row per user
    (``released_level``), per labelled user (``labels``), or an entry per sampled bit (``row``,
    ``col``, ``sign``: user ``row[i]``'s bit, local ids); anything else is attributed to every
    user (it must not move)."""
    a, b = f1[fld], f2[fld]
    ids = f1["report.node_ids"]
    every = set(ids.tolist())
    if fld == "report.labels":
        owners = f1["report.labelled_ids"], f2["report.labelled_ids"]
    elif (
        fld in ("report.mech.row", "report.mech.col", "report.mech.sign")
        and "report.mech.row" in f1
        and "report.mech.row" in f2
    ):
        owners = ids[f1["report.mech.row"]], ids[f2["report.mech.row"]]
    elif a.ndim >= 1 and a.shape[0] == ids.shape[0]:
        owners = ids, ids
    else:
        return set() if np.array_equal(a, b) else every
    if a.shape != b.shape or owners[0].shape != owners[1].shape:
        return every  # a count that moved: not one user's
    diff = np.any((a != b).reshape(a.shape[0], -1), axis=1) | (owners[0] != owners[1])
    return set(owners[0][diff].tolist()) | set(owners[1][diff].tolist())


def _joint_pma(rows, plans, cfg, ratios) -> str | None:
    """All clients' rows of one hop: without secure aggregation each row is released, so the
    change of all of them together; with it the server sees only the sums per node."""
    sens = max(float(p["sensitivity"]) for p in plans.values())
    if cfg.secure_aggregation:
        total = defaultdict(float)
        for _, ids, delta in rows:
            for i, row in zip(ids.tolist(), delta):
                total[i] = total[i] + row
        norm = math.sqrt(
            sum(float(np.dot(v, v)) for v in total.values() if isinstance(v, np.ndarray))
        )
    else:
        norm = math.sqrt(sum(float((d**2).sum()) for _, _, d in rows))
    ratios.append(norm / sens)
    return (
        None
        if norm <= sens * (1 + TOL) + TOL
        else f"L2 change {norm:.6g} > the sensitivity {sens:.6g}"
    )


def check_neighbour(harness, config, neighbour: Neighbour, modes=("live", "replay")):
    """Run ``config`` on ``D`` and ``D'``, compare in each mode; returns the ``D`` run and the
    findings per mode (asserting nothing)."""
    change = {"drop_half": neighbour.drop_half, "level_of": neighbour.level_of}
    run_d = harness.run(config, neighbour.d)
    found = {}
    if "live" in modes:
        run_d2 = harness.run(config, neighbour.d2, **change)
        found["live"] = compare(run_d, run_d2.log, neighbour, "live")
    if "replay" in modes:
        found["replay"] = compare(
            run_d, harness.replay(run_d, neighbour.d2, **change), neighbour, "replay"
        )
        if run_d.cfg.method in PRIVATE_STATE:
            found["replay"].problems += _private_hops_unchanged(
                run_d, harness.replay_grid, neighbour
            )
    return run_d, found


#: method -> the client states that hold its aggregations, and how to read the private part:
#: GAP's hops 1..K (hop 0, the encoder's embedding of the client's own features, may differ),
#: ProGAP's stages' aggregations ``x1..xK`` (``progap.cache``)
PRIVATE_STATE = {
    "gap": (("gap.hops", "gap.hops.test"), lambda t: t["hops"][:, 1:]),
    "progap": (("progap.cache",), lambda t: torch.cat([t[k] for k in sorted(t)], 1)),
}


def _private_hops_unchanged(run: Run, replay_grid, neighbour) -> list:
    """The replay's premise for GAP's hops >= 2 (ProGAP's stages >= 2): every client's own PMA
    output (hops 1..K of its nodes, its noisy local rows included, which never leave it;
    ``fedgraph.simulations.client_state`` under ``gap.hops``, ``gap.hops.test`` for the
    held-out graph; ProGAP: its aggregations under ``progap.cache``) is the same on D and D',
    so hop k was checked given the same hop k-1 (adaptive composition). Hop 0 is the encoder's
    embedding of the client's own features (the node's own data: it may differ)."""
    from fedgraph.simulations.client_state import get_tensors

    keys, private = PRIVATE_STATE[run.cfg.method]
    problems = []
    for node, context in run.grid.contexts.items():
        for key in keys:
            if key not in context.state:
                continue
            a = private(get_tensors(context, key))
            b = private(get_tensors(replay_grid.contexts[node], key))
            if not torch.equal(a, b):
                problems.append(
                    f"client {node - 1}: its private hops ({key}) differ on "
                    f"{neighbour.name}: the replay's checks of hops >= 2 were not "
                    "conditioned on the same previous hop"
                )
    found = any(key in c.state for c in run.grid.contexts.values() for key in keys)
    return (
        problems
        if found
        else [
            f"no client kept its PMA hops under {keys} (renamed? the replay's premise is unchecked)"
        ]
    )


def assert_clean(found: dict, expect_noised: set | None = None, must_differ: bool = True):
    """No problem in any mode; ``must_differ``: the neighbour changed some release (it reached
    the clients); ``expect_noised``: fields (``kind:field``) checked against their bound in the
    replay."""
    problems = [p for f in found.values() for p in f.problems]
    assert not problems, "\n".join(problems)
    for mode, f in found.items():
        assert f.differed or not must_differ, f"{mode}: nothing differed between D and D'"
    if expect_noised:
        assert expect_noised <= set(found["replay"].checked), expect_noised - set(
            found["replay"].checked
        )


# ================================================================================ cases
GAP_EDGE_CASES = {
    "undirected-fedavg": ({}, "undirected", "train"),
    "directed-fedavg": ({"edge-unit": "directed"}, "directed", "train"),
    "undirected-fedsgd": ({"schedule": "fedsgd"}, "undirected", "train"),
    "directed-fedsgd-secagg": (
        {"edge-unit": "directed", "schedule": "fedsgd", "secure-aggregation": True, **THREE},
        "directed",
        "train",
    ),
    "undirected-fedavg-secagg": ({"secure-aggregation": True, **THREE}, "undirected", "train"),
    "undirected-inductive-heldout-edge": ({"inference": "inductive"}, "undirected", "test"),
    "directed-inductive-training-edge": (
        {"inference": "inductive", "edge-unit": "directed"},
        "directed",
        "train",
    ),
}


@pytest.mark.parametrize("case", list(GAP_EDGE_CASES))
def test_gap_edge_level(harness, case):
    """GAP at edge level, a cross-client edge (both halves for the undirected unit, one for the
    directed): public fields identical, PMA rows within the edge sensitivity at every hop
    (replay) and at hop 1 (live: the encoder reads no edge), the third client's replies
    untouched (secure aggregation, 3 clients)."""
    extra, unit, graph = GAP_EDGE_CASES[case]
    config = {**GAP, **extra}
    neighbour = cross_client_edge(config, unit, graph)
    run, found = check_neighbour(harness, config, neighbour)
    secure = bool(extra.get("secure-aggregation"))
    sums = "query.gap_pma:partial_sums." + ("masked" if secure else "sums")
    assert_clean(found, {sums})
    assert sums in found["live"].checked  # hop 1, before anything differed
    index, kind, fld = found["live"].first_difference
    if graph == "test":  # parallel composition: the training graph's releases are unchanged
        first = run.log[index][0]
        assert kind == "query.gap_pma" and first.content["pma"]["graph"] == "test", (kind, fld)
    else:
        assert kind == "query.gap_pma", (kind, fld)


GAP_NODE_CASES = {
    "transductive": {},
    "secagg": {"secure-aggregation": True, **THREE},
    "inductive": {"inference": "inductive"},
}


@pytest.mark.parametrize("case", list(GAP_NODE_CASES))
def test_gap_node_level(harness, case):
    """GAP at node level: a training node with many in-neighbours at other clients (and a
    degree above the bound), isolated with other features and label. Public fields identical
    (the constant weight, no loss, the plan from public counts); every PMA hop within the node
    sensitivity (replay); the DP-SGD rounds are declared and not bounded (see the table)."""
    config = {**GAP_NODE, **GAP_NODE_CASES[case]}
    neighbour = boundary_node(config)
    run, found = check_neighbour(harness, config, neighbour)
    secure = case == "secagg"
    assert_clean(found, {"query.gap_pma:partial_sums." + ("masked" if secure else "sums")})
    # the node is a training node: its own client's first DP-SGD round is the first change
    _, kind, fld = found["live"].first_difference
    assert (kind, fld.split(".")[0]) == ("train[gap.encoder]", "arrays"), (kind, fld)
    if case == "inductive":  # a training node: the held-out graph's PMA is unchanged
        heldout = [
            fld
            for m, fld in found["replay"].differed_at
            if m.metadata.message_type == "query.gap_pma" and m.content["pma"]["graph"] == "test"
        ]
        assert not heldout, heldout


PROGAP_EDGE_CASES = {
    "undirected": ({}, "undirected"),
    "directed-secagg": ({"edge-unit": "directed", "secure-aggregation": True, **THREE}, "directed"),
}
RELEASE = "query.progap_aggregate[release]:partial_sums."


@pytest.mark.parametrize("case", list(PROGAP_EDGE_CASES))
def test_progap_edge_level(harness, case):
    """ProGAP at edge level, a cross-client edge: public fields identical (the plan, the
    node counts; stage 0's training rounds read no edge), the aggregation rows within the
    edge sensitivity at every stage (replay) and at stage 1 (live), the later stages'
    gradients and validation counts post-processing of them; the third client untouched
    (secure aggregation)."""
    extra, unit = PROGAP_EDGE_CASES[case]
    config = {**PROGAP, **extra}
    neighbour = cross_client_edge(config, unit)
    run, found = check_neighbour(harness, config, neighbour)
    sums = RELEASE + ("masked" if extra.get("secure-aggregation") else "sums")
    assert_clean(found, {sums})
    assert sums in found["live"].checked  # stage 1, before anything differed
    _, kind, fld = found["live"].first_difference
    assert kind == "query.progap_aggregate[release]", (kind, fld)


PROGAP_NODE_CASES = {"plain": {}, "secagg": {"secure-aggregation": True, **THREE}}


@pytest.mark.parametrize("case", list(PROGAP_NODE_CASES))
def test_progap_node_level(harness, case):
    """ProGAP at node level: a training node with in-neighbours at other clients (a degree
    above the bound), isolated with other features and label. Public fields identical (the
    constant weight, the plan from public counts); every aggregation within the node
    sensitivity (replay); the stages' DP-SGD rounds are declared, not bounded."""
    config = {**PROGAP_NODE, **PROGAP_NODE_CASES[case]}
    neighbour = boundary_node(config)
    run, found = check_neighbour(harness, config, neighbour)
    assert_clean(found, {RELEASE + ("masked" if case == "secagg" else "sums")})
    _, kind, fld = found["live"].first_difference  # stage 0's DP-SGD on the node's features
    assert (kind, fld.split(".")[0]) == ("train.progap_stage", "arrays"), (kind, fld)


PRIVGNN_CASES = {
    "posterior": PRIVGNN,
    "ensemble": PRIVGNN_ENSEMBLE,
    "ensemble-secagg": {**PRIVGNN_ENSEMBLE, "secure-aggregation": True},
}


@pytest.mark.parametrize("case", list(PRIVGNN_CASES))
def test_privgnn(harness, case):
    """PrivGNN, a private node of client 0 (edges at both clients): the counts in ``meta``
    identical, the answers within their sensitivity, the other client's answers unchanged."""
    config = PRIVGNN_CASES[case]
    # a node whose change moves the answers (a teacher's argmax vote need not move)
    neighbour = _visible(harness, config, lambda i: privgnn_node(config, i))
    run, found = check_neighbour(harness, config, neighbour)
    assert_clean(found, {"query.privgnn:answers.answers"})


PPGNN_CASES = {
    "features": ({}, "features"),
    "features-multibit": (
        {"mechanism": "multi-bit", "epsilon": 1.0, "denoiser": "kprop"},
        "features",
    ),  # LPGNN
    "features-laplace": ({"mechanism": "laplace", "epsilon": 1.0}, "features"),
    "label-rr": ({"label-epsilon": 0.5}, "label"),
    "level": ({}, "level"),
}


@pytest.mark.parametrize("case", list(PPGNN_CASES))
def test_ppgnn(harness, case):
    """PPGNN, one user of client 0: the structure, ids and split identical (public in the
    paper's setting), the report and the randomized labels differ only in that user's rows,
    the schema identical (the class counts of ``meta.statistics`` moved with a label)."""
    extra, what = PPGNN_CASES[case]
    if what == "level":
        from fedgraph.methods import ppgnn

        if not hasattr(ppgnn, "with_client_levels"):
            pytest.skip(
                "levels are not drawn on the client in this version (no "
                "fedgraph.methods.ppgnn.with_client_levels); "
                "test_ppgnn_report_of_a_users_level covers the report"
            )
    config = {**PPGNN, **extra}
    neighbour = _visible(harness, config, lambda i: ppgnn_user(config, what, i))
    run, found = check_neighbour(harness, config, neighbour)
    assert_clean(found, {"query.ppgnn:report.labels"} if what == "label" else None)
    assert any(f.startswith("query.ppgnn:report.mech.") for f in found["replay"].checked)
    if what == "label":  # the features are untouched: the mechanism's report is the same
        assert not [f for f in found["replay"].differed if ".mech." in f]


def _visible(harness, config, make, tries=8):
    """The first of ``make(0)``, ``make(1)``, ... whose change moves the release (replayed on
    ``D``'s requests): an LDP report of one user need not move (a one-bit randomizer may give
    the same bit for both feature values under the same draw), and a neighbour that moves
    nothing would check nothing."""
    for i in range(tries):
        neighbour = make(i)
        run = harness.run(config, neighbour.d)
        change = {"drop_half": neighbour.drop_half, "level_of": neighbour.level_of}
        if compare(run, harness.replay(run, neighbour.d2, **change), neighbour, "replay").differed:
            return neighbour
    raise AssertionError(f"none of {tries} neighbours moved a release")


def test_ppgnn_report_of_a_users_level():
    """The client's report function on two graphs whose ``levels`` differ in one user (same
    generator): only that user's rows of the mechanism's report differ; ids, labels and edges
    are the same."""
    from fedgraph.config import parse_run_config
    from fedgraph.data.partition import build_client_graphs
    from fedgraph.methods.ppgnn import client_report

    cfg = parse_run_config({"method": "ppgnn", "dataset": "cora", "num-clients": 1})
    data = base_graph()
    data.train_mask = torch.arange(N) % 2 == 0
    data.val_mask = torch.arange(N) % 4 == 1
    data.test_mask = ~(data.train_mask | data.val_mask)
    data.levels = (torch.arange(N) % len(cfg.budgets)) + 1
    other = data.clone()
    other.levels = data.levels.clone()
    j = 7
    other.levels[j] = data.levels[j] % len(cfg.budgets) + 1
    seen = set()
    for seed in range(4):  # a user's report may happen to coincide under both levels
        reports = []
        for g in (data, other):
            client = build_client_graphs(g, torch.zeros(N, dtype=torch.long), 1)[0]
            reports.append(
                client_report(client, cfg, (0.0, 1.0), C, torch.Generator().manual_seed(seed))
            )
        a, b = ({f"report.{k}": v.numpy() for k, v in r.items()} for r in reports)
        assert set(a) == set(b)
        changed = set()
        for k in a:
            if k.startswith("report.mech."):
                changed |= users_changed(a, b, k)
            else:
                assert np.array_equal(a[k], b[k]), k
        assert changed <= {j}, (seed, changed)
        seen |= changed
    assert seen == {j}


# ========================================================== every assertion can fail
def _edge_count(m) -> int:
    """The private count a leaking client would send: its local and boundary edges."""
    from fedgraph.config import parse_run_config
    from fedgraph.federation import client_view

    cfg = parse_run_config(json.loads(m.content["config"]["json"]))
    g = client_view(cfg, m.metadata.dst_node_id - 1).graph
    return int(g.edge_index.size(1) + g.boundary_edge_index.size(1))


def _leak_in_public_metric(m, reply):
    if kind_of(m) == "train[gap.encoder]":
        reply.content["metrics"]["train-loss"] = float(
            reply.content["metrics"]["train-loss"]
        ) + _edge_count(m)
    return reply


def _leak_new_metric(m, reply):
    if m.metadata.message_type == "train":
        reply.content["metrics"]["num-edges"] = _edge_count(m)
    return reply


def _leak_into_rows(m, reply):
    from flwr.app import ArrayRecord

    from fedgraph.messaging import tensors

    if m.metadata.message_type == "query.gap_pma":
        out = tensors(reply.content["partial_sums"])
        if out["sums"].numel():
            out["sums"] = out["sums"] + _edge_count(m) / 10.0
            reply.content["partial_sums"] = ArrayRecord(out)
    return reply


def _leak_post_early(m, reply):
    if kind_of(m) == "train[gap.classifier]":
        reply.content["metrics"]["train-loss"] = float(
            reply.content["metrics"]["train-loss"]
        ) + _edge_count(m)
    return reply


def _leak_into_progap_count(m, reply):
    """ProGAP: the stage-0 gradient replies' validation count carries the edge count."""
    if (
        m.metadata.message_type == "train.progap_stage"
        and int(m.content["config"]["stage"]) == 0
        and "val-examples" in reply.content["metrics"]
    ):
        reply.content["metrics"]["val-examples"] = int(
            reply.content["metrics"]["val-examples"]
        ) + _edge_count(m)
    return reply


def _leak_features_into_another_report(neighbour):
    """PPGNN: another user's sampled signs carry the changed user's first feature."""

    def tamper(m, reply):
        from flwr.app import ArrayRecord

        from fedgraph.config import parse_run_config
        from fedgraph.federation import client_view
        from fedgraph.messaging import tensors

        if m.metadata.message_type != "query.ppgnn":
            return reply
        cfg = parse_run_config(json.loads(m.content["config"]["json"]))
        g = client_view(cfg, m.metadata.dst_node_id - 1).graph
        at = (g.node_ids == neighbour.user).nonzero().flatten()
        if not at.numel():
            return reply
        j = int(at[0])
        rep = tensors(reply.content["report"])
        sign = rep["mech.sign"].clone()
        sign[rep["mech.row"] == (1 if j != 1 else 2)] = 1 if float(g.x[j, 0]) > 0.5 else -1
        rep["mech.sign"] = sign
        reply.content["report"] = ArrayRecord(rep)
        return reply

    return tamper


def _fixed(tamper):
    return lambda neighbour: tamper


#: leak -> (the tamper, given the neighbour; what the harness must say; config; neighbour)
LEAKS = {
    "public-metric": (_fixed(_leak_in_public_metric), "is declared public", GAP, cross_client_edge),
    "undeclared-metric": (_fixed(_leak_new_metric), "is not declared", GAP, cross_client_edge),
    "pma-rows": (_fixed(_leak_into_rows), "more than the sensitivity", GAP, cross_client_edge),
    # a held-out edge leaves the training graph's PMA unchanged: the classifier's loss is
    # post-processing of it and must not move
    "post-before-release": (
        _fixed(_leak_post_early),
        "differs before any of them did",
        {**GAP, "inference": "inductive"},
        lambda c: cross_client_edge(c, graph="test"),
    ),
    "ppgnn-other-user": (
        _leak_features_into_another_report,
        "more than the sensitivity",
        PPGNN,
        lambda c: ppgnn_user(c, "features"),
    ),
    "progap-public-count": (
        _fixed(_leak_into_progap_count),
        "is declared public",
        {**PROGAP, "depth": 1},
        cross_client_edge,
    ),
}


@pytest.mark.parametrize("leak", list(LEAKS))
def test_the_harness_reports_a_leaking_client(harness, leak):
    """A client that leaks (LocalGrid's tamper: what it adds is a function of the protected
    unit: the client's private edge count, the changed user's feature) is reported, naming the
    field and the neighbour, live and in the replay."""
    leaking, words, config, make = LEAKS[leak]
    if config["method"] == "gap":
        config = {**config, "classifier-rounds": 1}
    neighbour = make(config)
    tamper = leaking(neighbour)
    run_d = harness.run(config, neighbour.d, tamper=tamper)
    run_d2 = harness.run(config, neighbour.d2, tamper=tamper)
    for mode, log in (
        ("live", run_d2.log),
        ("replay", harness.replay(run_d, neighbour.d2, tamper=tamper)),
    ):
        problems = compare(run_d, log, neighbour, mode).problems
        hits = [p for p in problems if words in p]
        assert hits, (mode, problems)
        assert words == "is not declared" or all(neighbour.name in p for p in hits), hits


def test_identical_inputs_give_identical_transcripts(harness):
    """The control: ``D`` against itself, whole runs, every field identical (the noise is
    injected identically; no float nondeterminism on one thread)."""
    config = {**GAP, "classifier-rounds": 1}
    neighbour = cross_client_edge(config)
    run_a = harness.run(config, neighbour.d)
    run_b = harness.run(config, neighbour.d)
    same_data = Neighbour("D itself", neighbour.d, neighbour.d, set())
    found = compare(run_a, run_b.log, same_data, "live")
    assert not found.problems and not found.differed, (found.problems, found.differed)


def test_the_table_refines_the_allow_list():
    """Every refinement names a field the allow-list lists (no stale entry), with the kind it
    refines (a noised release stays noised; public may become post); every noised field of
    the allow-list has a bound or a stated reason."""
    for (method, kind, key, level), entry in REFINE.items():
        got_key, base = (
            _allowed(method, kind, key.replace(".*", ".x"), level)
            if key.endswith(".*")
            else _allowed(method, kind, key, level)
        )
        assert got_key == key and base is not None, (method, kind, key, level)
        assert (base[0], entry[0]) in {
            ("noised", "noised"),
            ("public", "post"),
            ("public", "noised"),
        }, (method, kind, key, base, entry)
        if base[0] == "public" and entry[0] == "noised":  # PPGNN's labels under RR only
            assert (method, key, level) == ("ppgnn", "report.labels", "rr")
        if entry[0] == "noised":
            assert entry[2] is not None or "tests/" in entry[3], (method, kind, key)
    for method, kinds in ALLOWED.items():
        levels = {
            "gap": LEVELS,
            "progap": LEVELS,
            "ppgnn": ("paper", "rr"),
            "privgnn": (None, "ensemble"),
        }[method]
        for kind, fields in kinds.items():
            for key, entry in fields.items():
                for level in levels:
                    e = entry.get(level) if isinstance(entry, dict) else entry
                    if e is None or e[0] != "noised":
                        continue
                    cat = category(method, kind, key.replace(".*", ".x"), level)
                    assert cat[2] is not None or "tests/" in cat[3], (method, kind, key, level)
