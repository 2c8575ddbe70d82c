"""Flower's flat run config onto its method's model: :func:`parse_run_config` (the method ->
model registry :data:`METHOD_CONFIGS`), and the keys a run sets that its method would ignore
(:func:`reject_keys_of_other_methods`).

Flower's run config is flat (``key = value`` with ``-`` in keys); :func:`parse_run_config`
maps it onto the models and turns validation errors into :class:`ConfigError` messages that
name the key and the allowed values.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from .base import _Base
from .gap import GAPConfig
from .ppgnn import MAX_STEPS, PPGNNConfig
from .privgnn import PrivGNNConfig
from .progap import ProGAPConfig

METHOD_CONFIGS: dict[str, type[_Base]] = {
    "ppgnn": PPGNNConfig,
    "gap": GAPConfig,
    "privgnn": PrivGNNConfig,
    "progap": ProGAPConfig,
}


def method_of(run_config: dict[str, Any]) -> str:
    """The method a flat run config selects: ``strategy`` if it names a method (``ppgnn``,
    ``gap``, ``privgnn``), else ``method`` (default ``ppgnn``); not validated here."""
    strategy = str(dict(run_config).get("strategy", "") or "")
    return strategy if strategy in METHOD_CONFIGS else str(dict(run_config).get("method", "ppgnn"))


#: the allowed values of list keys (checked by their validators), for the non-finite check
RANGES = {
    "budgets": "comma-separated epsilons in (0, inf), strictly increasing",
    "level_shares": "comma-separated shares >= 0 summing to 1, one per level",
    "steps": f"comma-separated integers in [0, {MAX_STEPS}]",
}


def _refuse_two_spellings(run_config: dict[str, Any]) -> None:
    """A key given as both ``a-b`` and ``a_b`` with different values (which one won depended
    on their order) raises :class:`ConfigError` naming it."""
    seen: dict[str, str] = {}
    for key in run_config:
        name = str(key).replace("-", "_")
        other = seen.setdefault(name, str(key))
        if other != str(key) and run_config[other] != run_config[key]:
            raise ConfigError(
                f"{name.replace('_', '-')}: given twice, as {other} = "
                f"{run_config[other]!r} and {key} = {run_config[key]!r}; give it "
                f"once (as {name.replace('_', '-')})"
            )


def parse_run_config(run_config: dict[str, Any]) -> _Base:
    """Validate a flat Flower run config (keys with ``-`` or ``_``) into its method's model:
    ``strategy`` if it names a method (``ppgnn``, ``gap``, ``privgnn``), else ``method``.

    Raises:
        ConfigError: unknown method or key, a value out of range, or one key given in both
            spellings with different values (``encoder-rounds`` and ``encoder_rounds``: which
            one won depended on their order); the message names the key.
    """
    _refuse_two_spellings(run_config)
    cfg = {str(k).replace("-", "_"): v for k, v in dict(run_config).items() if k != "strategy"}
    cfg["method"] = method_of(run_config)
    model = METHOD_CONFIGS.get(cfg["method"])
    text = {k for k, f in (model.model_fields.items() if model else ()) if f.annotation is str}
    for k in text & set(cfg):  # an unquoted number for a text key (--set run-name=123): text
        if isinstance(cfg[k], (int, float)) and not isinstance(cfg[k], bool):
            cfg[k] = str(cfg[k])
    bad = [
        k
        for k, v in cfg.items()
        if isinstance(v, float)
        and not math.isfinite(v)
        or k not in text
        and isinstance(v, str)
        and v.strip().lower() in ("nan", "inf", "-inf", "+inf")
    ]
    if bad and not all(
        k == "client_epsilons" and str(cfg[k]).strip().lower() == "inf" for k in bad
    ):
        raise ConfigError(
            "invalid run config:\n  "
            + "\n  ".join(
                (
                    f"{k.replace('_', '-')}: must be numbers > 0 or inf (no noise), not nan "
                    f"(got {cfg[k]!r})"
                    if k == "client_epsilons"
                    else f"{k.replace('_', '-')}: must be a finite number (got {cfg[k]!r})"
                    + (
                        f"; allowed: {_declared_range(model, k)}"
                        if _declared_range(model, k)
                        else ""
                    )
                )
                for k in bad
            )
        )
    method = cfg["method"]
    if method not in METHOD_CONFIGS:
        raise ConfigError(f"method: unknown {method!r}; allowed: {', '.join(METHOD_CONFIGS)}")
    model = METHOD_CONFIGS[method]
    # Keys declared for another method (pyproject declares them all) are not this method's.
    others = set().union(*(m.model_fields for m in METHOD_CONFIGS.values())) - set(
        model.model_fields
    )
    cfg = {
        k: v
        for k, v in cfg.items()
        if k not in others and not (k in METHOD_DEPENDENT and isinstance(v, str) and not v.strip())
    }
    try:
        return model(**cfg)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = "-".join(str(p) for p in e["loc"]).replace("_", "-") or "config"
            if key == "config":  # a check across fields: the field its message starts with
                field_ = e["msg"].removeprefix("Value error, ").split(":", 1)[0]
                if field_.replace("-", "_") in model.model_fields:
                    key = field_
            if e["type"] == "extra_forbidden":
                known = ["strategy"] + [k.replace("_", "-") for k in model.model_fields]
                lines.append(
                    f"{key}: unknown key{did_you_mean(key, known)}; allowed keys: "
                    f"{', '.join(known)}"
                )
            else:
                got = e.get("input")
                msg = e["msg"].removeprefix("Value error, ")
                msg = msg.removeprefix(f"{key}: ").removeprefix(f"{key.replace('-', '_')}: ")
                if e["type"] == "bool_parsing":
                    msg = "must be true or false"
                # the value already in the message; a bound's digits ("greater than 0") are
                # not the value, so a number out of a range is always shown
                shown = repr(got) in msg and (
                    isinstance(got, str) or e["type"] not in _RANGE_ERRORS
                )
                # a "got <value>" already in the message is enough; pydantic's "got a number
                # with a fractional part" names no value, so that one is still shown
                said = re.search(r"\bgot (?!a |an )", msg) is not None
                if not said and not shown and not isinstance(got, dict):
                    msg += f" (got {got!r})"
                if e["type"] in _RANGE_ERRORS and "allowed" not in msg:
                    allowed = _allowed_range(model, e["loc"])
                    msg += f"; allowed: {allowed}" if allowed else ""
                lines.append(f"{key}: {msg}")
        raise ConfigError("invalid run config:\n  " + "\n  ".join(lines)) from None


def did_you_mean(key: str, known) -> str:
    """`` (did you mean 'x'?)`` for the one ``known`` key closest to a misspelt ``key``, or
    ``""``."""
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return f" (did you mean {near[0]!r}?)" if near else ""


#: pydantic's error types after which the message adds the field's allowed values: a numeric
#: bound (``ge``, ``gt``, ``le``, ``lt``) or a value that is not a number of the field's type
_RANGE_ERRORS = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "int_parsing",
        "int_from_float",
        "float_parsing",
        "int_type",
        "float_type",
    }
)


def _declared_range(model, key: str) -> str | None:
    """:func:`_allowed_range` of ``key`` in ``model``, else in the first method that declares
    it (a key of another method: pyproject declares them all)."""
    declaring = [m for m in (model, *METHOD_CONFIGS.values()) if m and key in m.model_fields]
    return _allowed_range(declaring[0], (key,)) if declaring else None


def _allowed_range(model, loc: tuple) -> str | None:
    """The interval a numeric field's bounds allow, e.g. ``[0, 1)`` or ``[1, inf)``, for an
    error message (:data:`RANGES` for list keys, delta's from the accountants' floor; ``None`` when ``loc`` is
    not one bounded field of ``model``)."""
    info = model.model_fields.get(str(loc[0])) if len(loc) == 1 else None
    if info is None:
        return None
    if str(loc[0]) in RANGES:
        return RANGES[str(loc[0])]
    if str(loc[0]) == "delta":  # checked by accounting's check_delta, not by field bounds
        from ..accounting.accountants import DELTA_FLOOR

        return f"[{DELTA_FLOOR:g}, 1)"
    lo = hi = None
    lo_closed = hi_closed = False
    for m in info.metadata:
        for attr, is_low, closed in (
            ("ge", True, True),
            ("gt", True, False),
            ("le", False, True),
            ("lt", False, False),
        ):
            value = getattr(m, attr, None)
            if value is None:
                continue
            if is_low:
                lo, lo_closed = value, closed
            else:
                hi, hi_closed = value, closed
    if lo is None and hi is None:
        return None

    def num(v) -> str:  # an integer bound in full (a seed's 2^63 - 1), others as %g
        return str(v) if isinstance(v, int) else f"{v:g}"

    left = "(-inf" if lo is None else f"{'[' if lo_closed else '('}{num(lo)}"
    right = "inf)" if hi is None else f"{num(hi)}{']' if hi_closed else ')'}"
    return f"{left}, {right}"


def _method_dependent() -> frozenset[str]:
    """Keys that several methods have with different defaults (e.g. ``delta``: PPGNN 1e-5, GAP
    1e-7, PrivGNN 1e-4). An empty value (``""``) of such a key means the run's method's own
    default: ``pyproject.toml`` declares them so, because ``flwr run`` passes every declared key
    to every run and a declared value would replace the other methods' defaults."""
    fields: dict[str, set] = {}
    for m in METHOD_CONFIGS.values():
        for name, f in m.model_fields.items():
            if name != "method":
                fields.setdefault(name, set()).add(repr(f.get_default(call_default_factory=True)))
    return frozenset(name for name, defaults in fields.items() if len(defaults) > 1)


