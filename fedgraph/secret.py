"""Where a client's noise secret comes from (``noise-source = "secret"``), without torch:
``fedgraph run`` checks it before anything starts. The generators it keys are in
:mod:`fedgraph.randomness`."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: ``noise-source`` values no longer accepted, with what changed (fedgraph.randomness)
RETIRED_NOISE_SOURCES = {
    "os": "'os' is no longer accepted: it drew from PyTorch's MT19937, which is not a CSPRNG "
    "(a server can recover its state from the pure-noise values a client releases, e.g. "
    "GAP's remote rows that cover no edge, and remove the noise); allowed: 'secure' (the "
    "default now: an AES-256-CTR CSPRNG from fresh OS entropy, not reproducible, as 'os' "
    "was), 'secret' (the same CSPRNG from each client's own secret, reproducible) or "
    "'mt19937' (the old 'os', an explicit opt-in without that protection)"
}

#: node-config key of a client's noise secret (deployments: ``flower-supernode --node-config``)
SECRET_NODE_KEY = "noise-secret"
#: environment variable of the client process holding the secret (simulations)
SECRET_ENV = "FEDGRAPH_NOISE_SECRET"
#: the shortest secret accepted, in characters: 16 random hex digits are 64 bits, the least a
#: server's offline search over secrets should face (``secrets.token_hex(16)`` gives 128)
MIN_SECRET_LENGTH = 16


def check_secret(node_config: Mapping) -> bytes:
    """The client's noise secret: ``node_config["noise-secret"]``, else ``$FEDGRAPH_NOISE_SECRET``.

    Raises:
        ConfigError: neither is set, or the secret is shorter than :data:`MIN_SECRET_LENGTH`
            characters (a short secret is one a curious server can search for: it knows the run
            config, so the secret and the client's data are all that keep the noise unknown)."""
    from .errors import ConfigError

    value = node_config.get(SECRET_NODE_KEY) if node_config is not None else None
    if value is None or str(value) == "":
        value = os.environ.get(SECRET_ENV, "")
    if not str(value):
        raise ConfigError(
            f"noise-source: 'secret' needs a per-client secret the server never sees: set the "
            f"node config key {SECRET_NODE_KEY!r} (flower-supernode --node-config "
            f"\"{SECRET_NODE_KEY}='...'\") or the environment variable {SECRET_ENV} of the "
            "client processes (simulations: export it before `fedgraph run`); or use "
            "noise-source 'secure' (the default: fresh OS entropy, not reproducible)"
        )
    if len(str(value)) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"noise-source: the secret (node config {SECRET_NODE_KEY!r} or ${SECRET_ENV}) has "
            f"{len(str(value))} characters; use at least {MIN_SECRET_LENGTH} random ones, e.g. "
            "python -c 'import secrets; print(secrets.token_hex(16))'"
        )
    return str(value).encode()
