"""Which keys of a run config name a user's code (:func:`user_code`), and the traceback of
what that code raised without fedgraph's own frames (:func:`user_traceback`)."""

from __future__ import annotations

from pathlib import Path

from fedgraph.simulations.run_files import SPEC_KEYS


def user_code(run_config: dict) -> list[str]:
    """The keys of ``run_config`` that name a user's code (an import path
    ``package.module:attr`` or ``path/to/file.py:attr``, not a built-in dataset family such as
    ``facebook100:<College>``)."""
    out = []
    for key in SPEC_KEYS:
        v = run_config.get(key)
        if (
            isinstance(v, str)
            and ":" in v
            and not (
                key == "dataset"
                and v.strip().lower().startswith(("facebook100:", "synthetic-sbm:"))
            )
        ):
            out.append(key)
    return out


def user_traceback(err: BaseException) -> str:
    """The traceback of the exception under ``err`` (its causes and contexts) that a user's
    code raised: only its frames outside fedgraph's own packages, or ``""`` where none is.
    A context that ``raise ... from`` suppressed is not followed (as Python's own traceback)."""
    import traceback

    ours = tuple(
        str(Path(__file__).resolve().parents[1] / pkg)
        for pkg in ("fedgraph", "strategies", "simulations")
    )
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        frames = [
            f
            for f in traceback.extract_tb(e.__traceback__)
            if not f.filename.startswith(ours)
            and "site-packages" not in f.filename
            and not f.filename.startswith("<frozen")
        ]
        if frames and e is not err:
            return (
                "Traceback (the user's code):\n"
                + "".join(traceback.format_list(frames))
                + "".join(traceback.format_exception_only(type(e), e))
            )
        todo += [e.__cause__] if e.__suppress_context__ else [e.__cause__, e.__context__]
    return ""
