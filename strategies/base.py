"""Base class of fedgraph's private strategies: config, privacy ledger, phases and report.

A strategy subclasses :class:`PrivateStrategy` and implements :meth:`~PrivateStrategy.run`,
which talks to the clients through the Flower ``grid`` (:meth:`~PrivateStrategy.ask`, i.e.
``grid.send_and_receive``, or a built-in Flower strategy's ``start``), records every release
in ``self.ledger`` and fills ``self.report``. :meth:`~PrivateStrategy.start` writes the JSON
report atomically whether the run succeeds or fails, prints the table, and re-raises a failure
so that the ServerApp (and ``fedgraph run``) fail loudly.

The privacy contract, checked when :meth:`~PrivateStrategy.run` returns
(:meth:`~PrivateStrategy.check_contract`): the ledger holds at least one release and the
report has a test accuracy in ``[0, 1]``. A strategy is selected with ``strategy = "name"``
(:func:`register_strategy`) or ``strategy = "package.module:Class"``; see
``docs/extending.md``.
"""

from __future__ import annotations

import json
import math
import traceback
from abc import ABC, abstractmethod
from pathlib import Path

import torch

from fedgraph.accounting import PrivacyLedger
from fedgraph.randomness import describe as describe_noise_source
from fedgraph.registry import ContractError, Registry, spec_label
from fedgraph.report import RunReport, format_table


def check_method(strategy: type, config) -> None:
    """Refuse a run config whose ``method`` is not the strategy class's ``config_method``
    (checked before the run starts: :func:`fedgraph.simulations.server_app.validate_run_config`; and
    by :meth:`PrivateStrategy.check_config`).

    Raises:
        fedgraph.config.ConfigError: naming ``method``, the strategy and both methods.
    """
    from fedgraph.config import ConfigError

    want = getattr(strategy, "config_method", None)
    have = getattr(config, "method", None)
    if want is not None and have != want:
        raise ConfigError(
            f"method: strategy {strategy.__qualname__} needs "
            f"method = {want!r} (its config and client handlers), got {have!r}"
        )


