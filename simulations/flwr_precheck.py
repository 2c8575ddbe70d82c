"""``scripts/main.sh``'s check of the ``--run-config`` it passes to ``flwr run``, before a
SuperLink starts: Flower refuses an unknown key with only ``[code: 15] Invalid run
configuration.`` (naming no key), and a bad value fails after the SuperLink, the SuperExec and
Ray have started (about 30 s), amid Flower's own exit messages.

The run config is what ``flwr run`` will fuse: ``pyproject.toml``'s ``[tool.flwr.app.config]``
(:func:`~fedgraph.simulations.run_files.pyproject_defaults`) with every ``--run-config`` /
``-c`` value, parsed by Flower's own parser; ``num-clients = 0`` (one client per supernode)
counts the ``num-supernodes`` of ``--federation-config`` (else :data:`DEFAULT_SUPERNODES`), and
an explicit ``num-clients`` must equal the ``num-supernodes`` given there. A key that is not in that table is named (with the
closest one); the rest is checked as ``fedgraph run`` checks a config before Ray starts
(:func:`~fedgraph.simulations.simulate.check_run_config`, and the other-method keys the
ServerApp refuses, :func:`~fedgraph.simulations.server_app.check_flwr_run_config`).

    python -m fedgraph.simulations.flwr_precheck [flwr run arguments ...]

Exit status: 0 (nothing wrong found, or no project file to check against), 2 (the message on
standard error names the key and the allowed values).
"""

from __future__ import annotations

import difflib
import sys

#: supernodes of ``flwr run``'s local simulation when ``--federation-config`` names none
DEFAULT_SUPERNODES = 2


def option_values(argv: list[str], *names: str) -> list[str]:
    """The values of the option ``names`` (e.g. ``--run-config``, ``-c``) in ``flwr run``'s
    arguments (``--run-config X`` or ``--run-config=X``), in order."""
    out, it = [], iter(argv)
    for arg in it:
        if arg in names:
            out.append(next(it, ""))
        elif arg.startswith(tuple(f"{n}=" for n in names if n.startswith("--"))):
            out.append(arg.split("=", 1)[1])
    return out


def check(argv: list[str]) -> None:
    """Raise :class:`~fedgraph.config.ConfigError` for the first problem of the run config that
    ``flwr run`` would get from ``argv`` (module docs); nothing without a project file."""
    import click
    from flwr.common.config import parse_config_args

    from fedgraph.config import ConfigError
    from fedgraph.simulations.run_files import pyproject_defaults
    from fedgraph.simulations.server_app import check_flwr_run_config
    from fedgraph.simulations.simulate import check_run_config
    from fedgraph.simulations.supernodes import supernode_mismatch

    defaults = pyproject_defaults()
    if defaults is None:
        return
    parsed = {}
    for option in ("--run-config", "--federation-config"):
        try:
            parsed[option] = parse_config_args(
                option_values(argv, option, *(("-c",) if option == "--run-config" else ()))
            )
        except (click.ClickException, ValueError, OSError) as err:
            message = err.format_message() if isinstance(err, click.ClickException) else str(err)
            raise ConfigError(f"{option}: {message}") from None
    overrides = parsed["--run-config"]
    for key in overrides:
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"--run-config: unknown key {key!r}{hint}; flwr run accepts the "
                f"keys of pyproject.toml's [tool.flwr.app.config]: "
                f"{', '.join(sorted(defaults))}"
            )
    run_config = {**defaults, **overrides}
    federation = parsed["--federation-config"]
    if not run_config.get("num-clients"):  # 0: one client per supernode (the ServerApp's count)
        run_config["num-clients"] = int(federation.get("num-supernodes", DEFAULT_SUPERNODES))
    check_run_config(run_config)
    check_flwr_run_config(run_config, defaults)
    from fedgraph.report import epsilon_warning

    if epsilon_warning(overrides):  # the user's own values (pyproject's are sane)
        print(f"fedgraph: {epsilon_warning(overrides)}", file=sys.stderr)
    want, have = run_config["num-clients"], federation.get("num-supernodes")
    if isinstance(have, int) and want != have:  # the ServerApp would refuse it, 30 s later
        raise supernode_mismatch(want, have)


def main(argv: list[str] | None = None) -> int:
    from fedgraph.config import ConfigError

    try:
        check(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"fedgraph: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
