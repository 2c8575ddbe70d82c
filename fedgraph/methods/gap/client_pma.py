"""A client's steps of PMA (GAP paper Alg. 1) across clients, built from :mod:`.aggregation`'s
mechanism; the server's step between them is :mod:`.server`.

A client holds a :class:`~fedgraph.data.ClientGraph`. PMA runs hop by hop across clients:

1. :func:`pma_partial_sums`: from its normalized hop ``k-1``, the client sums over its edges
   (:func:`client_edges`), for its own nodes (local edges) and for remote nodes (boundary edges
   ``u -> v`` with ``u`` here), and adds ``N(0, sigma^2 I)`` to **every** row of both (node
   level: each remote row is first clipped to L2 norm <=
   :data:`~fedgraph.methods.gap.privacy.REMOTE_ROW_NORM`). Only the noisy remote rows leave the
   client (through the server, to the owner of ``v``; with secure aggregation masked,
   :func:`masked_release`).
2. :func:`pma_finish`: the owner adds the noisy partial sums it received to its own noisy sums
   and row-normalizes: hop ``k``.

The sigma, its sensitivity and the events: :mod:`.privacy`.

Inference (``GAPConfig.inference``). Transductive: one PMA on the whole graph serves training
and evaluation. Inductive: the masks split the graph into a *training graph* (edges with both
ends in train or val nodes) and a *held-out graph* (edges with both ends in test nodes); edges
between the two are dropped (:func:`graph_nodes`, :func:`client_edges`). PMA runs on the
training graph for the classifier's inputs, and once more, after the classifier rounds, on the
held-out graph (fresh noise, same sigma and K) for the test nodes' inputs. Who decides: the
client that owns an edge's source, from both endpoints' split membership, which every client
and the server know (the split is public: a seeded permutation of the public node count, or
the published Planetoid masks); the owner of the target therefore receives sums over exactly
the edges of the current graph, and the released rows are those of the current graph's remote
nodes (fixed by the public split, not by the edges). Why the two runs cost one:
:mod:`.privacy`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ... import randomness as rng
from ...config import GAPConfig
from ...nn.gap import normalize_rows_
from ...utils.graph import MAX_MESSAGE_ELEMENTS, bound_out_degree
from ...utils.scratch import shared_block
from ...utils.sparse import EdgeSum, MissingRowError, index_in

GRAPHS = ("all", "train", "test")  # PMA's edge sets: whole graph, training graph, held-out graph


def graph_nodes(test_mask: Tensor | None, graph: str) -> Tensor | None:
    """Global boolean mask ``[N]`` of the nodes of ``graph`` (``"train"``: train and val
    nodes, i.e. not test; ``"test"``: test nodes); ``None`` for ``"all"`` (every node).
    ``test_mask``: the global test mask (public, see the module docstring).

    Raises:
        ValueError: unknown ``graph``, or no test mask for a split graph.
    """
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")
    if graph == "all":
        return None
    if test_mask is None:
        raise ValueError("inductive inference needs the split's test mask")
    return test_mask.clone() if graph == "test" else ~test_mask


def client_edges(
    client, cfg: GAPConfig, generator: torch.Generator, in_graph: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The client's directed edges ``(local [2, e], boundary [2, b])`` that PMA uses: boundary
    edges only with ``cross_client_edges``; ``in_graph`` (global boolean mask ``[N]``, from
    :func:`graph_nodes`; ``None``: all nodes): only edges with both ends in it, local and
    boundary alike; node level: then out-degree bounded by ``D`` over both (the client owns its
    nodes' out-edges)."""
    local = client.edge_index
    boundary = (
        client.boundary_edge_index if cfg.cross_client_edges else client.boundary_edge_index[:, :0]
    )
    if in_graph is not None:
        mine = in_graph[client.node_ids]
        local = local[:, mine[local[0]] & mine[local[1]]]
        boundary = boundary[:, mine[boundary[0]] & in_graph[boundary[1]]]
    if cfg.level != "node" or cfg.variant == "gap-inf":
        return local, boundary
    n = client.num_nodes
    # Encode remote targets as ids >= n so one bounding covers both kinds of out-edges.
    remote_ids, remote_dst = torch.unique(boundary[1], return_inverse=True)
    both = torch.cat([local, torch.stack([boundary[0], remote_dst + n])], dim=1)
    kept = bound_out_degree(both, n + remote_ids.numel(), cfg.max_degree, generator)
    is_local = kept[1] < n
    rem = kept[:, ~is_local]
    return kept[:, is_local], torch.stack([rem[0], remote_ids[rem[1] - n]])


