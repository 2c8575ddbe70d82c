"""A feature mechanism never spends more than a level's budget on a user's features: the run is
refused before any data is perturbed (fedgraph.federation.check_feature_budgets)."""
from __future__ import annotations

import pytest

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.federation import check_feature_budgets
from fedgraph.mechanisms import FeatureMechanism
from fedgraph.methods.ppgnn import build_mechanism


def _cfg(**kw):
    return parse_run_config({"method": "ppgnn", "dataset": "cora", "num-clients": 2, **kw})


@pytest.mark.parametrize("mechanism", ["multi-bit", "one-bit", "laplace", "gaussian"])
def test_uniform_epsilon_above_the_smallest_budget_is_refused(mechanism):
    with pytest.raises(ConfigError, match=r"epsilon: 2 is above the smallest level's budget 1 "
                                          r".*allowed: \(0, 1\].*budgets = \"2\""):
        _cfg(mechanism=mechanism, epsilon=2.0, budgets="1,2,4")


@pytest.mark.parametrize("kw", [dict(mechanism="multi-bit", epsilon=1.0, budgets="1,2,4"),
                                dict(mechanism="multi-bit", budgets="1,2,4"),  # the smallest
                                dict(mechanism="multi-bit", epsilon=4.0, budgets="4"),
                                dict(mechanism="ppm", budgets="1,2,4"),
                                dict(mechanism="ppm", budgets="0.5,1,2,3", gamma=0.3)])
def test_spends_within_every_budget_pass(kw):
    cfg = _cfg(**kw)
    check_feature_budgets(cfg, build_mechanism(cfg))


class _Greedy(FeatureMechanism):
    """Declares 1.5 x each level's budget (a custom mechanism's bug)."""
    name = "greedy"

    def __init__(self, budgets, **_):
        self.budgets = list(budgets)

    def privacy_spent(self, level):
        return {"features": 1.5 * self.budgets[level - 1]}

    def perturb(self, x, levels, generator=None):
        raise AssertionError("never reached")

    def estimate(self, report, num_features, num_users):
        raise AssertionError("never reached")


def test_a_custom_mechanism_that_overspends_is_refused():
    cfg = _cfg(budgets="1,2")
    with pytest.raises(ConfigError, match=r"mechanism: 'ppm' spends epsilon 1.5 on a level-1 "
                                          r"user's features, above that level's budget 1"):
        check_feature_budgets(cfg, _Greedy([1.0, 2.0]))


def test_epsilon_with_ppm_is_refused_not_ignored():
    """PPM spends each level's budget; a uniform epsilon beside it would be silently ignored
    (and shown in the report's config): refused, naming what to set instead."""
    with pytest.raises(ConfigError, match=r"epsilon: has no effect with mechanism 'ppm'.*"
                                          r"budgets = \"0.5\""):
        _cfg(mechanism="ppm", epsilon=0.5)
    assert _cfg(mechanism="ppm", epsilon="").epsilon is None  # flwr run's "" is unset
