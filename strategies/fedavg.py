"""Flower's FedAvg (and its server-optimizer variants), made to fail loudly and to keep the
best round by validation accuracy.

Flower's FedAvg logs "0 results and N failures" and carries on; a private simulation that lost
a client must stop instead. :class:`StrictFedAvg` raises :class:`~fedgraph.federation.ClientFailure`
when any reply is an error or missing, and (``select_on_val``) remembers the aggregated arrays
of the round with the best weighted ``val-accuracy`` reported by the clients' evaluation.

:func:`strict_strategy` gives the same behaviour on top of Flower's server-optimizer
strategies (FedAvgM, FedAdam, FedYogi; Hsu et al. 2019, Reddi et al. ICLR 2021): the clients'
averaged update is treated as a pseudo-gradient and applied with server momentum or a server
Adam/Yogi step. They help when the clients' data are label-skewed (e.g. louvain communities).
The server step is post-processing of the aggregated arrays: it changes no client's privacy.
"""
from __future__ import annotations

import logging

from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedYogi

from fedgraph.federation import (ClientFailure, check_finite_reply, client_label,
                                 last_error_line)

class _QuietSkippedEvaluation(logging.Filter):
    """Drops Flower's "fraction_evaluate is set to 0.0" warning (and nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "fraction_evaluate is set to 0.0" not in record.getMessage()


class _Strict:
    """Mixin over a Flower FedAvg-family strategy: all clients every round, fail loudly, keep
    the best round by validation accuracy (``select_on_val``)."""

    #: ``on_train_reply(server_round, reply)``: called for every training reply that arrived
    #: (before a failed round raises), e.g. to record its release in a privacy ledger
    on_train_reply = None

    def __init__(self, num_clients: int, select_on_val: bool = False, **kwargs):
        # Without select_on_val the clients' evaluation is skipped on purpose (the strategy
        # evaluates once at the end); Flower's warning about it would only confuse.
        flwr_logger, quiet = logging.getLogger("flwr"), _QuietSkippedEvaluation()
        flwr_logger.addFilter(quiet)
        try:
            super().__init__(fraction_train=1.0, fraction_evaluate=1.0 if select_on_val else 0.0,
                             min_train_nodes=num_clients, min_evaluate_nodes=num_clients,
                             min_available_nodes=num_clients, **kwargs)
        finally:
            flwr_logger.removeFilter(quiet)
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
        for r in replies:
            check_finite_reply(r.content, client_label(r.metadata.src_node_id, r.content),
                               f"{phase} round {server_round}")
        return replies

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        if self.on_train_reply is not None:
            for r in replies:
                if not r.has_error():
                    self.on_train_reply(server_round, r)
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


class StrictFedAvg(_Strict, FedAvg):
    """FedAvg over all ``num_clients`` clients every round.

    Args:
        num_clients: clients expected in every round (all of them).
        select_on_val: evaluate every round and keep the best round's arrays in ``self.best``
            as ``(val_accuracy, round, arrays)``.
    """


class StrictFedAvgM(_Strict, FedAvgM):
    """:class:`StrictFedAvg` with Flower's server momentum (FedAvgM)."""


class StrictFedAdam(_Strict, FedAdam):
    """:class:`StrictFedAvg` with Flower's server Adam step (FedAdam)."""


class StrictFedYogi(_Strict, FedYogi):
    """:class:`StrictFedAvg` with Flower's server Yogi step (FedYogi)."""


#: ``server-optimizer`` names -> strict strategy classes.
STRICT_STRATEGIES = {"fedavg": StrictFedAvg, "fedavgm": StrictFedAvgM,
                     "fedadam": StrictFedAdam, "fedyogi": StrictFedYogi}


def strict_strategy(server_optimizer: str, num_clients: int, select_on_val: bool = False,
                    server_lr: float | None = None):
    """A strict (see :class:`StrictFedAvg`) Flower strategy with a server optimizer.

    Args:
        server_optimizer: ``fedavg`` (plain averaging), ``fedavgm`` (server momentum 0.9),
            ``fedadam`` or ``fedyogi`` (server Adam / Yogi on the averaged update).
        num_clients, select_on_val: as for :class:`StrictFedAvg`.
        server_lr: the server learning rate (FedAvgM's ``server_learning_rate``, FedAdam's and
            FedYogi's ``eta``); ``None``: Flower's default (1.0 for FedAvgM, 0.1 for FedAdam and
            FedYogi). Ignored by ``fedavg``.

    Raises:
        ValueError: unknown ``server_optimizer`` (the message lists the allowed names).
    """
    if server_optimizer not in STRICT_STRATEGIES:
        raise ValueError(f"server-optimizer: unknown {server_optimizer!r}; allowed: "
                         + ", ".join(STRICT_STRATEGIES))
    cls = STRICT_STRATEGIES[server_optimizer]
    kwargs: dict = {}
    if cls is StrictFedAvgM:
        kwargs["server_momentum"] = 0.9
        if server_lr is not None:
            kwargs["server_learning_rate"] = server_lr
    elif cls is not StrictFedAvg and server_lr is not None:
        kwargs["eta"] = server_lr
    return cls(num_clients, select_on_val, **kwargs)
