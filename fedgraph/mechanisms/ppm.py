r"""Personalized Perturbation Mechanism, PPM = ESW + MLR (PPGNN paper Alg. 3).

A user at level ``tau`` with budget ``eps_tau`` from the budget set ``E`` spends
``gamma * eps_tau`` on its level (ESW) and ``(1 - gamma) * eps_tau`` on its features (MLR).

What leaves the user is :class:`PPMReport`: the ESW output and, for each of ``m'`` sampled
dimensions, the index and a sign ``+-1``. ``m'`` follows Theorem 1 applied to the budget of the
*released* level (paper Sec. III-B: "we use a randomized version tau' through the ESW"), and the
server rescales with that same released level. So the set of values a report can take, and its
length, do not depend on ``tau``. Its *distribution* does, beyond ESW: each sign is drawn with
the user's own budget ``(1 - gamma) eps_tau / m'``. What the whole report reveals about the
level is therefore more than ESW's ``gamma * eps_tau``; :func:`level_epsilon` computes it
exactly and the ledger reports it (subject ``level-<tau> (level)``). The price of following the
released level: when ``tau' != tau`` the server's rescaling uses a slightly wrong budget, and
the estimate is biased for that user (it is unbiased when ``tau' == tau``).
With a single level (``|E| = 1``) the level is public, ESW is skipped and ``gamma`` is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..limits import PPM_LEVEL_SCAN_MAX, ppm_level_scan_limit
from ._checks import check_unit_features
from .bits import SampledBits, mlr_num_dims, multi_bit, multi_bit_estimate, scatter_bits
from .esw import esw, esw_decode, esw_window


@dataclass(frozen=True)
class PPMParams:
    """Public parameters of PPM, known to users and server.

    Args:
        budgets: the budget set ``E`` (epsilon per level, total per user), strictly increasing.
        gamma: share of each user's budget spent on its level, in ``(0, 1)``.
    """

    budgets: tuple[float, ...]
    gamma: float = 0.1
    #: public share of users at each level (the server's prior); ``None``: equal shares.
    shares: tuple[float, ...] | None = None

    def __post_init__(self):
        b = self.budgets
        if len(b) == 0 or any(not (x > 0 and x < float("inf")) for x in b):
            raise ValueError(f"budgets: every epsilon must be finite and > 0, got {list(b)}")
        if any(b[i + 1] <= b[i] for i in range(len(b) - 1)):
            raise ValueError(f"budgets must be strictly increasing, got {list(b)}")
        if len(b) > 1 and not (0.0 < self.gamma < 1.0):
            raise ValueError(f"gamma must lie in (0, 1), got {self.gamma}")
        if self.shares is not None and (
            len(self.shares) != len(b)
            or any(s < 0 for s in self.shares)
            or abs(sum(self.shares) - 1) > 1e-6
        ):
            raise ValueError(
                f"shares must be one non-negative share per level summing to 1, got {self.shares}"
            )

    @property
    def num_levels(self) -> int:
        return len(self.budgets)

    @property
    def esw_share(self) -> float:
        return self.gamma if self.num_levels > 1 else 0.0

    @property
    def window(self) -> int:
        """ESW window ``b`` from the public smallest ESW budget ``gamma * min(E)``."""
        return (
            esw_window(self.esw_share * self.budgets[0], self.num_levels)
            if self.num_levels > 1
            else 0
        )

    def budget_of(self, levels: Tensor) -> Tensor:
        """Epsilon of each level index (1-based) as float64."""
        return torch.tensor(self.budgets, dtype=torch.float64)[levels.cpu() - 1].to(levels.device)

    def epsilon_split(self, level: int) -> dict[str, float]:
        """Budget per release for one level: ``{"esw": ..., "mlr": ...}`` (pure epsilon-LDP).
        Their sum bounds what a report reveals about the features at a fixed level; it does
        not bound what it reveals about the level (:func:`level_epsilon`)."""
        eps = self.budgets[level - 1]
        out = {"mlr": (1.0 - self.esw_share) * eps}
        if self.num_levels > 1:
            out["esw"] = self.esw_share * eps
        return out


@dataclass
class PPMReport:
    """What users send: ``released_level`` long ``[n]`` in ``{1..f+2b}`` and their bits."""

    released_level: Tensor
    bits: SampledBits


def ppm(
    x: Tensor, levels: Tensor, params: PPMParams, generator: torch.Generator | None = None
) -> PPMReport:
    """User side of PPM (Alg. 3), vectorized over ``n`` users.

    Args:
        x: features ``[n, d]`` in ``[-1, 1]``.
        levels: long ``[n]`` in ``{1..h}``.

    Returns:
        :class:`PPMReport`. User ``i`` is ``E[levels[i]]``-LDP about its features at its level;
        what the report reveals about the level: :func:`level_epsilon`.
    """
    x = check_unit_features(x)
    n, d = x.shape
    if levels.shape != (n,) or levels.dtype != torch.long:
        raise ValueError(
            f"levels must be a long tensor of shape [{n}], got {levels.dtype} {tuple(levels.shape)}"
        )
    if n and (levels.min() < 1 or levels.max() > params.num_levels):
        raise ValueError(f"levels must lie in {{1, ..., {params.num_levels}}}")
    eps = params.budget_of(levels)
    if params.num_levels > 1:
        released = esw(levels, params.esw_share * eps, params.num_levels, params.window, generator)
    else:
        released = torch.ones_like(levels)
    m = mlr_num_dims(
        (1 - params.esw_share)
        * params.budget_of(esw_decode(released, params.num_levels, params.window)),
        d,
    )
    bits = multi_bit(x, (1 - params.esw_share) * eps, num_dims=m, generator=generator)
    return PPMReport(released, bits)


def level_posterior(released: Tensor, params: PPMParams) -> Tensor:
    r"""Posterior ``P(tau | tau')`` over the true levels given ESW outputs, float64 ``[n, h]``.

    Bayes' rule with the public level shares as prior and Eq. (6) as likelihood:
    :math:`P(\tau' | \tau) = p_\tau` inside the window of ``tau``, ``q_tau`` outside, with
    ``p_tau, q_tau`` at the ESW budget ``gamma * eps_tau``.
    """
    h = params.num_levels
    prior = torch.tensor(params.shares or [1.0 / h] * h, dtype=torch.float64)
    post = _esw_likelihood(released.cpu(), params) * prior.view(1, -1)
    return post / post.sum(1, keepdim=True)


def _esw_likelihood(released: Tensor, params: PPMParams) -> Tensor:
    """``P(released | tau)`` by Eq. (6), float64 ``[n, h]``: ``p_tau`` inside the window of
    ``tau``, ``q_tau`` outside, at the ESW budget ``gamma * eps_tau``."""
    from .esw import esw_probabilities

    h, b = params.num_levels, params.window
    taus = torch.arange(1, h + 1)
    p, q = esw_probabilities(
        params.esw_share * torch.tensor(params.budgets, dtype=torch.float64), h, b
    )
    inside = (released.view(-1, 1) - (taus.view(1, -1) + b)).abs() <= b  # [n, h]
    return torch.where(inside, p.view(1, -1), q.view(1, -1))


def decoded_level_posterior(params: PPMParams) -> Tensor:
    r"""``P(tau | tau_hat)``, float64 ``[h, h]`` (row: the decoded level ``tau_hat``, column: the
    true level ``tau``), marginalising the ESW output over the releases that decode to
    ``tau_hat`` (:func:`~fedgraph.mechanisms.esw.esw_decode`); public level shares as prior.
    With one level: ``[[1.]]``."""
    h, b = params.num_levels, params.window
    if h == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    released = torch.arange(1, h + 2 * b + 1)
    like = _esw_likelihood(released, params)  # [R, h]
    decoded = esw_decode(released, h, b)  # [R]
    given = torch.zeros(h, h, dtype=torch.float64).index_add_(
        0, decoded - 1, like
    )  # P(tau_hat|tau)
    prior = torch.tensor(params.shares or [1.0 / h] * h, dtype=torch.float64)
    post = given * prior.view(1, -1)
    return post / post.sum(1, keepdim=True).clamp_min(1e-300)


def posterior_inverse_variance(level_hat: Tensor, params: PPMParams, num_features: int) -> Tensor:
    r"""FlexProp source weights ``w_j`` = the inverse of the expected variance of user ``j``'s
    estimate given its decoded level: :math:`(m/d)\, E[\tanh(\epsilon'_\tau / 2m) \mid
    \hat\tau_j]^2` (multi-bit variance :math:`(d/m) / c^2` up to the :math:`x^2` term,
    :math:`c` averaged over :func:`decoded_level_posterior`). When ESW tells little (small
    ``gamma``), the weights are nearly uniform instead of trusting a noisy level as
    Eq. (12)'s ``w_j = tau'_j`` does. float64 ``[n]``.
    """
    post = decoded_level_posterior(params)  # [h_hat, h]
    eps_feat = (1 - params.esw_share) * torch.tensor(params.budgets, dtype=torch.float64)
    m_hat = mlr_num_dims(eps_feat, num_features).double()  # m of each decoded level
    c = torch.tanh(eps_feat.view(1, -1) / (2.0 * m_hat.view(-1, 1)))  # [h_hat, h]
    w = (m_hat / num_features) * (post * c).sum(1) ** 2  # [h_hat]
    return w[level_hat.cpu() - 1].to(level_hat.device)


def ppm_estimate(
    report: PPMReport, num_features: int, params: PPMParams, rescale: str = "released"
) -> tuple[Tensor, Tensor]:
    r"""Server side of PPM: rescale each user's signs into a feature estimate.

    Args:
        rescale: ``"released"``: with the budget of the decoded released level (unbiased for
            users whose release decodes to their true level, biased for the others);
            ``"posterior"``: with :math:`A = (d/m') / \sum_\tau P(\tau|\tau')
            \tanh(\epsilon'_\tau / 2m')` (:func:`level_posterior`), which makes the estimate
            unbiased given the release, averaged over the public level distribution.

    Returns:
        ``(x_hat, level_hat)``: float32 ``[n, d]`` feature estimates and long ``[n]`` decoded
        levels in ``{1..h}`` (:func:`~fedgraph.mechanisms.esw.esw_decode`).

    Raises:
        ValueError: unknown ``rescale``.
    """
    n = report.released_level.numel()
    level_hat = esw_decode(report.released_level, params.num_levels, params.window)
    eps_feat = (1 - params.esw_share) * params.budget_of(level_hat)
    m = mlr_num_dims(eps_feat, num_features)
    if rescale == "released" or params.num_levels == 1:
        return multi_bit_estimate(report.bits, n, num_features, eps_feat, m), level_hat
    if rescale != "posterior":
        raise ValueError(f"rescale must be 'released' or 'posterior', got {rescale!r}")
    post = level_posterior(report.released_level, params)  # [n, h]
    eps_all = (1 - params.esw_share) * torch.tensor(params.budgets, dtype=torch.float64)
    mean_tanh = (post * torch.tanh(eps_all.view(1, -1) / (2.0 * m.cpu().view(-1, 1)))).sum(1)
    scale = (num_features / m.cpu().double()) / mean_tanh
    return scatter_bits(report.bits, n, num_features, scale.to(report.bits.row.device)), level_hat


# --- what the whole report reveals about the level ----------------------------------------------

#: neighbouring relations of :func:`level_leakage`: the level changes and the features stay
#: (``"level"``), or the level and the features both change (``"level+features"``).
LEVEL_RELATIONS = ("level", "level+features")


def level_leakage(
    params: PPMParams, num_features: int | None = None, relation: str = "level"
) -> Tensor:
    r"""Exact worst-case log ratio between the distributions of one user's PPM report at two
    levels, float64 ``[h, h]`` (nats; entry ``[tau-1, tau'-1]``, symmetric).

    .. math::
        L(\tau, \tau') = \max_{r,\, x,\, x'} \bigl|\log P(r \mid x, \tau)
                                                 - \log P(r \mid x', \tau')\bigr|

    over every value ``r`` the report can take (released level ``g'``, the ordered sampled
    indices, their signs) and every features ``x, x'`` in ``[-1, 1]^d``, with ``x' = x`` for
    ``relation = "level"`` (what the report tells about the level of a user whose features are
    whatever they are) and ``x, x'`` free for ``"level+features"`` (the user's whole input
    changes; its diagonal is the features' epsilon ``(1 - gamma) eps_tau``).

    The report's likelihood factorizes (PPGNN paper Alg. 3; :func:`ppm`):
    :math:`P(r \mid x, \tau) = P_{ESW}(g' \mid \tau)\, P(S \mid m)\,
    \prod_{j \in S} P(s_j \mid x_j, \epsilon'_\tau / m)` with ``m = m'(g')`` (Theorem 1 at the
    released level's budget, so the length of the report is a function of ``g'``), ``S`` the
    ``m`` indices drawn uniformly (independent of ``tau``: it cancels), ESW by Eq. (6) and each
    sign by Eq. (4) at ``eps'_tau / m`` with ``eps'_tau = (1 - gamma) eps_tau``. A sign's log
    ratio is monotone in ``x_j``, so the worst features are the ends ``x_j = +-1`` (the images
    of the public feature domain's ends under :func:`~fedgraph.mechanisms.to_unit_range`: the
    domain does not change the result), and all ``m`` signs can push the ratio the same way:
    :math:`L = \max_{g'} \max(|\Delta_{ESW}(g') + m\, u_{hi}|,\ |\Delta_{ESW}(g') + m\, u_{lo}|)`
    with ``u_hi, u_lo`` the largest and smallest log ratio of one sign.

    ESW alone gives ``Delta_ESW`` only (0.297 for ``E = {1, 2, 4}``, ``gamma = 0.1``, levels
    1 and 3); the signs add up to ``|eps'_tau - eps'_tau'|`` on top (their probabilities
    depend on the user's own budget), e.g. 2.683 in total for that pair.

    Args:
        params: the public PPM parameters.
        num_features: ``d``; ``None``: the maximum over every ``d >= 1`` (the bound that holds
            whatever the dataset; equal to the exact value for every
            ``d >= floor((1 - gamma) max(E) / 2.2)``, where ``m'`` no longer depends on ``d``).
        relation: one of :data:`LEVEL_RELATIONS`.

    Returns:
        float64 ``[h, h]``. With a single level ``[[0.]]`` for ``"level"`` (the level is public,
        there is no other level) and ``[[(1 - gamma) eps_1]]`` for ``"level+features"``.

    Raises:
        ValueError: ``relation`` not in :data:`LEVEL_RELATIONS`, ``num_features < 1``, or
            ``num_features=None`` with a budget so large that the scan over ``d`` would exceed
            10,000 values.
    """
    if relation not in LEVEL_RELATIONS:
        raise ValueError(f"relation must be one of {LEVEL_RELATIONS}, got {relation!r}")
    if num_features is None:
        eps_feat = (1 - params.esw_share) * max(params.budgets)
        top = int(mlr_num_dims(eps_feat, 1 << 30))  # m' without the cap d
        if top > PPM_LEVEL_SCAN_MAX:
            limit = ppm_level_scan_limit(params.esw_share)  # floor(eps_feat / 2.2) <= max
            raise ValueError(
                f"budgets: {max(params.budgets):g} is too large for PPM's level "
                f"analysis over every feature count (MLR would sample up to {top} "
                f"dimensions; allowed: budgets below {limit:g}; from Python, "
                "passing the dataset's num_features lifts the limit)"
            )
        return torch.stack([level_leakage(params, d, relation) for d in range(1, top + 1)]).amax(0)
    if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
        raise ValueError(f"num_features must be an integer >= 1, got {num_features!r}")
    h, b = params.num_levels, params.window
    eps_feat = (1 - params.esw_share) * torch.tensor(params.budgets, dtype=torch.float64)  # [h]
    if h == 1:
        return (
            torch.zeros(1, 1, dtype=torch.float64) if relation == "level" else eps_feat.view(1, 1)
        )
    released = torch.arange(1, h + 2 * b + 1)  # [R], every ESW output
    log_esw = _esw_likelihood(released, params).log()  # [R, h]
    m = mlr_num_dims(eps_feat[esw_decode(released, h, b) - 1], num_features).double()  # [R]
    per_sign = eps_feat.view(1, -1) / m.view(-1, 1)  # [R, h]: budget of one sign at each level
    agree = -torch.nn.functional.softplus(-per_sign)  # log P(s = sign(x) | x = +-1)
    disagree = -torch.nn.functional.softplus(per_sign)  # log P(s = -sign(x) | x = +-1)
    # [R, tau, tau', 2]: one sign's log ratio at the worst ends x_j = +-1 (and x'_j = +-1)
    if relation == "level":
        u = torch.stack(
            [
                agree.unsqueeze(2) - agree.unsqueeze(1),
                disagree.unsqueeze(2) - disagree.unsqueeze(1),
            ],
            -1,
        )
    else:
        u = torch.stack(
            [
                agree.unsqueeze(2) - disagree.unsqueeze(1),
                disagree.unsqueeze(2) - agree.unsqueeze(1),
                agree.unsqueeze(2) - agree.unsqueeze(1),
                disagree.unsqueeze(2) - disagree.unsqueeze(1),
            ],
            -1,
        )
    d_esw = (log_esw.unsqueeze(2) - log_esw.unsqueeze(1)).unsqueeze(-1)  # [R, h, h, 1]
    total = d_esw + m.view(-1, 1, 1, 1) * torch.stack([u.amax(-1), u.amin(-1)], -1)
    return total.abs().amax(-1).amax(0)


def level_epsilon(
    params: PPMParams, num_features: int | None = None, relation: str = "level"
) -> Tensor:
    r"""Level-inference epsilon of a user at each level, float64 ``[h]`` (nats, whole report).

    Entry ``tau - 1`` is :math:`\max_{\tau' \ne \tau} L(\tau, \tau')` of :func:`level_leakage`:
    for any prior on the level and on the features that does not depend on the level, the
    server's posterior odds of ``tau`` against any other level move by at most
    ``e^epsilon`` after seeing the report. With ``relation = "level+features"`` the maximum
    also runs over ``tau' = tau`` (the features alone change), so it bounds what the report
    tells about the user's whole input (level and features, e.g. features correlated with the
    level). With one level: ``[0.]`` (``"level"``; the level is public).
    """
    leak = level_leakage(params, num_features, relation)
    if relation == "level" and params.num_levels > 1:
        leak = leak.masked_fill(torch.eye(params.num_levels, dtype=torch.bool), 0.0)
    return leak.amax(1)
