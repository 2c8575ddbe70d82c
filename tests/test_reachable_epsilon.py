"""A GAP or ProGAP client's target epsilon below what its releases spend at the largest noise
multiplier its calibration searches is refused before any client starts (the preflight),
naming client-epsilons, the client and the smallest epsilon allowed; the floor is checked
against an independent composition and against the calibration itself."""

import math

import pytest

from fedgraph.accounting import MAX_NOISE_MULTIPLIER, UnreachableTarget, compose_epsilon
from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods.gap import privacy as gap_privacy
from fedgraph.methods.gap.training import dpsgd_schedule
from fedgraph.methods.progap import privacy as progap_privacy


def _cfg(method, level="edge", **extra):
    return parse_run_config(
        {"method": method, "dataset": "cora", "level": level, "num-clients": 2, **extra}
    )


def test_gap_edge_floor_is_k_gaussians_at_the_largest_noise_multiplier():
    cfg = _cfg("gap")
    # independent: K Gaussian mechanisms of noise multiplier 1000, composed by the accountant
    expected = compose_epsilon(
        gap_privacy.gap_events(MAX_NOISE_MULTIPLIER, cfg.hops), cfg.delta, cfg.accountant
    )
    assert gap_privacy.epsilon_floor(cfg, 100) == pytest.approx(expected, rel=1e-9)
    assert 0 < expected < 0.1


def test_gap_node_floor_depends_on_the_training_nodes_and_counts_dp_sgd():
    cfg = _cfg("gap", "node")
    few, many = gap_privacy.epsilon_floor(cfg, 50), gap_privacy.epsilon_floor(cfg, 5000)
    enc = dpsgd_schedule(50, cfg.dpsgd_batch_size, cfg.encoder_rounds * cfg.local_epochs)
    cls = dpsgd_schedule(50, cfg.dpsgd_batch_size, cfg.classifier_rounds * cfg.local_epochs)
    z = MAX_NOISE_MULTIPLIER
    events = gap_privacy.gap_events(
        z,
        cfg.hops,
        node_level=True,
        encoder_dpsgd=(enc[0], z, enc[1]),
        classifier_dpsgd=(cls[0], z, cls[1]),
    )
    assert few == pytest.approx(compose_epsilon(events, cfg.delta, cfg.accountant), rel=1e-9)
    assert few != many


def test_the_floor_is_where_calibration_stops_being_possible():
    cfg = _cfg("gap")
    floor = gap_privacy.epsilon_floor(cfg, 100)
    with pytest.raises(UnreachableTarget) as err:
        gap_privacy.privacy_plan(cfg, floor * 0.99, 100)
    assert err.value.epsilon == pytest.approx(floor, rel=1e-9)
    plan = gap_privacy.privacy_plan(cfg, floor * 1.01, 100)
    assert 0 < plan.noise_multiplier <= MAX_NOISE_MULTIPLIER


def test_progap_floor_matches_its_events_and_its_calibration():
    cfg = _cfg("progap")
    floor = progap_privacy.epsilon_floor(cfg, 100)
    expected = compose_epsilon(
        progap_privacy.progap_events(MAX_NOISE_MULTIPLIER, cfg.depth), cfg.delta, cfg.accountant
    )
    assert floor == pytest.approx(expected, rel=1e-9)
    with pytest.raises(UnreachableTarget):
        progap_privacy.privacy_plan(cfg, floor * 0.99, 100)
    assert progap_privacy.epsilon_floor(_cfg("progap", "node"), 100) > 0


def test_no_noise_has_no_floor():
    assert gap_privacy.epsilon_floor(_cfg("gap", variant="mlp"), 100) == 0.0


