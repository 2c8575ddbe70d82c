"""PPGNN (He et al., "Towards Personalized Differentially Private Learning for Decentralized
Local Graphs", IEEE TKDE, arXiv 2607.04777), client and server halves as plain functions.

Client (one Flower supernode holding many users): map features to ``[-1, 1]`` with the public
feature domain, run the feature mechanism (PPM, Alg. 3, by default) for each user at its own
level, and release the report, the labels of its training/validation users and the graph
structure it knows. Server: decode every client's report, denoise with FlexProp (Alg. 4) or
KProp, train a GNN backbone with model selection on the validation users, and predict. Test
labels never leave the clients: accuracy is counted there.

Modules (each one job):

- :mod:`.privacy`: the feature mechanism and the ledger entries of what each level releases.
- :mod:`.client`: a client's levels, its release and its evaluation counts.
- :mod:`.server`: decoding, denoising, training and model selection on the server.
"""

from __future__ import annotations

from .client import client_query, client_report, count_correct, with_client_levels
from .privacy import LEVEL_RELEASE, build_mechanism, level_subject, record_privacy, set_budgets
from .server import ServerFit, assemble, fit_each_steps, server_fit

__all__ = [
    "build_mechanism",
    "level_subject",
    "LEVEL_RELEASE",
    "record_privacy",
    "set_budgets",
    "with_client_levels",
    "client_report",
    "client_query",
    "count_correct",
    "ServerFit",
    "assemble",
    "fit_each_steps",
    "server_fit",
]
