"""Flower's FedAvg (and its server-optimizer variants), made to fail loudly and to keep the
best round by validation accuracy.

Flower's FedAvg logs "0 results and N failures" and carries on; a private simulation that lost
a client must stop instead. :class:`StrictFedAvg` raises :class:`~fedgraph.errors.ClientFailure`
when any reply is an error or missing, and (``select_on_val``) remembers the aggregated arrays
of the round with the best weighted ``val-accuracy`` reported by the clients' evaluation.

:func:`strict_strategy` gives the same behaviour on top of Flower's server-optimizer
strategies (FedAvgM, FedAdam, FedYogi; Hsu et al. 2019, Reddi et al. ICLR 2021): the clients'
averaged update is treated as a pseudo-gradient and applied with server momentum or a server
Adam/Yogi step. They help when the clients' data are label-skewed (e.g. louvain communities).
The server step is post-processing of the aggregated arrays: it changes no client's privacy.

:func:`round_strategy` does the same for any :class:`flwr.serverapp.strategy.Strategy`
subclass, by name (``fedprox``, ``fedadagrad``, ...) or import path (a user's own): the
``round-strategy`` and ``round-strategy-args`` run-config keys of GAP.
"""

from __future__ import annotations

import inspect
import logging
import random

from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedYogi

from fedgraph.errors import ClientFailure
from fedgraph.messaging import check_finite_reply, client_label, last_error_line


class _QuietSkippedEvaluation(logging.Filter):
    """Drops Flower's "fraction_evaluate is set to 0.0" warning (and nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "fraction_evaluate is set to 0.0" not in record.getMessage()


class _QuietRounds(logging.Filter):
    """Drops Flower's INFO records (the per-round lines and the final history: about ten lines
    a round, 2,000 for GAP's default 100 + 100 FedSGD rounds); warnings and errors pass. The
    run's own progress (:meth:`fedgraph.report.RunReport.phase`) shows the rounds instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO


