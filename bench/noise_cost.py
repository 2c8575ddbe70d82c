"""The CSPRNG's cost in GAP's PMA phase, beside MT19937 (issue 28, fault 4).

The default noise source (``secure``, also ``secret``) draws from
:class:`fedgraph.randomness.SecureRandom` (AES-256-CTR, Box-Muller in float64, the noise added in
float64 and rounded once: :func:`fedgraph.randomness.add_gaussian_`); ``mt19937`` (the old
default, an explicit opt-in now) from PyTorch's MT19937 (``x += sigma * torch.randn``, float32).
For every size (``synthetic-sbm:<nodes>:<degree>``, no files) and ``--repeats`` times, the two
sources in alternating order:

* ``pma``: the federated PMA phase, exactly bench/scale.py's ``gap-pma`` (``--clients``
  clients, random partition; per hop every client's
  :func:`~fedgraph.methods.gap.client_pma.pma_partial_sums`, its local sums and one noisy row for
  every node it does not hold, the server's routing, every owner's
  :func:`~fedgraph.methods.gap.client_pma.pma_finish`), each (hop, client) with a fresh generator
  of the source under its own key, as the clients draw;
* ``noise``: only the noise of that phase: :func:`~fedgraph.randomness.add_gaussian_` on
  tensors of exactly the shapes PMA noises (per hop and client ``[n_i, e]`` local and
  ``[N - n_i, e]`` remote rows: ``hops * clients * N * e`` Gaussians in all), same generators.

Reported (mean +- std over the repeats, seconds): both phases for both sources, ``extra_s`` (the
CSPRNG's noise minus MT19937's), ``ratio`` = CSPRNG noise / PMA phase (with MT19937; the
issue's budget: < 0.10) and ``pma_ratio`` = PMA with the CSPRNG / PMA with MT19937; beside
them ``noise:secure-sum4`` and ``ratio_sum4``: the same rows' noise drawn as Opacus's sum of four
(``draw_dtype=float64``), which fedgraph does not use for float32 rows (fedgraph/randomness.py).

    OMP_NUM_THREADS=1 nice -n 5 python bench/noise_cost.py --sizes 1e5,1e6 --cache /tmp/sbm

Output: a table on stdout and JSON rows in ``--out`` (default
``bench/results/noise_cost.json``, git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SOURCES = ("mt19937", "secure")


def _graph(nodes: int, degree: float, cache: str):
    import torch

    from fedgraph.data import load_dataset

    name = f"synthetic-sbm:{nodes}:{degree:g}"
    file = Path(cache) / f"{name.replace(':', '_')}.pt" if cache else None
    if file is not None and file.is_file():  # bench/scale.py's cache format
        return torch.load(file, weights_only=False)
    data = load_dataset(name)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, file.with_suffix(".tmp"))
        file.with_suffix(".tmp").rename(file)
    return data


def _generator(source: str, root: bytes, hop: int, client: int):
    """What :func:`fedgraph.randomness.client_generator` gives for ``source``: one key per
    release, HMAC-SHA256 of the client's root."""
    from fedgraph import randomness as rng

    key = rng.derive_key(root, "bench", client, f"gap:pma{hop}")
    return rng.SecureRandom(key) if source in rng.CSPRNG_SOURCES else rng.torch_generator(key)


def _pma(data, clients, h0, hops: int, sigma: float, source: str, root: bytes) -> float:
    """bench/scale.py's ``gap-pma`` loop (:func:`scale.pma_hops`) with ``source``'s
    generators; returns the phase's seconds."""
    from scale import pma_hops

    t0 = time.perf_counter()
    pma_hops(data.num_nodes, clients, h0, hops, sigma, lambda k, i: _generator(source, root, k, i))
    return time.perf_counter() - t0


def _noise(
    n: int,
    sizes: list[int],
    dim: int,
    hops: int,
    sigma: float,
    source: str,
    root: bytes,
    draw_dtype=None,
) -> float:
    """Only the noise of the PMA phase: per hop and client, ``add_gaussian_`` on the local
    ``[n_i, e]`` and remote ``[n - n_i, e]`` sums (zeros, allocated outside the timing)."""
    import torch

    from fedgraph import randomness as rng

    total = 0.0
    for k in range(1, hops + 1):
        for i, n_i in enumerate(sizes):
            local, remote = torch.zeros(n_i, dim), torch.zeros(n - n_i, dim)
            gen = _generator(source, root, k, i)
            t0 = time.perf_counter()
            rng.add_gaussian_(local, sigma, gen, draw_dtype)  # in place, as pma_partial_sums
            rng.add_gaussian_(remote, sigma, gen, draw_dtype)
            total += time.perf_counter() - t0
            del local, remote
    return total


