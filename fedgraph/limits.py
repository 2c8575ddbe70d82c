"""Numeric limits of the mechanisms that the run config checks before anything runs (no torch:
``fedgraph run`` refuses a config in a fraction of a second). The mechanisms
(:mod:`fedgraph.mechanisms.ppm`, :mod:`fedgraph.mechanisms.esw`) and the config
(:mod:`fedgraph.config`) both read them from here."""

from __future__ import annotations

#: the largest ESW epsilon (gamma x budget) accepted: ESW's probabilities use exp(epsilon),
#: which overflows float64 above 709.78 (fedgraph.mechanisms.esw.esw_probabilities)
ESW_MAX_EPSILON = 700.0
#: the smallest feature epsilon accepted (PPGNN's ``budgets`` and ``epsilon``): the unbiased
#: estimates of PPM/MLR and the 1-bit mechanism grow as about ``2 d / epsilon`` per feature
#: (``d`` features), and below this their squares summed over a row overflow float32 in the
#: server's training for graphs with up to ~1e10 features (1e-30 on Cora trained on inf and
#: reported majority-class accuracy as a result; 1e-300 gave a non-finite estimate). At such
#: budgets the features carry no signal anyway.
MIN_FEATURE_EPSILON = 1e-6
#: the most clients a run config accepts (``num-clients``)
MAX_CLIENTS = 100_000
#: PPM's level analysis over every feature count scans at most this many feature counts
PPM_LEVEL_SCAN_MAX = 10_000


def ppm_level_scan_limit(esw_share: float) -> float:
    """The smallest budget for which PPM's MLR would sample more than
    :data:`PPM_LEVEL_SCAN_MAX` dimensions after the level's share ``esw_share``
    (``floor((1 - esw_share) * eps / 2.2) > PPM_LEVEL_SCAN_MAX``, PPGNN Theorem 1's sample
    size): :func:`fedgraph.mechanisms.ppm.level_leakage` over every ``d`` refuses from
    there."""
    return (PPM_LEVEL_SCAN_MAX + 1) * 2.2 / (1 - esw_share)
