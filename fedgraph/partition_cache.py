"""Partition once, load your part: an on-disk, content-addressed cache of the clients' data.

What a client needs (its :class:`~fedgraph.data.ClientGraph` with its boundary edges, the
dataset statistics, the public test mask) is computed once per (dataset contents, split,
partitioner, seed, number of clients, privacy levels, code) and stored as one file per
client; a client process reads only its own file. Louvain on a large graph thus runs once for
all clients and all later runs with the same data (an epsilon sweep), instead of once in every
client process of every run.

Layout under :func:`cache_dir` (``$FEDGRAPH_PARTITION_CACHE``, default
``<user cache>/fedgraph/partitions``; ``off`` disables the cache)::

    <digest>/part-<i>.pt      client i's part (tensors; ``torch.load(weights_only=True)``)
    <digest>/manifest.json    written last: the SHA-256 of every part file
    <digest>.lock             held while one process computes the entry
    graphs/<key>.json         the content digest of a dataset, keyed by its input files' stat

Correctness:

* The key (:func:`entry_digest`) holds the SHA-256 of the loaded graph's tensors (every
  attribute, :func:`graph_digest`), the data settings, the levels, :data:`FORMAT` and the
  source of the code that splits and partitions: a change of any input is a miss. Only
  fedgraph's own partitioners are cached (a user's may read more than its arguments: it runs
  in every client process, as before). Loading the
  graph only to hash it is skipped when the dataset's input files (:func:`fedgraph.data.
  dataset_inputs`, built-in datasets) have the size, mtime and inode they had when their
  contents were last hashed (``graphs/``, like ``make``); a user loader's graph is always
  loaded and hashed.
* Writes go to a temporary file and are renamed into place (``os.replace``, atomic); the
  manifest comes last, so a reader sees a whole entry or none. Concurrent clients: the first
  to miss computes under a file lock, the others wait for it and then read.
* A part whose bytes do not match the manifest's digest (truncated, corrupted) or that does
  not load is a miss: the entry is computed and written again.

Privacy: the entries hold every client's private data (features, labels, edges), as the
dataset files themselves do; the folders are created ``0700``. Only the simulation harness
(the client processes of this machine) reads them; no strategy does.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: version of the entry layout and of what a part holds: bump when either changes
FORMAT = 1
ENV = "FEDGRAPH_PARTITION_CACHE"
#: bytes of entries kept (``$FEDGRAPH_PARTITION_CACHE_MAX_GB``, default 4 GiB); beyond it
#: the least recently used entries are removed (the newest is always kept)
MAX_BYTES = int(float(os.environ.get("FEDGRAPH_PARTITION_CACHE_MAX_GB", "4")) * 2**30)
#: modules whose source decides what the parts hold (a changed one is a miss)
CODE_MODULES = (
    "fedgraph.data.splits",
    "fedgraph.data.partition",
    "fedgraph.data.levels",
    "fedgraph.data.datasets",
    "fedgraph.data.paths",
    "fedgraph.data.synthetic",
    "fedgraph.data.normal_form",
    "fedgraph.data.raw_folders",
    "fedgraph.data.pyg_loaders",
    "fedgraph.data.ogbn",
    "fedgraph.data.facebook100",
    "fedgraph.data.user_graphs",
    "fedgraph.federation",
    "fedgraph.partition_cache",
)


def cache_dir() -> Path | None:
    """The cache folder (``$FEDGRAPH_PARTITION_CACHE``; ``off``/``0``/``false``: ``None``,
    no cache; unset: ``<user cache>/fedgraph/partitions``)."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("0", "off", "false", "no", "none"):
        return None
    if value:
        return Path(value).expanduser()
    from .data.paths import user_cache_dir

    return user_cache_dir() / "partitions"


