"""The run configuration's common model: which graph, its split and its clients
(:class:`DataConfig`, every method's model extends it), and the parsers and validators the
methods' models share (number lists, epsilon targets per client, ``delta``, extension names).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..limits import MAX_CLIENTS
from ..secret import RETIRED_NOISE_SOURCES


def _floats(value: Any, allowed: str = "numbers separated by commas, e.g. '1,2,4'") -> list[float]:
    """Parse ``"1,2,4"`` (or a number, or a list) into floats; an empty entry or one that is
    not a number is an error naming ``allowed`` (the key's own values)."""
    if isinstance(value, str):
        if not value.strip():
            return []
        value = value.replace(";", ",").split(",")
        if any(not v.strip() for v in value):
            raise ValueError(f"empty entry in the list {','.join(value)!r} (allowed: {allowed})")
    if isinstance(value, (int, float)):
        value = [value]
    out = []
    for v in value:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            raise ValueError(f"{v!r} is not a number (allowed: {allowed})") from None
    return out


def _client_epsilons(cls, v: Any) -> list[float]:
    """``client-epsilons``: one epsilon target per client (cycled), each in (0, inf]."""
    vals = _floats(v, "numbers > 0 separated by commas, e.g. '1,4,8'; 'inf' for no limit")
    if any(math.isnan(e) for e in vals):
        raise ValueError(
            f"an epsilon is NaN; every epsilon must be a number > 0 (allowed: "
            f"(0, inf], inf: no noise), got {v!r}"
        )
    if not vals or any(not (e > 0) for e in vals):
        raise ValueError(f"every epsilon must be > 0 (allowed: (0, inf]), got {v!r}")
    return vals


def _epsilons_per_client(cls, v: list[float], info) -> list[float]:
    """``client-epsilons`` after parsing: at most one per client (a shorter list is cycled; a
    longer one would leave values unused without a word)."""
    n = info.data.get("num_clients")
    if n is not None and len(v) > n:
        raise ValueError(
            f"{len(v)} values for {n} client(s): give at most one per client "
            "(a shorter list is cycled over the clients)"
        )
    return v


def _delta(cls, v: float) -> float:
    """``delta``: in ``[1e-12, 1)`` (:data:`fedgraph.accounting.DELTA_FLOOR`: below it the
    accountants are not reliable)."""
    from ..accounting.accountants import check_delta

    return check_delta(v, "delta")


def _check_extension(kind: str, spec: str) -> str:
    """``spec`` as the registry of ``kind`` checks it (:meth:`~fedgraph.registry.Registry.
    check_name`); a built-in or unknown name is answered by :mod:`fedgraph.catalog` without
    importing the registry's module (torch), so that ``fedgraph run`` reports a config error
    in well under a second."""
    import importlib

    from .. import catalog

    name = catalog.check_name(kind, spec)
    if name is not None:
        return name
    k = catalog.KINDS[kind]  # registered or "package.module:attribute"
    return getattr(importlib.import_module(k.module), k.attr).check_name(spec)


#: ``round-strategy``'s description (GAP's FedAvg rounds, ProGAP's node-level rounds)
ROUND_STRATEGY_HELP = (
    "a strategy of flwr.serverapp.strategy by name (fedavg, fedavgm, fedprox, fedadam, "
    "fedyogi, fedadagrad, fedmedian, fedtrimmedavg, krum, ...; any case), or a user's Strategy "
    "subclass as package.module:Class or path/to/file.py:Class. Its rounds keep the method's "
    "privacy: every training reply is recorded in the ledger as it arrives "
    "(docs/extending.md)"
)
#: ``round-strategy-args``'s description
ROUND_STRATEGY_ARGS_HELP = (
    "keyword arguments of round-strategy's constructor, a JSON object, e.g. "
    "'{\"proximal_mu\": 0.1}' (FedProx) or '{\"fraction_train\": 0.5}' (half the clients "
    "sampled per round); fraction_train in (0, 1]"
)


def _round_strategy_name(cls, v: str) -> str:
    """``round-strategy``: empty, a Flower strategy's name or an import path."""
    v = v.strip()
    if v and ":" not in v and not v.replace("_", "").isalnum():
        raise ValueError(
            f"expected a Flower strategy name (e.g. fedprox) or an import path "
            f"package.module:Class / path/to/file.py:Class, got {v!r}"
        )
    return v


def _round_strategy_args(cls, v: Any) -> Any:
    """``round-strategy-args`` (before): a JSON object (or a dict) of keyword arguments."""
    import json

    if isinstance(v, str):
        if not v.strip():
            return {}
        try:
            v = json.loads(v)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"expected a JSON object of keyword arguments, e.g. "
                f"'{{\"proximal_mu\": 0.1}}': {err}"
            ) from None
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"expected a JSON object of keyword arguments, got {v!r}")
    return v


