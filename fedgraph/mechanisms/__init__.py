"""LDP and central mechanisms on torch tensors (one formula per function, checked on entry)."""

from .additive import gaussian, gaussian_sigma, laplace, laplace_scale
from .bits import (
    SampledBits,
    local_randomizer,
    mlr_num_dims,
    multi_bit,
    multi_bit_estimate,
    multi_bit_variance,
    one_bit,
    unbias_factor,
)
from .domain import to_unit_range
from .esw import esw, esw_decode, esw_probabilities, esw_window
from .feature import (
    FEATURE_MECHANISMS,
    FeatureMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    MultiBitMechanism,
    OneBitMechanism,
    PPMMechanism,
    check_mechanism,
    check_privacy_declaration,
    make_mechanism,
    register_mechanism,
)
from .ppm import PPMParams, PPMReport, ppm, ppm_estimate
from .randomized_response import randomized_response
from .thresholds import (
    BINARY_EPSILON_MAX,
    binary_effective_epsilon,
    binary_thresholds,
    esw_effective_epsilon,
    esw_thresholds,
    randomized_response_effective_epsilon,
    randomized_response_range,
    randomized_response_thresholds,
)

__all__ = [
    "FEATURE_MECHANISMS",
    "FeatureMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "MultiBitMechanism",
    "OneBitMechanism",
    "PPMMechanism",
    "PPMParams",
    "PPMReport",
    "SampledBits",
    "check_mechanism",
    "check_privacy_declaration",
    "esw",
    "esw_decode",
    "esw_probabilities",
    "esw_window",
    "gaussian",
    "gaussian_sigma",
    "laplace",
    "laplace_scale",
    "local_randomizer",
    "make_mechanism",
    "mlr_num_dims",
    "multi_bit",
    "multi_bit_estimate",
    "multi_bit_variance",
    "one_bit",
    "ppm",
    "ppm_estimate",
    "randomized_response",
    "register_mechanism",
    "to_unit_range",
    "unbias_factor",
    "BINARY_EPSILON_MAX",
    "binary_effective_epsilon",
    "binary_thresholds",
    "esw_effective_epsilon",
    "esw_thresholds",
    "randomized_response_effective_epsilon",
    "randomized_response_range",
    "randomized_response_thresholds",
]
