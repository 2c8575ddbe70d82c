"""Wall time and peak memory of the heaviest phases against graph size, beside a plain loop.

Phases (``--phase``):

* ``gap-pma``: GAP's edge-level aggregation perturbation, federated: ``K`` hops over
  ``--clients`` clients (random partition). Per hop every client runs
  :func:`~fedgraph.methods.gap_federated.pma_partial_sums` (its local sums and one noisy row
  for every node it does not hold, as the real client releases), the server routes the rows
  to their owners exactly as :class:`strategies.gap.GAPStrategy` does, and every client runs
  :func:`~fedgraph.methods.gap_federated.pma_finish`. The same code as ``fedgraph run``'s
  clients and server, in one process: Flower's transport (serialization, Ray) is not in it.
* ``gap-plain``: the same K hops written as a plain single-process PyTorch loop on the whole
  graph: ``h = normalize(index_add(h[src]) + noise)``.
* ``flexprop``: PPGNN's FlexProp on the server (:func:`fedgraph.nn.weighted_propagation`,
  level weights, ``--steps`` steps) on the graph's 32 binary features.
* ``flexprop-plain``: the same propagation as a plain loop (``index_add`` of weighted
  messages, in chunks of 2**24 elements: the whole ``[E, 32]`` block is 13 GB at 1e6 nodes,
  divided by the weight sums), per step.

Each (phase, size) runs in a fresh process (``resource.getrusage`` peak RSS is per process);
the graph is ``synthetic-sbm:<nodes>:<degree>`` (:mod:`fedgraph.data.synthetic`), built first
in that process: ``graph_s`` and ``graph_peak_gib`` are its cost alone, ``phase_s`` the phase's
wall time (for ``gap-pma`` without ``setup_s``, the partition into clients), ``peak_gib`` the
process's peak RSS (graph included). The ratio column divides a
federated phase's time by its plain loop's.

    nice -n 19 python bench/scale.py --sizes 1e4,1e5,1e6 --degree 50 --out bench/results/scale.json
    nice -n 19 python bench/scale.py --sizes 1e6 --phases gap-pma --device cpu   # one cell

Output: a table on stdout and, with ``--out``, JSON rows ``{phase, nodes, edges, graph_s,
graph_peak_gib, setup_s, phase_s, peak_gib, device, threads, ratio}``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("gap-plain", "gap-pma", "flexprop-plain", "flexprop")


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def run_one(phase: str, nodes: int, degree: float, clients: int, hops: int, dim: int,
            steps: int, sigma: float, device: str, cache: str = "") -> dict:
    """One (phase, size) cell in this process; returns its JSON row. ``cache``: a folder where
    the generated graph is saved once and loaded by later cells (``graph_s``: the load)."""
    import torch

    sys.path.insert(0, str(ROOT))
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
    graph_s, graph_peak = time.perf_counter() - t0, _peak_gib()
    n, e = data.num_nodes, data.edge_index.size(1)
    gen = torch.Generator().manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    setup_s = 0.0
    if phase == "gap-plain":
        from fedgraph.nn.gap import normalize_rows

        src, dst = data.edge_index.to(dev)
        h = normalize_rows(torch.randn(n, dim, generator=gen).to(dev))
        for _ in range(hops):
            s = torch.zeros(n, dim, device=dev).index_add_(0, dst, h[src])
            h = normalize_rows(s + sigma * torch.randn(n, dim, generator=gen).to(dev))
    elif phase == "gap-pma":
        setup_s = _gap_pma(data, clients, hops, dim, sigma, dev, gen)
    elif phase == "flexprop":
        from fedgraph.nn import weighted_propagation

        w = torch.randint(1, 4, (n,), generator=gen).double()  # released levels 1..3
        weighted_propagation(data.x.to(dev), data.edge_index.to(dev), steps, w.to(dev))
    elif phase == "flexprop-plain":
        from fedgraph.utils.graph import scatter_sum_chunked

        src, dst = data.edge_index.to(dev)
        loops = torch.arange(n, device=dev)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
        w = torch.randint(1, 4, (n,), generator=gen).float().to(dev)  # per source node
        norm = torch.zeros(n, device=dev).index_add_(0, dst, w[src])[:, None]
        h = data.x.to(dev)
        for _ in range(steps):  # the [E, d] message block in bounded chunks (13 GB at 1e6)
            h = scatter_sum_chunked(w[:, None] * h, src, dst, n) / norm
    else:
        raise ValueError(f"unknown phase {phase!r}; allowed: {', '.join(PHASES)}")
    _sync(dev)
    phase_s = time.perf_counter() - t0 - setup_s
    row = {"phase": phase, "nodes": n, "edges": e, "graph_s": round(graph_s, 2),
           "graph_peak_gib": round(graph_peak, 2), "setup_s": round(setup_s, 2),
           "phase_s": round(phase_s, 2),
           "peak_gib": round(_peak_gib(), 2), "device": str(dev),
           "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        row["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    return row


def _gap_pma(data, num_clients: int, hops: int, dim: int, sigma: float, dev, gen) -> float:
    """K hops of federated PMA (module docs): clients' partial sums, the server's routing,
    the owners' finish; every row released for every node a client does not hold. Returns
    the seconds spent partitioning the graph (setup, not part of the phase's time)."""
    import torch

    from fedgraph.data import partition
    from fedgraph.methods.gap_federated import pma_finish, pma_partial_sums
    from fedgraph.nn.gap import normalize_rows

    t0 = time.perf_counter()
    clients = partition(data, num_clients, "random", 0)
    setup_s = time.perf_counter() - t0
    n = data.num_nodes
    owner = torch.empty(n, dtype=torch.long)
    for i, c in enumerate(clients):
        owner[c.node_ids] = i
    h = [normalize_rows(torch.randn(c.num_nodes, dim, generator=gen).to(dev)) for c in clients]
    for k in range(1, hops + 1):
        routed = [([], []) for _ in clients]
        local_sums = []
        for i, c in enumerate(clients):
            others = torch.ones(n, dtype=torch.bool)
            others[c.node_ids] = False
            ls, ids, sums = pma_partial_sums(h[i], c.edge_index, c.boundary_edge_index, sigma,
                                             torch.Generator().manual_seed(k * 1000 + i),
                                             remote_ids=others.nonzero().flatten())
            local_sums.append(ls)
            # What the client sends and the server routes: CPU tensors in a Flower message.
            ids, sums = ids.cpu(), sums.cpu()
            dst_owner = owner[ids]
            for j in range(len(clients)):
                sel = dst_owner == j
                if bool(sel.any()):
                    routed[j][0].append(ids[sel])
                    routed[j][1].append(sums[sel])
            del ids, sums, dst_owner
        for i, c in enumerate(clients):
            ids, sums = routed[i]
            h[i] = pma_finish(local_sums[i], c.node_ids, torch.cat(ids), torch.cat(sums))
        del routed, local_sums
    return setup_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e4,1e5,1e6", help="node counts, comma-separated")
    ap.add_argument("--degree", type=float, default=50.0, help="average degree (directed)")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--hops", type=int, default=2, help="GAP's K")
    ap.add_argument("--dim", type=int, default=16, help="GAP encoder dimension")
    ap.add_argument("--steps", type=int, default=16, help="FlexProp steps")
    ap.add_argument("--sigma", type=float, default=1.0, help="PMA noise std")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    ap.add_argument("--out", default="", help="JSON file for the rows")
    ap.add_argument("--cache", default="", help="folder to keep generated graphs in (.pt)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(float(s)) for s in a.sizes.split(",") if s.strip()]
    phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    if a.one:
        print(json.dumps(run_one(phases[0], sizes[0], a.degree, a.clients, a.hops, a.dim,
                                 a.steps, a.sigma, a.device, a.cache)))
        return
    rows = []
    print(f"{'phase':<15}{'nodes':>10}{'edges':>12}{'graph s':>9}{'setup s':>9}{'phase s':>9}"
          f"{'peak GiB':>10}{'ratio':>7}  device", flush=True)
    for nodes in sizes:
        for phase in phases:
            cmd = [sys.executable, __file__, "--one", "--sizes", str(nodes), "--phases", phase,
                   "--degree", str(a.degree), "--clients", str(a.clients), "--hops",
                   str(a.hops), "--dim", str(a.dim), "--steps", str(a.steps), "--sigma",
                   str(a.sigma), "--device", a.device, "--cache", a.cache]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                print(f"{phase:<15}{nodes:>10}  timed out after {a.timeout:.0f} s", flush=True)
                continue
            if r.returncode != 0:
                print(f"{phase:<15}{nodes:>10}  failed: {r.stderr.strip().splitlines()[-1:]}",
                      flush=True)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            plain = next((x for x in rows if x["nodes"] == row["nodes"]
                          and x["phase"] == row["phase"].split("-")[0] + "-plain"
                          and not row["phase"].endswith("plain")), None)
            if plain is None and row["phase"] == "flexprop":
                plain = next((x for x in rows if x["nodes"] == row["nodes"]
                              and x["phase"] == "flexprop-plain"), None)
            if plain:
                row["ratio"] = round(row["phase_s"] / max(plain["phase_s"], 1e-9), 2)
            rows.append(row)
            print(f"{row['phase']:<15}{row['nodes']:>10}{row['edges']:>12}{row['graph_s']:>9}"
                  f"{row['setup_s']:>9}"
                  f"{row['phase_s']:>9}{row['peak_gib']:>10}{row.get('ratio', ''):>7}  "
                  f"{row['device']}", flush=True)
            if a.out:
                Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
