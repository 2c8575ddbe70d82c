"""PrivGNN's data split (Olatunji, Funke & Khosla, TMLR 2023, arXiv 2109.08907, App. F) and
the Poisson subsample of the private nodes with its ``K`` rule (Sec. 3.1.1, App. B.1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from ... import randomness as rng


def _check_fraction(value: float, name: str, *, allow_zero: bool = False) -> float:
    value = float(value)
    lo_ok = value >= 0.0 if allow_zero else value > 0.0
    if not (math.isfinite(value) and lo_ok and value < 1.0):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must lie in {interval} (got {value})")
    return value


def _induced(data: Data, nodes: Tensor) -> Data:
    """Induced subgraph on ``nodes`` (global ids, sorted); keeps ``node_ids`` = those ids."""
    nodes = nodes.sort().values
    edge_index, _ = subgraph(
        nodes, data.edge_index, relabel_nodes=True, num_nodes=int(data.num_nodes)
    )
    out = Data(x=data.x[nodes], y=data.y[nodes], edge_index=edge_index, num_nodes=nodes.numel())
    out.node_ids = nodes
    for key in ("name", "feature_domain"):
        if key in data:
            out[key] = data[key]
    return out


def privgnn_split(
    data: Data,
    *,
    public_fraction: float = 0.5,
    public_test_fraction: float = 0.5,
    audit_fraction: float = 0.0,
    seed: int = 0,
) -> tuple[Data, Data] | tuple[Data, Data, Data]:
    """The paper's inductive split into a private and a public graph (App. F).

    A seeded permutation puts ``round(audit_fraction * N)`` nodes aside (membership-inference
    audits only; by default none), then ``round(public_fraction * rest)`` in the public graph,
    the others in the private graph. Each graph is the *induced* subgraph of its nodes: edges
    between the two parts are dropped (the paper's private and public graphs are disjoint).

    The paper splits Facebook evenly between private and public graphs and reserves a share of
    the public nodes for testing: 50% (Amazon, Amazon2M, Reddit, Credit), 40% (ArXiv) or 20%
    (Facebook); hence the defaults ``public_fraction=0.5`` and ``public_test_fraction=0.5``.

    Args:
        data: graph with ``x [N, F]``, ``y [N]``, ``edge_index``.
        public_fraction: share of the (non-audit) nodes in the public graph, in (0, 1).
        public_test_fraction: share of the public nodes that are test nodes, in (0, 1); the
            others form the query pool (``train_mask``).
        audit_fraction: share of all nodes kept out of both graphs, in [0, 1).
        seed: seed of the permutation (a local generator).

    Returns:
        ``(private, public)``, or ``(private, public, audit)`` if ``audit_fraction > 0``.
        ``private``: all nodes labelled, ``train_mask`` all true (ready for
        :func:`fedgraph.data.partition`). ``public``: ``train_mask`` = query pool (their labels
        are kept for baselines and diagnostics only), ``test_mask`` = test nodes, ``val_mask``
        all false. Each carries ``node_ids`` (ids in ``data``).
    """
    public_fraction = _check_fraction(public_fraction, "public_fraction")
    public_test_fraction = _check_fraction(public_test_fraction, "public_test_fraction")
    audit_fraction = _check_fraction(audit_fraction, "audit_fraction", allow_zero=True)
    n = int(data.num_nodes)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    n_audit = int(round(audit_fraction * n))
    rest = perm[n_audit:]
    n_pub = int(round(public_fraction * rest.numel()))
    if n_pub < 2 or rest.numel() - n_pub < 1:
        raise ValueError(
            f"privgnn_split: {n} nodes are too few for public_fraction={public_fraction}"
        )
    pub_nodes, priv_nodes = rest[:n_pub], rest[n_pub:]
    private = _induced(data, priv_nodes)
    private.train_mask = torch.ones(private.num_nodes, dtype=torch.bool)
    private.val_mask = torch.zeros(private.num_nodes, dtype=torch.bool)
    private.test_mask = torch.zeros(private.num_nodes, dtype=torch.bool)
    public = _induced(data, pub_nodes)
    n_test = min(n_pub - 1, max(1, int(round(public_test_fraction * n_pub))))
    order = torch.randperm(n_pub, generator=torch.Generator().manual_seed(int(seed) + 1))
    public.test_mask = torch.zeros(n_pub, dtype=torch.bool)
    public.test_mask[order[:n_test]] = True
    public.train_mask = ~public.test_mask
    public.val_mask = torch.zeros(n_pub, dtype=torch.bool)
    if n_audit == 0:
        return private, public
    audit = _induced(data, perm[:n_audit])
    return private, public, audit


def poisson_subsample(
    num_nodes: int, rate: float, generator: torch.Generator | None = None
) -> Tensor:
    """Poisson subsample (paper Sec. 3.1.1, App. B.1): every node is kept independently with
    probability ``rate``; the subsampled-mechanism accountant assumes exactly this. The coins
    compare 53-bit uniform integers with ``floor(rate 2^53)`` (:func:`fedgraph.randomness.
    bernoulli`): the real rate is at most ``rate`` (by less than ``2^-53``), so the
    amplification the accountant claims at ``rate`` holds (Mironov, CCS 2012; issue 60,
    fault 7).

    Returns:
        bool ``[num_nodes]``.
    Raises:
        ValueError: ``rate`` not in ``(0, 1]``.
    """
    rate = float(rate)
    if not (0.0 < rate <= 1.0):
        raise ValueError(f"rate (gamma) must lie in (0, 1] (got {rate})")
    return rng.bernoulli(rate, int(num_nodes), generator)


def max_neighbours(num_candidates: int, rate: float) -> int:
    """The largest valid ``K`` (``num-neighbours``) for a private graph of ``num_candidates``
    labelled nodes at Poisson rate ``gamma``: ``floor(gamma * num_candidates)``, the expected
    size of a subsample (paper Sec. 3.1.1 retrieves ``K`` of the sampled nodes; a larger ``K``
    would silently use every sampled node, i.e. a teacher on the whole subsample)."""
    return int(math.floor(float(rate) * int(num_candidates) + 1e-9))


def check_neighbours(k: int, num_candidates: int, rate: float, where: str = "") -> int:
    """``k`` if it is a valid ``K`` for ``num_candidates`` labelled nodes at rate ``gamma``.

    Rule: ``1 <= K <= floor(gamma * num_candidates)`` (:func:`max_neighbours`). A subsample
    that happens to be smaller than ``K`` (Poisson fluctuation below its mean) uses all its
    nodes; :class:`TeacherTiming` counts those teachers (``short_samples``).

    Raises:
        ValueError: naming ``num-neighbours`` and the largest valid value.
    """
    k = int(k)
    largest = max_neighbours(num_candidates, rate)
    if k < 1 or k > largest:
        raise ValueError(
            f"num-neighbours (K) = {k} exceeds the expected Poisson sample "
            f"gamma * n = {float(rate):g} * {int(num_candidates)} = "
            f"{float(rate) * int(num_candidates):.1f}{where}: every teacher would be trained on "
            f"its whole subsample; allowed: 1 <= num-neighbours <= {largest} (or raise gamma)"
            if k >= 1
            else f"num-neighbours (K) must be >= 1 (got {k})"
        )
    return k


__all__ = ["privgnn_split", "poisson_subsample", "max_neighbours", "check_neighbours"]
