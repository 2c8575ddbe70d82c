"""Base class of fedgraph's private strategies: config, privacy ledger, phases and report.

A strategy subclasses :class:`PrivateStrategy` and implements :meth:`run`, which talks to the
clients through the Flower ``grid`` (``grid.send_and_receive`` or a built-in Flower strategy's
``start``), records every release in ``self.ledger`` and fills ``self.report``. :meth:`start`
writes the JSON report atomically whether the run succeeds or fails, prints the table, and
re-raises a failure so that the ServerApp (and ``fedgraph run``) fail loudly.
"""
from __future__ import annotations

import importlib
import time
import traceback
from abc import ABC, abstractmethod
from pathlib import Path

from fedgraph.accounting import PrivacyLedger
from fedgraph.report import RunReport, format_table


class PrivateStrategy(ABC):
    """Server side of a private federated graph-learning method.

    Args:
        config: the validated method config (a :mod:`fedgraph.config` model).
    """

    method: str = "abstract"
    #: delta at which the report composes non-pure events (a strategy sets its own).
    privacy_delta: float = 1e-6
    #: accountant the report composes with (the cross-check uses an independent one).
    privacy_accountant: str = "prv"

    def __init__(self, config):
        self.config = config
        self.ledger = PrivacyLedger()
        self.report = RunReport(self.method, config.model_dump())

    @abstractmethod
    def run(self, grid) -> None:
        """All phases of the method. Fill ``self.report`` and ``self.ledger``."""

    def record_accuracy(self, counts: dict, statistics: dict) -> None:
        """Accuracy per split from the clients' ``<split>_correct`` / ``<split>_total`` counts
        (test labels never leave the clients), and the majority-class rate for reference."""
        for split in ("train", "val", "test"):
            correct = sum(int(c["metrics"][f"{split}_correct"]) for c in counts.values())
            total = sum(int(c["metrics"][f"{split}_total"]) for c in counts.values())
            self.report.accuracy[split] = correct / total if total else float("nan")
        class_counts = statistics["class_counts"]
        self.report.accuracy["majority_class"] = max(class_counts) / sum(class_counts)

    def report_path(self) -> Path:
        name = self.config.run_name or (
            f"{self.method}-{self.config.dataset.replace(':', '_')}-seed{self.config.seed}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}")
        return Path(self.config.output_dir).expanduser().resolve() / f"{name}.json"

    def start(self, grid) -> dict:
        """Run all phases, write the report (also on failure), print the table.

        Raises:
            Exception: whatever a phase raised, after the report recorded it as failed.
        """
        try:
            self.run(grid)
            self.report.status = "ok"
        except BaseException as err:
            self.report.status = "failed"
            self.report.error = f"{type(err).__name__}: {err}"
            self.report.extra["traceback"] = traceback.format_exc()
            raise
        finally:
            self.report.privacy["per_subject"] = self.ledger.summary(delta=self.privacy_delta, accountant=self.privacy_accountant)
            path = self.report_path()
            self.report.write(path.parent, path.stem)
            print(format_table(self.report.to_dict()))
            print(f"report: {path}")
        return self.report.to_dict()


STRATEGIES: dict[str, type[PrivateStrategy]] = {}


def register_strategy(name: str):
    """Class decorator: make a strategy selectable by ``method = name``."""
    def deco(cls):
        STRATEGIES[name] = cls
        return cls
    return deco


def resolve_strategy(spec: str) -> type[PrivateStrategy]:
    """A registered name or an import path ``"pkg.module:Class"``.

    Raises:
        ValueError: the name is unknown, the path does not resolve, or the class is not a
            :class:`PrivateStrategy`.
    """
    if ":" not in spec:
        if spec not in STRATEGIES:
            raise ValueError(f"strategy: unknown {spec!r}; registered: {sorted(STRATEGIES)} "
                             "or an import path 'package.module:Class'")
        return STRATEGIES[spec]
    module, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"strategy: cannot import {spec!r}: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, PrivateStrategy)):
        raise ValueError(f"strategy: {spec!r} is not a subclass of strategies.PrivateStrategy")
    return cls
