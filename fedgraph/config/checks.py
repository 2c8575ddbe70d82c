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
        ConfigError: ``data-root`` is not an existing folder (nor, for dataset ``files``, an
            existing ``.pt`` file), or it is empty,
            ``$FEDGRAPH_DATA`` names one that does not exist and the dataset is neither the
            bundled Cora nor synthetic.
    """
    import os
    from pathlib import Path

    ENV_DATA = "FEDGRAPH_DATA"  # fedgraph.data.paths.ENV_DATA (not imported: it loads torch)
    root = getattr(cfg, "data_root", "")
    path = Path(root).expanduser()
    pt_file = str(getattr(cfg, "dataset", "")).lower() == "files" and path.suffix == ".pt"
    if root and pt_file and not path.is_file():  # dataset files: a torch.save'd graph
        raise ConfigError(f"data-root: {root} is not a file (dataset 'files' reads a .pt file "
                          "saved with torch.save, or a folder of plain files)")
    if root and not pt_file and not path.is_dir():
        raise ConfigError(f"data-root: {root} is not a folder (give an existing data root, or "
                          "leave data-root empty for $FEDGRAPH_DATA, the user cache and the "
                          "bundled Cora; dataset 'files' also reads a .pt file)")
    env = os.environ.get(ENV_DATA, "")
    dataset = str(getattr(cfg, "dataset", "")).lower()
    needs_files = dataset != "cora" and not dataset.startswith("synthetic")  # Cora is bundled
    if not root and env and needs_files and not Path(env).expanduser().is_dir():
        raise ConfigError(f"data-root: empty, and ${ENV_DATA} = {env} is not a folder (set "
                          f"${ENV_DATA} to an existing data root or unset it for the user "
                          "cache and the bundled Cora, or set data-root)")
