"""ProGAP (Sajadmanesh and Gatica-Perez, WSDM 2024): progressive private GNN training.

Modules: :mod:`.model` (the stage submodels with jumping knowledge), :mod:`.privacy`
(sensitivity, calibration per client, ledger events), :mod:`.reference` (the centralized
algorithm), :mod:`.client` (a federated client's steps, without Flower).
"""

from .model import JK_MODES, ProgressiveModel, StageMLP, stage_input
from .privacy import (
    PrivacyPlan,
    aggregation_sensitivity,
    calibrate_progap,
    plan_events,
    privacy_plan,
    progap_events,
    remote_noise,
)
from .reference import LEVEL_DEFAULTS, noisy_aggregation, run_progap

__all__ = [
    "JK_MODES",
    "ProgressiveModel",
    "StageMLP",
    "stage_input",
    "PrivacyPlan",
    "aggregation_sensitivity",
    "calibrate_progap",
    "plan_events",
    "privacy_plan",
    "progap_events",
    "remote_noise",
    "LEVEL_DEFAULTS",
    "noisy_aggregation",
    "run_progap",
]