class _Strict:
    """Mixin over a Flower strategy: every client that was sent a message replies (all clients
    every round unless ``fraction_train`` samples them), fail loudly, keep the best round by
    validation accuracy (``select_on_val``)."""

    #: ``on_train_reply(server_round, reply)``: called for every training reply that arrived
    #: (before a failed round raises), e.g. to record its release in a privacy ledger
    on_train_reply = None
    #: keep Flower's INFO log of every round (default: quiet, see :class:`_QuietRounds`)
    flower_round_logs = False
    #: seed of the client sampling (Flower's ``random.sample``) at :meth:`start`; ``None``: not
    #: seeded. Which clients train in a round is the server's public choice.
    sampling_seed: int | None = None
    #: the message types of the rounds (Flower's ``train`` / ``evaluate``, or a named handler of
    #: the ClientApp such as ``train.progap_stage``)
    train_message_type: str = "train"
    evaluate_message_type: str = "evaluate"
    #: names of entries of the arrays that the rounds do not train (e.g. a ProGAP stage's
    #: earlier stages): the aggregated arrays keep the values sent, whatever the replies hold
    frozen: frozenset = frozenset()

    def start(self, *args, **kwargs):
        flwr_logger, quiet = logging.getLogger("flwr"), _QuietRounds()
        if not self.flower_round_logs:
            flwr_logger.addFilter(quiet)
        if self.sampling_seed is not None:
            random.seed(self.sampling_seed)
        try:
            return super().start(*args, **kwargs)
        finally:
            flwr_logger.removeFilter(quiet)

    def __init__(self, num_clients: int, select_on_val: bool = False, **kwargs):
        fraction = kwargs.get("fraction_train", 1.0)
        defaults = {
            "fraction_train": 1.0,
            "fraction_evaluate": 1.0 if select_on_val else 0.0,
            "min_train_nodes": max(1, int(num_clients * fraction)),
            "min_evaluate_nodes": num_clients,
            "min_available_nodes": num_clients,
        }
        accepted = inspect.signature(super().__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            defaults = {k: v for k, v in defaults.items() if k in accepted}
        # Without select_on_val the clients' evaluation is skipped on purpose (the strategy
        # evaluates once at the end); Flower's warning about it would only confuse.
        flwr_logger, quiet = logging.getLogger("flwr"), _QuietSkippedEvaluation()
        flwr_logger.addFilter(quiet)
        try:
            super().__init__(**{**defaults, **kwargs})
        finally:
            flwr_logger.removeFilter(quiet)
        self.num_clients = num_clients
        self.best = None
        self.best_key = None
        self._latest = None
        self._sent_to: dict[str, int] = {}  # "train"/"evaluate" -> clients sent this round
        self._train_arrays = None  # the arrays of the current round's training messages

    @staticmethod
    def _typed(messages: list, message_type: str) -> list:
        for m in messages:
            if m.metadata.message_type != message_type:
                m.metadata.message_type = message_type
        return messages

    def configure_train(self, server_round, arrays, config, grid):
        self._train_arrays = arrays
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._sent_to["train"] = len(messages)
        return self._typed(messages, self.train_message_type)

    def configure_evaluate(self, server_round, arrays, config, grid):
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self._sent_to["evaluate"] = len(messages)
        return self._typed(messages, self.evaluate_message_type)

    def _keep_frozen(self, arrays):
        """``arrays`` with the :attr:`frozen` entries of the arrays sent this round."""
        if not self.frozen or arrays is None:
            return arrays
        from flwr.app import ArrayRecord

        sent = self._train_arrays
        return ArrayRecord(
            {
                **{k: v for k, v in arrays.items() if k not in self.frozen},
                **{k: sent[k] for k in sent if k in self.frozen},
            }
        )

    def _check(self, replies, phase: str, server_round: int) -> list:
        replies = list(replies)
        errors = sorted({last_error_line(r.error.reason) for r in replies if r.has_error()})
        expected = self._sent_to.get(phase, self.num_clients)
        if len(replies) < expected:
            errors.append(
                f"{expected - len(replies)} of {expected} client(s) did not reply in time"
            )
        if errors:
            raise ClientFailure(f"{phase} round {server_round}: " + "; ".join(errors))
        for r in replies:
            check_finite_reply(
                r.content,
                client_label(r.metadata.src_node_id, r.content),
                f"{phase} round {server_round}",
            )
        return replies

    def aggregate_train(self, server_round, replies):
        # In node-id order: Flower sums the replies in the order given, which follows its
        # unseeded client sampling; float sums in another order differ in the last bits, and
        # a server Adam amplifies that (a run would not repeat itself).
        replies = sorted(replies, key=lambda r: r.metadata.src_node_id)
        if self.on_train_reply is not None:
            for r in replies:
                if not r.has_error():
                    self.on_train_reply(server_round, r)
        arrays, metrics = super().aggregate_train(
            server_round, self._check(replies, "train", server_round)
        )
        arrays = self._keep_frozen(arrays)
        self._latest = arrays
        return arrays, metrics

    def aggregate_evaluate(self, server_round, replies):
        if getattr(self, "fraction_evaluate", 0.0) == 0.0:
            return None
        replies = self._check(
            sorted(replies, key=lambda r: r.metadata.src_node_id), "evaluate", server_round
        )
        metrics = super().aggregate_evaluate(server_round, replies)
        self._consider(server_round, selection_key([r.content for r in replies]), self._latest)
        return metrics

    def _consider(self, server_round: int, key: tuple[float, float], arrays) -> None:
        """Keep ``arrays`` (the weights after ``server_round``) if their ``key`` is the best
        so far (ties: the earlier round)."""
        if self.best is None or key > self.best_key:
            self.best, self.best_key = (key[0], server_round, arrays), key


def selection_key(contents: list, count: str = "num-examples") -> tuple[float, float]:
    """``(validation accuracy, -validation loss)`` of a round over all clients, the key of
    :func:`fedgraph.methods.gap.fit`'s best epoch: the accuracy from the exact counts
    (``round(val-accuracy * num-examples)`` per client; a float weighted mean of the clients'
    accuracies is not exact, and would break ties between rounds differently for different
    partitions of the same validation set), the loss the weighted mean of ``val-loss`` (0
    when the clients send none). ``(-inf, 0)`` without ``val-accuracy``. ``count``: the
    metric that holds the validation count (a training reply's is ``val-examples``)."""
    correct, total, loss = 0, 0, 0.0
    for c in contents:
        m = next(iter(c.metric_records.values()), {})
        if "val-accuracy" not in m:
            return float("-inf"), 0.0
        n = int(m[count])
        correct += round(float(m["val-accuracy"]) * n)
        total += n
        loss += float(m.get("val-loss", 0.0)) * n
    return (correct / total, -loss / total) if total else (float("-inf"), 0.0)


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


class StrictFedSGD(_Strict, FedAvg):
    """FedSGD with a server Adam: every round each client sends the gradient of its mean
    training loss at the current weights (:func:`fedgraph.methods.gap.local_gradient`) with
    ``num-examples`` = its training nodes; Flower's weighted average of the replies is then the
    gradient of the mean loss over all training nodes, and the server applies it with
    ``torch.optim.Adam(lr)``, whose state persists across rounds. Full batch, this is the
    centralized trajectory (:func:`fedgraph.methods.gap.fit`, one round per epoch).

    What leaves a client: one gradient per round, where FedAvg sends weights after local
    steps; both are functions of the same inputs, so the privacy analysis is the FedAvg one.

    With ``select_on_val`` a round's validation travels with the next round's training
    message: from round 2 on the train config says ``evaluate = True`` and each client adds
    to its reply's metrics ``val-accuracy``, ``val-loss`` and ``val-examples`` (the count) of
    the weights it received (the previous round's result; :func:`selection_key`); only the
    last round's weights get an evaluation round of their own. The same metrics of the same
    weights as one evaluation round per round, in half the exchanges.

    Args:
        num_clients, select_on_val: as for :class:`StrictFedAvg`.
        lr: the server Adam's learning rate (the centralized optimizer's).
        keep_gradients: keep every round's averaged gradient in ``self.gradients`` (a list of
            ``{name: tensor}``; tests and diagnostics).
        param_names: the state-dict entries that are parameters (a client sends their
            gradients); every other entry not :attr:`frozen` is a buffer (batch norm's running
            statistics, which a client sends as updated by its forward pass): the server keeps
            their weighted mean, in the buffer's dtype. ``None``: every entry is a parameter.
        weight_decay: the server Adam's (L2) weight decay (``torch.optim.Adam``'s).
        frozen: entries sent but not trained (the clients need not return them; kept as sent).
    """

    def __init__(
        self,
        num_clients: int,
        select_on_val: bool = False,
        *,
        lr: float,
        keep_gradients: bool = False,
        param_names=None,
        weight_decay: float = 0.0,
        frozen=(),
    ):
        super().__init__(num_clients, select_on_val)
        self.lr = lr
        self.weight_decay = weight_decay
        self.frozen = frozenset(frozen)
        self.keep_gradients = keep_gradients
        self.param_names = None if param_names is None else set(param_names)
        self.gradients: list[dict] = []
        self._params = None  # name -> float tensor, the weights the server steps
        self._buffers = None  # name -> tensor
        self._adam = None
        self._num_rounds = None
        self._sent = None  # the weights of the current round's training messages

    #: a fused round's training metrics that validate the received weights
    VAL_METRICS = ("val-accuracy", "val-loss", "val-examples")

    def start(self, grid, initial_arrays, num_rounds: int = 3, *args, **kwargs):
        self._num_rounds = num_rounds
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def _fused(self, server_round: int) -> bool:
        """Whether round ``server_round``'s training messages also validate their weights."""
        return self.fraction_evaluate > 0.0 and server_round > 1

    def _validated_next_round(self, server_round: int) -> bool:
        """Whether the weights after ``server_round`` are validated by the next round's
        training messages (every round but the last), not by an evaluation round."""
        return self._fused(server_round + 1) and server_round < (self._num_rounds or 0)

    def configure_evaluate(self, server_round, arrays, config, grid):
        if self._validated_next_round(server_round):
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        if self._validated_next_round(server_round):
            return None
        return super().aggregate_evaluate(server_round, replies)

    def configure_train(self, server_round, arrays, config, grid):
        from flwr.app import ConfigRecord

        if self._fused(server_round):
            config = ConfigRecord({**dict(config.items()), "evaluate": True})
        self._sent = arrays
        if self._params is None:
            import torch

            state = arrays.to_torch_state_dict()
            names = set(state) if self.param_names is None else self.param_names
            self._params = {
                k: v.detach().clone().requires_grad_(True)
                for k, v in state.items()
                if k in names and k not in self.frozen
            }
            self._buffers = {
                k: v.clone() for k, v in state.items() if k not in names and k not in self.frozen
            }
            self._adam = torch.optim.Adam(
                list(self._params.values()), lr=self.lr, weight_decay=self.weight_decay
            )
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        from flwr.app import ArrayRecord

        replies = sorted(replies, key=lambda r: r.metadata.src_node_id)  # (see _Strict's)
        mean, metrics = super().aggregate_train(server_round, replies)
        if self._fused(server_round):  # the validation of the weights sent (round - 1's)
            contents = [r.content for r in replies]
            missing = [
                k
                for k in self.VAL_METRICS
                if any(k not in next(iter(c.metric_records.values())) for c in contents)
            ]
            if missing:
                raise ClientFailure(
                    f"train round {server_round}: replies without {missing} "
                    "(the validation of the weights they received)"
                )
            self._consider(server_round - 1, selection_key(contents, "val-examples"), self._sent)
            for k in self.VAL_METRICS:  # not training metrics (Flower weighted them by them)
                metrics.pop(k, None)
        mean = {k: v for k, v in mean.to_torch_state_dict().items() if k not in self.frozen}
        if set(mean) != set(self._params) | set(self._buffers):
            raise ClientFailure(
                f"train round {server_round}: the reply's names {sorted(mean)} "
                f"differ from the model's "
                f"{sorted(set(self._params) | set(self._buffers))}"
            )
        for k, p in self._params.items():
            p.grad = mean[k].to(p.dtype).reshape(p.shape)
        self._adam.step()
        for k, b in self._buffers.items():
            v = mean[k].reshape(b.shape)
            self._buffers[k] = (v.round() if not b.is_floating_point() else v).to(b.dtype)
        if self.keep_gradients:
            self.gradients.append({k: mean[k].clone() for k in self._params})
        arrays = self._keep_frozen(
            ArrayRecord(
                {
                    **{k: p.detach().clone() for k, p in self._params.items()},
                    **{k: b.clone() for k, b in self._buffers.items()},
                }
            )
        )
        self._latest = arrays
        return arrays, metrics


#: ``server-optimizer`` names -> strict strategy classes.
STRICT_STRATEGIES = {
    "fedavg": StrictFedAvg,
    "fedavgm": StrictFedAvgM,
    "fedadam": StrictFedAdam,
    "fedyogi": StrictFedYogi,
}


def strict_strategy(
    server_optimizer: str,
    num_clients: int,
    select_on_val: bool = False,
    server_lr: float | None = None,
):
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
        raise ValueError(
            f"server-optimizer: unknown {server_optimizer!r}; allowed: "
            + ", ".join(STRICT_STRATEGIES)
        )
    cls = STRICT_STRATEGIES[server_optimizer]
    kwargs: dict = {}
    if cls is StrictFedAvgM:
        kwargs["server_momentum"] = 0.9
        if server_lr is not None:
            kwargs["server_learning_rate"] = server_lr
    elif cls is not StrictFedAvg and server_lr is not None:
        kwargs["eta"] = server_lr
    return cls(num_clients, select_on_val, **kwargs)


#: Flower strategies that aggregate something other than torch weights (XGBoost's trees, one
#: byte array per reply): they cannot drive a GNN's rounds
NOT_WEIGHT_STRATEGIES = ("FedXgbBagging", "FedXgbCyclic")


def flower_strategies() -> dict[str, type]:
    """Lower-case name -> class of every strategy class :mod:`flwr.serverapp.strategy` exports
    that needs no constructor argument and averages weights (``fedavg``, ``fedprox``,
    ``fedadam``, ``krum``, ...; not :data:`NOT_WEIGHT_STRATEGIES`)."""
    import flwr.serverapp.strategy as flower

    out = {}
    for name in flower.__all__:
        obj = getattr(flower, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, flower.Strategy)
            and obj is not flower.Strategy
            and not _required_parameters(obj)
            and name not in NOT_WEIGHT_STRATEGIES
        ):
            out[name.lower()] = obj
    return out