class PrivateStrategy(ABC):
    """Server side of a private federated graph-learning method.

    Class attributes a subclass may set:

    * ``method``: the name in the report and the report's file name (default: the class
      name, lower case).
    * ``config_method``: the run config's ``method`` this strategy needs (``"ppgnn"``,
      ``"gap"``: it decides which keys the config has and which client handlers answer);
      ``None``: any.
    * ``privacy_delta``, ``privacy_accountant``: delta and accountant at which the report
      composes the ledger's events when the run config has no ``delta`` / ``accountant`` (a
      config's own values win: :meth:`privacy_parameters`).

    Args:
        config: the validated run config (a :mod:`fedgraph.config` model, e.g.
            :class:`~fedgraph.config.PPGNNConfig`).
    """

    method: str = "abstract"
    config_method: str | None = None
    #: delta at which the report composes non-pure events when the config has no ``delta``.
    privacy_delta: float = 1e-6
    #: accountant the report composes with when the config has no ``accountant`` (the
    #: cross-check uses an independent one).
    privacy_accountant: str = "prv"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "method" not in cls.__dict__:
            cls.method = cls.__name__.lower()

    def __init__(self, config):
        self.config = config
        self.ledger = PrivacyLedger()
        #: the clients' own ledger summaries, subject -> summary (:meth:`note_client_ledgers`)
        self.client_ledgers: dict[str, dict] = {}
        self.report = RunReport(self.method, config.model_dump())
        self.nodes: list[int] = []

    @abstractmethod
    def run(self, grid) -> None:
        """All phases of the method. Record every release in ``self.ledger`` and set
        ``self.report.accuracy`` (e.g. with :meth:`record_accuracy`)."""

    # ------------------------------------------------------------------ helpers for run()
    def connect(self, grid) -> list[int]:
        """Wait until ``config.num_clients`` supernodes are connected (phase ``connect``,
        at most ``min(timeout, 60)`` seconds); returns and keeps their ids in ``self.nodes``.

        Raises:
            fedgraph.errors.ClientFailure: too few or too many supernodes.
        """
        from fedgraph.messaging import wait_for_nodes

        with self.report.phase("connect"):
            self.nodes = wait_for_nodes(
                grid, self.config.num_clients, timeout=min(self.config.timeout, 60.0)
            )
        return self.nodes

    def ask(
        self, grid, message_type: str, records: dict | None = None, per_node: dict | None = None
    ) -> dict:
        """Send ``message_type`` (e.g. ``"query.ppgnn"``) to every node of :meth:`connect`
        and wait for all replies (``config.timeout`` seconds).

        Every message carries the run config as ``content["config"]["json"]`` (what the
        client handlers read), plus ``records`` (name -> Flower record, the same for every
        node) and ``per_node[node][name]`` (a record for one node).

        Returns:
            node id -> reply content (a ``RecordDict``).
        Raises:
            fedgraph.errors.ClientFailure: a client failed or timed out (one line per
                distinct cause).
        """
        from flwr.app import ConfigRecord, RecordDict

        from fedgraph.messaging import send_to_all

        if not self.nodes:
            raise RuntimeError("call self.connect(grid) before self.ask(...)")
        payload = ConfigRecord({"json": json.dumps(self.config.model_dump())})
        contents = {
            n: RecordDict({"config": payload, **(records or {}), **((per_node or {}).get(n, {}))})
            for n in self.nodes
        }
        return send_to_all(grid, message_type, contents, self.config.timeout)

    def send_and_record(
        self,
        grid,
        message_type: str,
        contents: dict,
        record,
        on_reply=None,
        pushed: dict | None = None,
    ) -> dict:
        """:func:`fedgraph.messaging.send_to_all`, calling ``record(node, reply)`` for every
        reply that arrived, also when other clients failed (their releases left them: the
        ledger must hold them before the failure propagates). A ``record`` that raises (e.g.
        a malformed reply) does not keep the other replies from being recorded; the first such
        error is raised after all of them, before a client failure. ``on_reply`` and
        ``pushed``: as :func:`~fedgraph.messaging.send_to_all`'s (the server's work on each
        reply as it arrives; messages of this exchange sent ahead).

        Returns:
            node id -> reply content.
        Raises:
            fedgraph.errors.ClientFailure: a client failed or timed out.
        """
        from fedgraph.errors import ClientFailure
        from fedgraph.messaging import send_to_all

        failure = None
        try:
            replies = send_to_all(
                grid, message_type, contents, self.config.timeout, on_reply=on_reply, pushed=pushed
            )
        except ClientFailure as err:
            replies, failure = err.replies, err
        errors = []
        self.note_client_ledgers(replies)
        for node, reply in replies.items():
            try:
                record(node, reply)
            except Exception as err:  # noqa: BLE001 - re-raised below, after the others
                errors.append(err)
        if errors:
            raise errors[0]
        if failure is not None:
            raise failure
        return replies

    def privacy_parameters(self) -> tuple[float, str]:
        """``(delta, accountant)`` at which the report composes and cross-checks the ledger:
        the run config's ``delta`` and ``accountant`` where it has them (the delta the clients
        calibrated for), else :attr:`privacy_delta` / :attr:`privacy_accountant`."""
        return (
            float(getattr(self.config, "delta", None) or self.privacy_delta),
            str(getattr(self.config, "accountant", None) or self.privacy_accountant),
        )

    def record_accuracy(self, counts: dict, statistics: dict | None = None) -> None:
        """Accuracy per split from the clients' ``<split>_correct`` / ``<split>_total`` counts
        (test labels never leave the clients). The majority-class rate, a function of every
        label, is not released: the simulation harness puts it in the report's
        ``ground_truth`` (:meth:`start`'s ``ground_truth``).

        Args:
            counts: node id -> reply content with a ``"metrics"`` record holding
                ``train_correct``, ``train_total``, ``val_correct``, ... (what the
                ``evaluate.<method>`` handlers return).
            statistics: unused (kept for strategies written against the older signature).
        """
        self.note_client_ledgers(counts)
        for split in ("train", "val", "test"):
            correct = sum(int(c["metrics"][f"{split}_correct"]) for c in counts.values())
            total = sum(int(c["metrics"][f"{split}_total"]) for c in counts.values())
            self.report.accuracy[split] = correct / total if total else float("nan")

    def note_client_ledgers(self, replies: dict) -> None:
        """Keep the clients' own ledger summaries (record ``ledger`` of a reply: the client's
        epsilon, budget and releases per subject, :mod:`fedgraph.client_authority`), the
        latest per subject, for the report's ``privacy.client_ledgers``."""
        import json

        for reply in replies.values():
            try:
                if "ledger" in reply:
                    self.__dict__.setdefault("client_ledgers", {}).update(
                        json.loads(str(reply["ledger"]["json"]))
                    )
            except (TypeError, ValueError, KeyError):  # a malformed record: no ledger to show
                continue

    def client_ledger_rows(self, per_subject: dict) -> dict:
        """subject -> ``{"client", "server", "budget", "agree"}``: each client's own epsilon
        beside the server's ledger (``per_subject``), ``agree`` within the cross-check's
        tolerance (:data:`fedgraph.accounting.ledger.AGREE_RTOL`; both compose the same events
        at the same delta on an honest run)."""
        from fedgraph.accounting.ledger import AGREE_ATOL, AGREE_RTOL

        rows = {}
        for subject, mine in sorted(getattr(self, "client_ledgers", {}).items()):
            server = (per_subject.get(subject) or {}).get("epsilon")
            client = mine.get("epsilon")
            agree = (
                server is not None
                and client is not None
                and abs(float(server) - float(client))
                <= AGREE_ATOL + AGREE_RTOL * abs(float(server))
            )
            rows[subject] = {
                "client": client,
                "server": server,
                "budget": mine.get("budget"),
                "releases": mine.get("releases"),
                "agree": bool(agree),
            }
        return rows

    # ------------------------------------------------------------------ contract and report
    def check_config(self) -> None:
        """Called by :meth:`start` before :meth:`run`.

        Raises:
            fedgraph.config.ConfigError: the run config's ``method`` is not
                ``config_method``.
        """
        check_method(type(self), self.config)

    def check_contract(self) -> None:
        """Called by :meth:`start` after :meth:`run` returned: what every run must deliver.

        Raises:
            ContractError: the privacy ledger is empty (a strategy must record every release,
                ``self.ledger.record(subject, release, event)``), or the report has no test
                accuracy in ``[0, 1]``.
        """
        name = type(self).__qualname__
        if not self.ledger.subjects:
            raise ContractError(
                f"strategy {name} finished with an empty privacy ledger: record every release "
                "that leaves a client with self.ledger.record(subject, release, event), e.g. "
                "self.ledger.record('client-0', 'features', PureDP(1.0))"
            )
        test = self.report.accuracy.get("test")
        if test is None:
            raise ContractError(
                f"strategy {name} finished without a test accuracy "
                f"(report.accuracy = {self.report.accuracy}); set it, e.g. with "
                "self.record_accuracy(counts) on the clients' evaluate replies"
            )
        if (
            not isinstance(test, (int, float))
            or isinstance(test, bool)
            or math.isnan(test)
            or not 0.0 <= test <= 1.0
        ):
            raise ContractError(
                f"strategy {name}: test accuracy {test!r} is not a fraction in [0, 1]"
            )

    def _privacy_summary(self) -> dict:
        """The ledger's ``per_subject`` rows at the run's delta and accountant."""
        delta, accountant = self.privacy_parameters()
        return self.ledger.summary(delta, accountant)

    def report_path(self) -> Path:
        from fedgraph.report import default_run_name

        name = self.config.run_name or default_run_name(
            self.method, spec_label(self.config.dataset), self.config.seed
        )
        return Path(self.config.output_dir).expanduser().resolve() / f"{name}.json"

    def start(self, grid, ground_truth: dict | None = None) -> dict:
        """Check the config, run all phases, check the contract, write the report (also on
        failure) and print the table.

        ``ground_truth``: the simulation's statistics of the whole graph
        (:func:`fedgraph.data.dataset_statistics`, computed by the harness that loaded it:
        the ServerApp's preflight, :func:`fedgraph.simulations.local.run_local`). It is written to the
        report's ``ground_truth`` (:func:`fedgraph.report.ground_truth`) only after
        :meth:`run` has returned or failed: the strategy never sees it.

        Returns:
            the report as a dict.
        Raises:
            Exception: whatever a phase or a check raised (among them
                :func:`check_budgets_kept`: a subject over its budget), after the report
                recorded it as failed.
        """
        per_subject = None
        try:
            self.check_config()
            # Server-side randomness (initialisation, sampling) follows the run's seed, so a
            # strategy is reproducible without seeding it itself.
            torch.manual_seed(self.config.seed)
            self.run(grid)
            self.check_contract()
            per_subject = self._privacy_summary()
            check_budgets_kept(per_subject, type(self).__qualname__)
            self.report.status = "ok"
            not_dp = sorted(s for s, r in per_subject.items() if r.get("not_dp"))
            if not_dp:  # a mode chosen knowing it has no finite epsilon (check_budgets_kept)
                reason = self.report.privacy.get("not_dp_reason") or "no finite epsilon"
                self.report.extra["status_note"] = (
                    f"NOT DP: {', '.join(not_dp)} released without a finite epsilon, as "
                    f"the run config asked ({reason})"
                )
        except BaseException as err:
            from fedgraph.errors import RunInterrupted

            interrupted = isinstance(err, (RunInterrupted, KeyboardInterrupt))
            self.report.status = "interrupted" if interrupted else "failed"
            self.report.error = f"{type(err).__name__}: {err}"
            self.report.extra["traceback"] = traceback.format_exc()
            raise
        finally:
            self.report.privacy["per_subject"] = (
                per_subject if per_subject is not None else self._privacy_summary()
            )
            # the clients' own ledgers beside the server's (fedgraph.client_authority)
            self.report.privacy["client_ledgers"] = self.client_ledger_rows(
                self.report.privacy["per_subject"]
            )
            delta, accountant = self.privacy_parameters()
            self.report.privacy["composed_at"] = {"delta": delta, "accountant": accountant}
            # where the clients' noise came from (fedgraph.randomness); never the secret itself
            self.report.privacy["noise_source"] = self.config.noise_source
            self.report.privacy["noise_source_detail"] = describe_noise_source(
                self.config.noise_source
            )
            if ground_truth is not None:
                from fedgraph.report import ground_truth as truth

                self.report.extra["ground_truth"] = truth(ground_truth)
            path = self.report_path()
            self.report.write(path.parent, path.stem)
            print(format_table(self.report.to_dict()))
            print(f"report: {path}")
        return self.report.to_dict()


