"""Where a client's (or the server's) tensors and models live: ``device`` in the run config.

Flower's Ray backend gives each client ``client-resources-num-gpus`` of a GPU (federation
config; ``fedgraph run --gpus-per-client``) and Ray sets ``CUDA_VISIBLE_DEVICES`` in the
client's worker accordingly: a worker without a GPU share sees no GPU at all. So
``device = "auto"`` (the default) means: CUDA when this process was given a GPU, else CPU. The
same code runs on both; CI tests the CPU path.
"""

from __future__ import annotations

import os

import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(requested: str = "auto") -> torch.device:
    """The :class:`torch.device` for the run-config value ``requested``.

    Args:
        requested: ``"auto"`` (``cuda`` if :func:`torch.cuda.is_available`, else ``cpu``),
            ``"cpu"`` or ``"cuda"``.

    Returns:
        ``torch.device("cuda")`` (the first visible GPU: the one Ray assigned) or
        ``torch.device("cpu")``.

    Raises:
        fedgraph.config.ConfigError: ``"cuda"`` is asked but this process sees no GPU (the
            message names the key ``device``, ``CUDA_VISIBLE_DEVICES`` and the federation
            setting that gives clients a GPU), or ``requested`` is not one of :data:`DEVICES`.
    """
    from .errors import ConfigError

    value = str(requested).strip().lower()
    if value not in DEVICES:
        raise ConfigError(f"device: unknown {requested!r}; allowed: {', '.join(DEVICES)}")
    if value == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if value == "auto":
        return torch.device("cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise ConfigError(
        "device: 'cuda' was asked but this process sees no GPU (torch.cuda.is_available() is "
        f"False; CUDA_VISIBLE_DEVICES={visible!r}, torch {torch.__version__} built with CUDA "
        f"{torch.version.cuda}). Give each client a GPU share (federation config "
        "client-resources-num-gpus, or fedgraph run --gpus-per-client 0.1) on a machine with "
        "a GPU and a CUDA build of torch, or set device='auto' or 'cpu'"
    )


def to_cpu(state: dict) -> dict:
    """``{name: tensor.detach().cpu()}``: what goes into a Flower ``ArrayRecord`` (numpy)."""
    return {k: v.detach().cpu() for k, v in state.items()}