def _required_parameters(cls: type) -> list[str]:
    """The constructor parameters without a default (the differential-privacy wrappers need
    the ``strategy`` they wrap: not a round strategy by name)."""
    return [
        p.name
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def resolve_round_strategy(spec: str) -> type:
    """The Flower strategy class of ``round-strategy``: a name of :func:`flower_strategies`
    (any case) or an import path ``package.module:Class`` / ``path/to/file.py:Class``.

    Raises:
        ValueError: unknown name (the message lists the allowed ones), an import path that does
            not resolve, or a class that is not a :class:`flwr.serverapp.strategy.Strategy`.
    """
    from flwr.serverapp.strategy import Strategy

    from fedgraph.registry import import_object

    spec = spec.strip()
    if ":" in spec:
        cls = import_object(spec, "round-strategy")
    else:
        known = flower_strategies()
        if spec.lower() in {n.lower() for n in NOT_WEIGHT_STRATEGIES}:
            raise ValueError(
                f"round-strategy: {spec!r} aggregates XGBoost trees (one byte array "
                "per reply), not a GNN's weights; allowed: " + ", ".join(sorted(known))
            )
        if spec.lower() not in known:
            raise ValueError(
                f"round-strategy: unknown {spec!r}; allowed: a Flower strategy ("
                + ", ".join(sorted(known))
                + ") or an import path "
                "package.module:Class / path/to/file.py:Class"
            )
        cls = known[spec.lower()]
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ValueError(
            f"round-strategy: {spec!r} is not a subclass of "
            f"flwr.serverapp.strategy.Strategy (got {cls!r})"
        )
    if inspect.isabstract(cls):
        raise ValueError(
            f"round-strategy: {spec!r} ({cls.__qualname__}) does not implement "
            + ", ".join(sorted(cls.__abstractmethods__))
        )
    return cls


def strict_class(cls: type) -> type:
    """``cls`` with the :class:`_Strict` behaviour (fail loudly, every sampled client replies,
    ``on_train_reply``, ``select_on_val``); a strict class is returned as it is."""
    if issubclass(cls, _Strict):
        return cls
    return type(
        f"Strict{cls.__name__}",
        (_Strict, cls),
        {
            "__module__": cls.__module__,
            "__qualname__": f"Strict{cls.__qualname__}",
            "__doc__": f"{cls.__qualname__} made strict (:class:`fedgraph.strategies.fedavg._Strict`).",
        },
    )


def round_strategy(spec: str, args: dict, num_clients: int, select_on_val: bool = False):
    """The strict Flower strategy of ``round-strategy`` ``spec`` built with ``args``
    (``round-strategy-args``): its constructor's keywords, over fedgraph's defaults (all
    ``num_clients`` clients every round, ``min_train_nodes = max(1, int(num_clients *
    fraction_train))``, evaluation every round iff ``select_on_val``).

    Raises:
        ValueError: :func:`resolve_round_strategy`'s, the constructor refused ``args`` (named
            ``round-strategy-args``), or it raised (named ``round-strategy``, the error as the
            cause).
    """
    cls = strict_class(resolve_round_strategy(spec))
    name = cls.__qualname__.removeprefix("Strict")
    try:
        return cls(num_clients, select_on_val, **args)
    except TypeError as err:
        raise ValueError(f"round-strategy-args: {name} refused {args}: {err}") from None
    except Exception as err:  # noqa: BLE001 - a user's constructor: named, its traceback kept
        raise ValueError(
            f"round-strategy: {spec!r} ({name}) failed in its constructor with "
            f"round-strategy-args {args}: {type(err).__name__}: {err}"
        ) from err


def client_sampling_note(cfg) -> str | None:
    """The report's ``privacy.client_sampling`` when ``round-strategy-args``' ``fraction_train``
    samples the clients (any method with ``round-strategy``); ``None`` otherwise."""
    fraction = cfg.round_strategy_args.get("fraction_train", 1.0)
    if fraction >= 1:
        return None
    n = cfg.num_clients
    k = max(1, int(n * fraction))  # Flower's sample size with fedgraph's min_train_nodes
    return (
        f"fraction_train {fraction}: each round the server samples {k} of its {n} clients "
        "(max(1, int(fraction_train x clients)); a public choice, seeded from the run's "
        "seed); a client not sampled releases nothing in that "
        "round and the ledger records only the rounds each client took part in. Each "
        "client's guarantee is over its own releases: no amplification by client sampling "
        "is claimed (it would hold only for a guarantee over the union of the clients' "
        "data, and only if the sampling were secret)"
    )