def _stat(xs: list[float]) -> dict:
    return {
        "mean": round(statistics.fmean(xs), 3),
        "std": round(statistics.stdev(xs), 3) if len(xs) > 1 else 0.0,
        "runs": [round(x, 3) for x in xs],
    }


def measure(
    nodes: int,
    degree: float,
    clients: int,
    hops: int,
    dim: int,
    sigma: float,
    repeats: int,
    cache: str,
) -> dict:
    import torch

    from fedgraph.data import partition
    from fedgraph.nn.gap import normalize_rows

    t0 = time.perf_counter()
    data = _graph(nodes, degree, cache)
    graph_s = time.perf_counter() - t0
    parts = partition(data, clients, "random", 0)
    gen = torch.Generator().manual_seed(0)
    h0 = [normalize_rows(torch.randn(c.num_nodes, dim, generator=gen)) for c in parts]
    n = data.num_nodes
    sizes = [int(c.num_nodes) for c in parts]
    root = os.urandom(32)
    times = {f"{kind}:{s}": [] for kind in ("pma", "noise") for s in SOURCES}
    times["noise:secure-sum4"] = []
    for r in range(repeats):
        order = SOURCES if r % 2 == 0 else SOURCES[::-1]  # alternate against drift
        for s in order:
            times[f"noise:{s}"].append(_noise(n, sizes, dim, hops, sigma, s, root))
        # what Opacus's sum of four would cost for these rows (float64 draws)
        times["noise:secure-sum4"].append(
            _noise(n, sizes, dim, hops, sigma, "secure", root, torch.float64)
        )
        for s in order:
            times[f"pma:{s}"].append(_pma(data, parts, h0, hops, sigma, s, root))
    st = {k: _stat(v) for k, v in times.items()}
    noise_cs, noise_mt = st["noise:secure"]["mean"], st["noise:mt19937"]["mean"]
    pma_mt, pma_cs = st["pma:mt19937"]["mean"], st["pma:secure"]["mean"]
    return {
        "nodes": n,
        "edges": int(data.edge_index.size(1)),
        "clients": clients,
        "hops": hops,
        "dim": dim,
        "gaussians": hops * clients * n * dim,
        "threads": torch.get_num_threads(),
        "graph_s": round(graph_s, 2),
        "repeats": repeats,
        **st,
        "extra_s": round(noise_cs - noise_mt, 3),
        "ratio": round(noise_cs / pma_mt, 4),
        "ratio_sum4": round(st["noise:secure-sum4"]["mean"] / pma_mt, 4),
        "pma_ratio": round(pma_cs / pma_mt, 3),
    }


def _fmt(row: dict) -> str:
    def ms(key):
        return f"{row[key]['mean']:.2f} +- {row[key]['std']:.2f}"

    return (
        f"{row['nodes']:>9,} {row['edges']:>11,} {row['gaussians'] / 1e6:>8.1f}M "
        f"{ms('noise:mt19937'):>15} {ms('noise:secure'):>15} {row['extra_s']:>8.2f} "
        f"{ms('pma:mt19937'):>15} {ms('pma:secure'):>15} {row['ratio']:>7.3f} "
        f"{row['pma_ratio']:>6.2f} {ms('noise:secure-sum4'):>15} {row['ratio_sum4']:>7.3f}"
    )


HEADER = (
    f"{'nodes':>9} {'edges':>11} {'gauss.':>9} {'noise MT19937 s':>15} "
    f"{'noise CSPRNG s':>15} {'extra s':>8} {'PMA MT19937 s':>15} {'PMA CSPRNG s':>15} "
    f"{'ratio':>7} {'PMA r':>6} {'noise sum-4 s':>15} {'ratio 4':>7}"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6", help="node counts, comma-separated")
    ap.add_argument("--degree", type=float, default=50.0, help="average degree (directed)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--hops", type=int, default=2, help="GAP's K (its default)")
    ap.add_argument("--dim", type=int, default=16, help="GAP's encoder-dim (its default)")
    ap.add_argument("--sigma", type=float, default=1.0, help="PMA noise std")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as OMP=1)")
    ap.add_argument("--cache", default="", help="folder of generated graphs (bench/scale.py's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "noise_cost.json"))
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    rows = []
    print(
        "ratio: CSPRNG noise / PMA phase (MT19937); PMA r: PMA CSPRNG / PMA MT19937; sum-4: "
        "the CSPRNG's noise as Opacus's sum of four (not used for these float32 rows); "
        f"{a.clients} clients, K = {a.hops}, e = {a.dim}, {a.repeats} repeats, "
        f"{a.threads} thread(s)",
        flush=True,
    )
    print(HEADER, flush=True)
    for size in (int(float(s)) for s in a.sizes.split(",") if s.strip()):
        row = measure(size, a.degree, a.clients, a.hops, a.dim, a.sigma, a.repeats, a.cache)
        rows.append(row)
        print(_fmt(row), flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
