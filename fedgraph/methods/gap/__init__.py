r"""GAP (Sajadmanesh et al., "GAP: Differentially Private Graph Neural Networks with Aggregation
Perturbation", USENIX Security 2023) as plain functions, usable without Flower.

Three modules (paper Sec. 4, Fig. 3, Alg. 2):

1. **Encoder (EM)**: an MLP with a linear softmax head, pre-trained on features and labels
   without the graph (:class:`~fedgraph.nn.gap.GAPEncoder`, :func:`train_encoder`); its
   row-normalized output :math:`\check X^{(0)}` goes to the aggregation module.
2. **Aggregation (AM)**: the Private Multi-hop Aggregation (PMA, Alg. 1, Eq. 7-9),
   :func:`pma`: for ``k = 1..K`` sum-aggregate the normalized previous hop over in-neighbours,
   add :math:`\mathcal N(0, \sigma^2 I)` to every row, row-normalize. Its pieces
   (:func:`aggregate`, :func:`perturb`, :func:`normalize_rows`) are exposed so that a federation
   can run PMA across clients.
3. **Classifier (CM)**: one base MLP per hop, a combination, a head MLP
   (:class:`~fedgraph.nn.gap.GAPClassifier`, :func:`train_classifier`), trained on the private
   aggregations only; inference uses the same aggregations (no further access to the edges).

One job per module (the names below are re-exported here, as ``fedgraph.methods.gap`` had them;
the federated pieces are imported from their modules):

=====================  ===================================================================
:mod:`.aggregation`    PMA, the aggregation perturbation mechanism (Alg. 1, Eq. 7-9):
                       :func:`aggregate`, :func:`perturb`, :func:`pma`
:mod:`.privacy`        the privacy argument in one place: sensitivities (edge, node, across
                       clients), events, calibration, ``delta="auto"``, a federated client's
                       :class:`~.privacy.PrivacyPlan` and the noise of the remote rows
:mod:`.training`       training and evaluation of EM and CM: a FedAvg local step or a
                       centralized epoch (Adam, or DP-SGD through Opacus), a FedSGD gradient,
                       accuracy counts, best-epoch selection
:mod:`.models`         the federated run's encoder and classifier, built from its config
:mod:`.client_pma`     a client's steps of PMA across clients: which edges, its noisy
                       partial sums, their masked release, the finish of a hop
:mod:`.client`         one function per message a GAP client answers (the ClientApp decodes,
                       calls one of them, encodes), its state between messages explicit
:mod:`.server`         the server's step of federated PMA: the released rows summed per node,
                       each owner sent its nodes' sums (from masked rows under secure
                       aggregation)
:mod:`.baselines`      GraphSAGE without DP and with node-level DP-SGD (paper Sec. 6)
:mod:`.reference`      :func:`run_gap`: centralized GAP and its baselines end to end (one
                       client), what ``bench/`` and the equivalence tests compare against
=====================  ===================================================================

Federating it (a client holds a :class:`fedgraph.data.ClientGraph`; with one client every step
below is the centralized one): EM and CM train with FedAvg rounds of :func:`local_train`
(node level: ``dp=DPSGD(...)``; account ``rounds * local_epochs`` epochs with
:func:`dpsgd_schedule`). For each PMA hop a client sums its normalized rows over its local edges
(:func:`aggregate` with local ids) and, separately, over its boundary edges grouped by remote
target (:func:`aggregate` with targets renumbered ``0..T-1``), adds :func:`perturb` noise to
every partial sum it releases, and the owner of a target adds the noisy partial sums it receives
to its own noisy local sum before :func:`normalize_rows` (:mod:`.client_pma`, :mod:`.server`).
Each edge enters exactly one noisy partial sum, so the per-hop edge-level sensitivity is
unchanged (the total noise at a target with remote in-neighbours is larger than centrally).
Node level: a client bounds the out-degrees of its own nodes over local and boundary edges
together (:func:`fedgraph.utils.bound_out_degree`): it owns every out-edge of its nodes; a
node's in-edges from another client are that client's out-edges, summed in the row it releases
for the node, so every remote row is clipped to norm 1 and the sensitivity grows to
:math:`\sqrt{D + n - 1}` (:func:`node_sensitivity` has the argument).

Randomness comes from the caller's generator: a seeded ``torch.Generator`` in the centralized
runs (:mod:`.reference`); a federated client's from :func:`fedgraph.randomness.client_generator`
(a ``torch.Generator`` (``mt19937``) keyed so the server cannot rebuild it, or (the default) an
AES-256-CTR :class:`~fedgraph.randomness.SecureRandom`, which :func:`local_train` accepts too).
"""

from .aggregation import aggregate, normalize_rows, perturb, pma
from .baselines import (
    SAGE_COMBINATIONS,
    SAGE_DP_DEFAULTS,
    calibrate_sage_dp,
    mean_aggregate,
    sage_dp_events,
    sage_dp_features,
    sage_dp_sensitivity,
    train_sage,
    train_sage_dp,
)
from .privacy import (
    LEVELS,
    calibrate_gap,
    default_delta,
    edge_sensitivity,
    gap_events,
    node_sensitivity,
)
from .reference import LEVEL_DEFAULTS, METHODS, run_gap
from .training import (
    DPSGD,
    FitResult,
    dpsgd_schedule,
    evaluate,
    fit,
    local_gradient,
    local_train,
    train_classifier,
    train_encoder,
)

__all__ = [
    "aggregate",
    "perturb",
    "normalize_rows",
    "pma",
    "edge_sensitivity",
    "node_sensitivity",
    "DPSGD",
    "dpsgd_schedule",
    "default_delta",
    "gap_events",
    "calibrate_gap",
    "local_train",
    "local_gradient",
    "evaluate",
    "FitResult",
    "fit",
    "train_encoder",
    "train_classifier",
    "run_gap",
    "METHODS",
    "LEVELS",
    "LEVEL_DEFAULTS",
    "mean_aggregate",
    "sage_dp_features",
    "sage_dp_sensitivity",
    "sage_dp_events",
    "calibrate_sage_dp",
    "train_sage_dp",
    "train_sage",
    "SAGE_COMBINATIONS",
    "SAGE_DP_DEFAULTS",
]
