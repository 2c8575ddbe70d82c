"""Validated run configuration (pydantic), one model per method, shared pieces reused.

Flower's run config is flat (``key = value`` with ``-`` in keys); :func:`parse_run_config`
maps it onto these models and turns validation errors into :class:`ConfigError` messages that
name the key and the allowed values.

Modules: :mod:`.base` (the common :class:`DataConfig` and the shared parsers and validators),
:mod:`.ppgnn`, :mod:`.gap`, :mod:`.privgnn`, :mod:`.progap` (each method's model), :mod:`.parse` (the method ->
model registry, :func:`parse_run_config`, keys of other methods), :mod:`.checks` (output folder,
data root and dataset files). Importing this package imports neither torch nor Flower
(``fedgraph run`` validates a config in well under a second: ``tests/test_fast_config.py``).
"""

from ..errors import ConfigError
from ..limits import ESW_MAX_EPSILON, PPM_LEVEL_SCAN_MAX, ppm_level_scan_limit
from .base import DataConfig
from .checks import check_data_root, check_dataset_files, check_output_dir
from .gap import SCHEDULE_DEFAULTS, GAPConfig
from .parse import (
    IGNORED_WITH,
    METHOD_CONFIGS,
    METHOD_DEPENDENT,
    keys_of_other_methods,
    method_of,
    parse_run_config,
    reject_keys_of_other_methods,
)
from .ppgnn import PPGNNConfig
from .privgnn import PrivGNNConfig
from .progap import ProGAPConfig

__all__ = [
    "ConfigError",
    "DataConfig",
    "ESW_MAX_EPSILON",
    "GAPConfig",
    "IGNORED_WITH",
    "METHOD_CONFIGS",
    "METHOD_DEPENDENT",
    "PPGNNConfig",
    "PPM_LEVEL_SCAN_MAX",
    "PrivGNNConfig",
    "ProGAPConfig",
    "SCHEDULE_DEFAULTS",
    "check_data_root",
    "check_dataset_files",
    "check_output_dir",
    "keys_of_other_methods",
    "method_of",
    "parse_run_config",
    "ppm_level_scan_limit",
    "reject_keys_of_other_methods",
]