def pma_edge_sums(
    local: Tensor,
    boundary: Tensor,
    num_nodes: int,
    remote_ids: Tensor | None = None,
    max_elements: int = MAX_MESSAGE_ELEMENTS,
) -> tuple[EdgeSum, EdgeSum]:
    """A client's two sums over edges of every PMA hop, built once for a run's hops (the edges
    are the same at every hop, the node level's degree-bounded ones too: one ``gap:degree``
    draw): ``(local [n] rows from its local edges, remote [m] rows, one per id of remote_ids,
    from its boundary edges)`` as :class:`~fedgraph.utils.sparse.EdgeSum`.

    Args:
        local: ``[2, e_l]`` local edges (local ids); boundary: ``[2, e_b]`` (local src, global
            dst); num_nodes: ``n``, the client's nodes; remote_ids: as :func:`pma_partial_sums`
            (``None``: the boundary targets); max_elements: as :func:`pma_partial_sums`.

    Raises:
        ValueError: ``remote_ids`` missing a boundary target, ids out of range.
    """
    if remote_ids is None:
        remote_ids = torch.unique(boundary[1])
    local_sum = EdgeSum(
        local[0], local[1], num_nodes, num_rows=num_nodes, max_elements=max_elements
    )
    try:
        remote_sum = EdgeSum(
            boundary[0], boundary[1], num_nodes, row_ids=remote_ids, max_elements=max_elements
        )
    except MissingRowError:
        raise ValueError("remote_ids must contain every boundary target") from None
    return local_sum, remote_sum


