"""Wall time and peak memory of the heaviest phases against graph size, beside a plain loop.

Phases (``--phases``):

* ``gap-pma``: GAP's edge-level aggregation perturbation, federated: ``K`` hops over
  ``--clients`` clients (random partition). Per hop every client runs
  :func:`~fedgraph.methods.gap.client_pma.pma_partial_sums` (its local sums and one noisy row
  for every node it does not hold, as the real client releases), the server sums the rows per
  node for their owners exactly as :class:`fedgraph.strategies.gap.GAPStrategy` does, and every client runs
  :func:`~fedgraph.methods.gap.client_pma.pma_finish`. The same code as ``fedgraph run``'s
  clients and server, in one process: Flower's transport (serialization, Ray) is not in it.
* ``gap-plain``: the same K hops written as a plain single-process PyTorch loop on the whole
  graph: ``h = normalize(torch.sparse.mm(adj_t, h) + noise)``, ``adj_t`` the CSR matrix of the
  loaded graph's target-sorted edges (before 2026-12-03: ``index_add`` of ``h[src]``, 5x
  slower).
* ``gap-release-noise``: only the noise that the federated PMA draws beyond the plain loop's:
  per hop and client, the run's default noise source (:class:`fedgraph.randomness.SecureRandom`,
  a fresh key per release, :func:`~fedgraph.randomness.add_gaussian_`) on one ``[N - n_i, e]``
  block, the rows a client releases for the nodes it does not hold (``(C - 1) N`` rows per
  hop in all; ``--clients`` clients, random partition). The plain side of the comparison
  "with the releases' work": a whole run's ``run:gap`` row reports ``pma_ratio`` (its PMA
  phase against ``run-plain:gap``'s aggregation) and, with this cell in the same invocation,
  ``pma_ratio_releases`` (against that aggregation plus this noise) and ``pma_ratio_same_work``
  (plus also the plain run's ``embed``: the trained encoder's forward pass on every node, PMA's
  input, which the federated clients compute inside the PMA phase, at its first hop).
* ``flexprop``: PPGNN's FlexProp on the server (:func:`fedgraph.nn.weighted_propagation`,
  level weights, ``--steps`` steps) on the graph's 32 binary features.
* ``flexprop-plain``: the same propagation as a plain loop, per step
  ``h = (adj_t @ (w h) + w h) / (adj_t @ w + w)`` (``adj_t`` as in ``gap-plain``, ``+ w h``
  the self loop; before 2026-12-03 a chunked ``index_add`` of the weighted messages).
* ``privgnn-answer``: PrivGNN's heaviest client phase, one client answering ``--queries``
  queries: :func:`fedgraph.methods.privgnn.client_answer`, the function the real
  ClientApp calls (decode the message, budget, then per query a Poisson subsample of the
  client's private nodes, the ``K`` nearest sampled nodes, a teacher GraphSAGE trained on their
  induced subgraph, batched :class:`~fedgraph.methods.privgnn.BatchedSAGE`, its posterior at
  the query from the query's public neighbourhood, Laplace noise). Setup (``setup_s``, not
  timed): :func:`~fedgraph.methods.privgnn.privgnn_split` of the graph, the private half
  partitioned over ``--clients`` clients (random; client 0 answers), the server's query
  selection and message (:func:`~fedgraph.methods.privgnn.make_queries`). The
  hyperparameters are :data:`RUN_SETTINGS` ``["privgnn"]`` (K = 100, teachers of 32 hidden
  units trained 100 epochs, 64 at a time; no PCA, client epsilon ``inf`` so no PLD in the
  budget lookup). The client's private graph holds ``1 / (2 * clients)`` of the nodes and about
  ``1 / (4 * clients**2)`` of the edges (at 1e5 with 4 clients: 12,539 nodes, 78,752 edges);
  the teachers' size does not depend on the graph's.
* ``privgnn-answer-plain``: the same per-query computation as a plain loop, one query at a
  time: Poisson subsample, distances, ``topk``, PyG ``subgraph``, a fresh PyG ``GraphSAGE``
  (:func:`~fedgraph.methods.privgnn.make_sage`, the same sizes) trained alone with Adam, its
  softmax at the query in the query's public neighbourhood, Laplace noise of scale ``2 / lam``.
  Here the ratio is not a federation overhead (there is no transport in either): it is what
  the client's batching of teachers saves (ratio < 1) or costs over the naive loop.
* ``run:<method>`` (``gap``, ``ppgnn``, ``privgnn``): a whole federated run, the real
  ``fedgraph run`` CLI (Flower's simulation engine on a fresh local Ray cluster) with
  ``--num-cpus --run-cpus`` (default 1: one Ray actor runs the clients one after the other,
  one thread, like the plain run), ``--clients`` clients (random partition) and the small
  training budgets of :data:`RUN_SETTINGS` (the data size dominates). ``phase_s`` is the wall
  time of the ``fedgraph`` process from start to exit (interpreter, imports, Ray start and
  stop, every client's data loading: each client reads its part from the partition cache,
  filled by the preflight on a miss; the cache is a fresh empty folder per cell, so every
  federated run pays the preflight's split and partition, as a user's first run does:
  ``--warm-cache`` keeps the user's cache, where a repeated run reads the parts; ``--keep-work``
  keeps the work folder, its report, logs and the clients' ``handlers.jsonl``, as the row's
  ``work_dir``); ``setup_s`` the report's client setup phase (GAP:
  ``setup + calibration (clients)``: the Ray worker's start, the part's load, calibration)
  and ``setup_share`` its share of ``phase_s``.
* ``run-plain:<method>``: the same method and hyperparameters in one plain process without
  Flower or Ray (a child process, timed the same way): ``gap``: load, split and
  :func:`fedgraph.methods.gap.run_gap` (encoder and classifier epochs = rounds x local
  epochs of the federated run; the same architecture, noise calibration and accountant);
  ``ppgnn``: the one-client path of ``bench/ppgnn_table.py``'s ``run_once``
  (:func:`~fedgraph.federation.load_federated`, :func:`~fedgraph.methods.ppgnn.client_report`,
  :func:`~fedgraph.methods.ppgnn.server_fit`); ``privgnn``: the steps of
  :func:`fedgraph.methods.privgnn.run_centralized` with the private half partitioned over the
  same ``--clients`` parts, each answering the same ``Q`` queries (:func:`answer_queries`),
  answers summed, student trained, epsilon composed per client (PLD). ``run_centralized``
  itself is the one-client case: beside a 4-client federation it would train a quarter of the
  teachers and the ratio would measure the method, not the federation.

Memory of whole runs: ``peak_gib`` is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of the cell's
process, i.e. the **largest single process** among those reaped within the tree: Ray's worker
processes are not always among them (in ``run:gap`` at 1e6 the sampled Ray worker, 3.26 GiB,
was above ``peak_gib`` = 3.18), so read ``largest_proc_gib`` beside it. With ``psutil``, the
tree (the ``fedgraph`` process and all its descendants: GCS, raylet, workers) is also sampled
every 0.5 s:
``tree_rss_gib`` is the peak of the **summed RSS** (counts shared pages such as torch's
libraries and Ray's object store once per process: an upper bound), ``tree_pss_gib`` the peak
of the **summed PSS** (shared pages divided among their users: the tree's own footprint), and
``largest_proc`` the sampled process with the largest RSS. ``mem_ratio`` divides a federated
row's ``tree_pss_gib`` by its plain row's.

Each (phase, size) runs in a fresh process (``resource.getrusage`` peak RSS is per process);
for every phase but the whole runs the graph is ``synthetic-sbm:<nodes>:<degree>``
(:mod:`fedgraph.data.synthetic`), built first in that process: ``graph_s`` and
``graph_peak_gib`` are its cost alone, ``phase_s`` the phase's wall time (without
``setup_s``), ``peak_gib`` the process's peak RSS (graph included). The ratio column divides a
federated phase's time by its plain loop's. A cell whose process tree's summed RSS exceeds
``--mem-limit`` GiB (default 18), or that leaves the machine less than ``--min-avail`` GiB
(default 1) available, is killed and reported as aborted.

    nice -n 19 python bench/scale.py --sizes 1e4,1e5,1e6 --degree 50 --out bench/results/scale.json
    nice -n 19 python bench/scale.py --sizes 1e6 --phases gap-pma --device cpu   # one cell
    OMP_NUM_THREADS=1 nice -n 5 python bench/scale.py --sizes 1e4,1e5 --degree 50 --clients 4 \\
        --phases privgnn-answer-plain,privgnn-answer,run-plain:gap,run:gap,run-plain:ppgnn,\\
run:ppgnn,run-plain:privgnn,run:privgnn --device cpu --out bench/results/scale_runs.json
    OMP_NUM_THREADS=1 nice -n 5 python bench/scale.py --sizes 1e6 --degree 50 --clients 4 \\
        --phases run-plain:gap,run:gap --device cpu --timeout 900 --min-avail 1.5 \\
        --out 1e6.json   # then its two rows appended to scale_runs.json
    # issue 16 (README, "Scale out"): PMA and FlexProp vs their plain loops, a GAP run vs plain
    OMP_NUM_THREADS=1 nice -n 5 python bench/scale.py --sizes 1e6 --phases gap-plain,gap-pma \\
        --device cpu --cache /tmp/sbm
    OMP_NUM_THREADS=1 nice -n 5 python bench/scale.py --sizes 1e5 \\
        --phases gap-plain,gap-pma,flexprop-plain,flexprop --device cpu --cache /tmp/sbm
    OMP_NUM_THREADS=1 nice -n 5 python bench/scale.py --sizes 1e5 --clients 4 \\
        --phases run-plain:gap,run:gap --device cpu
    # the same at FedAvg's default training budgets (both sides of the ratio)
    OMP_NUM_THREADS=1 python bench/scale.py --sizes 1e5 --clients 4 --phases \\
        run-plain:gap,run:gap --device cpu --set encoder-rounds=10 classifier-rounds=10 \\
        local-epochs=10

Output: a table on stdout and, with ``--out``, JSON rows ``{phase, nodes, edges, graph_s,
graph_peak_gib, setup_s, phase_s, peak_gib, device, threads, ratio}`` (``run`` rows also
``tree_rss_gib``, ``tree_pss_gib``, ``largest_proc``, ``mem_ratio``, ``test_acc``,
``settings``, ``timings``; federated ``run`` rows ``phase_peak_mib``, the report's peak RSS of
the process tree per phase, ``partition_cache`` and ``client_state`` (the report's
``host.client_state``); ``privgnn-answer`` rows ``queries`` and the client's size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages first

# the process settings of every fedgraph process, before torch loads (OpenMP's wait policy,
# torch's huge-page allocator): the plain side runs under the same ones as the federated run
import fedgraph.simulations  # noqa: E402,F401
from fedgraph.procstats import (  # noqa: E402
    GIB,
    PhaseTimer,
    TreeSampler,
    have_psutil,
    peak_rss_gib,
    terminate_leftovers,
)

PHASES = ("gap-plain", "gap-pma", "flexprop-plain", "flexprop")
#: the federated PMA's extra noise (module docs), the plain side "with the releases' work"
RELEASE_NOISE = "gap-release-noise"
RUN_METHODS = ("gap", "ppgnn", "privgnn")
ALL_PHASES = (
    PHASES
    + (RELEASE_NOISE, "privgnn-answer-plain", "privgnn-answer")
    + tuple(f"{kind}:{m}" for m in RUN_METHODS for kind in ("run-plain", "run"))
)
#: federated phase -> its plain counterpart (the ratio's denominator)
PLAIN = {
    "gap-pma": "gap-plain",
    "flexprop": "flexprop-plain",
    "privgnn-answer": "privgnn-answer-plain",
    **{f"run:{m}": f"run-plain:{m}" for m in RUN_METHODS},
}
#: run-config keys of the whole runs (and of ``privgnn-answer``), besides ``dataset``,
#: ``num-clients``, ``seed`` and ``device``: small training budgets, random partitions.
RUN_SETTINGS = {
    "gap": {
        "method": "gap",
        "partitioner": "random",
        "level": "edge",
        "client-epsilons": "4",
        "delta": 1e-7,
        "hops": 2,
        "encoder-rounds": 2,
        "classifier-rounds": 2,
        "local-epochs": 5,
    },
    "ppgnn": {
        "method": "ppgnn",
        "partitioner": "random",
        "budgets": "1,2,4",
        "mechanism": "ppm",
        "gamma": 0.1,
        "denoiser": "flexprop",
        "steps": "16",
        "backbone": "sage",
        "epochs": 10,
    },
    "privgnn": {
        "method": "privgnn",
        "partitioner": "random",
        "num-queries": 64,
        "num-neighbours": 100,
        "teacher-hidden": 32,
        "teacher-epochs": 100,
        "teacher-batch-size": 64,
        "lam": 2.0,
        "gamma": 0.3,
        "client-epsilons": "inf",
        "hops": 2,
        "neighbourhood-size": 50,
        "projection-dim": 0,
        "epochs": 10,
    },
}


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


#: ``--set key=value`` overrides of :data:`RUN_SETTINGS`, for the federated and the plain run
#: alike (e.g. FedAvg's default training budgets: ``--set encoder-rounds=10 classifier-rounds=10
#: local-epochs=10``).
RUN_OVERRIDES: dict[str, str] = {}
#: ``--warm-cache``: the federated runs use the user's partition cache (else a fresh one each)
WARM_CACHE = False
#: ``--keep-work``: a whole run's work folder (report, logs, the clients' ``handlers.jsonl``)
#: is kept, and its path recorded in the row as ``work_dir`` (else removed after the cell)
KEEP_WORK = False


def _settings(
    method: str, nodes: int, degree: float, clients: int, device: str, queries: int | None = None
) -> dict:
    """The run config of ``method`` on ``synthetic-sbm:<nodes>:<degree>`` (:data:`RUN_SETTINGS`)."""
    cfg = {
        **RUN_SETTINGS[method],
        "dataset": f"synthetic-sbm:{nodes}:{degree:g}",
        "num-clients": clients,
        "seed": 0,
        "device": device,
        **RUN_OVERRIDES,
    }
    if method == "privgnn" and queries:
        cfg["num-queries"] = queries
    return cfg


def run_one(
    phase: str,
    nodes: int,
    degree: float,
    clients: int,
    hops: int,
    dim: int,
    steps: int,
    sigma: float,
    device: str,
    cache: str = "",
    queries: int = 64,
    run_cpus: int = 1,
    mem_limit: float = 18.0,
    timeout: float = 3600.0,
    min_avail: float = 1.0,
) -> dict:
    """One (phase, size) cell in this process; returns its JSON row. ``cache``: a folder where
    the generated graph is saved once and loaded by later cells (``graph_s``: the load)."""
    if phase.startswith("run"):
        return _whole_run(
            phase, nodes, degree, clients, device, queries, run_cpus, mem_limit, timeout, min_avail
        )
    import torch

    from fedgraph.data import load_dataset
    from fedgraph.device import resolve_device

    dev = resolve_device(device)
    t0 = time.perf_counter()
    name = f"synthetic-sbm:{nodes}:{degree:g}"
    file = Path(cache) / f"{name.replace(':', '_')}.pt" if cache else None
    if file is not None and file.is_file():
        data = torch.load(file, weights_only=False)
    else:
        data = load_dataset(name)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(data, file.with_suffix(".tmp"))
            file.with_suffix(".tmp").rename(file)
    graph_s, graph_peak = time.perf_counter() - t0, peak_rss_gib()
    n, e = data.num_nodes, data.edge_index.size(1)
    gen = torch.Generator().manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    setup_s, extra = 0.0, {}
    if phase == "gap-plain":
        from fedgraph.nn.gap import normalize_rows

        adj_t = _plain_adj_t(data.edge_index, n, dev)
        h = normalize_rows(torch.randn(n, dim, generator=gen).to(dev))
        for _ in range(hops):
            s = torch.sparse.mm(adj_t, h)
            h = normalize_rows(s + sigma * torch.randn(n, dim, generator=gen).to(dev))
    elif phase == "gap-pma":
        setup_s = _gap_pma(data, clients, hops, dim, sigma, dev, gen)
    elif phase == RELEASE_NOISE:
        setup_s = _release_noise(data, clients, hops, dim, sigma)
    elif phase == "flexprop":
        from fedgraph.nn import weighted_propagation

        w = torch.randint(1, 4, (n,), generator=gen).double()  # released levels 1..3
        weighted_propagation(data.x.to(dev), data.edge_index.to(dev), steps, w.to(dev))
    elif phase == "flexprop-plain":
        adj_t = _plain_adj_t(data.edge_index, n, dev)
        w = torch.randint(1, 4, (n,), generator=gen).float().to(dev)[:, None]  # per source
        norm = torch.sparse.mm(adj_t, w) + w  # + w: the self loop
        h = data.x.to(dev)
        for _ in range(steps):
            wh = w * h
            h = (torch.sparse.mm(adj_t, wh) + wh) / norm
    elif phase in ("privgnn-answer", "privgnn-answer-plain"):
        setup_s, extra = _privgnn_answer(phase, data, degree, clients, queries, device, dev)
    else:
        raise ValueError(f"unknown phase {phase!r}; allowed: {', '.join(ALL_PHASES)}")
    _sync(dev)
    phase_s = time.perf_counter() - t0 - setup_s
    row = {
        "phase": phase,
        "nodes": n,
        "edges": e,
        "graph_s": round(graph_s, 2),
        "graph_peak_gib": round(graph_peak, 2),
        "setup_s": round(setup_s, 2),
        "phase_s": round(phase_s, 2),
        "peak_gib": round(peak_rss_gib(), 2),
        "device": str(dev),
        "threads": torch.get_num_threads(),
        **extra,
    }
    if dev.type == "cuda":
        row["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    return row


def _plain_adj_t(edge_index, n: int, dev):
    """The plain loops' graph: the transposed adjacency ``adj_t[dst, src] = 1`` as a sparse
    CSR matrix on ``dev`` (``torch.sparse.mm(adj_t, h)`` is ``h``'s sum over in-neighbours),
    the loaded graph's target-sorted edges as they stand
    (:func:`fedgraph.utils.sparse.dst_csr`)."""
    from fedgraph.utils.sparse import dst_csr

    return dst_csr(edge_index.to(dev), n)


def _gap_pma(data, num_clients: int, hops: int, dim: int, sigma: float, dev, gen) -> float:
    """K hops of federated PMA (module docs): clients' partial sums, the server's sums per node,
    the owners' finish; every row released for every node a client does not hold. Returns
    the seconds spent partitioning the graph (setup, not part of the phase's time)."""
    import torch

    from fedgraph.data import partition
    from fedgraph.nn.gap import normalize_rows

    t0 = time.perf_counter()
    clients = partition(data, num_clients, "random", 0)
    setup_s = time.perf_counter() - t0
    h = [normalize_rows(torch.randn(c.num_nodes, dim, generator=gen).to(dev)) for c in clients]
    pma_hops(
        data.num_nodes,
        clients,
        h,
        hops,
        sigma,
        lambda k, i: torch.Generator().manual_seed(k * 1000 + i),
    )
    return setup_s


def _release_noise(data, num_clients: int, hops: int, dim: int, sigma: float) -> float:
    """``gap-release-noise`` (module docs): per hop and client, the CSPRNG noise of the
    ``[N - n_i, e]`` rows the client releases, into one preallocated block (its allocation is
    setup). Returns the setup seconds (partition and block)."""
    import torch

    from fedgraph import randomness as rng
    from fedgraph.data import partition

    t0 = time.perf_counter()
    sizes = [c.num_nodes for c in partition(data, num_clients, "random", 0)]
    n = data.num_nodes
    block = torch.zeros(n - min(sizes), dim)
    setup_s = time.perf_counter() - t0
    for _ in range(hops):
        for n_i in sizes:
            rng.add_gaussian_(block[: n - n_i], sigma, rng.SecureRandom())
    return setup_s


def pma_hops(n: int, clients, h: list, hops: int, sigma: float, generator) -> list:
    """The federated PMA loop: per hop, every client's partial sums with
    ``generator(hop, client)``'s noise and a row for every node it does not hold, the server's
    sums per node, the owners' finish (``h``: each client's hop-0 rows). Returns the last hop's rows.
    Each client's sums over its edges are built at the first hop for the others, as the
    ClientApp does (:func:`~fedgraph.methods.gap.client_pma.pma_edge_sums`).
    Also ``bench/noise_cost.py``'s phase."""
    import torch

    from fedgraph.methods.gap.client_pma import pma_edge_sums, pma_finish, pma_partial_sums
    from fedgraph.methods.gap.server import sum_partial_sums

    owner = torch.empty(n, dtype=torch.long)
    for i, c in enumerate(clients):
        owner[c.node_ids] = i
    h = list(h)
    edge_sums = {}
    for k in range(1, hops + 1):
        released, local_sums = [], []
        for i, c in enumerate(clients):
            if i not in edge_sums:
                others = torch.ones(n, dtype=torch.bool)
                others[c.node_ids] = False
                edge_sums[i] = pma_edge_sums(
                    c.edge_index, c.boundary_edge_index, c.num_nodes, others.nonzero().flatten()
                )
            ls, ids, sums = pma_partial_sums(h[i], *edge_sums[i], sigma, generator(k, i))
            local_sums.append(ls)
            # What the client sends and the server sums: CPU tensors in a Flower message.
            released.append((ids.cpu(), sums.cpu()))
            del ids, sums
        routed = sum_partial_sums(released, owner, len(clients))  # the strategy's step
        del released
        for i, c in enumerate(clients):
            h[i] = pma_finish(local_sums[i], c.node_ids, *routed[i])
        del routed, local_sums
    return h


def _privgnn_answer(
    phase: str, data, degree: float, num_clients: int, queries: int, device: str, dev
):
    """Client 0 of ``num_clients`` answers ``queries`` queries (module docs): the real client
    function (``privgnn-answer``) or the plain per-query loop. Returns ``(setup_s, extra)``."""
    import torch

    from fedgraph.config import parse_run_config
    from fedgraph.data import dataset_statistics, partition
    from fedgraph.methods import privgnn as pg
    from fedgraph.methods.privgnn import client as pf

    t0 = time.perf_counter()
    cfg = parse_run_config(
        _settings("privgnn", data.num_nodes, degree, num_clients, device, queries)
    )
    private, public = pg.privgnn_split(
        data,
        public_fraction=cfg.public_fraction,
        public_test_fraction=cfg.public_test_fraction,
        seed=cfg.seed,
    )
    clients = partition(private, cfg.num_clients, cfg.partitioner, cfg.seed)
    # K at most client 0's expected Poisson sample (pg.check_neighbours); recorded in extra["k"]
    cfg = cfg.model_copy(
        update={
            "num_neighbours": min(
                cfg.num_neighbours, max(1, pg.max_neighbours(int(clients[0].num_nodes), cfg.gamma))
            )
        }
    )
    stats = dataset_statistics(data)
    gen = torch.Generator().manual_seed(cfg.seed)
    qidx = pg.select_queries(public, cfg.num_queries, "random", generator=gen)
    arrays = pg.make_queries(public, qidx, cfg, gen)  # the server's message (public data)
    client = clients[0]
    extra = {
        "clients": num_clients,
        "queries": int(qidx.numel()),
        "k": cfg.num_neighbours,
        "teacher_epochs": cfg.teacher_epochs,
        "client_nodes": int(client.num_nodes),
        "client_edges": int(client.edge_index.size(1)),
    }
    answer_gen = torch.Generator().manual_seed(1)
    if phase == "privgnn-answer":
        # The client's data as client_graph() would load it (same split and partition), here
        # from the graph already in memory instead of a second load of the dataset.
        pf.client_graph = lambda _cfg, pid: (clients[pid], stats)
        setup_s = time.perf_counter() - t0
        reply = pf.client_answer(cfg, 0, arrays, 0, answer_gen)
        assert reply.answers.shape[0] == extra["queries"]
        return setup_s, extra
    hoods, _ = pg.decode_queries(arrays)
    setup_s = time.perf_counter() - t0
    _plain_answers(client, hoods, cfg, int(stats["num_classes"]), dev, answer_gen)
    return setup_s, extra


def _plain_answers(client, hoods, cfg, num_classes: int, dev, gen):
    """PrivGNN's client computation as a plain loop, one query and one teacher at a time."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.utils import subgraph

    from fedgraph.methods.privgnn import SENSITIVITY, laplace_noise, make_sage

    x, y, ei = client.x.float().to(dev), client.y.to(dev), client.edge_index.to(dev)
    n = x.shape[0]
    out = []
    for q in range(int(hoods.center.numel())):
        gx, gei, c = hoods.graph(q)
        gx, gei = gx.float().to(dev), gei.to(dev)
        sample = (torch.rand(n, generator=gen, dtype=torch.float64) < cfg.gamma).to(dev)
        dist = (x - gx[c]).pow(2).sum(1).masked_fill(~sample, float("inf"))
        kk = min(cfg.num_neighbours, int(sample.sum()))
        if kk == 0:
            out.append(torch.full((num_classes,), 1.0 / num_classes))
            continue
        idx = torch.topk(dist, kk, largest=False).indices
        sei, _ = subgraph(idx, ei, relabel_nodes=True, num_nodes=n)
        teacher = make_sage(x.shape[1], num_classes, cfg.teacher_hidden, 2, cfg.dropout).to(dev)
        opt = torch.optim.Adam(teacher.parameters(), lr=cfg.lr)
        teacher.train()
        for _ in range(cfg.teacher_epochs):
            opt.zero_grad()
            F.cross_entropy(teacher(x[idx], sei), y[idx]).backward()
            opt.step()
        teacher.eval()
        with torch.no_grad():
            post = teacher(gx, gei)[c].softmax(-1)
        out.append(post.cpu() + laplace_noise(post.shape, SENSITIVITY / cfg.lam, gen))
    return torch.stack(out)


# --------------------------------------------------------------------------------------------
# Whole runs: a child process (``fedgraph run`` or the plain run), its process tree sampled
# --------------------------------------------------------------------------------------------
def _measure(
    cmd: list[str],
    env: dict,
    timeout: float,
    mem_limit: float,
    out_path: Path,
    err_path: Path,
    pss: bool = True,
    min_avail: float = 1.0,
) -> dict:
    """Run ``cmd`` to its end (stdout, stderr to files); with psutil, sample its process tree
    every 0.5 s (peak summed RSS and, with ``pss``, PSS: reading smaps costs some
    milliseconds per process; largest process); kill the whole tree past
    ``timeout`` s, ``mem_limit`` GiB of summed RSS or when the machine has less than
    ``min_avail`` GiB available. Processes of the tree still alive 10 s
    after the root exits (none expected: Ray stops its own) are terminated: all were started
    here."""

    def abort(rss: int):
        if rss > mem_limit * GIB:
            return f"aborted: process tree RSS {rss / GIB:.1f} GiB > {mem_limit:g} GiB"
        avail = psutil.virtual_memory().available
        if avail < min_avail * GIB:  # a shared machine: never drive it to the OOM killer
            return (
                f"aborted: the machine has {avail / GIB:.1f} GiB available "
                f"< {min_avail:g} GiB (tree RSS {rss / GIB:.1f} GiB)"
            )
        return None

    timer = PhaseTimer()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
    sampler = None  # without psutil: wall time and ru_maxrss only
    if have_psutil():
        import psutil

        sampler = TreeSampler(proc.pid, 0.5, pss=pss, abort=abort).start()
    status = "ok"
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = f"timed out after {timeout:.0f} s"
        if sampler:
            sampler.kill(status)
        else:
            proc.kill()
        proc.wait()
    wall = timer.elapsed()
    stats = {
        "tree_rss_gib": None,
        "tree_pss_gib": None,
        "largest_proc": None,
        "largest_proc_gib": None,
        "samples": 0,
        "status": status,
    }
    if sampler:
        sampler.stop()
        if sampler.samples:
            stats.update(
                tree_rss_gib=round(sampler.peak_rss / GIB, 2),
                tree_pss_gib=round(sampler.peak_pss / GIB, 2),
                largest_proc=sampler.largest_cmd,
                largest_proc_gib=round(sampler.largest_rss / GIB, 2),
            )
        stats.update(samples=sampler.samples, status=sampler.aborted or status)
    stats.update(
        wall_s=round(wall, 2),
        rc=proc.returncode,
        ru_maxrss_gib=round(peak_rss_gib(children=True), 2),
    )
    if sampler:
        stats["leftover_terminated"] = terminate_leftovers(sampler.seen, proc.pid, timeout=10)
    return stats


def _whole_run(
    phase: str,
    nodes: int,
    degree: float,
    clients: int,
    device: str,
    queries: int,
    run_cpus: int,
    mem_limit: float,
    timeout: float,
    min_avail: float = 1.0,
) -> dict:
    """``run:<method>`` (the ``fedgraph run`` CLI) or ``run-plain:<method>`` (a plain child
    process, :func:`_plain_run`), measured by :func:`_measure`; returns the row."""
    kind, method = phase.split(":", 1)
    if method not in RUN_METHODS or kind not in ("run", "run-plain"):
        raise ValueError(f"unknown phase {phase!r}; allowed: {', '.join(ALL_PHASES)}")
    settings = _settings(method, nodes, degree, clients, device, queries)
    work = Path(tempfile.mkdtemp(prefix=f"fedgraph-scale-{method}-"))
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # a fresh local Ray cluster, never someone else's
    if kind == "run" and not WARM_CACHE:  # cold: the preflight splits and partitions
        env["FEDGRAPH_PARTITION_CACHE"] = str(work / "partitions")
    if (
        kind == "run"
    ):  # the clients' handler times, out of band (fedgraph.simulations.handler_times)
        env["FEDGRAPH_HANDLER_TIMES"] = str(work / "handlers.jsonl")
        cmd = [
            str(Path(sys.executable).with_name("fedgraph")),
            "run",
            "--num-cpus",
            str(run_cpus),
            "--cpus-per-client",
            "1",
        ]
        for k, v in {
            **settings,
            "output-dir": str(work),
            "run-name": "scale",
            "timeout": float(timeout),
        }.items():
            cmd += ["--set", f"{k}={v}"]
    else:
        cmd = [
            sys.executable,
            __file__,
            "--plain-child",
            "--phases",
            phase,
            "--sizes",
            str(nodes),
            "--degree",
            str(degree),
            "--clients",
            str(clients),
            "--queries",
            str(queries),
            "--device",
            device,
        ]
        cmd += ["--set", *(f"{k}={v}" for k, v in RUN_OVERRIDES.items())] if RUN_OVERRIDES else []
    st = _measure(
        cmd, env, timeout, mem_limit, work / "stdout.log", work / "stderr.log", min_avail=min_avail
    )
    if st["status"] != "ok" or st["rc"] != 0:
        tail = (work / "stderr.log").read_text().strip().splitlines()[-3:]
        raise RuntimeError(
            f"{phase} {nodes}: {st['status']}, exit {st['rc']}: {tail} (logs in {work})"
        )
    if kind == "run":
        rep = json.loads((work / "scale.json").read_text())
        res = {
            "edges": (rep.get("ground_truth") or {}).get("dataset", {}).get("num_edges"),
            "test_acc": rep["accuracy"].get("test"),
            "timings": rep.get("timings_s"),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "phase_peak_mib": rep.get("peak_rss_mib"),
            "pseudo_label": rep["accuracy"].get("pseudo_label"),
        }
        from fedgraph.simulations import handler_times

        res["split"] = run_split(st["wall_s"], rep, handler_times.read(work / "handlers.jsonl"))
        res["ray_cpus"] = run_cpus
        res["client_state"] = (rep.get("host") or {}).get("client_state")
    else:
        res = json.loads((work / "stdout.log").read_text().strip().splitlines()[-1])
        res["split"] = plain_split(st["wall_s"], res["timings"])
    if KEEP_WORK:
        res["work_dir"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    # The clients' setup phase of a federated run (GAP: "setup + calibration (clients)"):
    # its seconds and its share of the whole wall time.
    setup = next(
        (
            v
            for k, v in (res.get("timings") or {}).items()
            if kind == "run" and k.startswith("setup")
        ),
        None,
    )
    return {
        "phase": phase,
        "nodes": nodes,
        "edges": res["edges"],
        "graph_s": None,
        "graph_peak_gib": None,
        "setup_s": setup,
        "setup_share": None if setup is None else round(setup / st["wall_s"], 3),
        "phase_s": st["wall_s"],
        "peak_gib": st["ru_maxrss_gib"],
        "tree_rss_gib": st["tree_rss_gib"],
        "tree_pss_gib": st["tree_pss_gib"],
        "largest_proc": st["largest_proc"],
        "largest_proc_gib": st["largest_proc_gib"],
        "samples": st["samples"],
        "leftover_terminated": st.get("leftover_terminated"),
        "device": device,
        "threads": res.get("threads"),
        "clients": clients,
        **(
            {
                "ray_cpus": run_cpus,
                "partition_cache": "warm" if WARM_CACHE else "cold",
                "client_state": res.get("client_state"),
            }
            if kind == "run"
            else {}
        ),
        "test_acc": None if res.get("test_acc") is None else round(res["test_acc"], 4),
        **({"phase_peak_mib": res.get("phase_peak_mib")} if kind == "run" else {}),
        **(
            {"pseudo_label": round(res["pseudo_label"], 4)}
            if res.get("pseudo_label") is not None
            else {}
        ),
        "timings": res.get("timings"),
        "split_s": res.get("split"),
        "settings": settings,
        **({"work_dir": res["work_dir"]} if "work_dir" in res else {}),
    }


#: the handlers of a federated run's setup phase (GAP's ``setup + calibration (clients)``)
SETUP_MESSAGES = ("query.gap_setup",)


def run_split(wall: float, report: dict, handlers: list[dict]) -> dict:
    """A whole federated run's wall seconds in five parts that add up to ``wall``:
    ``setup`` (the report's phases named ``setup...``: the clients' start, their part's
    load, calibration), ``compute_clients`` (the clients' handlers outside setup, from
    :mod:`fedgraph.simulations.handler_times`), ``compute_server`` (the other phases' wall time minus
    the server's waits on clients, the report's ``exchange_s``), ``communication`` (those
    waits minus the clients' handlers: Flower's and Ray's transport and queues; with several
    Ray actors the handlers overlap and this part is a lower bound) and ``other`` (outside the
    strategy's timed phases: the interpreter, imports, Ray's start and shutdown, the report's
    privacy summary)."""
    timings = {k: v for k, v in report["timings_s"].items() if k != "total"}
    exchange = report.get("exchange_s", {})
    setup_phases = [k for k in timings if k.startswith("setup")]
    setup = sum(timings[k] for k in setup_phases)
    clients = sum(h["seconds"] for h in handlers if h["type"] not in SETUP_MESSAGES)
    waits = sum(exchange.get(k, 0.0) for k in timings if k not in setup_phases)
    server = sum(timings[k] for k in timings if k not in setup_phases) - waits
    strategy = setup + server + waits
    return {
        k: round(v, 2)
        for k, v in (
            ("setup", setup),
            ("communication", max(waits - clients, 0.0)),
            ("compute_clients", clients),
            ("compute_server", server),
            ("other", wall - strategy),
        )
    }


def plain_split(wall: float, timings: dict) -> dict:
    """The plain process's wall seconds: ``setup`` (loading, splitting, calibration),
    ``compute_server`` (the rest of its timed work), ``other`` (interpreter and imports)."""
    setup = sum(v for k, v in timings.items() if k.startswith(("load", "calibration")))
    work = timings.get("total", sum(v for k, v in timings.items() if k != "total"))
    return {
        "setup": round(setup, 2),
        "communication": 0.0,
        "compute_clients": 0.0,
        "compute_server": round(work - setup, 2),
        "other": round(wall - work, 2),
    }


def _plain_run(method: str, settings: dict) -> dict:
    """``run-plain:<method>`` in this process (module docs); returns edges, test accuracy,
    timings and torch's thread count."""
    import torch

    from fedgraph.config import parse_run_config
    from fedgraph.data import apply_split, load_dataset, partition
    from fedgraph.device import resolve_device

    timer = PhaseTimer()
    timings = timer.seconds
    extra = {}  # PrivGNN: the pseudo-labels' accuracy
    if method == "gap":
        from fedgraph.methods.gap import run_gap

        with timer.phase("load + split"):
            cfg = parse_run_config(settings)
            data = apply_split(load_dataset(cfg.dataset), cfg.split, cfg.seed)
        res = run_gap(
            data,
            method=cfg.variant,
            level=cfg.level,
            epsilon=cfg.client_epsilon(0),
            delta=cfg.delta,
            num_hops=cfg.hops,
            encoder_dim=cfg.encoder_dim,
            hidden=cfg.hidden,
            encoder_layers=2,
            base_layers=1,
            head_layers=1,
            combine=cfg.combine,
            dropout=0.0,
            batch_norm=False,
            encoder_epochs=cfg.encoder_rounds * cfg.local_epochs,
            classifier_epochs=cfg.classifier_rounds * cfg.local_epochs,
            lr=cfg.lr,
            batch_size=cfg.batch_size or None,
            max_degree=cfg.max_degree,
            max_grad_norm=cfg.max_grad_norm,
            edge_unit=cfg.edge_unit,
            accountant=cfg.accountant,
            seed=cfg.seed,
        )
        acc = res["test_acc"]
        timings.update(res.get("timings", {}))
    elif method == "ppgnn":  # bench/ppgnn_table.py's run_once: one client holds every user
        from fedgraph.federation import load_federated
        from fedgraph.methods import ppgnn

        with timer.phase("load + split"):
            cfg = parse_run_config({**settings, "num-clients": 1})
            data, clients = load_federated(cfg, cfg.budgets, cfg.shares)
        with timer.phase("perturb"):
            c = int(data.y.max()) + 1
            rep = ppgnn.client_report(
                clients[0], cfg, data.feature_domain, c, torch.Generator().manual_seed(cfg.seed)
            )
        with timer.phase("calibrate + train"):
            fit = ppgnn.server_fit([rep], cfg, data.num_nodes, data.num_features, c)
        mask = clients[0].test_mask
        acc = float((fit.predictions[mask] == clients[0].y[mask]).float().mean())
    else:  # privgnn: run_centralized's steps, the private half over the same clients
        from fedgraph.methods import privgnn as pg
        from fedgraph.methods.privgnn import teacher_config

        with timer.phase("load + split"):
            cfg = parse_run_config(settings)
            data = load_dataset(cfg.dataset)
            private, public = pg.privgnn_split(
                data,
                public_fraction=cfg.public_fraction,
                public_test_fraction=cfg.public_test_fraction,
                seed=cfg.seed,
            )
            parts = partition(private, cfg.num_clients, cfg.partitioner, cfg.seed, alpha=cfg.alpha)
        with timer.phase("queries"):
            c = int(data.y.max()) + 1
            gen = torch.Generator().manual_seed(cfg.seed)
            qidx = pg.select_queries(public, cfg.num_queries, "random", generator=gen)
            hoods = pg.query_neighbourhoods(public, qidx, cfg.hops, cfg.neighbourhood_size, gen)
            proj = (
                pg.public_projection(public.x, cfg.projection_dim, cfg.seed)
                if cfg.projection_dim
                else None
            )
        with timer.phase("answers"):
            answers = [
                pg.answer_queries(
                    p,
                    hoods.query_x,
                    rate=cfg.gamma,
                    k=cfg.num_neighbours,
                    lam=cfg.lam,
                    num_classes=c,
                    teacher=teacher_config(cfg),
                    mode=cfg.answer_mode,
                    neighbourhoods=hoods,
                    projection=proj,
                    generator=gen,
                    device=resolve_device(cfg.device),
                )
                for p in parts
            ]
        labels = pg.aggregate_answers(answers)
        extra["pseudo_label"] = float((labels == public.y[qidx]).float().mean())
        with timer.phase("student"):
            st = pg.train_student(
                public,
                qidx,
                labels,
                hidden=cfg.hidden,
                dropout=cfg.dropout,
                epochs=cfg.epochs,
                lr=cfg.lr,
                weight_decay=cfg.weight_decay,
                seed=cfg.seed,
            )
        with timer.phase("epsilon"):
            for _ in parts:  # the server's ledger: one PLD composition per client
                pg.privgnn_epsilon(int(qidx.numel()), cfg.gamma, cfg.lam, cfg.delta, "pld")
        acc = st.test_accuracy
    timings["total"] = timer.elapsed()
    return {
        "edges": int(data.edge_index.size(1)),
        "test_acc": float(acc),
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "threads": torch.get_num_threads(),
        **extra,
    }


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------
HEADER = (
    f"{'phase':<21}{'nodes':>9}{'edges':>11}{'graph s':>8}{'setup s':>8}{'phase s':>9}"
    f"{'peak GiB':>9}{'tree RSS':>9}{'tree PSS':>9}{'ratio':>7}{'mem r':>7}  device"
)


def _fmt(row: dict) -> str:
    if row.get("status", "ok") != "ok":
        return f"{row['phase']:<21}{row['nodes']:>9}  {row['status']}"

    def c(key, width):
        v = row.get(key)
        return f"{'-' if v is None else v:>{width}}"

    note = f"  Q={row['queries']}" if "queries" in row else ""
    if row.get("seed") is not None:
        note += f"  seed {row['seed']}"
    if row.get("setup_share") is not None:
        note += f"  setup {100 * row['setup_share']:.1f} %"
    if row.get("pma_ratio") is not None:
        note += f"  PMA/aggregation {row['pma_ratio']}"
        if row.get("pma_ratio_releases") is not None:
            note += f" ({row['pma_ratio_releases']} with the releases' noise"
            if row.get("pma_ratio_same_work") is not None:
                note += f", {row['pma_ratio_same_work']} with the encoder's output too"
            note += ")"
    if row.get("split_s"):
        sp = row["split_s"]
        note += (
            f"  [setup {sp['setup']:.1f} / comm {sp['communication']:.1f} / compute "
            f"{sp['compute_clients'] + sp['compute_server']:.1f} / other {sp['other']:.1f} s]"
        )
    return (
        f"{row['phase']:<21}{row['nodes']:>9}{row['edges']:>11}{c('graph_s', 8)}"
        f"{c('setup_s', 8)}{c('phase_s', 9)}{c('peak_gib', 9)}{c('tree_rss_gib', 9)}"
        f"{c('tree_pss_gib', 9)}{c('ratio', 7)}{c('mem_ratio', 7)}  {row['device']}{note}"
    )


def _ratios(rows: list[dict]) -> None:
    """``ratio`` (time) and, for whole runs, ``mem_ratio`` (tree PSS) of every federated row
    whose plain row of the same size is there."""
    for r in rows:
        plain = next(
            (
                x
                for x in rows
                if x["nodes"] == r["nodes"]
                and x.get("seed") == r.get("seed")
                and x["phase"] == PLAIN.get(r["phase"])
                and x.get("status", "ok") == "ok"
                and r.get("status", "ok") == "ok"
            ),
            None,
        )
        if plain:
            r["ratio"] = round(r["phase_s"] / max(plain["phase_s"], 1e-9), 2)
            if r.get("tree_pss_gib") and plain.get("tree_pss_gib"):
                r["mem_ratio"] = round(r["tree_pss_gib"] / plain["tree_pss_gib"], 2)
        if plain and r["phase"] == "run:gap":
            _pma_ratios(r, plain, rows)


#: the federated GAP run's PMA phase (its report's timings), the plain run's counterpart and
#: the plain run's encoder output on every node (PMA's input, which the federated clients
#: compute in PMA's first hop)
PMA_PHASE, PLAIN_AGGREGATION, PLAIN_EMBED = "PMA (clients, via server)", "aggregation", "embed"


def _pma_ratios(run: dict, plain: dict, rows: list[dict]) -> None:
    """A ``run:gap`` row's PMA phase against its plain run's aggregation, three ways (module
    docs, ``gap-release-noise``): ``pma_ratio`` (the aggregation alone); when a
    ``gap-release-noise`` cell of the same size ran, ``pma_ratio_releases`` (its seconds added
    to the plain aggregation) and, where the plain run timed its encoder's output apart,
    ``pma_ratio_same_work`` (the plain side doing what the federated phase does: the encoder's
    forward pass on every node, the aggregation and the released rows' noise)."""
    pma = (run.get("timings") or {}).get(PMA_PHASE)
    agg = (plain.get("timings") or {}).get(PLAIN_AGGREGATION)
    if not pma or not agg:
        return
    run["pma_ratio"] = round(pma / agg, 2)
    cells = [
        x
        for x in rows
        if x["phase"] == RELEASE_NOISE
        and x["nodes"] == run["nodes"]
        and x.get("status", "ok") == "ok"
    ]  # the run's seed's cell if there is one
    noise = next(
        (x for x in cells if x.get("seed") == run.get("seed")), cells[0] if cells else None
    )
    if noise is not None:
        run["pma_ratio_releases"] = round(pma / (agg + noise["phase_s"]), 2)
        embed = plain["timings"].get(PLAIN_EMBED)
        if embed is not None:
            run["pma_ratio_same_work"] = round(pma / (agg + embed + noise["phase_s"]), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e4,1e5,1e6", help="node counts, comma-separated")
    ap.add_argument("--degree", type=float, default=50.0, help="average degree (directed)")
    ap.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of: {', '.join(ALL_PHASES)}"
    )
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--hops", type=int, default=2, help="GAP's K")
    ap.add_argument("--dim", type=int, default=16, help="GAP encoder dimension")
    ap.add_argument("--steps", type=int, default=16, help="FlexProp steps")
    ap.add_argument("--sigma", type=float, default=1.0, help="PMA noise std")
    ap.add_argument(
        "--queries",
        type=int,
        default=64,
        help="PrivGNN queries (privgnn-answer and the privgnn runs)",
    )
    ap.add_argument("--run-cpus", type=int, default=1, help="fedgraph run --num-cpus (Ray)")
    ap.add_argument(
        "--mem-limit",
        type=float,
        default=18.0,
        help="GiB of summed RSS of a cell's process tree before it is killed",
    )
    ap.add_argument(
        "--min-avail",
        type=float,
        default=1.0,
        help="GiB the machine must keep available, else the cell is killed",
    )
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    ap.add_argument("--out", default="", help="JSON file for the rows")
    ap.add_argument("--cache", default="", help="folder to keep generated graphs in (.pt)")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="override run-config keys of the whole runs (both sides of the ratio)",
    )
    ap.add_argument(
        "--seeds",
        default="",
        help="whole runs: run every cell once per seed (comma-separated; the run "
        "config's seed, both sides of the ratio) and print mean and std",
    )
    ap.add_argument(
        "--warm-cache",
        action="store_true",
        help="federated runs read the user's partition cache (default: a fresh "
        "empty one per cell: the first run's split and partition included)",
    )
    ap.add_argument(
        "--keep-work",
        action="store_true",
        help="keep each whole run's work folder (report, logs, the clients' "
        "handler times) and record its path in the row as work_dir",
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global WARM_CACHE, KEEP_WORK
    WARM_CACHE, KEEP_WORK = a.warm_cache, a.keep_work
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--set takes KEY=VALUE, got {item!r}")
        RUN_OVERRIDES[key.strip()] = value.strip()
    sizes = [int(float(s)) for s in a.sizes.split(",") if s.strip()]
    phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in ALL_PHASES]
    if unknown:
        ap.error(f"unknown phases {unknown}; allowed: {', '.join(ALL_PHASES)}")
    if a.plain_child:
        method = phases[0].split(":", 1)[1]
        print(
            json.dumps(
                _plain_run(
                    method, _settings(method, sizes[0], a.degree, a.clients, a.device, a.queries)
                )
            ),
            flush=True,
        )
        return
    if a.one:
        print(
            json.dumps(
                run_one(
                    phases[0],
                    sizes[0],
                    a.degree,
                    a.clients,
                    a.hops,
                    a.dim,
                    a.steps,
                    a.sigma,
                    a.device,
                    a.cache,
                    a.queries,
                    a.run_cpus,
                    a.mem_limit,
                    a.timeout,
                    a.min_avail,
                )
            ),
            flush=True,
        )
        return
    rows = []
    print(HEADER, flush=True)
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()] or [None]
    # each seed's plain and federated cells side by side (their ratio: one seed, close in time)
    cells = [(nodes, phase, seed) for nodes in sizes for seed in seeds for phase in phases]
    for nodes, phase, seed in cells:
        sets = list(a.set) + ([f"seed={seed}"] if seed is not None else [])
        cmd = (
            [
                sys.executable,
                __file__,
                "--one",
                "--sizes",
                str(nodes),
                "--phases",
                phase,
                "--degree",
                str(a.degree),
                "--clients",
                str(a.clients),
                "--hops",
                str(a.hops),
                "--dim",
                str(a.dim),
                "--steps",
                str(a.steps),
                "--sigma",
                str(a.sigma),
                "--device",
                a.device,
                "--cache",
                a.cache,
                "--queries",
                str(a.queries),
                "--run-cpus",
                str(a.run_cpus),
                "--mem-limit",
                str(a.mem_limit),
                "--min-avail",
                str(a.min_avail),
                "--timeout",
                str(a.timeout),
            ]
            + (["--set", *sets] if sets else [])
            + (["--warm-cache"] if a.warm_cache else [])
            + (["--keep-work"] if a.keep_work else [])
        )
        work = Path(tempfile.mkdtemp(prefix="fedgraph-scale-cell-"))
        st = _measure(
            cmd,
            dict(os.environ),
            a.timeout + 60,
            a.mem_limit,
            work / "stdout.log",
            work / "stderr.log",
            pss=False,
            min_avail=a.min_avail,
        )
        if st["status"] != "ok" or st["rc"] != 0:
            err = (work / "stderr.log").read_text().strip().splitlines()
            why = st["status"] if st["status"] != "ok" else f"failed: {err[-1:]}"
            row = {"phase": phase, "nodes": nodes, "status": why}
        else:
            row = json.loads((work / "stdout.log").read_text().strip().splitlines()[-1])
        shutil.rmtree(work, ignore_errors=True)
        if seed is not None:
            row["seed"] = seed
        rows.append(row)
        _ratios(rows)
        print(_fmt(row), flush=True)
        if a.out:
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            tmp.replace(out)  # atomic: a reader sees the old rows or the new, never half
    print("\n" + HEADER)
    for row in rows:
        print(_fmt(row))
    if len(seeds) > 1:
        print(f"\nover seeds {a.seeds}: mean +- std (n)")
        for line in seed_summary(rows):
            print(line)


