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
    return parse_run_config({"method": method, "dataset": "cora", "level": level,
                             "num-clients": 2, **extra})


def test_gap_edge_floor_is_k_gaussians_at_the_largest_noise_multiplier():
    cfg = _cfg("gap")
    # independent: K Gaussian mechanisms of noise multiplier 1000, composed by the accountant
    expected = compose_epsilon(gap_privacy.gap_events(MAX_NOISE_MULTIPLIER, cfg.hops),
                               cfg.delta, cfg.accountant)
    assert gap_privacy.epsilon_floor(cfg, 100) == pytest.approx(expected, rel=1e-9)
    assert 0 < expected < 0.1


def test_gap_node_floor_depends_on_the_training_nodes_and_counts_dp_sgd():
    cfg = _cfg("gap", "node")
    few, many = gap_privacy.epsilon_floor(cfg, 50), gap_privacy.epsilon_floor(cfg, 5000)
    enc = dpsgd_schedule(50, cfg.dpsgd_batch_size, cfg.encoder_rounds * cfg.local_epochs)
    cls = dpsgd_schedule(50, cfg.dpsgd_batch_size, cfg.classifier_rounds * cfg.local_epochs)
    z = MAX_NOISE_MULTIPLIER
    events = gap_privacy.gap_events(z, cfg.hops, node_level=True,
                                    encoder_dpsgd=(enc[0], z, enc[1]),
                                    classifier_dpsgd=(cls[0], z, cls[1]))
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
    expected = compose_epsilon(progap_privacy.progap_events(MAX_NOISE_MULTIPLIER, cfg.depth),
                               cfg.delta, cfg.accountant)
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


@pytest.mark.parametrize("eps", ["8", "inf", "8,inf"])
def test_reachable_targets_pass(eps):
    from fedgraph.federation import check_epsilons_reachable

    check_epsilons_reachable(_cfg("gap", **{"client-epsilons": eps}))
    assert math.isfinite(gap_privacy.epsilon_floor(_cfg("gap"), 10))
