"""Any Flower strategy drives GAP's training rounds and ProGAP's node-level stage rounds (issue
30): ``round-strategy`` and ``round-strategy-args``, made strict (strategies/fedavg.py), with
the privacy kept by the method: every training reply is in the ledger, a client trains only
the rounds its plan covers, FedProx's proximal term reads no example. The examples in
examples/round_strategies/ run from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedProx
from flwr.supercore.task_identity import TaskIdentity

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.errors import ClientFailure
from fedgraph.methods.gap.client import admit_round
from fedgraph.methods.gap.training import local_train
from fedgraph.simulations.local import LocalGrid, run_local
from fedgraph.simulations.run_files import load_run_config
from fedgraph.simulations.server_app import validate_run_config
from fedgraph.strategies.fedavg import round_strategy

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples" / "round_strategies"
#: the examples, shrunk: 4 clients, 2 + 3 rounds of 2 local epochs
SMALL = ["num-clients=4", "encoder-rounds=2", "classifier-rounds=3", "local-epochs=2"]


@pytest.fixture
def identity(monkeypatch):
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


class _Grid:
    def __init__(self, n):
        self.n = n

    def get_node_ids(self):
        return list(range(1, self.n + 1))


def _reply(w: float) -> Message:
    return Message(
        content=RecordDict(
            {
                "arrays": ArrayRecord({"w": torch.tensor([w])}),
                "metrics": MetricRecord({"num-examples": 1}),
            }
        ),
        dst_node_id=1,
        message_type="train",
    )


def test_a_flower_strategy_by_name_is_flowers_made_strict(identity):
    s = round_strategy("FedProx", {"proximal_mu": 0.3}, 3)
    assert isinstance(s, FedProx) and s.proximal_mu == 0.3
    messages = s.configure_train(
        1,
        ArrayRecord({"w": torch.zeros(1)}),
        __import__("flwr.app", fromlist=["ConfigRecord"]).ConfigRecord(),
        _Grid(3),
    )
    assert len(messages) == 3
    assert all(float(m.content["config"]["proximal-mu"]) == 0.3 for m in messages)
    with pytest.raises(ClientFailure, match="1 of 3 client"):
        s.aggregate_train(1, [_reply(1.0), _reply(2.0)])


def test_client_sampling_expects_the_sampled_clients_only(identity):
    from flwr.app import ConfigRecord

    s = round_strategy("fedavg", {"fraction_train": 0.5}, 4)
    messages = s.configure_train(1, ArrayRecord({"w": torch.zeros(1)}), ConfigRecord(), _Grid(4))
    assert len(messages) == 2 and len({m.metadata.dst_node_id for m in messages}) == 2
    arrays, _ = s.aggregate_train(1, [_reply(1.0), _reply(3.0)])
    assert arrays.to_torch_state_dict()["w"].item() == pytest.approx(2.0)
    with pytest.raises(ClientFailure, match="1 of 2 client"):
        s.aggregate_train(2, [_reply(1.0)])


@pytest.mark.parametrize(
    "keys,message",
    [
        ({"round-strategy": "fedsomething"}, "round-strategy: unknown 'fedsomething'; allowed"),
        (
            {"round-strategy": "fedprox", "round-strategy-args": '{"mu": 1}'},
            "round-strategy-args: FedProx refused",
        ),
        (
            {"round-strategy": "fedavg", "round-strategy-args": '{"fraction_train": 0}'},
            "fraction_train must be a number in \\(0, 1\\]",
        ),
        ({"round-strategy": "fedavg", "round-strategy-args": "{nope"}, "expected a JSON object"),
        ({"round-strategy-args": '{"proximal_mu": 1}'}, "has no effect without round-strategy"),
        ({"round-strategy": "fedprox", "server-optimizer": "fedadam"}, "not both"),
        ({"round-strategy": "fedprox", "schedule": "fedsgd"}, "round-strategy drives FedAvg"),
        ({"round-strategy": "no.such.module:Strategy"}, "round-strategy"),
        ({"round-strategy": "FedXgbBagging"}, "aggregates XGBoost trees"),
        (
            {"round-strategy": "fedgraph.strategies.gap:GAPStrategy"},
            "not a subclass of flwr.serverapp.strategy.Strategy",
        ),
    ],
)
def test_bad_round_strategies_name_the_key(keys, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config({"method": "gap", "num-clients": 2, **keys})


def test_round_strategy_selects_the_fedavg_schedule():
    cfg = parse_run_config({"method": "gap", "round-strategy": "fedprox"})
    assert cfg.schedule == "fedavg" and cfg.round_strategy_args == {}
    again = parse_run_config(cfg.model_dump())  # what the clients parse
    assert again.round_strategy == "fedprox"


def test_a_client_trains_only_the_rounds_its_plan_covers():
    cfg = parse_run_config(
        {"method": "gap", "level": "node", "encoder-rounds": 2, "classifier-rounds": 3}
    )
    last = admit_round(cfg, "gap.encoder", 1, {})
    last = admit_round(cfg, "gap.encoder", 2, last)
    with pytest.raises(ValueError, match="round 3 refused: allowed rounds 3..2"):
        admit_round(cfg, "gap.encoder", 3, last)
    last = admit_round(cfg, "gap.classifier", 2, last)  # sampled out of round 1
    with pytest.raises(ValueError, match="round 2 refused"):  # a round twice: its draws again
        admit_round(cfg, "gap.classifier", 2, last)
    with pytest.raises(ValueError, match="unknown GAP phase"):
        admit_round(cfg, "gap.other", 1, last)


def _linear(seed=0):
    torch.manual_seed(seed)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    return torch.nn.Linear(5, 3), x, y


def test_fedprox_step_adds_mu_times_the_distance_to_the_round_model():
    """Two full-batch SGD steps: the second one's gradient has mu (w1 - w0) added (Li et al.
    2020, Eq. 2: the gradient of mu/2 ||w - w0||^2); the first one's is the plain gradient."""
    mu, lr = 2.0, 0.1
    model, x, y = _linear()
    w0 = [p.detach().clone() for p in model.parameters()]
    local_train(
        model,
        x,
        y,
        None,
        2,
        None,
        lr,
        optimizer=torch.optim.SGD(model.parameters(), lr),
        proximal_mu=mu,
    )
    ref, _, _ = _linear()
    params = list(ref.parameters())
    for _step in range(2):
        ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for p, p0 in zip(params, w0):
                p -= lr * (p.grad + mu * (p - p0))
    for p, q in zip(model.parameters(), params):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("dp", [False, True])
