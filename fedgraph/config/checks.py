"""Cheap checks of where a run reads and writes (no torch): the output folder, the data
root and the dataset's files, run before anything starts and again by the preflight."""

from __future__ import annotations

from ..dataset_files import ENV_DATA, missing_files
from ..errors import ConfigError


def unwritable_folder(folder, create: bool = True) -> str | None:
    """Why files cannot be written in ``folder`` (a :class:`~pathlib.Path`), or ``None``: a
    file on its path, or (``create``) the folder or a temporary file in it cannot be made;
    without ``create`` nothing is made, and the nearest existing folder above it must be
    writable (a dry run's check)."""
    import os
    import tempfile

    blocking = next((a for a in (folder, *folder.parents) if a.exists() and not a.is_dir()), None)
    if blocking is not None:
        return f"{blocking} is a file, not a folder"
    if not create:
        near = next(a for a in (folder, *folder.parents) if a.exists())
        return None if os.access(near, os.W_OK | os.X_OK) else f"{near} is not writable"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def check_output_dir(cfg, create: bool = True) -> None:
    """Raise :class:`ConfigError` naming ``output-dir`` when reports cannot be written there
    (:func:`unwritable_folder`; ``create``: make the folder and a temporary file in it),
    cheap, no torch; called before anything starts and again by the preflight.

    Raises:
        ConfigError: ``output-dir`` names a file, or the folder cannot be created or written
            to.
    """
    from pathlib import Path

    out = Path(getattr(cfg, "output_dir", "") or ".").expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"output-dir: {out} is a file, not a folder (name a folder for the "
            "reports, or one that does not exist yet)"
        )
    why = unwritable_folder(out, create)
    if why is not None:
        raise ConfigError(f"output-dir: cannot write reports to {out}: {why}")


def check_data_root(cfg) -> None:
    """Raise :class:`ConfigError` naming ``data-root`` when it is set but not a folder, or
    ``$FEDGRAPH_DATA`` when it is read and names no folder (cheap: no torch; called before
    anything starts and again by the preflight).

    Raises:
        ConfigError: ``data-root`` is not an existing folder (nor, for dataset ``files``, an
            existing ``.pt`` file), or it is empty,
            ``$FEDGRAPH_DATA`` names one that does not exist and the dataset is not synthetic
            (even Cora, bundled: a mistyped folder is not ignored without a word).
    """
    import os
    from pathlib import Path

    root = getattr(cfg, "data_root", "")
    path = Path(root).expanduser()
    pt_file = str(getattr(cfg, "dataset", "")).lower() == "files" and path.suffix == ".pt"
    if root and pt_file and not path.is_file():  # dataset files: a torch.save'd graph
        raise ConfigError(
            f"data-root: {root} is not a file (dataset 'files' reads a .pt file "
            "saved with torch.save, or a folder of plain files)"
        )
    if root and not pt_file and not path.is_dir():
        raise ConfigError(
            f"data-root: {root} is not a folder (give an existing data root, or "
            "leave data-root empty for $FEDGRAPH_DATA, the user cache and the "
            "bundled Cora; dataset 'files' also reads a .pt file)"
        )
    env = os.environ.get(ENV_DATA, "")
    generated = str(getattr(cfg, "dataset", "")).lower().startswith("synthetic")  # no files
    if not root and env and not generated and not Path(env).expanduser().is_dir():
        raise ConfigError(
            f"data-root: empty, and ${ENV_DATA} = {env} is not a folder (set "
            f"${ENV_DATA} to an existing data root or unset it for the user "
            "cache and the bundled Cora, or set data-root)"
        )


def check_dataset_files(cfg) -> None:
    """Raise :class:`ConfigError` when a built-in dataset's files are not under its data root
    (:func:`fedgraph.dataset_files.check_files`: cheap, no torch), with the message the
    preflight gives when its load fails, before Ray starts instead of after. Cora (bundled),
    ``synthetic-sbm:...`` and a user's loader need no file here.

    Raises:
        ConfigError: ``dataset/data-root: <the loader's message>`` (the paths looked for).
    """
    root = getattr(cfg, "data_root", "") or None
    problem = missing_files(str(getattr(cfg, "dataset", "")), root)
    if problem:
        raise ConfigError(f"dataset/data-root: {problem}")
