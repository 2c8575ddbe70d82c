"""Strict FedAvg and its server-optimizer variants (strategies/fedavg.py): the aggregation is
Flower's, a lost client fails the round, the config key is validated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedYogi
from flwr.supercore.task_identity import TaskIdentity

from fedgraph.config import ConfigError, parse_run_config
from fedgraph.errors import ClientFailure
from fedgraph.strategies.fedavg import STRICT_STRATEGIES, StrictFedAvg, strict_strategy


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _reply(w, n: int) -> Message:
    return Message(
        content=RecordDict(
            {
                "arrays": ArrayRecord({"w": torch.tensor(w)}),
                "metrics": MetricRecord({"num-examples": n}),
            }
        ),
        dst_node_id=1,
        message_type="train",
    )


def _set_current(strategy, w) -> None:
    """What ``configure_train`` stores before a round (FedAvgM: an ArrayRecord; FedOpt: a dict
    of numpy arrays)."""
    w = np.asarray(w, dtype=np.float32)
    if isinstance(strategy, FedAvgM):
        strategy.current_arrays = ArrayRecord({"w": torch.from_numpy(w.copy())})
    else:
        strategy.current_arrays = {"w": w.copy()}


def _error_reply() -> Message:
    instruction = Message(content=RecordDict(), dst_node_id=1, message_type="train")
    return Message(error=Error(code=0, reason="ValueError: client exploded"), reply_to=instruction)


def test_fedavg_is_the_weighted_mean():
    s = strict_strategy("fedavg", 2)
    assert isinstance(s, StrictFedAvg)
    arrays, _ = s.aggregate_train(1, [_reply([0.0, 0.0], 1), _reply([3.0, 6.0], 2)])
    np.testing.assert_allclose(arrays.to_torch_state_dict()["w"].numpy(), [2.0, 4.0])


@pytest.mark.parametrize(
    "name,base", [("fedavgm", FedAvgM), ("fedadam", FedAdam), ("fedyogi", FedYogi)]
)
def test_server_optimizers_are_flowers_and_step_towards_the_clients(name, base):
    s = strict_strategy(name, 2, server_lr=0.05)
    assert isinstance(s, base) and isinstance(s, FedAvg)
    start = np.array([1.0, -1.0], dtype=np.float32)
    _set_current(s, start)
    arrays, _ = s.aggregate_train(1, [_reply([2.0, -3.0], 1), _reply([2.0, -3.0], 1)])
    new = arrays.to_torch_state_dict()["w"].numpy()
    # the averaged update points to (2, -3); the server step moves along it, no further
    assert new[0] > start[0] and new[1] < start[1]
    assert new[0] <= 2.0 + 1e-6 and new[1] >= -3.0 - 1e-6
    if name == "fedavgm":  # server_learning_rate: w + lr * (avg - w) in the first round
        np.testing.assert_allclose(new, start + 0.05 * (np.array([2.0, -3.0]) - start), rtol=1e-5)
    else:  # adaptive: every coordinate moves by the same step (updates 1 and 2), at most eta
        step = np.abs(new - start)
        assert np.all(step > 0.01) and np.all(step <= 0.05 + 1e-6)
        np.testing.assert_allclose(step[0], step[1], rtol=0.02)


@pytest.mark.parametrize("name", sorted(STRICT_STRATEGIES))
def test_a_failed_or_missing_client_fails_the_round(name):
    s = strict_strategy(name, 2)
    _set_current(s, [0.0, 0.0])
    with pytest.raises(ClientFailure, match="client exploded"):
        s.aggregate_train(3, [_reply([1.0, 1.0], 1), _error_reply()])
    with pytest.raises(ClientFailure, match="1 of 2 client\\(s\\) did not reply"):
        s.aggregate_train(3, [_reply([1.0, 1.0], 1)])


def test_unknown_server_optimizer_names_the_key_and_the_allowed_values():
    with pytest.raises(ValueError, match="server-optimizer.*fedavg, fedavgm, fedadam, fedyogi"):
        strict_strategy("sgd", 2)
    with pytest.raises(ConfigError, match="server-optimizer"):
        parse_run_config({"method": "gap", "server-optimizer": "sgd"})
    for bad in ("0", "-1", "nan", "inf", "abc"):
        with pytest.raises(ConfigError, match="server-lr"):
            parse_run_config({"method": "gap", "server-optimizer": "fedadam", "server-lr": bad})
    with pytest.raises(
        ConfigError, match="server-lr: has no effect with server-optimizer 'fedavg'"
    ):
        parse_run_config({"method": "gap", "server-lr": "0.5"})  # would be silently ignored
    cfg = parse_run_config({"method": "gap", "server-optimizer": "fedadam", "server-lr": ""})
    assert cfg.server_optimizer == "fedadam" and cfg.server_lr is None


def test_the_skipped_evaluation_warning_is_dropped_and_nothing_else():
    import logging

    class Capture(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    logger, capture = logging.getLogger("flwr"), Capture()
    logger.addHandler(capture)
    try:
        FedAvg(fraction_evaluate=0.0)  # Flower itself warns
        assert any("fraction_evaluate is set to 0.0" in m for m in capture.messages)
        capture.messages.clear()
        strict_strategy("fedadam", 2)  # no evaluation on purpose: no warning
        assert not any("fraction_evaluate" in m for m in capture.messages)
        s = strict_strategy("fedavg", 2)
        s.summary()  # other Flower logs still pass
        assert any("Sampling" in m for m in capture.messages)
    finally:
        logger.removeHandler(capture)
    assert not logger.filters  # the filter was removed again


def test_flowers_per_round_info_is_quiet_during_a_strategy_and_warnings_pass(tmp_path):
    """A real GAP run in one process: no Flower INFO record reaches a handler while a strict
    strategy runs (Flower logs about ten per round), its warnings do, and with
    ``flower_round_logs`` the rounds are logged as Flower does."""
    import logging

    from fedgraph.simulations.local import run_local
    from fedgraph.strategies.fedavg import StrictFedSGD

    class Capture(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []

        def emit(self, record):
            self.records.append(record)

    logger, capture = logging.getLogger("flwr"), Capture()
    logger.addHandler(capture)
    cfg = {
        "method": "gap",
        "num-clients": 2,
        "encoder-rounds": 2,
        "classifier-rounds": 3,
        "output-dir": str(tmp_path),
        "run-name": "quiet",
    }
    try:
        assert run_local(cfg)["status"] == "ok"
        assert not any("[ROUND" in r.getMessage() for r in capture.records)
        logging.getLogger("flwr").warning("a warning")
        assert capture.records[-1].getMessage() == "a warning"
        capture.records.clear()
        StrictFedSGD.flower_round_logs = True
        try:
            assert run_local({**cfg, "run-name": "loud"})["status"] == "ok"
        finally:
            StrictFedSGD.flower_round_logs = False
        rounds = [r.getMessage() for r in capture.records if "[ROUND" in r.getMessage()]
        assert rounds == [
            "[ROUND 1/2]",
            "[ROUND 2/2]",
            "[ROUND 1/3]",
            "[ROUND 2/3]",
            "[ROUND 3/3]",
        ], rounds
    finally:
        logger.removeHandler(capture)
    assert not logger.filters
