"""PrivGNN's privacy argument in one place: what a client releases, its sensitivity, the noise,
the privacy events the ledger records, their calibration and each client's answer limit.

Source: Olatunji, Funke & Khosla, "Releasing Graph Neural Networks with Differential Privacy
Guarantees" (TMLR 2023, arXiv 2109.08907); the ensemble mode follows PATE (Papernot et al.,
ICLR 2018, "Scalable Private Learning with PATE").

1. Release (paper Alg. 1 lines 6-7, Sec. 3.1.2): per answered query, the teacher's class
   posterior (``posterior``) or its one-hot argmax (``vote``) plus i.i.d. Laplace noise on every
   coordinate (:func:`noisy_answers`). Any two probability vectors or one-hot votes differ by at
   most 2 in L1 norm (:data:`SENSITIVITY`), whatever two subsamples are compared, so the noise
   scale is ``2 / lambda`` and the accountant sees a noise multiplier (scale / sensitivity) of
   ``1 / lambda``; the paper's RDP curve (``b = 1/lambda`` at sensitivity 1) gives the same
   epsilon. ``log-softmax-paper`` reproduces the authors' code and is not DP
   (:data:`NOT_DP_REASON`).
2. Subsampling (Sec. 3.1.1, App. B.1): each teacher is trained on a Poisson subsample of rate
   ``gamma`` (:func:`~.split.poisson_subsample`), which amplifies the Laplace mechanism.
3. Composition (Sec. 3.1.4, Sec. 3.2 Thm. 7, App. B.2): ``Q`` answered queries compose ``Q``
   Poisson-subsampled Laplace mechanisms (:func:`privgnn_events`); epsilon at ``delta`` is
   computed numerically (PLD, dp-accounting; the paper's displayed bound is a rough upper
   bound and its experiments compute epsilon numerically too) by :func:`privgnn_epsilon`;
   :func:`lam_for_epsilon` and :func:`max_queries` invert it.
4. Ensemble mode (our federated adaptation of PATE): vote histograms of L2 sensitivity
   ``sqrt 2`` (:data:`VOTE_SENSITIVITY`; it needs a split in which one node changes one
   teacher: :func:`~.teachers.teacher_assignment`) plus Gaussian noise (:func:`noisy_votes`),
   Gaussian events (:func:`ensemble_events`, PATE 2018 Prop. 8), composed exactly (analytic
   Gaussian).
5. Per client (node-level DP for the nodes it holds, paper Thm. 7): a client's limit is the
   largest total number of answers whose epsilon at ``delta`` stays within its target
   (:func:`client_limit`; public parameters only); :class:`QueryBudget` refuses beyond it. A
   node of one client never influences another client's answers, so epsilons are per client,
   not summed over clients.

Everything after the noise (aggregation, student training) is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import randomness as rng
from ...config import PrivGNNConfig

Mode = Literal["posterior", "vote", "log-softmax-paper"]

#: answer modes whose release is differentially private (the others reproduce a published rule)
DP_MODES = ("posterior", "vote")

#: why ``log-softmax-paper`` is not DP (the report's reason)
NOT_DP_REASON = (
    "answer-mode log-softmax-paper reproduces the authors' code: Laplace noise of scale "
    "1/lam on the teachers' log-softmax outputs, accounted by the paper as sensitivity 1. "
    "Log-probabilities are unbounded (one private node can move a log-probability from near "
    "0 to below -100), so no finite sensitivity, hence no finite epsilon, holds"
)

#: L1 sensitivity of a released answer: a probability vector or a one-hot vote (any two differ
#: by at most 2 in L1 norm).
SENSITIVITY = 2.0


def laplace_noise(
    shape,
    scale: float,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """i.i.d. ``Laplace(0, scale)`` samples of ``shape``: ``scale`` times
    :func:`fedgraph.randomness.laplace` (float64, inverse CDF on 52-bit uniforms and a sign
    bit), rounded to ``dtype``. The same draws as :func:`noisy_answers` makes from the same
    generator; a release adds them before rounding (:func:`fedgraph.randomness.add_laplace`),
    never these rounded samples (Mironov, CCS 2012; issue 60, fault 5).

    Raises:
        ValueError: ``scale`` not finite and > 0.
    """
    from ...mechanisms._checks import check_noise_scale

    scale = check_noise_scale(scale, "scale (Laplace noise)")
    return (float(scale) * rng.laplace(shape, generator)).to(dtype)


def noisy_answers(
    posteriors: Tensor,
    lam: float,
    mode: Mode = "posterior",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Laplace mechanism on the teachers' outputs (paper Sec. 3.1.2): ``posterior`` releases
    the probability vector, ``vote`` the one-hot argmax, each plus i.i.d. Laplace noise of scale
    ``SENSITIVITY / lam`` (= 2 / lambda) per coordinate. The noise is drawn in float64 from
    ``generator`` on the CPU (the same draws everywhere), added in float64 and rounded once to
    the answers' dtype (:func:`fedgraph.randomness.add_laplace`; Mironov, CCS 2012; issue 60,
    fault 5: float32 noise added in float32 makes the reachable outputs depend on the answer).

    ``log-softmax-paper`` (a reproduction, **not differentially private**): the authors' code
    releases ``log(posterior) + Laplace(1 / lambda)`` (log-softmax outputs, the paper's
    ``beta = 1/lambda`` at an assumed sensitivity of 1); log-probabilities have no finite
    sensitivity (:data:`NOT_DP_REASON`). Probabilities are clamped at the float32 ``tiny``
    (``log`` of an underflowed softmax is ``-87.3`` instead of ``-inf``).

    Returns:
        ``[Q, C]`` noisy answers, on ``posteriors``' device.
    """
    lam = float(lam)
    if not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"lam (lambda) must be finite and > 0 (got {lam})")
    if mode == "posterior":
        clean = posteriors
    elif mode == "vote":
        clean = F.one_hot(posteriors.argmax(-1), posteriors.shape[-1]).float()
    elif mode == "log-softmax-paper":
        clean = posteriors.float().clamp_min(torch.finfo(torch.float32).tiny).log()
        return rng.add_laplace(clean, 1.0 / lam, generator)
    else:
        raise ValueError(
            f"answer-mode: unknown {mode!r}; allowed: ['posterior', 'vote', 'log-softmax-paper']"
        )
    return rng.add_laplace(clean, SENSITIVITY / lam, generator)


