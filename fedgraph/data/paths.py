"""Where the datasets' files are (data root, user cache, bundled Cora) and which inputs a
built-in dataset is read from, without importing torch or PyG (the partition cache's keys
need them in every client process). The data root and the user cache are resolved by
:mod:`fedgraph.dataset_files` (outside this package, whose ``__init__`` imports torch), which
``fedgraph run`` reads before anything starts."""

from __future__ import annotations

from pathlib import Path

from ..catalog import SBM_PREFIX
from ..dataset_files import ENV_DATA, OGBN_PRODUCTS_DIR, PYG_RAW, resolve_root, user_cache_dir  # noqa: F401 (re-exported)
from ..dataset_files import PLANETOID_NAMES as _PLANETOID_NAMES

PathLike = str | Path


_BUNDLED_ROOT = Path(__file__).resolve().parent / "_bundled"


def bundled_root() -> Path:
    """Folder of the data shipped with the package (Cora's raw files).

    ``flwr run`` executes a copy of the app (a FAB) that holds only ``.py``/``.toml``/``.md``
    and similar files, and that copy shadows the installed package on ``sys.path``: so when
    the files are not next to this module, look in the installed distribution (a regular
    install in site-packages, or the source tree of an editable install).
    """
    candidates = [_BUNDLED_ROOT]
    try:
        import json
        from importlib.metadata import distribution

        dist = distribution("fedgraph")
        located = Path(dist.locate_file("fedgraph/data/_bundled"))
        if located.is_absolute():
            candidates.append(located)
        url = dist.read_text("direct_url.json")
        if url:
            info = json.loads(url)
            if info.get("url", "").startswith("file://"):
                from urllib.parse import unquote, urlparse

                src = Path(unquote(urlparse(info["url"]).path))
                candidates.append(src / "fedgraph" / "data" / "_bundled")
    except Exception:  # not installed: only the folder next to this module
        pass
    for c in candidates:
        if (c / "planetoid" / "Cora" / "raw" / "ind.cora.x").is_file():
            return c
    return _BUNDLED_ROOT


def dataset_inputs(name: str, root: PathLike | None = None) -> list[Path] | None:
    r"""The folders and files a built-in dataset is read from (for
    :mod:`fedgraph.partition_cache` to notice a changed input without loading
    the graph): ``raw`` folders of the PyG datasets (Cora: the root's and the
    bundled copy), the college's ``.mat`` for Facebook100, ``[]`` for
    ``synthetic-sbm:`` (generated from its name). ``None`` where only the
    loader knows (``files``, registered loaders, import paths).
    """
    key = name.strip().lower()
    base = resolve_root(root)
    if key.startswith(SBM_PREFIX):
        return []
    if key.startswith("facebook100:"):
        college = name.strip().split(":", 1)[1].strip().lower()
        folder = base / "facebook100"
        return (
            sorted(p for p in folder.glob("*") if p.stem.lower() == college)
            if folder.is_dir()
            else []
        )
    if key in _PLANETOID_NAMES:
        rel = Path("planetoid") / _PLANETOID_NAMES[key] / "raw"
        return [base / rel] + ([bundled_root() / rel] if key == "cora" else [])
    folders = {
        **{k: rel / "raw" for k, (rel, _) in PYG_RAW.items()},
        "ogbn-products": Path(OGBN_PRODUCTS_DIR),
    }
    return [base / folders[key]] if key in folders else None
