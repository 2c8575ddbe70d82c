"""Flower apps (ServerApp, ClientApp), presets and the command line."""

import os

# torch's CPU threads are OpenMP threads, which by default spin between parallel regions. On
# a machine whose cores are shared (Ray's workers, the SuperLink, other jobs) the spinning
# threads take the cores from the ones with work: PPGNN's server step on Cora took 5-20 s of
# wall time (and as much CPU) with 2 spinning threads against 2.6-3.7 s with passive waiting
# (2 cores, load 4). Set before torch is imported in every process that loads the apps
# (``fedgraph run``, ``flwr run``'s ServerApp process, the Ray workers); a user's own value
# stays.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch's CPU allocator backs every allocation of >= 2 MiB with transparent huge pages
# (``madvise``), which the kernel otherwise fills 4 KiB page by page at first touch: each PMA
# hop allocates its [n, e] sums afresh. A federated GAP run at 1e6 nodes (2 cores, 4 clients)
# spent half its CPU time in the kernel; with huge pages its PMA phase took 5.6-6.2 s
# instead of 7.1 s (bench/scale.py; docs/results/performance.md). Same rule: before torch
# loads, a user's own value (``0``: off) stays; no effect where the kernel's THP is ``never``.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
