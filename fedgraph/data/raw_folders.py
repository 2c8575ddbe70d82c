"""A writable dataset folder holding a built-in dataset's raw files, for PyG to process.

Raw files are checked *before* PyG is called, so PyG never tries to download (and hang)
offline: if they are missing, :class:`FileNotFoundError` names the paths looked for (unless
``download=True``: then a writable folder for PyG's own download, the root's or the user
cache's). When the dataset folder is not writable (read-only mount, or no write permission
bits, which also covers running as root on a read-only-by-convention folder), the raw files
are copied to ``<user cache>/fedgraph/processed-copies/<hash of source>/...`` and PyG is
pointed at that copy. A failed load leaves no empty ``processed`` folder behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from ..dataset_files import missing_raw_files, raw_files_message
from .paths import user_cache_dir


def is_writable_dir(path: Path) -> bool:
    r"""Whether ``path`` (or, if it does not exist, its first existing
    ancestor) may be written to. Requires both :func:`os.access` (catches
    read-only mounts) and a write permission bit (so that ``root``, to whom
    :func:`os.access` always says yes, respects read-only folders)."""
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK):
        return False
    mode = p.stat().st_mode
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def writable_copy(src_dataset_dir: Path, rel: Path, raw_files: Sequence[str]) -> Path:
    r"""Copies ``src_dataset_dir/raw/<raw_files>`` to a writable cache folder
    and returns the new dataset folder (``.../rel``). Files already copied
    with the same size are reused, so the processed cache survives."""
    key = hashlib.sha1(str(src_dataset_dir.resolve()).encode()).hexdigest()
    dst_dataset_dir = user_cache_dir() / "processed-copies" / key[:12] / rel
    dst_raw = dst_dataset_dir / "raw"
    dst_raw.mkdir(parents=True, exist_ok=True)
    for fname in raw_files:
        src = src_dataset_dir / "raw" / fname
        dst = dst_raw / fname
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)  # atomic: concurrent loaders see whole files
            # A changed raw file invalidates PyG's processed cache.
            shutil.rmtree(dst_dataset_dir / "processed", ignore_errors=True)
    return dst_dataset_dir


def not_found(name: str, paths: Sequence[Path], extra: str = "") -> None:
    """Raise the missing raw files' :class:`FileNotFoundError`
    (:func:`fedgraph.dataset_files.raw_files_message`: ``fedgraph run`` gives the same before
    anything starts)."""
    raise FileNotFoundError(raw_files_message(name, paths, extra))


def prepare_pyg_dir(
    name: str,
    dataset_dir: Path,
    rel: Path,
    raw_files: Sequence[str],
    download: bool,
    fallback_dir: Path | None = None,
) -> Path:
    r"""Returns a writable dataset folder whose ``raw/`` holds ``raw_files``
    (or, if ``download`` and the files are absent, a writable folder for PyG
    to download into).

    Raises:
        FileNotFoundError: if the raw files are absent, there is no
            ``fallback_dir`` and ``download`` is :obj:`False`.
    """
    missing = missing_raw_files(dataset_dir, raw_files)
    bundled = False
    if missing and fallback_dir is not None:
        dataset_dir, missing, bundled = fallback_dir, [], True
    if missing:
        if not download:
            not_found(name, missing)
        if is_writable_dir(dataset_dir):
            return dataset_dir
        return user_cache_dir() / "downloads" / rel
    # Bundled package data is never written to.
    if not bundled and is_writable_dir(dataset_dir):
        processed = dataset_dir / "processed"
        if not processed.exists() or is_writable_dir(processed):
            return dataset_dir
    return writable_copy(dataset_dir, rel, raw_files)


def remove_empty_processed(base: Path, since: float) -> None:
    """Remove the empty ``processed`` folders a failed load created (under ``base`` and the
    user cache's writable copies) at or after ``since``: a failed load leaves nothing behind."""
    for root in (base, user_cache_dir() / "processed-copies"):
        if not root.is_dir():
            continue
        for folder in root.rglob("processed"):
            try:
                if (
                    folder.is_dir()
                    and not any(folder.iterdir())
                    and folder.stat().st_mtime >= since - 1
                ):
                    folder.rmdir()
            except OSError:
                pass
