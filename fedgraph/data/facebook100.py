"""Facebook100 college graphs (Traud et al., 2012) from their ``.mat`` files, for class-year
prediction (the "Facebook" task of GAP, Sajadmanesh et al., USENIX Security 2023):
:func:`load_facebook100` and its one-hot attribute encoding."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from ..dataset_files import find_facebook100  # noqa: F401 (re-exported)
from .normal_form import finalize

PathLike = str | Path

#: Columns of ``local_info`` in the Facebook100 ``.mat`` files.
FACEBOOK100_COLUMNS: tuple[str, ...] = (
    "status",
    "gender",
    "major",
    "second_major",
    "dorm",
    "year",
    "high_school",
)
_FB100_YEAR = 5
#: The feature columns of :func:`load_facebook100` by default: those of the GAP reference
#: code (sisaman/GAP, ``core/datasets/facebook.py``: ``local_info[:, :-1]`` without the year),
#: i.e. every column but the year and the high school. The high school's one-hot block is
#: most of the features (2,304 of 2,903 columns on Wisconsin87, about 8 nodes per column) and
#: costs accuracy: GAP on Wisconsin87, one client, 5 seeds, 79.5 without noise without it,
#: 76.9 with it (issue 14; docs/results/accuracy.md, GAP).
FACEBOOK100_FEATURES: tuple[str, ...] = ("status", "gender", "major", "second_major", "dorm")


def one_hot_attributes(attributes: np.ndarray) -> Tensor:
    r"""One-hot encodes integer categorical attributes column by column.

    Each column gets one output column per distinct *non-zero* value, in
    increasing value order; the value 0 (missing) gets no column, so a node
    with a missing attribute has all zeros in that attribute's block.

    Args:
        attributes (np.ndarray): integer array of shape ``[N, A]``.

    Returns:
        Tensor: ``float32`` tensor of shape ``[N, sum_a #categories_a]``.
    """
    attributes = np.asarray(attributes)
    n = attributes.shape[0]
    blocks = []
    for col in range(attributes.shape[1]):
        values = attributes[:, col].astype(np.int64)
        cats = np.unique(values[values != 0])
        block = np.zeros((n, cats.size), dtype=np.float32)
        present = values != 0
        block[np.nonzero(present)[0], np.searchsorted(cats, values[present])] = 1.0
        blocks.append(block)
    if not blocks:
        return torch.zeros((n, 0), dtype=torch.float32)
    return torch.from_numpy(np.concatenate(blocks, axis=1))


def load_facebook100(
    path: PathLike, min_class_size: int = 1000, features: Sequence[str] = FACEBOOK100_FEATURES
) -> Data:
    r"""Loads a Facebook100 college graph for class-year prediction (the
    "Facebook" task of the GAP paper, Sajadmanesh et al., USENIX Sec. 2023).

    Nodes whose year is missing (0) are dropped, then all nodes of years with
    fewer than ``min_class_size`` remaining nodes, together with their edges.
    Years are relabelled ``0..C-1`` in increasing order (``data.class_years``
    keeps the years). Features are the one-hot encoding of the ``features``
    columns of ``local_info`` (default :data:`FACEBOOK100_FEATURES`: status,
    gender, major, second major, dorm, as GAP's reference code; the high school
    is left out) over the categories present among the kept nodes, with no
    column for missing values (see :func:`one_hot_attributes`).

    Args:
        path (str or Path): the ``<College>.mat`` file (keys ``A`` and
            ``local_info``).
        min_class_size (int, optional): smallest year class kept.
            (default: :obj:`1000`)
        features (sequence of str, optional): the ``local_info`` columns to
            encode, names of :data:`FACEBOOK100_COLUMNS` other than ``year``
            (e.g. ``FACEBOOK100_FEATURES + ('high_school',)``).

    Example::

        from fedgraph.data import FACEBOOK100_FEATURES, load_facebook100
        data = load_facebook100("data/facebook100/Wisconsin87.mat")  # 599 features
        wide = load_facebook100("data/facebook100/Wisconsin87.mat",
                                features=FACEBOOK100_FEATURES + ("high_school",))  # 2,903

    (``load_dataset("facebook100:Wisconsin87", root)`` finds the file under
    ``<root>/facebook100/`` and uses the default features.)

    Returns:
        Data: ``x [N', F]`` float32, ``y [N']`` long, undirected
        ``edge_index [2, E']`` without self loops, ``feature_domain=(0, 1)``.

    Raises:
        ValueError: if ``min_class_size < 1``, a ``features`` name is not a
            column other than the year (or none is given), or no class is left.
    """
    import scipy.io
    import scipy.sparse as sp

    if min_class_size < 1:
        raise ValueError(f"'min_class_size' must be >= 1 (got {min_class_size})")
    if isinstance(features, str):  # one column name, not its letters
        features = (features,)
    allowed = [c for c in FACEBOOK100_COLUMNS if c != "year"]
    bad = [f for f in features if f not in allowed]
    if bad or not features:
        raise ValueError(f"'features': {bad or 'none given'}; allowed: {', '.join(allowed)}")
    path = Path(path)
    mat = scipy.io.loadmat(str(path))
    adj = sp.csr_matrix(mat["A"])
    info = np.asarray(mat["local_info"]).astype(np.int64)

    years = info[:, _FB100_YEAR]
    uniq, counts = np.unique(years[years != 0], return_counts=True)
    kept_years = uniq[counts >= min_class_size]
    if kept_years.size == 0:
        raise ValueError(
            f"No class-year of '{path.name}' has at least min_class_size="
            f"{min_class_size} nodes (largest: {int(counts.max(initial=0))})"
        )
    keep = np.isin(years, kept_years)  # year 0 is never in kept_years
    idx = np.nonzero(keep)[0]

    sub = adj[idx][:, idx].tocoo()
    edge_index = torch.from_numpy(np.vstack([sub.row, sub.col]).astype(np.int64))
    y = torch.from_numpy(np.searchsorted(kept_years, years[idx]).astype(np.int64))
    columns = [FACEBOOK100_COLUMNS.index(f) for f in features]
    x = one_hot_attributes(info[idx][:, columns])

    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=idx.size)
    out = finalize(data, f"facebook100:{path.stem}", (0.0, 1.0))
    out.class_years = torch.from_numpy(kept_years.astype(np.int64))
    out.original_ids = torch.from_numpy(idx.astype(np.int64))
    return out