METHOD_DEPENDENT = _method_dependent()


def keys_of_other_methods(run_config: dict[str, Any]) -> dict[str, list[str]]:
    """Keys of ``run_config`` that its method does not have but another method does, with the
    methods that have them: ``{"budgets": ["ppgnn"]}`` for a GAP run given ``budgets``.

    :func:`parse_run_config` ignores such keys, because ``flwr run`` passes every key
    ``pyproject.toml`` declares to every run; ``fedgraph run`` knows which keys the user set
    (preset and ``--set``) and rejects them with :func:`reject_keys_of_other_methods`.
    """
    method = method_of(run_config)
    if method not in METHOD_CONFIGS:
        return {}  # parse_run_config names the unknown method
    own = set(METHOD_CONFIGS[method].model_fields)
    found = {}
    for key in run_config:
        name = str(key).replace("-", "_")
        if key == "strategy" or name in own:
            continue
        owners = [m for m, model in METHOD_CONFIGS.items() if name in model.model_fields]
        if owners:
            found[str(key)] = owners
    return found


#: (key, value) -> {key set with it that would be ignored: the value it would have to be}
IGNORED_WITH = {("schedule", "fedsgd"): {"local-epochs": 1}}


#: (a key of another method, this method): the key that does the same here
_OWN_KEY = {
    **{
        ("epsilon", m): "client-epsilons, each client's epsilon target"
        for m in ("gap", "progap", "privgnn")
    },
    ("client-epsilons", "ppgnn"): "budgets, the privacy levels' epsilons",
}


def reject_keys_of_other_methods(run_config: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming every key of ``run_config`` that belongs only to
    another method (see :func:`keys_of_other_methods`), or that another key's value makes
    ignored (:data:`IGNORED_WITH`, e.g. ``local-epochs`` other than 1 with ``schedule =
    "fedsgd"``): such a key would be ignored."""
    found = keys_of_other_methods(run_config)
    method = method_of(run_config)
    problems = [
        f"{k}: a key of method {' and '.join(repr(m) for m in owners)}, not of this "
        f"run's method {method!r} (it would be ignored); remove it or set method"
        + (f" (for method {method!r}: {_OWN_KEY[k, method]})" if (k, method) in _OWN_KEY else "")
        for k, owners in found.items()
    ]
    for (key, value), ignored in IGNORED_WITH.items():
        if run_config.get(key) == value:
            problems += [
                f"{k}: ignored with {key} = {value!r} (it would have to be {want!r}); "
                f"set {k}={want!r} or another {key}"
                for k, want in ignored.items()
                if k in run_config and run_config[k] != want
            ]
    if problems:
        raise ConfigError("invalid run config:\n  " + "\n  ".join(problems))
