"""Module attributes imported from their submodule on first use (PEP 562), so that importing a
package does not import what only some of its names need (PyG: about 2 s per process)."""
from __future__ import annotations

from importlib import import_module
from typing import Callable


def lazy_attributes(package: str, where: dict[str, str],
                    namespace: dict) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
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
