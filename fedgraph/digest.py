"""One content digest of named values (tensors by dtype, shape and bytes; anything else by
``repr``), shared by the partition cache's graph key (:func:`fedgraph.partition_cache.
graph_digest`) and the noise keys' data binding (:func:`fedgraph.randomness.client_data_digest`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any


def content_digest(items: Iterable[tuple[str, Any]]) -> str:
    """SHA-256 (hex) of ``(name, value)`` pairs, in the order given."""
    import torch

    h = hashlib.sha256()
    for key, value in items:
        h.update(f"{key}\0".encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}\0".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        else:
            h.update(f"{value!r}\0".encode())
    return h.hexdigest()
