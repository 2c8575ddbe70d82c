"""How many clients a run has: the federation's supernodes, unless ``num-clients`` says so.

``flwr run .`` runs on Flower's default federation (Flower 1.42: 2 simulated supernodes, or
``--federation-config "num-supernodes=N"``); pyproject declares ``num-clients = 0`` ("one
client per supernode"), so the ServerApp takes the count from ``grid.get_node_ids()``. A
``num-clients`` set explicitly is checked against the simulation's supernodes before anything
runs, and refused naming both numbers.
"""

from __future__ import annotations

import time

from fedgraph.errors import ConfigError

__all__ = ["FROM_GRID", "resolve_num_clients", "supernode_mismatch"]

#: the value of ``num-clients`` (pyproject's default) that means "one per supernode"
FROM_GRID = 0


def _is_simulation(grid) -> bool:
    """Flower's in-memory grid (a simulation registers all its supernodes at once); a
    deployment's supernodes connect one by one (``wrapped``: the grid inside a wrapper)."""
    return type(getattr(grid, "wrapped", grid)).__name__ == "InMemoryGrid"


def _settled_count(grid, settle: float, timeout: float) -> int:
    """The number of connected supernodes once it is > 0 and held still ``settle`` seconds
    (or the last count after ``timeout`` seconds)."""
    start = seen_at = time.monotonic()
    seen = -1
    while True:
        n = len(list(grid.get_node_ids()))
        now = time.monotonic()
        if n != seen:
            seen, seen_at = n, now
        if (n > 0 and now - seen_at >= settle) or now - start > timeout:
            return n
        time.sleep(0.1)


def resolve_num_clients(grid, run_config: dict, settle: float = 1.0, timeout: float = 60.0) -> dict:
    """``run_config`` with ``num-clients`` set from the grid where it is missing or
    :data:`FROM_GRID`; an explicit value on a simulation must equal its supernode count.

    Args:
        grid: a Flower ``Grid`` (or :class:`fedgraph.simulations.grid.InterruptibleGrid`).
        run_config: the flat run config (``num-clients``: int, ``0``/missing: from the grid).
        settle: seconds the supernode count must hold still before it is taken as final.
        timeout: seconds to wait for a first supernode.
    Returns:
        a copy of ``run_config`` with an int ``num-clients`` >= 1.
    Raises:
        ConfigError: no supernode connected within ``timeout`` seconds (``num-clients`` from
            the grid), or an explicit ``num-clients`` that differs from the simulation's
            supernodes (both numbers named).
    """
    run_config = dict(run_config)
    want = run_config.get("num-clients", FROM_GRID)
    from_grid = want in (FROM_GRID, "", None)
    if not from_grid and not _is_simulation(grid):
        return run_config  # a deployment: the connect phase waits for late supernodes
    if not from_grid and (not isinstance(want, int) or isinstance(want, bool) or want < 1):
        return run_config  # the config's validation names the bad value and its range
    if not from_grid and len(list(grid.get_node_ids())) == want:
        return run_config  # all there (a simulation registers its supernodes at once)
    have = _settled_count(grid, settle, timeout)
    if from_grid:
        if have < 1:
            raise ConfigError(
                f"num-clients: no supernode connected within {timeout:g} s (with "
                "num-clients = 0 the run has one client per supernode)"
            )
        run_config["num-clients"] = have
    elif have != want:
        raise supernode_mismatch(want, have)
    return run_config


def supernode_mismatch(want: int, have: int) -> ConfigError:
    """The error of an explicit ``num-clients`` (``want``) that differs from a simulation's
    ``have`` supernodes (the ServerApp's check, and ``scripts/main.sh``'s before it starts)."""
    return ConfigError(
        f"num-clients: the run config has num-clients={want} but the "
        f"federation has {have} supernodes; leave num-clients unset (one "
        f"client per supernode) or run with --federation-config "
        f'"num-supernodes={want}"'
    )