def privgnn_events(
    num_queries: int, rate: float, lam: float, sensitivity: float = SENSITIVITY
) -> list:
    """Privacy events of answering ``num_queries`` queries (paper Thm. 7): that many
    Poisson-subsampled (rate ``gamma``) Laplace mechanisms of scale ``sensitivity / lam`` on an
    answer of L1 sensitivity ``sensitivity``, i.e. noise multiplier ``1 / lam``."""
    from ...accounting import Laplace

    if num_queries < 1:
        return []
    scale = sensitivity / float(lam)
    return [Laplace(scale / sensitivity, count=int(num_queries), sample_rate=float(rate))]


def privgnn_epsilon(
    num_queries: int, rate: float, lam: float, delta: float, accountant: str = "pld"
) -> float:
    """Epsilon of ``num_queries`` answers at ``delta`` (0 for no query)."""
    from ...accounting import compose_epsilon

    if num_queries < 1:
        return 0.0
    return float(
        compose_epsilon(privgnn_events(num_queries, rate, lam), delta, accountant=accountant)
    )


def lam_for_epsilon(epsilon: float, delta: float, num_queries: int, rate: float) -> float:
    """The largest ``lam`` (least noise) at which ``num_queries`` answers cost at most
    ``epsilon`` at ``delta`` (:func:`privgnn_epsilon`, PLD): :func:`fedgraph.accounting.calibrate`
    on the ledger's own events (:func:`privgnn_events`) over the noise multiplier ``1 / lam``.

    Raises:
        ValueError: ``epsilon`` not finite and > 0, or ``num_queries`` < 1.
    """
    from ...accounting import calibrate

    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1 (got {num_queries})")
    z = calibrate(
        epsilon,
        delta,
        lambda s: privgnn_events(num_queries, rate, 1.0 / s),
        accountant="pld",
        lower=0.01,
        upper=1e6,
    )
    return 1.0 / float(z)


def max_queries(
    epsilon_budget: float,
    delta: float,
    rate: float,
    lam: float,
    *,
    accountant: str = "pld",
    cap: int = 1_000_000,
) -> int:
    """The largest number of queries whose composed epsilon stays within ``epsilon_budget``
    (binary search over the count; epsilon grows with it). At most ``cap``."""
    if not (epsilon_budget > 0):
        raise ValueError(f"epsilon_budget must be > 0 (got {epsilon_budget})")

    def fits(q: int) -> bool:
        return privgnn_epsilon(q, rate, lam, delta, accountant) <= epsilon_budget

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    if hi > cap:
        return cap if fits(cap) else _bisect(fits, lo, cap)
    return _bisect(fits, lo, hi)


