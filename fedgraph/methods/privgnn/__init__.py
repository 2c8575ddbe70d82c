"""PrivGNN (Olatunji, Funke & Khosla, "Releasing Graph Neural Networks with Differential Privacy
Guarantees", TMLR 2023, arXiv 2109.08907), client and server halves as plain functions.

Setting (paper Sec. 3, App. F): a *private* labelled graph and a *public* graph whose nodes
have features but (for training) no labels. The released model is a *student* GNN trained on the
public graph; its labels come from private *teachers* through two noise mechanisms:

1. Private data selection (Alg. 1 lines 4-5, Sec. 3.1.1): for every query node ``v`` the holder
   of the private graph draws a Poisson subsample of its nodes (each node independently with
   probability ``gamma``), keeps the ``K`` sampled nodes nearest to ``v`` in feature space, and
   trains a teacher GNN on their induced subgraph (a *personalised* teacher per query).
2. Noisy pseudo-labels (lines 6-7, Sec. 3.1.2): the teacher predicts ``v`` from ``v``'s
   ``l``-hop public neighbourhood and releases its class posterior with Laplace noise on every
   coordinate (scale ``2 / lambda``, :mod:`.privacy`).
3. Student (Sec. 3.1.3): the public server takes the argmax of the (summed) noisy answers as
   pseudo-labels and trains a GraphSAGE student transductively on the public graph.

Federation: the server holds the public graph, every client holds a part of the private graph,
answers queries within its own budget and refuses beyond it. One client is the paper's
centralized setting. Protocol, one message type ``query.privgnn`` per query round: the server
sends the queries' public neighbourhoods (:func:`make_queries`), each client answers the first
``m`` of them (:func:`client_answer`), the server sums the answers per query
(:func:`aggregate_partial`) and trains the student (:func:`train_student`).

Modules (each one job):

- :mod:`.split`: the private/public split (App. F), Poisson subsamples and the ``K`` rule.
- :mod:`.graphs`: who holds which graph in a federation; the run config's preflight check.
- :mod:`.queries`: query selection, public neighbourhoods, the public PCA map, the message.
- :mod:`.teachers`: the teachers (per-query, batched; or an ensemble), noise-free outputs.
- :mod:`.privacy`: the privacy argument: sensitivity, noise, events, calibration, limits.
- :mod:`.client`: a client's answers within its budget, masking, its state across rounds.
- :mod:`.server`: aggregation of the (partial, or masked) answers into pseudo-labels.
- :mod:`.student`: the student GraphSAGE and label propagation.
- :mod:`.reference`: the centralized run and the baselines.
"""

from __future__ import annotations

from .client import (
    ClientReply,
    SecAggKeys,
    answer_queries,
    client_answer,
    masked_histograms,
    query_round,
)
from .graphs import check_config_neighbours, client_graph, public_graph
from .privacy import (
    DP_MODES,
    NOT_DP_REASON,
    SENSITIVITY,
    VOTE_SENSITIVITY,
    BudgetExceededError,
    Mode,
    QueryBudget,
    answer_limit,
    client_limit,
    ensemble_answer_limit,
    ensemble_collusion_epsilon,
    ensemble_epsilon,
    ensemble_events,
    ensemble_sigma_for_epsilon,
    lam_for_epsilon,
    laplace_noise,
    max_queries,
    noisy_answers,
    noisy_votes,
    one_answer_epsilon,
    privgnn_epsilon,
    privgnn_events,
)
from .queries import (
    SPARSE_DENSITY,
    FeatureProjection,
    QueryGraphs,
    decode_queries,
    encode_queries,
    first_queries,
    make_queries,
    public_projection,
    query_neighbourhoods,
    select_queries,
)
from .reference import (
    BaselineResult,
    PrivGNNRun,
    majority_accuracy,
    nonprivate_teacher,
    public_label_student,
    run_centralized,
)
from .server import (
    Aggregate,
    aggregate_answers,
    aggregate_ensemble,
    aggregate_partial,
    confident_aggregate,
    margin_filter,
    unmask_histograms,
)
from .split import check_neighbours, max_neighbours, poisson_subsample, privgnn_split
from .student import StudentResult, make_sage, propagate_labels, train_student
from .teachers import (
    BatchedSAGE,
    TeacherConfig,
    TeacherTiming,
    ensemble_votes,
    teacher_assignment,
    teacher_config,
    teacher_groups,
    teacher_posteriors,
    train_teachers,
)

__all__ = [
    # split
    "privgnn_split",
    "poisson_subsample",
    "max_neighbours",
    "check_neighbours",
    # graphs
    "public_graph",
    "client_graph",
    "check_config_neighbours",
    # queries
    "QueryGraphs",
    "query_neighbourhoods",
    "FeatureProjection",
    "public_projection",
    "select_queries",
    "SPARSE_DENSITY",
    "encode_queries",
    "decode_queries",
    "first_queries",
    "make_queries",
    # teachers
    "TeacherConfig",
    "teacher_config",
    "BatchedSAGE",
    "train_teachers",
    "TeacherTiming",
    "teacher_posteriors",
    "teacher_assignment",
    "teacher_groups",
    "ensemble_votes",
    # privacy
    "Mode",
    "DP_MODES",
    "NOT_DP_REASON",
    "SENSITIVITY",
    "VOTE_SENSITIVITY",
    "laplace_noise",
    "noisy_answers",
    "privgnn_events",
    "privgnn_epsilon",
    "lam_for_epsilon",
    "max_queries",
    "BudgetExceededError",
    "QueryBudget",
    "answer_limit",
    "noisy_votes",
    "ensemble_events",
    "ensemble_epsilon",
    "ensemble_collusion_epsilon",
    "ensemble_sigma_for_epsilon",
    "ensemble_answer_limit",
    "client_limit",
    "one_answer_epsilon",
    # client
    "answer_queries",
    "SecAggKeys",
    "ClientReply",
    "client_answer",
    "query_round",
    "masked_histograms",
    # server
    "aggregate_answers",
    "margin_filter",
    "confident_aggregate",
    "unmask_histograms",
    "Aggregate",
    "aggregate_partial",
    "aggregate_ensemble",
    # student
    "make_sage",
    "StudentResult",
    "propagate_labels",
    "train_student",
    # reference
    "BaselineResult",
    "nonprivate_teacher",
    "public_label_student",
    "majority_accuracy",
    "PrivGNNRun",
    "run_centralized",
]