def pma_partial_sums(
    h_prev: Tensor,
    local: Tensor | EdgeSum,
    boundary: Tensor | EdgeSum,
    sigma: float,
    generator: torch.Generator,
    remote_ids: Tensor | None = None,
    max_elements: int = MAX_MESSAGE_ELEMENTS,
    remote_sigma: float | None = None,
    remote_norm: float | None = None,
    remote_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One hop of PMA on a client (Alg. 1 lines 3-4, split across clients).

    Args:
        h_prev: normalized hop ``k-1`` of this client's nodes ``[n, e]``.
        local: ``[2, e_l]`` local edges (local ids); boundary: ``[2, e_b]`` (local src, global
            dst); or both as built once for every hop by :func:`pma_edge_sums` (then
            ``remote_ids`` and ``max_elements`` are theirs).
        sigma: noise std (noise multiplier x sensitivity); 0 only for GAP without noise.
        remote_ids: sorted global ids of the remote rows to release. Pass every node the client
            does not hold: the released ids must not depend on the edges, or their presence
            would reveal which remote nodes are neighbours (an edge leak no noise covers).
            ``None``: the remote targets of ``boundary`` (only for tests and non-private use).
        max_elements: memory cap of the per-hop aggregation when the edges are not sorted by
            target: then they are summed in chunks whose ``[chunk, e]`` message block has at
            most this many elements; sorted (a client's parts are), one sparse matmul
            (:func:`~fedgraph.utils.sparse.sum_over_edges`); never an ``[E, e]`` block.
        remote_sigma: noise std of the remote rows (``None``: ``sigma``). Secure aggregation
            (:func:`secure_remote_sigma`): the server learns only the sum over the clients of a
            node's remote rows, so each adds a share of the noise. ``> 0`` when ``sigma > 0``.
        remote_norm: node level (:attr:`PrivacyPlan.remote_norm`): every remote row is
            projected onto the L2 ball of this radius before its noise, so that a node's
            in-edges from this client change its row by at most this much; ``None``: no
            clipping (edge level, where one edge changes one row by <= 1 anyway).
        remote_out: a contiguous ``[m, e]`` tensor of ``h_prev``'s dtype and device the remote
            rows are written into and returned as ``remote_sums`` (its contents are
            overwritten): a block kept across hops (:func:`release_buffer`), whose memory is
            then faulted in once; ``None``: a new tensor.

    Raises:
        ValueError: ``sigma`` not finite and >= 0; ``remote_sigma`` not finite and > 0 (>= 0
            when ``sigma == 0``); ``remote_norm`` not > 0; ``remote_ids`` missing a boundary
            target.

    Returns:
        ``(local_sums [n, e], remote_ids [m], remote_sums [m, e])``, every row noised, on
        ``h_prev``'s device (edges and ids may be on the CPU; the noise is drawn from the CPU
        ``generator``, so a run is the same on CPU and GPU up to float rounding).
    """
    from ...mechanisms._checks import check_noise_scale

    sigma = check_noise_scale(sigma, "sigma", allow_zero=True)
    remote_sigma = (
        sigma
        if remote_sigma is None
        else check_noise_scale(remote_sigma, "remote_sigma", allow_zero=sigma == 0)
    )
    if not isinstance(local, EdgeSum):
        local, boundary = pma_edge_sums(local, boundary, h_prev.size(0), remote_ids, max_elements)
    if remote_norm is not None and not remote_norm > 0:
        raise ValueError(f"remote_norm must be > 0 (or None), got {remote_norm}")
    local_sums = local(h_prev)
    remote_sums, remote_ids = boundary(h_prev, out=remote_out), boundary.row_ids
    if remote_norm is not None:
        norms = remote_sums.norm(dim=1, keepdim=True)
        remote_sums.mul_(remote_norm / norms.clamp_min(remote_norm))
    # the Gaussian mechanism, in place: under a CSPRNG the noise is added in float64 and
    # rounded once (fedgraph.randomness.add_gaussian_); a torch.Generator: += sigma * randn
    if sigma > 0:
        rng.add_gaussian_(local_sums, sigma, generator)
    if remote_sigma > 0:
        rng.add_gaussian_(remote_sums, remote_sigma, generator)
    return local_sums, remote_ids, remote_sums


def release_buffer(buffers: dict, rows: int, like: Tensor) -> Tensor | None:
    """The ``[rows, e]`` block of ``like``'s dtype that a client's remote rows are written into
    at every hop of a PMA run (``pma_partial_sums``' ``remote_out``), kept in ``buffers`` (a
    dict that lives as long as the run's edge sums) and made at its first use: the first rows
    of the process's release block (:func:`~fedgraph.utils.scratch.shared_block`), which the
    other clients a simulation's worker runs in turn share, so that it is faulted in once, not
    per client. What was written in it is overwritten at this client's next hop or by the next
    client's: the release must have been encoded before the handler returns (a reply's record
    is a copy). Nothing in it is sent apart from the release. ``None`` (a new tensor per hop)
    off the CPU: a GPU product allocates its result anyway, and the device's release is copied
    to the CPU for the message."""
    if like.device.type != "cpu":
        return None
    key = (rows, like.size(1), like.dtype)
    if key not in buffers:
        buffers[key] = shared_block("gap.release", rows, like.size(1), like.dtype)
    return buffers[key]


def masked_release(
    ids: Tensor,
    sums: Tensor,
    private_key: bytes,
    public_keys: list[bytes],
    me: int,
    owner: Tensor,
    context: str,
) -> dict[str, Tensor]:
    """Secure aggregation of a client's remote rows: what leaves the client instead of
    ``{"ids", "sums"}`` (:func:`fedgraph.secure_aggregation.mask_rows`).

    Args:
        ids: ``[m]`` global ids of the remote rows (every node of the graph held elsewhere).
        sums: ``[m, e]`` the noisy remote rows (:func:`pma_partial_sums`).
        private_key: this client's X25519 private key (never sent); public_keys: every
            client's, by client index; me: this client's index.
        owner: ``[N]`` client index owning each node (from the server, public).
        context: the masks' context (run, graph, hop), distinct for every release.

    Returns:
        ``{"ids": [m], "masked": [m, e] int64}`` (the ``uint64`` ring elements' bits): uniform
        on the ring for the server; the masks cancel in the sum over the ``n - 1``
        contributors of each node.
    """
    import numpy as np

    from ...secure_aggregation import mask_rows

    masked = mask_rows(
        sums.detach().double().cpu().numpy(),
        ids.cpu().numpy(),
        owner.cpu().numpy(),
        me,
        private_key,
        public_keys,
        context,
    )
    return {"ids": ids.cpu(), "masked": torch.from_numpy(masked.view(np.int64))}


def pma_finish(
    local_sums: Tensor, node_ids: Tensor, incoming_ids: Tensor, incoming_sums: Tensor
) -> Tensor:
    """Add the noisy partial sums received for this client's nodes and row-normalize (Alg. 1
    line 5, Eq. 9).

    Args:
        local_sums: ``[n, e]`` this client's noisy sums of the hop (:func:`pma_partial_sums`;
            not written: the ClientApp's kept state is read-only).
        node_ids: ``[n]`` the global ids of its nodes; incoming_ids: ``[m]`` global ids, each
            one of ``node_ids``; incoming_sums: ``[m, e]`` the rows received for them (CPU
            tensors from a message, moved to ``local_sums``' device).

    Returns:
        a new ``[n, e]`` on ``local_sums``' device, every row of L2 norm 1 (a zero row stays
        zero); normalized in place, so that one ``[n, e]`` block is allocated (and its pages
        faulted in) per hop, not two (issue 31).

    Raises:
        ValueError: an id of ``incoming_ids`` not in ``node_ids``.
    """
    if not incoming_ids.numel():
        return normalize_rows_(local_sums.clone())
    pos = index_in(node_ids, incoming_ids)
    if bool((pos < 0).any()):
        raise ValueError("received partial sums for nodes this client does not hold")
    dev = local_sums.device
    return normalize_rows_(
        local_sums.index_add(0, pos.to(dev), incoming_sums.to(dev, local_sums.dtype))
    )
