"""Cheap checks of where a run reads and writes (no torch): the output folder and the data
root, run before anything starts and again by the preflight."""
from __future__ import annotations

from ..errors import ConfigError


def check_output_dir(cfg) -> None:
    """Raise :class:`ConfigError` naming ``output-dir`` when reports cannot be written there:
    creates the folder and a temporary file in it (cheap, no torch; called before anything
    starts and again by the preflight).

    Raises:
        ConfigError: the folder cannot be created or written to.
    """
    import tempfile
    from pathlib import Path

    out = Path(getattr(cfg, "output_dir", "") or ".").expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ConfigError(f"output-dir: cannot write reports to {out}: {err}") from None


def check_data_root(cfg) -> None:
    """Raise :class:`ConfigError` naming ``data-root`` when it is set but not a folder (cheap:
    no torch; called before anything starts and again by the preflight).

    Raises:
        ConfigError: ``data-root`` is not an existing folder.
    """
    from pathlib import Path

    root = getattr(cfg, "data_root", "")
    if root and not Path(root).expanduser().is_dir():
        raise ConfigError(f"data-root: {root} is not a folder (give an existing data root, or "
                          "leave data-root empty for $FEDGRAPH_DATA, the user cache and the "
                          "bundled Cora)")
