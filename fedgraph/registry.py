"""Registries of extension points: names or import paths in the run config -> user code.

fedgraph has four kinds of extensions, each with a :class:`Registry`:

=============  ===============================================  ==================================
kind           registry (register with)                         contract checked by
=============  ===============================================  ==================================
strategy       ``fedgraph.strategies.STRATEGIES`` (``register_strategy``)  ``PrivateStrategy`` subclass, ``run``
mechanism      ``fedgraph.mechanisms.FEATURE_MECHANISMS``         ``fedgraph.mechanisms.check_mechanism``
               (``register_mechanism``)
dataset        ``fedgraph.data.DATASETS`` (``register_dataset``)  ``fedgraph.data.check_graph``
partitioner    ``fedgraph.data.PARTITIONERS``                     ``fedgraph.data.partition``
               (``register_partitioner``)
=============  ===============================================  ==================================

A run-config value selects an extension in one of three ways (:meth:`Registry.resolve`):

1. a registered name (``"ppm"``), registered by fedgraph or by a module already imported;
2. an import path ``"package.module:attribute"`` (the module is imported, registering whatever
   it registers, and the attribute is used; the working directory is searched too, as
   ``python -m`` does) or a file path ``"path/to/file.py:attribute"`` (relative to the working
   directory; config validation makes it absolute, so Flower's client processes load the
   same file);
3. a name published by an installed package under the entry-point group ``fedgraph.<kind>s``
   (``[project.entry-points."fedgraph.mechanisms"] my-rr = "mypkg.mech:make"``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ContractError(ValueError):
    """An extension breaks fedgraph's contract (e.g. a mechanism that declares no privacy
    loss, a dataset whose labels are out of range, a strategy that records no release).

    A subclass of :class:`ValueError`, so the run-config checks (``fedgraph run``: exit 2)
    and the report (``status failed``) treat it like any other invalid input.
    """


def is_file_spec(spec: str) -> bool:
    """True for ``"path/to/file.py:attribute"`` (the module part names a ``.py`` file)."""
    return spec.rpartition(":")[0].strip().endswith(".py")


def split_spec(spec: str) -> tuple[str, str, str]:
    """``(module, ":", attribute)`` of an import path (a file path splits at its last colon,
    a module path at its first: dots may follow the colon); stripped."""
    module, sep, attr = spec.rpartition(":") if is_file_spec(spec) else spec.partition(":")
    return module.strip(), sep, attr.strip()


def canonical_spec(spec: str) -> str:
    """``spec`` with a relative ``.py`` path made absolute (against the working directory),
    so that processes with another working directory (Flower's clients) find the same file."""
    if not is_file_spec(spec):
        return spec.strip()
    module, _, attr = spec.strip().rpartition(":")
    return f"{Path(module.strip()).expanduser().resolve()}:{attr.strip()}"


def spec_label(spec: str) -> str:
    """A file-name-safe short label: ``"data/loader.py:load"`` -> ``"loader_load"``,
    ``"facebook100:Caltech36"`` -> ``"facebook100_Caltech36"``."""
    if is_file_spec(spec):
        module, _, attr = spec.rpartition(":")
        spec = f"{Path(module.strip()).stem}:{attr}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.strip()).strip("_") or "custom"


def import_object(spec: str, kind: str = "object") -> Any:
    """The attribute named by ``"package.module:attribute"`` or ``"path/to/file.py:attribute"``
    (dots allowed after the colon: ``"mod:Class.factory"``).

    A module path: if the module is not importable from ``sys.path``, the current working
    directory is added (as ``python -m`` and ``python -c`` do) and the import is tried again.
    A file path (relative: to the working directory) is loaded once per process as a module
    of its own, whatever the folders around it are called.

    Raises:
        ValueError: ``spec`` is not of either form, the module or file cannot be imported (the
            message carries the error) or has no such attribute.
    """
    module, sep, attr = split_spec(spec)
    if not sep or not module or not attr:
        raise ValueError(
            f"{kind}: {spec!r} is not an import path 'package.module:attribute' "
            "or 'path/to/file.py:attribute'"
        )
    try:
        obj = _import_file(module) if module.endswith(".py") else _import_module(module)
    except (ImportError, SyntaxError) as err:  # a user's file that does not parse, too
        raise ValueError(f"{kind}: cannot import {spec!r}: {type(err).__name__}: {err}") from None
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ValueError(
            f"{kind}: cannot import {spec!r}: module {module!r} has no attribute {attr!r}"
        ) from None
    return obj


def _import_file(path: str):
    """Load ``path`` as the module ``fedgraph_user_<stem>_<hash of the absolute path>``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ImportError(
            f"no file {file} (a relative path is taken from the working directory {os.getcwd()})"
        )
    name = f"fedgraph_user_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        cwd = os.getcwd()
        top = module.split(".")[0]
        if err.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module)


class Registry(dict):
    """``name -> object`` for one kind of extension, with import paths and entry points.

    A ``dict`` subclass: ``name in registry``, ``registry[name]`` and ``sorted(registry)``
    work as before.

    Args:
        kind: what is registered, used in messages and as entry-point group
            ``fedgraph.<kind>s`` (``"mechanism"`` -> ``fedgraph.mechanisms``).
        check: ``check(obj, name)`` called on registration and on every object that
            :meth:`resolve` returns; raises :class:`ContractError` when ``obj`` does not fit.
        hint: appended to the unknown-name message (e.g. where the docs are).
        builtin: names handled outside the registry, listed first (unquoted) in that
            message.
    """

    def __init__(
        self,
        kind: str,
        check: Callable[[Any, str], None] | None = None,
        hint: str = "",
        builtin: tuple[str, ...] = (),
    ):
        super().__init__()
        self.kind = kind
        self.check = check
        self.hint = hint
        self.builtin = tuple(builtin)

    def register(self, name: str, obj: Any = None, *, replace: bool = False):
        """Register ``obj`` under ``name``; without ``obj``, a decorator.

        Raises:
            ValueError: ``name`` is empty or contains ``":"`` (reserved for import paths), or
                is taken by a different object and ``replace`` is false.
            ContractError: ``obj`` fails the registry's check.
        """
        if not isinstance(name, str) or not name.strip() or ":" in name:
            raise ValueError(
                f"{self.kind} name must be a non-empty string without ':' "
                f"(':' marks an import path), got {name!r}"
            )

        def deco(o):
            if self.check is not None:
                self.check(o, name)
            old = self.get(name)
            if old is not None and not replace and _ident(old) != _ident(o):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered "
                    f"({_ident(old)}); pass replace=True to override it"
                )
            self[name] = o
            return o

        return deco(obj) if obj is not None else deco

    def resolve(self, spec: str) -> Any:
        """The object for a registered name, an import path or an entry-point name.

        Raises:
            ValueError: unknown name (the message lists the registered names), or an import
                path that does not resolve.
            ContractError: the object fails the registry's check.
        """
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"{self.kind}: expected a name or an import path, got {spec!r}")
        spec = spec.strip()
        if spec in self:
            return self[spec]
        if ":" in spec:
            obj = import_object(spec, self.kind)
        else:
            obj = self._entry_point(spec)
            if obj is None:
                raise unknown_name_error(
                    self.kind,
                    spec,
                    [*self.builtin, *sorted(self)],
                    self.hint,
                    quoted_from=len(self.builtin),
                )
        if self.check is not None:
            self.check(obj, spec)
        return obj

    def check_name(self, spec: str) -> str:
        """:func:`canonical_spec` of ``spec`` if :meth:`resolve` accepts it (for config
        validators)."""
        self.resolve(spec)
        return canonical_spec(spec)

    def _entry_point(self, name: str) -> Any:
        from importlib.metadata import entry_points

        for ep in entry_points(group=f"fedgraph.{self.kind}s"):
            if ep.name == name:
                return ep.load()
        return None


def unknown_name_error(
    kind: str, spec: str, known: list[str], hint: str = "", quoted_from: int = 0
) -> ValueError:
    """The error for a name that no registry entry, import path or entry point gives:
    ``known[:quoted_from]`` are listed as they are (descriptions such as
    ``facebook100:<College>``), the rest quoted. Shared by :meth:`Registry.resolve` and
    :mod:`fedgraph.catalog` (the same message with or without torch imported)."""
    hint = f" {hint}" if hint else ""
    names = [*known[:quoted_from], *(repr(k) for k in known[quoted_from:])]
    near = ""
    if "." in spec:  # 'my_module.Thing' for 'my_module:Thing'
        mod, _, attr = spec.rpartition(".")
        near = f" Did you mean '{mod}:{attr}'?"
    return ValueError(
        f"{kind}: unknown {spec!r}; allowed: {', '.join(names)}, or an import "
        "path 'package.module:attribute' or "
        f"'path/to/file.py:attribute'.{near}{hint}"
    )


def has_entry_point(kind: str, name: str) -> bool:
    """Whether an installed package publishes ``name`` in the group ``fedgraph.<kind>s``
    (without loading it)."""
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group=f"fedgraph.{kind}s"))


def _ident(obj: Any) -> str:
    """Module and qualified name: a re-imported module re-registers the same object."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
