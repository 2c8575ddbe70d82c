r"""Datasets, splits, client partitions and privacy levels."""
from .datasets import (DATASETS, KNOWN_DATASETS, check_graph, dataset_spec,
                       dataset_statistics, known_datasets, load_dataset,
                       load_facebook100, one_hot_attributes, read_graph_files,
                       register_dataset, resolve_root, user_cache_dir)
from .levels import (assign_privacy_levels, check_budgets, geometric_budgets,
                     level_budgets)
from .partition import (PARTITIONERS, ClientGraph, build_client_graphs,
                        fix_empty_clients, partition, register_partitioner)
from .splits import (SPLITS, apply_split, gap_split, planetoid_split,
                     ppgnn_split, random_split)

__all__ = [
    'DATASETS', 'KNOWN_DATASETS', 'check_graph', 'dataset_spec', 'known_datasets',
    'read_graph_files', 'register_dataset', 'load_dataset', 'load_facebook100', 'dataset_statistics',
    'one_hot_attributes', 'resolve_root', 'user_cache_dir',
    'SPLITS', 'random_split', 'ppgnn_split', 'gap_split', 'planetoid_split',
    'apply_split',
    'PARTITIONERS', 'ClientGraph', 'partition', 'register_partitioner',
    'build_client_graphs', 'fix_empty_clients',
    'assign_privacy_levels', 'geometric_budgets', 'level_budgets',
    'check_budgets',
]
