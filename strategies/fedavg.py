"""Flower's FedAvg, made to fail loudly and to keep the best round by validation accuracy.

Flower's FedAvg logs "0 results and N failures" and carries on; a private simulation that lost
a client must stop instead. :class:`StrictFedAvg` raises :class:`~fedgraph.federation.ClientFailure`
when any reply is an error or missing, and (``select_on_val``) remembers the aggregated arrays
of the round with the best weighted ``val-accuracy`` reported by the clients' evaluation.
"""
from __future__ import annotations

from flwr.serverapp.strategy import FedAvg

from fedgraph.federation import ClientFailure, last_error_line


class StrictFedAvg(FedAvg):
    """FedAvg over all ``num_clients`` clients every round.

    Args:
        num_clients: clients expected in every round (all of them).
        select_on_val: evaluate every round and keep the best round's arrays in ``self.best``
            as ``(val_accuracy, round, arrays)``.
    """

    def __init__(self, num_clients: int, select_on_val: bool = False):
        super().__init__(fraction_train=1.0, fraction_evaluate=1.0 if select_on_val else 0.0,
                         min_train_nodes=num_clients, min_evaluate_nodes=num_clients,
                         min_available_nodes=num_clients)
        self.num_clients = num_clients
        self.best = None
        self._latest = None

    def _check(self, replies, phase: str, server_round: int) -> list:
        replies = list(replies)
        errors = sorted({last_error_line(r.error.reason) for r in replies if r.has_error()})
        if len(replies) < self.num_clients:
            errors.append(f"{self.num_clients - len(replies)} client(s) did not reply in time")
        if errors:
            raise ClientFailure(f"{phase} round {server_round}: " + "; ".join(errors))
        return replies

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, self._check(replies, "train", server_round))
        self._latest = arrays
        return arrays, metrics

    def aggregate_evaluate(self, server_round, replies):
        if self.fraction_evaluate == 0.0:
            return None
        metrics = super().aggregate_evaluate(server_round, self._check(replies, "evaluate", server_round))
        acc = float(metrics["val-accuracy"]) if metrics and "val-accuracy" in metrics else float("-inf")
        if self.best is None or acc > self.best[0]:
            self.best = (acc, server_round, self._latest)
        return metrics
