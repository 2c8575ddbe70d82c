"""PPGNN's privacy plan (He et al., "Towards Personalized Differentially Private Learning for
Decentralized Local Graphs", IEEE TKDE, arXiv 2607.04777): the configured feature mechanism
(PPM = MLR, Alg. 2, + ESW, Eq. 6, with the budget split gamma of Alg. 3, by default) and the
ledger entries of what each user at each privacy level releases, next to the mechanism's
parameters they describe.
"""

from __future__ import annotations

from ...accounting import ApproxDP, PrivacyLedger, PureDP
from ...config import PPGNNConfig
from ...mechanisms import FeatureMechanism, make_mechanism


def build_mechanism(cfg: PPGNNConfig) -> FeatureMechanism:
    """The configured feature mechanism (``cfg.mechanism``) with each level's features'
    budget (``cfg.feature_budgets``: ``budgets`` less ``label_epsilon``)."""
    return make_mechanism(
        cfg.mechanism,
        budgets=cfg.feature_budgets,
        gamma=cfg.gamma,
        shares=cfg.shares,
        rescale=cfg.rescale,
        epsilon=cfg.epsilon,
        delta=cfg.delta,
    )


def level_subject(level: int) -> str:
    """Ledger subject of what the reports reveal about the level of a user at ``level``."""
    return f"level-{level} (level)"


#: release name of the level-inference entries (:func:`record_privacy`)
LEVEL_RELEASE = "whole report: level inference, features fixed"


def set_budgets(ledger: PrivacyLedger, cfg: PPGNNConfig) -> None:
    """Each level's epsilon target (``cfg.budgets``, epsilon per user at that level for the
    whole run) as the budget of its subject ``level-<tau>``, and the smallest as that of
    ``every-user`` (:func:`record_privacy`'s one subject when every user gets the same
    guarantee: within budget only if within the smallest level's). The report then marks a
    subject above its budget ``OVER BUDGET``."""
    for level, budget in enumerate(cfg.budgets, start=1):
        ledger.set_budget(f"level-{level}", budget)
    ledger.set_budget("every-user", min(cfg.budgets))


def reply_events(cfg: PPGNNConfig, mech: FeatureMechanism) -> list[tuple[str, str, object]]:
    """``(subject, release, event)`` triples of the users' reports (``query.ppgnn``), the one
    definition both ledgers use: the server's (:func:`record_privacy`) and each client's own
    (:class:`fedgraph.client_authority.ClientAuthority`, before its report leaves). Each user
    at level ``tau`` releases its features once through the mechanism's parts (PPGNN paper
    Sec. 4, PPM = MLR + ESW: ``mech.privacy_spent(tau)``) and, with ``label_epsilon > 0``,
    its label by randomized response; subject ``level-<tau>``, or ``every-user`` when the
    mechanism gives every level the same (LPGNN, the uniform baselines)."""
    levels = range(1, len(cfg.budgets) + 1)
    spent = {level: mech.privacy_spent(level) for level in levels}
    uniform = len(levels) > 1 and all(spent[level] == spent[1] for level in levels)
    out = []
    for level in [1] if uniform else levels:
        # A mechanism that ignores the levels (LPGNN, the uniform baselines) gives every user
        # the same guarantee: one subject, not one row per level with the same epsilon.
        subject = "every-user" if uniform else f"level-{level}"
        for release, eps in spent[level].items():
            event = ApproxDP(eps, mech.delta()) if mech.delta() > 0 else PureDP(eps)
            out.append((subject, release, event))
        if cfg.label_epsilon > 0:
            out.append((subject, "labels (randomized response)", PureDP(cfg.label_epsilon)))
    return out


def record_privacy(
    ledger: PrivacyLedger, cfg: PPGNNConfig, mech: FeatureMechanism, num_features: int | None = None
) -> None:
    """Record in ``ledger`` what each user at each level releases (subject ``level-<tau>``;
    ``every-user`` when the mechanism declares the same for every level).

    Every user releases once: the mechanism's parts (e.g. ESW and MLR) and, with
    ``label_epsilon > 0``, its label through randomized response. Without randomized response
    the labels of training/validation users are given to the server in the clear (the paper's
    setting) and the report says so.

    The unit of ``level-<tau>`` is the user's features (with its level fixed). A mechanism that
    hides the level (``hides_level``, PPM) also gets, with several levels, a subject
    :func:`level_subject` per level whose unit is the user's level: the epsilon of the whole
    report against every other level, features fixed
    (:meth:`~fedgraph.mechanisms.FeatureMechanism.level_epsilon`; for PPM 2.68 at level 1 of
    ``E = {1, 2, 4}``, ``gamma = 0.1``, not the ``gamma * eps_tau`` of ESW alone), for
    ``num_features`` features (``None``: the bound for every ``d``).
    """
    for subject, release, event in reply_events(cfg, mech):
        ledger.record(subject, release, event)
    levels = range(1, len(cfg.budgets) + 1)
    if mech.hides_level and len(levels) > 1:
        for level in levels:
            ledger.record(
                level_subject(level), LEVEL_RELEASE, PureDP(mech.level_epsilon(level, num_features))
            )


__all__ = ["build_mechanism", "level_subject", "LEVEL_RELEASE", "record_privacy", "reply_events"]