def check_budgets_kept(per_subject: dict, strategy: str = "") -> None:
    """Fail a run that spent more than a subject's budget (``ledger.set_budget``): its report
    is still written, with the subject flagged ``over_budget``, but the run is ``failed``, not
    ``ok``, and exits non-zero. The built-in methods calibrate within their budgets, so this
    only catches a strategy or mechanism that does not.

    Raises:
        ContractError: naming each subject over budget with its epsilon and budget.
    """
    over = {s: r for s, r in per_subject.items() if r.get("over_budget")}
    # A release the user chose knowing it is not DP (a documented reproduction mode, such as
    # PrivGNN's answer-mode log-softmax-paper: recorded unprotected with the claim of the paper
    # it reproduces) has no finite epsilon: it runs, and its row and the report's status say
    # plainly that it is not DP. Only an unintended overspend fails the run.
    for s, r in list(over.items()):
        if r.get("claimed") and math.isinf(r.get("epsilon", 0.0)):
            r["not_dp"] = True
            del over[s]
    if over:
        rows = "; ".join(
            f"{s}: epsilon {r['epsilon']:.4g} > budget {r['budget']:g}" for s, r in over.items()
        )
        raise ContractError(
            f"strategy {strategy or 'the run'} spent more than a privacy "
            f"budget ({rows}): the guarantee asked for does not hold"
        )


