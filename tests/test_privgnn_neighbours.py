"""PrivGNN's ``num-neighbours`` (K) against the expected Poisson sample (issue 15, item 2):
before, ``kk = min(K, sample size)`` silently trained every teacher on its whole subsample
whenever K exceeded gamma * n (every shipped 5-client Cora configuration)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.methods import privgnn as pg

REPO = Path(__file__).resolve().parents[1]


def _graph(n: int) -> Data:
    g = torch.Generator().manual_seed(0)
    src = torch.arange(n - 1)
    return Data(
        x=torch.rand(n, 4, generator=g),
        y=torch.arange(n) % 2,
        edge_index=torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])]),
        num_nodes=n,
    )


def test_largest_valid_k_is_floor_gamma_n():
    assert pg.max_neighbours(258, 0.3) == 77
    assert pg.max_neighbours(100, 0.3) == 30  # 0.3 * 100 is 30.000000000000004 or 29.99...
    assert pg.check_neighbours(77, 258, 0.3) == 77
    with pytest.raises(ValueError, match=r"num-neighbours .*= 78 .*num-neighbours <= 77"):
        pg.check_neighbours(78, 258, 0.3)
    with pytest.raises(ValueError, match=r"num-neighbours \(K\) must be >= 1"):
        pg.check_neighbours(0, 258, 0.3)


def test_teachers_refuse_k_above_the_expected_sample():
    """A client with 40 nodes at gamma 0.3 expects 12 sampled nodes: K = 13 is refused, naming
    the key and 12; K = 12 answers."""
    g = _graph(40)
    kw = dict(
        rate=0.3,
        num_classes=2,
        teacher=pg.TeacherConfig(hidden=4, epochs=1),
        generator=torch.Generator().manual_seed(1),
    )
    with pytest.raises(ValueError, match=r"num-neighbours.*num-neighbours <= 12"):
        pg.teacher_posteriors(g, g.x[:3], k=13, **kw)
    timing = pg.TeacherTiming()
    out = pg.teacher_posteriors(g, g.x[:3], k=12, timing=timing, **kw)
    assert out.shape == (3, 2)
    assert 0 <= timing.short_samples <= 3  # Poisson fluctuations below K are counted


def _preset(name: str) -> dict:
    return tomllib.loads((REPO / "simulations" / "presets" / f"{name}.toml").read_text())


def test_preflight_names_num_neighbours_and_the_largest_value(tmp_path):
    from fedgraph.federation import preflight

    cfg = parse_run_config(
        {**_preset("privgnn-cora"), "num-neighbours": 100, "output-dir": str(tmp_path)}
    )
    with pytest.raises(
        ConfigError,
        match=r"num-neighbours \(K\) = 100 .*client \d .*"
        r"num-neighbours <= 77",
    ):
        preflight(cfg)


def test_shipped_cora_preset_fits_every_client(tmp_path):
    from fedgraph.methods.privgnn import check_config_neighbours

    cfg = parse_run_config({**_preset("privgnn-cora"), "output-dir": str(tmp_path)})
    check_config_neighbours(cfg)  # raises if K exceeds a client's expected sample


def test_preflight_names_num_teachers_above_a_clients_labelled_nodes(tmp_path):
    """Ensemble mode: one disjoint group per teacher, so at most n_c teachers; refused before
    any client starts (was: every client failed, exit 1)."""
    from fedgraph.federation import preflight

    base = {**_preset("privgnn-cora"), "answer-mode": "ensemble", "output-dir": str(tmp_path)}
    with pytest.raises(
        ConfigError,
        match=r"num-teachers = 100000 .*client \d .*"
        r"1 <= num-teachers <= 258",
    ):
        preflight(parse_run_config({**base, "num-teachers": 100000}))
    preflight(parse_run_config({**base, "num-teachers": 258}))


def test_preflight_names_num_queries_above_the_public_query_pool(tmp_path):
    """num-queries = 5000 on Cora was silently capped at the 677-node query pool (the
    report's config said 5000); now refused before any client starts."""
    from fedgraph.federation import preflight

    base = {**_preset("privgnn-cora"), "output-dir": str(tmp_path)}
    with pytest.raises(
        ConfigError,
        match=r"num-queries = 5000 exceeds the public query pool "
        r"\(677 .*1 <= num-queries <= 677",
    ):
        preflight(parse_run_config({**base, "num-queries": 5000}))
    preflight(parse_run_config({**base, "num-queries": 677}))