@pytest.mark.parametrize("method", ["gap", "progap"])
def test_the_preflight_refuses_an_unreachable_client_epsilon_by_name(method, tmp_path):
    from fedgraph.federation import preflight

    cfg = _cfg(method, **{"client-epsilons": "8,1e-9", "output-dir": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    msg = str(err.value)
    assert msg.startswith("client-epsilons: client 1's target epsilon 1e-09")
    floor = float(msg.split("allowed: epsilon >= ")[1].split()[0])
    assert 1e-9 < floor < 0.1
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "method, level, knobs",
    [
        ("gap", "edge", "or fewer hops"),
        ("gap", "node", "or fewer hops, encoder-rounds, classifier-rounds or local-epochs"),
        ("progap", "edge", "or a smaller depth"),
        ("progap", "node", "or a smaller depth, fewer epochs or local-epochs"),
    ],
)
def test_the_refusal_names_what_else_lowers_the_floor_in_the_methods_own_keys(method, level, knobs):
    from fedgraph.federation import check_epsilons_reachable

    with pytest.raises(ConfigError) as err:
        check_epsilons_reachable(_cfg(method, level, **{"client-epsilons": "1e-9"}))
    assert str(err.value).endswith(knobs)


@pytest.mark.parametrize("eps", ["8", "inf", "8,inf"])
def test_reachable_targets_pass(eps):
    from fedgraph.federation import check_epsilons_reachable

    check_epsilons_reachable(_cfg("gap", **{"client-epsilons": eps}))
    assert math.isfinite(gap_privacy.epsilon_floor(_cfg("gap"), 10))


# PrivGNN: a client answers only as many queries as its target affords; where no client can
# afford one, no query is labelled, so the preflight refuses before any teacher trains.


def _privgnn(**extra):
    return parse_run_config(
        {"method": "privgnn", "dataset": "cora", "num-clients": 2, "min-class-size": 1, **extra}
    )


def test_one_answer_costs_the_subsampled_laplace_bound():
    from fedgraph.methods.privgnn import privacy as privgnn_privacy

    cfg = _privgnn(lam=2.0, gamma=0.3, delta=1e-4)
    cost = privgnn_privacy.one_answer_epsilon(cfg)
    # independent: a lam-DP Laplace answer (L1 sensitivity 2, scale 2 / lam) under Poisson
    # subsampling at rate gamma is log(1 + gamma (e^lam - 1))-DP (pure; amplification by
    # subsampling); at delta > 0 the PLD epsilon may only be smaller
    bound = math.log1p(0.3 * math.expm1(2.0))
    assert 0.9 * bound < cost <= bound * (1 + 1e-3)


@pytest.mark.parametrize("sigma_threshold", [0.0, 8.0])
def test_one_histogram_costs_the_analytic_gaussian(sigma_threshold):
    from scipy.stats import norm

    from fedgraph.methods.privgnn import privacy as privgnn_privacy

    cfg = _privgnn(
        **{
            "answer-mode": "ensemble",
            "sigma-votes": 4.0,
            "sigma-threshold": sigma_threshold,
            "delta": 1e-5,
        }
    )
    cost = privgnn_privacy.one_answer_epsilon(cfg)
    # independent: Balle & Wang (2018) Thm. 8 for a Gaussian of L2 sensitivity sqrt 2 per
    # released copy: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    mu = math.sqrt(sum(2.0 / s**2 for s in (4.0, sigma_threshold) if s))
    delta = norm.cdf(-cost / mu + mu / 2) - math.exp(cost) * norm.cdf(-cost / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-3)


@pytest.mark.parametrize(
    "extra",
    [
        {"lam": 2.0},
        {"answer-mode": "vote", "lam": 0.5},
        {"answer-mode": "ensemble", "sigma-votes": 4.0},
    ],
)
def test_privgnn_is_refused_exactly_when_no_client_affords_an_answer(extra):
    from fedgraph.federation import check_epsilons_reachable
    from fedgraph.methods.privgnn import privacy as privgnn_privacy

    cost = privgnn_privacy.one_answer_epsilon(_privgnn(**extra))
    below, above = f"{cost * 0.99!r},{cost * 0.5!r}", f"{cost * 0.5!r},{cost * 1.01!r}"
    with pytest.raises(ConfigError) as err:
        check_epsilons_reachable(_privgnn(**extra, **{"client-epsilons": below}))
    msg = str(err.value)
    assert msg.startswith("client-epsilons: no client can answer a single query")
    assert float(msg.split("allowed: epsilon >= ")[1].split()[0]) == pytest.approx(cost, rel=1e-3)
    cfg = _privgnn(**extra, **{"client-epsilons": above})
    check_epsilons_reachable(cfg)
    assert [privgnn_privacy.client_limit(cfg, p, 1) for p in (0, 1)] == [0, 1]


def test_with_secure_aggregation_the_strictest_target_binds():
    from fedgraph.federation import check_epsilons_reachable

    ens = {"answer-mode": "ensemble", "sigma-votes": 4.0, "client-epsilons": "100,1e-6"}
    check_epsilons_reachable(_privgnn(**ens))  # client 0 answers alone
    with pytest.raises(ConfigError, match="the strictest target .* is epsilon 1e-06"):
        check_epsilons_reachable(_privgnn(**ens, **{"secure-aggregation": True}))


def test_the_preflight_refuses_privgnn_before_anything_is_written(tmp_path):
    from fedgraph.federation import preflight

    cfg = _privgnn(lam=2.0, **{"client-epsilons": "1e-6", "output-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="client-epsilons: no client can answer"):
        preflight(cfg)
    assert not list(tmp_path.iterdir())
