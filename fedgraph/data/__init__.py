r"""Datasets, splits, client partitions and privacy levels."""

# The dataset loaders (and with them PyG and torch._dynamo, about 2 s per process on 2 cores)
# are imported on first use (PEP 562): a client that only reads its part of the partition
# cache (a ClientGraph) does not need them. Splits, partitions and levels need only torch.
from .._lazy import lazy_attributes
from .levels import (
    assign_privacy_levels,
    check_budgets,
    draw_privacy_levels,
    geometric_budgets,
    level_budgets,
)
from .partition import (
    PARTITIONERS,
    ClientGraph,
    PartitionerError,
    build_client_graphs,
    fix_empty_clients,
    partition,
    register_partitioner,
)
from .splits import SPLITS, apply_split, gap_split, planetoid_split, ppgnn_split, random_split

_WHERE = {
    **dict.fromkeys(
        (
            "DATASETS",
            "KNOWN_DATASETS",
            "dataset_spec",
            "known_datasets",
            "load_dataset",
            "load_graph_locked",
            "register_dataset",
        ),
        "datasets",
    ),
    **dict.fromkeys(("check_graph", "dataset_statistics"), "normal_form"),
    **dict.fromkeys(
        ("load_facebook100", "FACEBOOK100_FEATURES", "one_hot_attributes"), "facebook100"
    ),
    "read_graph_files": "user_graphs",
    **dict.fromkeys(("resolve_root", "user_cache_dir"), "paths"),
}


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())


__all__ = [
    "DATASETS",
    "KNOWN_DATASETS",
    "PartitionerError",
    "check_graph",
    "dataset_spec",
    "known_datasets",
    "load_graph_locked",
    "read_graph_files",
    "register_dataset",
    "load_dataset",
    "load_facebook100",
    "FACEBOOK100_FEATURES",
    "dataset_statistics",
    "one_hot_attributes",
    "resolve_root",
    "user_cache_dir",
    "SPLITS",
    "random_split",
    "ppgnn_split",
    "gap_split",
    "planetoid_split",
    "apply_split",
    "PARTITIONERS",
    "ClientGraph",
    "partition",
    "register_partitioner",
    "build_client_graphs",
    "fix_empty_clients",
    "assign_privacy_levels",
    "draw_privacy_levels",
    "geometric_budgets",
    "level_budgets",
    "check_budgets",
]
