"""Module attributes imported from their submodule on first use (PEP 562), so that importing a
package does not import what only some of its names need (PyG: about 2 s per process)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from importlib import import_module


def lazy_attributes(
    package: str, where: dict[str, str], namespace: dict
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` in ``where`` is read from
    ``package.<where[n]>`` when first asked for and cached in ``namespace`` (the package's
    ``globals()``)."""

    def __getattr__(name: str):
        if name in where:
            value = getattr(import_module(f"{package}.{where[name]}"), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__


class LazyModule:
    """A module imported on its first attribute access: ``pg = LazyModule("fedgraph.methods.
    privgnn")`` at a module's top costs nothing until ``pg.something`` runs (e.g. PyG for a
    strategy module that registers itself on import but whose method is not the run's)."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"


@contextmanager
def no_root_logging_config():
    """While open, a root logger without handlers has a ``NullHandler`` (removed after), so
    that a library calling ``logging.basicConfig`` (Opacus when imported; absl at its first
    warning) does not configure the root logger: once configured, every record reaching it is
    printed to stderr, Flower's DEBUG lines among them."""
    import logging

    added = None
    if not logging.root.handlers:
        added = logging.NullHandler()
        logging.root.addHandler(added)
    try:
        yield
    finally:
        if added is not None:
            logging.root.removeHandler(added)


def import_without_root_logging(name: str):
    """``import_module(name)`` inside :func:`no_root_logging_config`: Opacus calls
    ``logging.basicConfig`` when imported (``opacus.utils.module_utils``; ``fedgraph run
    gap-node-cora`` printed 14 Flower DEBUG lines). Returns the module."""
    with no_root_logging_config():
        return import_module(name)