def test_a_large_proximal_term_keeps_the_local_model_near_the_round_model(dp):
    from fedgraph.methods.gap.training import DPSGD

    moved = {}
    for mu in (0.0, 1e4):
        model, x, y = _linear()
        w0 = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        local_train(
            model,
            x,
            y,
            None,
            20,
            16 if dp else None,
            0.05,
            DPSGD(noise_multiplier=1.0, max_grad_norm=1.0) if dp else None,
            generator=torch.Generator().manual_seed(1),
            proximal_mu=mu,
        )
        moved[mu] = float(
            (torch.cat([p.detach().flatten() for p in model.parameters()]) - w0).norm()
        )
    assert moved[1e4] < 0.3 * moved[0.0], moved


def _example(name: str, tmp_path, *extra) -> dict:
    return load_run_config(str(EXAMPLES / name), [*SMALL, f"output-dir='{tmp_path}'", *extra])


def test_the_fedprox_example_runs_and_its_clients_get_mu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # any folder
    grid = LocalGrid(4, record=True)
    report = run_local(_example("fedprox.toml", tmp_path), grid=grid)
    assert report["status"] == "ok"
    trains = [m for m, _ in grid.log if m.metadata.message_type == "train"]
    assert len(trains) == 4 * (2 + 3)
    assert {float(m.content["config"]["proximal-mu"]) for m in trains} == {0.1}
    assert "fedprox: proximal_mu=0.1" in report["privacy"]["schedule"]
    assert any("FedProx" in phase for phase in report["timings_s"])
    for subject in report["privacy"]["per_subject"].values():
        assert subject["epsilon"] <= 4 + 1e-6 and not subject["over_budget"]