def relayed_keys(replies: dict, nodes: list[int]) -> dict:
    """Secure aggregation's key list as the server relays it: the clients' ``query.<method>_keys``
    replies (``public-key``, ``partition-id``, ``signature``), by client index (``nodes``'
    order), unchanged: ``{"public-keys", "partition-ids", "signatures"}``; every client's
    request adds its own ``index`` (:func:`secagg_record`).

    The server only relays: each client signed its public key under an identity key
    provisioned outside the server, and every client checks every signature against its own
    directory of identity keys before it masks
    (:func:`fedgraph.secure_aggregation.verify_key_list`). The server code never reads the
    provisioning (identity keys, directory, the simulation's provisioning secret), so a
    server that substitutes or reorders keys is refused, not trusted."""
    recs = [replies[n]["secagg"] for n in nodes]
    return {
        "public-keys": [bytes(r["public-key"]) for r in recs],
        "partition-ids": [int(r["partition-id"]) for r in recs],
        "signatures": [bytes(r["signature"]) for r in recs],
    }


def secagg_record(keys: dict, index: int):
    """The ``secagg`` record of one client's request: the relayed key list
    (:func:`relayed_keys`) and the client's ``index`` in it."""
    from flwr.app import ConfigRecord

    return ConfigRecord({**keys, "index": int(index)})


def _check_strategy(cls, name: str) -> None:
    """Registry check: a concrete subclass of :class:`PrivateStrategy`."""
    if not (isinstance(cls, type) and issubclass(cls, PrivateStrategy)):
        raise ContractError(
            f"strategy: {name!r} is not a subclass of fedgraph.strategies.PrivateStrategy "
            f"(got {getattr(cls, '__qualname__', type(cls).__name__)})"
        )
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ContractError(
            f"strategy: {name!r} ({cls.__qualname__}) does not implement {', '.join(missing)}"
        )


#: name -> strategy class (``method`` names select theirs: ``ppgnn``, ``gap``).
STRATEGIES: Registry = Registry(
    "strategy", check=_check_strategy, hint="See docs/extending.md, 'A strategy'."
)


def register_strategy(name: str, *, replace: bool = False):
    """Class decorator: make a strategy selectable by ``strategy = name`` (and, for the
    built-in methods, ``method = name``).

    Raises:
        ContractError: the class is not a concrete :class:`PrivateStrategy` subclass.
        ValueError: ``name`` is taken by another class (pass ``replace=True``).
    """
    return STRATEGIES.register(name, replace=replace)


def resolve_strategy(spec: str) -> type[PrivateStrategy]:
    """A registered name or an import path ``"pkg.module:Class"``.

    Raises:
        ValueError: the name is unknown (the message lists the registered names) or the path
            does not resolve.
        ContractError: the class is not a concrete :class:`PrivateStrategy` subclass.
    """
    return STRATEGIES.resolve(spec)