def seed_summary(rows: list[dict]) -> list[str]:
    """Per (phase, nodes): mean and sample std of ``phase_s``, ``ratio`` and ``test_acc``
    (PrivGNN: and ``pseudo_label``, the pseudo-labels' accuracy) over the seeds' rows that
    ran."""
    import statistics

    def ms(values):
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.4g} +- {sd:.2g} ({len(values)})"

    out = []
    for key in dict.fromkeys((r["phase"], r["nodes"]) for r in rows):
        ok = [r for r in rows if (r["phase"], r["nodes"]) == key and r.get("status", "ok") == "ok"]
        out.append(
            f"{key[0]:<21}{key[1]:>9}  time {ms([r['phase_s'] for r in ok])} s  "
            f"ratio {ms([r.get('ratio') for r in ok])}  test {ms([r.get('test_acc') for r in ok])}"
            + (
                f"  pseudo-labels {ms([r.get('pseudo_label') for r in ok])}"
                if any("pseudo_label" in r for r in ok)
                else ""
            )
            + "".join(
                f"  {label} {ms([r.get(k) for r in ok])}"
                for k, label in (
                    ("pma_ratio", "PMA/aggregation"),
                    ("pma_ratio_releases", "PMA/(aggregation + releases' noise)"),
                    ("pma_ratio_same_work", "PMA/(embed + aggregation + releases' noise)"),
                )
                if any(k in r for r in ok)
            )
        )
    return out


if __name__ == "__main__":
    main()
