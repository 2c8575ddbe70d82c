"""Write the example graph of ``graph/`` (run once; the files are committed).

A stochastic block model: 400 nodes in 4 classes (communities) of 100, edge probability 0.05
within a class and 0.004 across; 32 binary features, each class has 8 "topic" features set
with probability 0.3 (others 0.05). Node ids are shuffled so that classes are not contiguous.

    python examples/custom_dataset/make_graph.py
"""

from pathlib import Path

import numpy as np

rng = np.random.default_rng(7)
n, k, f = 400, 4, 32
y = rng.permutation(np.repeat(np.arange(k), n // k))
same = y[:, None] == y[None, :]
upper = np.triu(rng.random((n, n)) < np.where(same, 0.05, 0.004), k=1)
src, dst = np.nonzero(upper)
topic = (np.arange(f)[None, :] // (f // k)) == y[:, None]
x = (rng.random((n, f)) < np.where(topic, 0.3, 0.05)).astype(int)

out = Path(__file__).parent / "graph"
out.mkdir(exist_ok=True)
np.savetxt(
    out / "edges.csv",
    np.stack([src, dst], 1),
    fmt="%d",
    delimiter=",",
    header="source,target (0-based node ids; undirected, each edge once)",
)
np.savetxt(out / "features.csv", x, fmt="%d", delimiter=",", header="32 binary features per node")
np.savetxt(out / "labels.csv", y, fmt="%d", header="class id per node, in [0, 4)")
(out / "graph.toml").write_text(
    'name = "sbm-400"\nfeature_domain = [0, 1]  # binary features: public range\n'
)
print(f"{n} nodes, {len(src)} edges, {f} features, {k} classes -> {out}")
