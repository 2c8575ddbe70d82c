"""A user's own graph from plain files, split by a user's own partitioner, run through GAP.

``load`` is a dataset loader: ``load(root) -> torch_geometric.data.Data`` with ``x [N, F]``
(float), ``y [N]`` (class ids in [0, C)), ``edge_index [2, E]`` and the public
``feature_domain``; fedgraph checks it (``fedgraph.data.check_graph``) and makes the graph
undirected. ``root`` is the run config's ``data-root`` (None when unset): here the files next
to this module by default. (Without any code, ``dataset = "files"`` with
``data-root = "<folder>"`` reads the same files.)

``by_blocks`` is a partitioner: node i goes to client ``i * num_clients // N``, as if the
rows were ordered by the institution that holds them.

Privacy (``run.toml``): edge-level DP per client, protecting one edge of ``edges.csv`` (an
undirected friendship, stored as two directed halves: ``edge-unit = "undirected"``,
the default, sensitivity sqrt 2 per PMA hop).

Run: fedgraph run examples/custom_dataset/run.toml
"""

from pathlib import Path

import torch

from fedgraph.data import read_graph_files

GRAPH = Path(__file__).resolve().parent / "graph"  # edges.csv, features.csv, labels.csv


def load(root):
    return read_graph_files(root or GRAPH)


def by_blocks(data, num_clients, seed, **options):
    """LongTensor [N] of client ids in [0, num_clients)."""
    return torch.arange(data.num_nodes) * num_clients // data.num_nodes