def _sha256_file(path: Path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h


def code_digest() -> str:
    """SHA-256 of the sources of :data:`CODE_MODULES`, by module name (not path: two
    checkouts of the same code share entries). Only fedgraph's own partitioners are cached: a
    user's may depend on more than its inputs."""
    h = hashlib.sha256()
    for name in CODE_MODULES:
        h.update(f"{name}\0".encode())
        _sha256_file(_source_file(name), h)
    return h.hexdigest()


def _source_file(module: str) -> Path:
    """The source file of ``module``, found, not imported (a client reading its part need
    not import PyG's dataset loaders)."""
    import importlib.util

    return Path(importlib.util.find_spec(module).origin)


def graph_digest(data) -> str:
    """SHA-256 of every attribute of a PyG ``Data`` (tensors: dtype, shape and bytes; other
    values: their ``repr``), in key order (:func:`fedgraph.digest.content_digest`)."""
    from .digest import content_digest

    return content_digest((key, data[key]) for key in sorted(data.keys()))


def _inputs_stat(paths: list[Path]) -> list:
    """(path, size, mtime_ns, inode) of every file under ``paths`` (``processed`` folders and
    hidden files skipped: PyG and fedgraph write them while loading)."""
    out = []
    for root in paths:
        if root.is_file():
            files = [root]
        elif root.is_dir():
            files = []
            for folder, dirs, names in os.walk(root):
                dirs[:] = [d for d in dirs if d != "processed" and not d.startswith(".")]
                files += [Path(folder) / f for f in names if not f.startswith(".")]
        else:
            files = []
        for f in sorted(files):
            st = f.stat()
            out.append([str(f), st.st_size, st.st_mtime_ns, st.st_ino])
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    from .report import write_bytes_atomic

    write_bytes_atomic(path, data)


def _mkdir_private(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def known_graph_digest(root: Path, source_key: str | None) -> str | None:
    """The content digest recorded for ``source_key`` (:func:`source_key`), if any."""
    if source_key is None:
        return None
    try:
        return json.loads((root / "graphs" / f"{source_key}.json").read_text())["graph"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_graph_digest(root: Path, source_key: str | None, digest: str) -> None:
    if source_key is not None:
        _mkdir_private(root / "graphs")
        _write_atomic(
            root / "graphs" / f"{source_key}.json", json.dumps({"graph": digest}).encode()
        )


def source_key(dataset: str, data_root: str | None, min_class_size: int) -> str | None:
    """A key for the dataset's input files as they are now (names, sizes, mtimes, inodes) and
    the loaders' code; ``None`` when the inputs are not known (a user loader)."""
    from .data.paths import dataset_inputs

    paths = dataset_inputs(dataset, data_root or None)
    if paths is None:
        return None
    payload = json.dumps(
        {
            "format": FORMAT,
            "dataset": dataset,
            "min_class_size": min_class_size,
            "inputs": _inputs_stat(paths),
            "code": code_digest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:40]


def entry_digest(settings: dict, graph: str, code: str) -> str:
    """The entry's name: SHA-256 of the data ``settings`` (split, partitioner, seed, number
    of clients, levels, ...), the ``graph`` content digest and the ``code`` digest."""
    payload = json.dumps(
        {"format": FORMAT, "settings": settings, "graph": graph, "code": code},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:40]


def read_part(entry: Path, pid: int) -> dict | None:
    """Client ``pid``'s payload from ``entry``, or ``None`` when the entry is incomplete, the
    part's bytes do not match the manifest, or it does not load (logged)."""
    import torch

    try:
        manifest = json.loads((entry / "manifest.json").read_text())
        if manifest.get("format") != FORMAT:
            return None
        blob = (entry / f"part-{pid}.pt").read_bytes()
        if hashlib.sha256(blob).hexdigest() != manifest["parts"][str(pid)]:
            log.warning(
                "partition cache: %s part %d does not match its manifest; recomputing", entry, pid
            )
            return None
        payload = torch.load(io.BytesIO(blob), weights_only=True)
        os.utime(entry / "manifest.json")  # last use, for pruning
        return payload
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a damaged entry is recomputed
        log.warning(
            "partition cache: cannot read %s part %d (%s: %s); recomputing",
            entry,
            pid,
            type(err).__name__,
            err,
        )
        return None


def write_entry(entry: Path, payloads: list[dict]) -> None:
    """Write every part (atomically, each tensor compacted), then the manifest."""
    import torch

    _mkdir_private(entry)
    digests = {}
    for pid, payload in enumerate(payloads):
        buf = io.BytesIO()
        torch.save(_compact(payload), buf)
        blob = buf.getvalue()
        _write_atomic(entry / f"part-{pid}.pt", blob)
        digests[str(pid)] = hashlib.sha256(blob).hexdigest()
    _write_atomic(
        entry / "manifest.json", json.dumps({"format": FORMAT, "parts": digests}).encode()
    )


def _compact(obj):
    """Tensors cloned (a view would save its whole storage), containers walked."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _compact(v) for k, v in obj.items()}
    return obj


def prune(root: Path, max_bytes: int | None = None) -> None:
    """Remove the least recently used entries (by their manifest's mtime) once the entries
    above them hold ``max_bytes`` (default :data:`MAX_BYTES`); the newest is always kept."""
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    entries = []
    for d in root.iterdir():
        manifest = d / "manifest.json"
        if d.is_dir() and manifest.exists():
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            entries.append((manifest.stat().st_mtime, size, d))
    total = 0
    for i, (_, size, d) in enumerate(sorted(entries, reverse=True)):
        total += size
        if i and total > max_bytes:
            shutil.rmtree(d, ignore_errors=True)
            (root / f"{d.name}.lock").unlink(missing_ok=True)


def load_part(
    root: Path, digest: str, pid: int, compute: Callable[[], list[dict]]
) -> dict[int, dict]:
    """Client ``pid``'s payload from the entry ``digest`` under ``root``; on a miss,
    ``compute()`` every client's payload under the entry's lock (another process may have
    written it meanwhile: then it is read), write the entry and return all of them.

    Returns:
        partition id -> payload: ``{pid: ...}`` on a hit, every client's after computing.
    """
    from filelock import FileLock

    entry = root / digest
    payload = read_part(entry, pid)
    if payload is not None:
        return {pid: payload}
    _mkdir_private(root)
    with FileLock(str(root / f"{digest}.lock")):
        payload = read_part(entry, pid)  # written while we waited
        if payload is not None:
            return {pid: payload}
        payloads = compute()
        try:
            write_entry(entry, payloads)
            prune(root)
        except OSError as err:  # a full or read-only disk: the run goes on without the cache
            print(f"fedgraph: partition cache: cannot write {entry}: {err}", file=sys.stderr)
        return dict(enumerate(payloads))