def test_the_sampling_example_ledgers_only_the_rounds_each_client_took(tmp_path, monkeypatch):
    """Node level, half the clients per round: a client's DP-SGD steps in the ledger are its
    per-round steps times the rounds it was sampled in (the same per-round count in both
    phases), and a phase it never took has no release."""
    monkeypatch.chdir(tmp_path)
    # 2 clients, one sampled per round; calibration in seconds (accountant rdp)
    fast = ["num-clients=2", "accountant='rdp'", "max-degree=5", "local-epochs=1", "batch-size=256"]
    grid = LocalGrid(2, record=True)
    report = run_local(_example("sampling.toml", tmp_path, *fast), grid=grid)
    assert report["status"] == "ok" and "client_sampling" in report["privacy"]
    trains = [m for m, _ in grid.log if m.metadata.message_type == "train"]
    assert len(trains) == 2 + 3  # half of the 2 clients each round
    taken = {}  # (partition id, phase) -> rounds (LocalGrid: node id = partition id + 1)
    for m in trains:
        key = (m.metadata.dst_node_id - 1, str(m.content["config"]["phase"]).split(".")[1])
        taken[key] = taken.get(key, 0) + 1
    for pid in range(2):
        s = report["privacy"]["per_subject"][f"client-{pid}"]
        steps = {
            r["release"].split()[0]: r["steps"]
            for r in s["releases"]
            if r["release"].endswith("dp-sgd")
        }
        per_round = set()
        for phase in ("encoder", "classifier"):
            rounds = taken.get((pid, phase), 0)
            assert (phase in steps) == (rounds > 0), (pid, phase, s["releases"], taken)
            if rounds:
                assert steps[phase] % rounds == 0
                per_round.add(steps[phase] // rounds)
        assert len(per_round) <= 1, (pid, steps, taken)
        assert s["epsilon"] <= 8 + 1e-6 and not s["over_budget"]


def test_a_users_strategy_by_path_runs_without_private_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = run_local(_example("damped.toml", tmp_path, "encoder-rounds=1", "classifier-rounds=2"))
    assert report["status"] == "ok"
    assert any("DampedFedAvg" in phase for phase in report["timings_s"])
    source = (EXAMPLES / "damped.py").read_text()
    for example in EXAMPLES.iterdir():
        text = example.read_text()
        assert "._" not in text.replace("__init__", ""), example  # no private attribute
    assert "class DampedFedAvg(FedAvg)" in source


def test_a_users_strategy_that_raises_is_named_with_its_error(tmp_path):
    """A constructor that raises: a config error naming ``round-strategy`` and the class, the
    user's exception kept as the cause (its traceback is what ``fedgraph run`` shows)."""
    from fedgraph.simulations.user_code import user_traceback

    (tmp_path / "boom.py").write_text(
        "from flwr.serverapp.strategy import FedAvg\n\n"
        "class Boom(FedAvg):\n    def __init__(self, **kw):\n"
        "        raise RuntimeError('boom in constructor')\n"
    )
    spec = f"{tmp_path / 'boom.py'}:Boom"
    with pytest.raises(ConfigError, match="round-strategy: .*Boom.*RuntimeError: boom") as err:
        validate_run_config({"method": "gap", "num-clients": 2, "round-strategy": spec})
    assert "boom.py" in user_traceback(err.value)


def test_a_bad_round_strategy_name_keeps_ray_from_starting_early():
    """``fedgraph run`` starts Ray early only for a config that will run: an unknown Flower
    strategy name is refused before (in about a second, not after Ray's start)."""
    from fedgraph.simulations.simulate import _early_ray_method

    assert _early_ray_method({"method": "gap", "round-strategy": "fedprx"}) is None
    assert _early_ray_method({"method": "gap", "round-strategy": "fedprox"}) == "gap"


# ------------------------------------------------------------------ ProGAP's stages
PROGAP_NODE = {
    "method": "progap",
    "dataset": "synthetic-sbm:400:4",
    "num-clients": 2,
    "level": "node",
    "depth": 1,
    "epochs": 3,
    "hidden": 8,
    "client-epsilons": "8",
    "max-degree": 5,
    "batch-size": 256,
    "accountant": "rdp",
    "delta": 1e-4,
    "device": "cpu",
    "noise-source": "mt19937",
}


def _progap(tmp_path, **keys):
    cls, cfg = validate_run_config(
        {**PROGAP_NODE, "output-dir": str(tmp_path), "run-name": "progap", **keys}
    )
    grid = LocalGrid(cfg.num_clients, record=True)
    report = cls(cfg).start(grid)
    assert report["status"] == "ok", report.get("error")
    return report, grid


def test_progap_node_stages_sample_clients_and_ledger_only_their_rounds(tmp_path):
    """Node-level ProGAP with Flower's FedAvg sampling one of 2 clients per round: every
    stage's rounds go to the sampled client only, and a client's ``stage dp-sgd`` steps in
    the ledger are one round's steps times the rounds it took part in."""
    report, grid = _progap(
        tmp_path, **{"round-strategy": "fedavg", "round-strategy-args": '{"fraction_train": 0.5}'}
    )
    assert "client_sampling" in report["privacy"]
    assert any("FedAvg" in phase and "stage 1" in phase for phase in report["timings_s"])
    trains = [m for m, _ in grid.log if m.metadata.message_type == "train.progap_stage"]
    assert len(trains) == 2 * 3  # 2 stages, 3 rounds, 1 client each
    taken = {pid: sum(m.metadata.dst_node_id - 1 == pid for m in trains) for pid in range(2)}
    per_round = set()
    for pid, rounds in taken.items():
        s = report["privacy"]["per_subject"][f"client-{pid}"]
        steps = sum(r["steps"] for r in s["releases"] if r["release"] == "stage dp-sgd")
        assert (steps > 0) == (rounds > 0), (pid, s["releases"])
        if rounds:
            assert steps % rounds == 0
            per_round.add(steps // rounds)
        assert s["epsilon"] <= 8 + 1e-6 and not s["over_budget"]
    assert len(per_round) == 1, (taken, per_round)


def test_progap_fedprox_sends_mu_and_keeps_earlier_stages_frozen(tmp_path):
    """FedProx on node-level ProGAP: every stage round carries ``proximal-mu``; the entries
    stage 1 does not train (stage 0's head) are bit for bit the same from stage 1's first
    round to the final evaluation (frozen: kept as sent, not averaged again)."""
    report, grid = _progap(
        tmp_path,
        **{
            "num-clients": 3,
            "round-strategy": "fedprox",
            "round-strategy-args": '{"proximal_mu": 0.1}',
        },
    )
    trains = [m for m, _ in grid.log if m.metadata.message_type == "train.progap_stage"]
    assert {float(m.content["config"]["proximal-mu"]) for m in trains} == {0.1}
    stage1 = [m for m in trains if int(m.content["config"]["stage"]) == 1]
    final = next(m for m, _ in grid.log if m.metadata.message_type == "query.progap_eval")
    sent = stage1[0].content["arrays"].to_torch_state_dict()
    last = final.content["arrays"].to_torch_state_dict()
    from fedgraph.methods.progap.client import build_model

    _, cfg = validate_run_config(PROGAP_NODE)
    model = build_model(cfg, report["dataset"]["num_features"], report["dataset"]["num_classes"])
    model.set_stage(1)
    frozen = set(sent) - set(model.stage_parameter_names())  # stage 0's head
    assert frozen, sorted(sent)
    changed = {k for k in sent if not torch.equal(sent[k], last[k])}
    assert changed and not changed & frozen  # stage 1 trained, the frozen entries did not


def test_a_progap_client_trains_only_the_rounds_its_plan_covers():
    from fedgraph.methods.progap.client import admit_round as progap_admit

    cfg = parse_run_config({**PROGAP_NODE, "epochs": 2})
    last = progap_admit(cfg, 0, 1, {})
    last = progap_admit(cfg, 0, 2, last)
    with pytest.raises(
        ValueError,
        match=r"progap.stage0: train round 3 refused: allowed "
        r"rounds 3..2",
    ):
        progap_admit(cfg, 0, 3, last)
    last = progap_admit(cfg, 1, 2, last)  # sampled out of stage 1's round 1
    with pytest.raises(ValueError, match="round 2 refused"):
        progap_admit(cfg, 1, 2, last)  # a replay
    with pytest.raises(ValueError, match=r"stage 2 refused: allowed stages 0..1"):
        progap_admit(cfg, 2, 1, last)


def test_progap_edge_level_refuses_a_round_strategy():
    with pytest.raises(ConfigError, match="round-strategy: edge level trains FedSGD"):
        validate_run_config({**PROGAP_NODE, "level": "edge", "round-strategy": "fedprox"})


def test_a_progap_client_refuses_to_validate_at_node_level():
    """``evaluate.progap_stage`` reads validation labels, private at node level."""
    from fedgraph.methods.progap.client import validation

    cfg = parse_run_config(PROGAP_NODE)
    with pytest.raises(ValueError, match="refused at node level"):
        validation(cfg, None, None, None)
