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
    with pytest.raises(
        ConfigError,
        match=r"epsilon: 2 is above the smallest level's budget 1 "
        r".*allowed: \(0, 1\].*budgets = \"2\"",
    ):
        _cfg(mechanism=mechanism, epsilon=2.0, budgets="1,2,4")


@pytest.mark.parametrize(
    "kw",
    [
        dict(mechanism="multi-bit", epsilon=1.0, budgets="1,2,4"),
        dict(mechanism="multi-bit", budgets="1,2,4"),  # the smallest
        dict(mechanism="multi-bit", epsilon=4.0, budgets="4"),
        dict(mechanism="ppm", budgets="1,2,4"),
        dict(mechanism="ppm", budgets="0.5,1,2,3", gamma=0.3),
    ],
)
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
    with pytest.raises(
        ConfigError,
        match=r"mechanism: 'ppm' spends epsilon 1.5 on a level-1 "
        r"user's features, above that level's budget 1",
    ):
        check_feature_budgets(cfg, _Greedy([1.0, 2.0]))


def test_epsilon_with_ppm_is_refused_not_ignored():
    """PPM spends each level's budget; a uniform epsilon beside it would be silently ignored
    (and shown in the report's config): refused, naming what to set instead."""
    with pytest.raises(
        ConfigError,
        match=r"epsilon: has no effect with mechanism 'ppm'.*"
        r"budgets = \"0.5\"",
    ):
        _cfg(mechanism="ppm", epsilon=0.5)
    assert _cfg(mechanism="ppm", epsilon="").epsilon is None  # flwr run's "" is unset


def _label(**kw):
    return _cfg(**{"label-epsilon": 0.5, **kw})


def test_label_epsilon_comes_out_of_every_budget():
    """Randomized response on the labels is spent out of each level's budget: the feature
    mechanism is built with ``budgets - label-epsilon``, so features + label = the budget."""
    cfg = _label(budgets="1,2,4")
    assert cfg.feature_budgets == pytest.approx([0.5, 1.5, 3.5])
    mech = build_mechanism(cfg)
    for level, budget in enumerate(cfg.budgets, start=1):
        assert sum(mech.privacy_spent(level).values()) + cfg.label_epsilon == pytest.approx(budget)
    check_feature_budgets(cfg, mech)
    uniform = _label(mechanism="multi-bit", budgets="1,2,4")  # epsilon: the smallest's rest
    assert build_mechanism(uniform).privacy_spent(1) == {"multi-bit": pytest.approx(0.5)}


@pytest.mark.parametrize(
    "kw,message",
    [
        (
            {"label-epsilon": 1.0, "budgets": "1,2,4"},
            r"label-epsilon: 1.0 is spent out of every level's budget and leaves the smallest \(1\) "
            r"less than .* for the features \(allowed: \[0, 0\.99",
        ),
        (
            {"label-epsilon": 0.5, "mechanism": "multi-bit", "epsilon": 1.0, "budgets": "1,2,4"},
            r"epsilon: 1 on the features and label-epsilon 0\.5 on the labels exceed the smallest "
            r"level's budget 1 \(allowed: epsilon in \(0, 0\.5\]",
        ),
    ],
)
def test_label_epsilon_that_leaves_no_room_is_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(**kw)


class _Exact(_Greedy):
    """Declares each level's whole budget (built with ``budgets``, not the features' share)."""

    def privacy_spent(self, level):
        return {"features": self.budgets[level - 1]}


def test_a_mechanism_that_leaves_no_room_for_the_labels_is_refused():
    cfg = _label(budgets="1,2")
    check_feature_budgets(cfg, _Exact(cfg.feature_budgets))
    with pytest.raises(
        ConfigError,
        match=r"spends epsilon 1 on a level-1 user's features and "
        r"0\.5 on its label \(label-epsilon\), above that "
        r"level's budget 1",
    ):
        check_feature_budgets(cfg, _Exact(cfg.budgets))
