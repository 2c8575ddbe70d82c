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