def _round_strategy_args_need_a_strategy(cls, v: dict, info) -> dict:
    """``round-strategy-args`` (after): only with ``round-strategy``; ``fraction_train`` in
    (0, 1]."""
    if v and not info.data.get("round_strategy"):
        raise ValueError(
            "has no effect without round-strategy; set round-strategy (e.g. "
            "'fedavg' for client sampling, 'fedprox' for proximal_mu)"
        )
    f = v.get("fraction_train", 1.0)
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1:
        raise ValueError(f"fraction_train must be a number in (0, 1], got {f!r}")
    return v


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Base):
    """Which graph, how it is split into train/val/test, and how it is spread over clients."""

    dataset: str = Field("cora", description="name understood by fedgraph.data.load_dataset")
    data_root: str = Field("", description="dataset root; empty: $FEDGRAPH_DATA or the cache")
    split: Literal["random-50-25-25", "random-75-10-15", "planetoid"] = "random-50-25-25"
    partitioner: str = Field("users", description="random, louvain, label-skew, users")
    num_clients: int = Field(10, ge=1, le=MAX_CLIENTS)
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration for label-skew")
    min_class_size: int = Field(1000, ge=1, description="facebook100: smallest class kept")
    seed: int = Field(0, ge=0, le=2**63 - 1)  # torch's generators take a signed 64-bit seed
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when the process has a GPU (Ray's share), else cpu"
    )
    noise_source: Literal["secure", "secret", "mt19937"] = Field(
        "secure",
        description="where a client's randomness comes from (fedgraph.randomness): "
        "secure (default: an AES-256-CTR CSPRNG keyed from fresh OS entropy, not reproducible), "
        "secret (the same CSPRNG keyed from each client's own secret, reproducible: node "
        "config noise-secret or $FEDGRAPH_NOISE_SECRET, never the run config), mt19937 "
        "(explicit opt-in, NOT a CSPRNG: PyTorch's MT19937 from OS entropy; a server can "
        "recover its state from the pure-noise values the clients release); 'os' (the old "
        "default, MT19937) is refused",
    )

    @field_validator("noise_source", mode="before")
    @classmethod
    def _retired_noise_source(cls, v: Any) -> Any:
        if isinstance(v, str) and v in RETIRED_NOISE_SOURCES:
            raise ValueError(RETIRED_NOISE_SOURCES[v])
        return v

    @field_validator("dataset")
    @classmethod
    def _known(cls, v: str) -> str:
        from .. import catalog  # built-in names without importing torch

        spec = catalog.dataset_spec(v)
        if spec is None:
            from ..data import dataset_spec  # registered or "package.module:loader"

            spec = dataset_spec(v)
        return spec

    @model_validator(mode="after")
    def _files_need_a_root(self):
        """``dataset = "files"`` reads the folder (or ``.pt`` file) ``data-root`` names, not
        ``$FEDGRAPH_DATA``: refused here, before any client or Ray starts."""
        if self.dataset == "files" and not str(self.data_root).strip():
            raise ValueError(
                "data-root: dataset 'files' reads the folder (or .pt file) of the "
                "graph's files named by data-root; set data-root (got nothing)"
            )
        return self

    @field_validator("partitioner")
    @classmethod
    def _partitioner(cls, v: str) -> str:
        return _check_extension("partitioner", v)

    @field_validator("num_clients")
    @classmethod
    def _at_most_one_client_per_node(cls, v: int, info) -> int:
        """At once where the dataset's size is known without loading it (the preflight checks
        every dataset, :func:`fedgraph.federation.preflight`, with the same message)."""
        from .. import catalog

        n = catalog.known_num_nodes(info.data["dataset"]) if "dataset" in info.data else None
        if n is not None and v > n:
            raise ValueError(
                f"must lie in [1, {n}] for dataset {info.data['dataset']!r} (one "
                f"node at least per client), got {v}"
            )
        return v

    @field_validator("run_name", check_fields=False)
    @classmethod
    def _plain_file_name(cls, v: str) -> str:
        """The report is ``<output-dir>/<run-name>.json``: a name, never a path out of it; a
        name given with the ``.json`` suffix means that file (``x.json``, not ``x.json.json``)."""
        if v.lower().endswith(".json"):
            v = v[: -len(".json")]
            if not v:
                raise ValueError("must name the report: '.json' alone leaves no name")
        if v and (v in (".", "..") or "/" in v or "\\" in v or "\0" in v):
            raise ValueError(
                f"must be a plain file name without '/', '\\' or '..' (got {v!r}); "
                "choose the folder with output-dir"
            )
        return v