def _bisect(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest q in [lo, hi) with fits(q), given fits(lo) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


class BudgetExceededError(RuntimeError):
    """A client refused queries beyond its privacy budget."""


@dataclass
class QueryBudget:
    """A client's query budget: it answers at most ``limit`` queries (from :func:`max_queries`
    for its ``(epsilon, delta)`` target, or given directly) and refuses beyond it.

    Use :meth:`for_epsilon` to compute the limit; ``answered`` counts what was released.
    """

    limit: int
    answered: int = 0
    epsilon: float | None = None
    delta: float | None = None

    @classmethod
    def for_epsilon(
        cls, epsilon: float, delta: float, rate: float, lam: float, accountant: str = "pld"
    ) -> QueryBudget:
        return cls(max_queries(epsilon, delta, rate, lam, accountant=accountant), 0, epsilon, delta)

    @property
    def remaining(self) -> int:
        return max(self.limit - self.answered, 0)

    def charge(self, num_queries: int) -> None:
        """Reserve ``num_queries`` answers, or refuse all of them.

        Raises:
            BudgetExceededError: if they exceed :attr:`remaining`.
        """
        if num_queries > self.remaining:
            target = f" (epsilon={self.epsilon}, delta={self.delta})" if self.epsilon else ""
            raise BudgetExceededError(
                f"privacy budget exhausted{target}: {num_queries} queries asked, "
                f"{self.remaining} of {self.limit} left; ask at most {self.remaining}"
            )
        self.answered += int(num_queries)


@lru_cache(maxsize=64)
def answer_limit(epsilon: float, delta: float, rate: float, lam: float, wanted: int) -> int:
    """The most answers (in total, at most ``wanted``) whose composed epsilon at ``delta``
    (PLD) stays within ``epsilon``; ``inf`` allows ``wanted``. Depends on public parameters
    only, so the limit itself reveals nothing about the private data (cached: PLD takes up to
    a second per count)."""
    if wanted < 1 or math.isinf(epsilon):
        return max(int(wanted), 0)
    if privgnn_epsilon(wanted, rate, lam, delta, "pld") <= epsilon:
        return int(wanted)
    return max_queries(epsilon, delta, rate, lam, accountant="pld", cap=int(wanted))


def noisy_votes(
    votes: Tensor,
    sigma_votes: float,
    sigma_threshold: float | None = None,
    generator: torch.Generator | None = None,
    shares: int = 1,
) -> Tensor:
    """A client's release of its vote histograms ``[Q, C]``: ``votes + N(0, sigma_votes^2 /
    shares)`` per coordinate (the GNMax copy) and, with ``sigma_threshold``, an independent
    ``votes + N(0, sigma_threshold^2 / shares)`` (the copy for Confident-GNMax's threshold
    check), concatenated: ``[Q, C]`` or ``[Q, 2C]`` (threshold copy first), on the CPU.

    ``shares = 1`` (no secure aggregation): each copy is the Gaussian mechanism of std
    ``sigma`` on a histogram of L2 sensitivity ``sqrt 2`` (:func:`ensemble_events`), against
    everyone who sees the reply, the server included.

    ``shares = n`` (secure aggregation over the ``n`` clients; distributed DP, e.g. Kairouz
    et al., ICML 2021, "The Distributed Discrete Gaussian Mechanism", Sec. 1): each client adds
    only ``1/n`` of the variance, so the *sum* the server learns carries ``N(0, sigma^2)``,
    the same events as above, against a server that sees only that sum and does not collude
    with the other clients; against a coalition of the server and all ``n - 1`` other clients
    a client is protected by its own share only (std ``sigma / sqrt n``,
    :func:`ensemble_collusion_epsilon`).

    Raises:
        ValueError: a noise std not finite and > 0 (names the key), or ``shares < 1``.
    """
    from ...mechanisms._checks import check_noise_scale

    if int(shares) < 1:
        raise ValueError(f"shares must be >= 1 (the clients that split the noise), got {shares}")
    root = math.sqrt(int(shares))
    votes = votes.detach().float().cpu()
    sigma_votes = check_noise_scale(sigma_votes, "sigma-votes")
    # a CSPRNG's noise is added in float64 and rounded once (fedgraph.randomness.add_gaussian)
    out = rng.add_gaussian(votes, sigma_votes / root, generator)
    if sigma_threshold:
        sigma_threshold = check_noise_scale(sigma_threshold, "sigma-threshold")
        out = torch.cat([rng.add_gaussian(votes, sigma_threshold / root, generator), out], 1)
    return out


#: L2 sensitivity of a vote histogram: one private node changes one teacher (each node is
#: assigned to a teacher independently, :func:`~.teachers.teacher_assignment`), whose vote
#: moves from one class to another (``sqrt 2``) or to an abstention (an empty teacher: 1)
VOTE_SENSITIVITY = math.sqrt(2.0)


def ensemble_events(
    num_queries: int, sigma_votes: float, sigma_threshold: float | None = None
) -> list:
    """Privacy events of ``num_queries`` released noisy histograms (:func:`noisy_votes`): per
    query a Gaussian of noise multiplier ``sigma / sqrt 2`` per copy (RDP ``alpha / sigma^2``:
    PATE 2018 Prop. 8's data-independent bound of GNMax, which also covers the whole noisy
    histogram)."""
    from ...accounting import Gaussian

    if num_queries < 1:
        return []
    out = [Gaussian(float(sigma_votes) / VOTE_SENSITIVITY, count=int(num_queries))]
    if sigma_threshold:
        out.append(Gaussian(float(sigma_threshold) / VOTE_SENSITIVITY, count=int(num_queries)))
    return out


def ensemble_epsilon(
    num_queries: int,
    sigma_votes: float,
    sigma_threshold: float | None,
    delta: float,
    accountant: str = "analytic",
) -> float:
    """Epsilon at ``delta`` of ``num_queries`` released histograms (0 for none); by default
    the exact composition of Gaussians (analytic Gaussian, Balle & Wang 2018: microseconds,
    where PLD's discretisation needs gigabytes once epsilon is in the hundreds)."""
    from ...accounting import compose_epsilon

    if num_queries < 1:
        return 0.0
    return float(
        compose_epsilon(
            ensemble_events(num_queries, sigma_votes, sigma_threshold), delta, accountant=accountant
        )
    )


def ensemble_collusion_epsilon(
    num_queries: int,
    sigma_votes: float,
    sigma_threshold: float | None,
    delta: float,
    num_clients: int,
) -> float:
    """Secure aggregation's weak point, stated: epsilon at ``delta`` of ``num_queries``
    histograms of one client against a server that colludes with all ``num_clients - 1``
    other clients (they know their own noise shares and subtract them from the sum), so only
    this client's share, std ``sigma / sqrt(num_clients)``, protects it (:func:`noisy_votes`
    with ``shares = num_clients``). With ``num_clients = 1`` it is :func:`ensemble_epsilon`."""
    root = math.sqrt(int(num_clients))
    return ensemble_epsilon(
        num_queries, sigma_votes / root, sigma_threshold / root if sigma_threshold else None, delta
    )


def ensemble_sigma_for_epsilon(
    epsilon: float, delta: float, num_queries: int, threshold_ratio: float | None = None
) -> float:
    """``sigma_votes`` (per-client std) at which ``num_queries`` released histograms cost
    ``epsilon`` at ``delta`` (with a threshold copy of std ``threshold_ratio * sigma_votes``):
    :func:`fedgraph.accounting.calibrate` on the ledger's own events (:func:`ensemble_events`,
    the analytic Gaussian composition: exact), so the result never exceeds ``epsilon``.

    Raises:
        ValueError: ``epsilon`` not finite and > 0 or ``num_queries`` < 1.
    """
    from ...accounting import calibrate

    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1 (got {num_queries})")
    ratio = threshold_ratio or None
    return float(
        calibrate(
            epsilon,
            delta,
            lambda s: ensemble_events(num_queries, s, ratio * s if ratio else None),
            accountant="analytic",
            lower=1.0,
            upper=1e6,
        )
    )


@lru_cache(maxsize=64)
def ensemble_answer_limit(
    epsilon: float, delta: float, sigma_votes: float, sigma_threshold: float, wanted: int
) -> int:
    """Ensemble mode: the most released histograms (at most ``wanted``) whose composed epsilon
    at ``delta`` (:func:`ensemble_epsilon`, exact) stays within ``epsilon``; public
    parameters only. Epsilon grows with the count, so a bisection finds it."""
    if wanted < 1 or math.isinf(epsilon):
        return max(int(wanted), 0)

    def fits(q: int) -> bool:
        return ensemble_epsilon(q, sigma_votes, sigma_threshold or None, delta) <= epsilon

    if fits(int(wanted)):
        return int(wanted)
    if not fits(1):
        return 0
    return _bisect(fits, 1, int(wanted))


def one_answer_epsilon(cfg: PrivGNNConfig) -> float:
    """Epsilon (at ``cfg.delta``) of a client's first answer: one noisy reply
    (:func:`privgnn_epsilon` of one query at ``gamma``, ``lam``) or, in ensemble mode, one
    released histogram (:func:`ensemble_epsilon` at ``sigma-votes``, ``sigma-threshold``). A
    client whose target is below it answers nothing (:func:`client_limit` is 0); public
    parameters only."""
    if cfg.answer_mode == "ensemble":
        return ensemble_epsilon(1, cfg.sigma_votes, cfg.sigma_threshold or None, cfg.delta)
    return privgnn_epsilon(1, cfg.gamma, cfg.lam, cfg.delta, "pld")


def client_limit(cfg: PrivGNNConfig, partition_id: int, wanted: int) -> int:
    """Answers client ``partition_id`` may give in total (at most ``wanted``) within its
    target: :func:`ensemble_answer_limit` in ensemble mode (with ``secure-aggregation``: the
    smallest over all clients' targets, since every client must answer the same queries for
    the masks to cancel; public parameters only), else :func:`answer_limit` (for
    ``log-softmax-paper`` the paper's own accounting, which does not hold: the report marks it
    not DP)."""
    target = cfg.client_epsilon(partition_id)
    if cfg.answer_mode == "ensemble":
        if cfg.secure_aggregation:  # the masks cancel only over every client: same queries
            return min(
                ensemble_answer_limit(
                    cfg.client_epsilon(p),
                    cfg.delta,
                    cfg.sigma_votes,
                    cfg.sigma_threshold,
                    int(wanted),
                )
                for p in range(min(cfg.num_clients, len(cfg.client_epsilons)))
            )
        return ensemble_answer_limit(
            target, cfg.delta, cfg.sigma_votes, cfg.sigma_threshold, int(wanted)
        )
    return answer_limit(target, cfg.delta, cfg.gamma, cfg.lam, int(wanted))


__all__ = [
    "Mode",
    "DP_MODES",
    "NOT_DP_REASON",
    "SENSITIVITY",
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
    "VOTE_SENSITIVITY",
    "ensemble_events",
    "ensemble_epsilon",
    "ensemble_collusion_epsilon",
    "ensemble_sigma_for_epsilon",
    "ensemble_answer_limit",
    "client_limit",
    "one_answer_epsilon",
]


def reply_events(cfg, answered: int) -> list[tuple[str, object]]:
    """``(release, event)`` pairs a client's reply with ``answered`` new answers spends, the
    one definition both ledgers use: the server's (:class:`fedgraph.strategies.privgnn.
    PrivGNNStrategy`, when the reply arrives) and the client's own (:class:`fedgraph.
    client_authority.ClientAuthority`, before it leaves). ``ensemble``: the noisy vote
    histograms and their threshold copy (:func:`ensemble_events`; PATE, Papernot et al. 2018);
    ``posterior``/``vote``: one Poisson-subsampled Laplace mechanism per answer
    (:func:`privgnn_events`; PrivGNN paper Sec. 4). ``log-softmax-paper`` is not DP
    (:data:`NOT_DP_REASON`): ``[]`` (its claimed events are the server's to show, never
    composed). No answer: ``[]``."""
    if answered <= 0:
        return []
    if cfg.answer_mode == "ensemble":
        names = ["noisy vote histograms", "noisy vote histograms (threshold copy)"]
        return list(zip(names, ensemble_events(answered, cfg.sigma_votes, cfg.sigma_threshold)))
    if cfg.answer_mode not in DP_MODES:
        return []
    return [("noisy answers", e) for e in privgnn_events(answered, cfg.gamma, cfg.lam)]


def accountant(cfg) -> str:
    """The accountant composing a PrivGNN client's events, for the server's ledger and the
    client's own alike: the ensemble's Gaussian events compose exactly in closed form
    (``analytic``), the Laplace modes by PLD (dp-accounting) unless the config names one."""
    if cfg.answer_mode == "ensemble":
        return "analytic"
    return str(getattr(cfg, "accountant", None) or "pld")
