"""fedgraph: federated simulation of differentially private graph learning on Flower and PyG.

Installed, the library and its Flower layers are one package: ``fedgraph`` (this folder),
``fedgraph.strategies`` (the checkout's ``strategies/``) and ``fedgraph.simulations``
(``simulations/``), mapped by ``[tool.setuptools.package-dir]`` in ``pyproject.toml``, so that
no generic top-level name (``strategies``, ``simulations``) enters a user's environment.

In a checkout, and in the copy of it Flower runs (``flwr run .`` ships the project folder as
its app), the two folders sit beside this one; the lines below let ``fedgraph.strategies`` and
``fedgraph.simulations`` resolve there as well. This folder comes first on the path, so a
module of the library is never shadowed by one of the checkout's folders.
"""

from pathlib import Path as _Path

_CHECKOUT = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "simulations").is_dir() and all(
    (_CHECKOUT / name / "__init__.py").is_file() for name in ("strategies", "simulations")
):
    __path__.append(str(_CHECKOUT))  # type: ignore[name-defined]  # noqa: F821
