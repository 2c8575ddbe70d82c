"""What sharing one process's blocks saves (``fedgraph.utils.scratch``, issue 31): the first PMA
hop of 4 GAP clients in one process, as a simulation's sole Ray actor runs them one after
another (no Flower): each client builds its two sums over edges
(:func:`~fedgraph.utils.sparse.EdgeSum`: local ``[n, n]`` and remote ``[N - n, n]`` on random
target-sorted edges of 1e6-node sizes), computes both products into its release block
(:func:`~fedgraph.methods.gap.client_pma.release_buffer`) and copies the release as a reply
would; then hop 2 on the kept sums. ``own``: every client its own ones and release block (the
code before the change); ``shared``: the process's. Each mode runs in a fresh process,
alternating, ``--rounds`` times; reported: seconds and minor page faults per hop.

    OMP_NUM_THREADS=1 python bench/shared_blocks.py --rounds 3 --out bench/results/shared_blocks.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

NODES, CLIENT_NODES, LOCAL_EDGES, BOUNDARY_EDGES, CLIENTS, DIM = (
    1_000_000,
    250_000,
    3_100_000,
    9_400_000,
    4,
    16,
)


def one(mode: str) -> dict:
    """Both hops of the 4 clients in this process (``mode``: own or shared)."""
    import warnings

    import torch

    import fedgraph.utils.sparse as sparse
    from fedgraph.methods.gap import client_pma

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if mode == "own":
        sparse.shared_ones = lambda n, dtype, device: torch.ones(n, dtype=dtype, device=device)
        client_pma.shared_block = lambda name, rows, cols, dtype: torch.empty(
            rows, cols, dtype=dtype
        )
    g = torch.Generator().manual_seed(0)
    n, m = CLIENT_NODES, NODES - CLIENT_NODES
    clients = []
    for _ in range(CLIENTS):
        local = (
            torch.randint(0, n, (LOCAL_EDGES,), generator=g),
            torch.sort(torch.randint(0, n, (LOCAL_EDGES,), generator=g)).values,
        )
        boundary = (
            torch.randint(0, n, (BOUNDARY_EDGES,), generator=g),
            torch.sort(torch.randint(0, m, (BOUNDARY_EDGES,), generator=g)).values,
        )
        clients.append((local, boundary, torch.randn(n, DIM, generator=g)))
    kept, seconds, faults = [], [], []
    for hop in (1, 2):
        for i, (local, boundary, h) in enumerate(clients):
            time.sleep(0.5)  # the other clients' messages and the server in between
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            if hop == 1:
                kept.append(
                    (
                        sparse.EdgeSum(*local, n, num_rows=n),
                        sparse.EdgeSum(*boundary, n, num_rows=m),
                        {},
                    )
                )
            local_sum, remote_sum, buffers = kept[i]
            local_sum(h)
            release = remote_sum(h, out=client_pma.release_buffer(buffers, m, h))
            release.numpy().tobytes()  # the reply's copy
            seconds.append(time.perf_counter() - t0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {
        "mode": mode,
        "hop1_s": sum(seconds[:CLIENTS]),
        "hop2_s": sum(seconds[CLIENTS:]),
        "hop1_faults": sum(faults[:CLIENTS]),
        "hop2_faults": sum(faults[CLIENTS:]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per mode (>= 1)")
    p.add_argument("--out", type=Path, help="write the result as JSON")
    p.add_argument("--one", choices=("own", "shared"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one)))
        return
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    runs = []
    for _ in range(a.rounds):
        for mode in ("own", "shared"):
            res = subprocess.run(
                [sys.executable, __file__, "--one", mode],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    summary = {}
    for mode in ("own", "shared"):
        rows = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            k: (
                round(statistics.mean(r[k] for r in rows), 3),
                round(statistics.stdev(r[k] for r in rows), 3) if len(rows) > 1 else 0.0,
            )
            for k in ("hop1_s", "hop2_s", "hop1_faults", "hop2_faults")
        }
    print(json.dumps(summary, indent=1))
    if a.out:
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "command": f"python bench/shared_blocks.py --rounds {a.rounds}",
                    "runs": runs,
                    "summary": summary,
                },
                indent=1,
            )
        )
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
