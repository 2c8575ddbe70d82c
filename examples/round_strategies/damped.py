"""A user's Flower strategy for GAP's training rounds: FedAvg with a damped server step.

``w <- w + damping * (mean of the clients' weights - w)``: ``damping = 1`` is FedAvg. Only
Flower's public API (``configure_train``, ``aggregate_train``); fedgraph makes it strict
(every sampled client replies or the round fails) and records each client's training reply in
the privacy ledger. The server step is post-processing of what the clients sent: it changes no
client's privacy.

Run: fedgraph run examples/round_strategies/damped.toml
"""

from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAvg


class DampedFedAvg(FedAvg):
    def __init__(self, *args, damping: float = 0.5, **kwargs):
        if not 0 < damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {damping}")
        super().__init__(*args, **kwargs)
        self.damping = damping
        self.current = None

    def configure_train(self, server_round, arrays, config, grid):
        self.current = arrays.to_torch_state_dict()  # the global model of this round
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or not self.current:
            return arrays, metrics
        mean = arrays.to_torch_state_dict()
        step = {
            k: (w + self.damping * (mean[k] - w)) if w.is_floating_point() else mean[k]
            for k, w in self.current.items()
        }
        return ArrayRecord(step), metrics
