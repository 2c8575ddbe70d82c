"""A client's long-term identity for authenticated secure aggregation: an Ed25519 key pair,
and the directory of every client's identity public key, both provisioned *outside the
server*, as certificates are in a deployment.

Why: secure aggregation's pairwise masks protect a client's rows only if the X25519 public keys
it masks with belong to its peers. The server relays those keys; a server that substitutes its
own (whose private keys it knows) would unmask every row. So each client signs its fresh
X25519 public key under its identity key (:func:`key_statement`: bound to the run id, the
method, its partition id and the key exchange's label), and every client checks every peer's
signature against the directory it got from the provisioning, never from the server
(:func:`fedgraph.secure_aggregation.verify_key_list`).

Where the identity comes from (:func:`client_identity`), in this order:

1. A deployment: the node config (``flower-supernode --node-config``) names
   ``identity-key`` (a file holding the client's Ed25519 private key, PEM / PKCS#8 or its 32
   raw bytes, or the 64 hex digits of its 32-byte seed inline) and ``identity-directory`` (a
   JSON file: every client's Ed25519 public key in hex, a list by partition id or an object
   ``{"<partition id>": "<hex>"}``), installed with the client like a certificate and the CA's
   trust store.
2. A simulation: the simulation-wide provisioning secret ``$FEDGRAPH_IDENTITY_SECRET`` in the
   client processes' environment. Client ``i``'s key is derived from it
   (:func:`derive_identity_key`: HMAC-SHA256 of the secret and ``i``), and each client computes
   the directory of all identity public keys from it. The simulation launchers create the
   secret with ``os.urandom`` when it is absent (:func:`ensure_simulation_secret`: ``fedgraph
   run`` before Ray starts, whose workers inherit the environment; the in-process
   :class:`~fedgraph.simulations.local.LocalGrid`). That every simulated client can derive
   every identity key is an artifact of simulating many clients in one environment, like
   ``$FEDGRAPH_NOISE_SECRET`` (:mod:`fedgraph.secret`): a deployment provisions each client
   with its own key only.

The server code (``fedgraph.strategies``) never reads the provisioning secret, the identity
keys or the directory: it relays the signed public keys as it receives them
(``tests/test_authenticated_secagg.py`` checks that no strategy module names the secret).

Plain stdlib and ``cryptography``; no torch, no Flower.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: environment variable of the client processes holding the simulation's provisioning secret
IDENTITY_ENV = "FEDGRAPH_IDENTITY_SECRET"
#: node-config key of a deployed client's identity key (a file path, or a 64-hex-digit seed)
IDENTITY_KEY_NODE = "identity-key"
#: node-config key of a deployed client's directory of identity public keys (a JSON file)
IDENTITY_DIRECTORY_NODE = "identity-directory"
#: the shortest provisioning secret accepted, in characters (as fedgraph.secret's)
MIN_SECRET_LENGTH = 16
#: domain separation of the signed statement (:func:`key_statement`)
STATEMENT_DOMAIN = b"fedgraph secure-aggregation public key v1"
SIGNATURE_BYTES = 64  #: Ed25519 signature size
PUBLIC_BYTES = 32  #: Ed25519 public key size


class IdentityError(ValueError):
    """The client has no usable identity (nothing provisioned, or a directory that does not
    hold its own key): it cannot take part in authenticated secure aggregation."""


@dataclass(frozen=True)
class Identity:
    """What the provisioning gave one client: its partition id, its Ed25519 private key (raw
    32 bytes; never sent) and the directory ``{partition id: Ed25519 public key}`` of every
    client it will mask with."""

    partition_id: int
    private_key: bytes = field(repr=False)
    directory: Mapping[int, bytes] = field(repr=False)

    @property
    def public_key(self) -> bytes:
        return (
            Ed25519PrivateKey.from_private_bytes(self.private_key).public_key().public_bytes_raw()
        )

    def sign(self, statement: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.private_key).sign(statement)

    def verifies(self, partition_id: int, statement: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is ``partition_id``'s identity key's signature of
        ``statement``, by the directory (``False`` for a partition id not in it)."""
        pk = self.directory.get(int(partition_id))
        if pk is None or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(pk).verify(signature, statement)
        except InvalidSignature:
            return False
        return True


def key_label(method: str) -> str:
    """The key exchange's label a key is signed for: its message type (``query.<method>_keys``)."""
    return f"query.{method}_keys"


def key_statement(
    run_id: int, method: str, partition_id: int, public_key: bytes, label: str
) -> bytes:
    """What a client signs for its fresh X25519 ``public_key``: the domain, the run id, the
    method, its partition id and the label (NUL-separated, none may hold a NUL), then the key.
    A signature for one run, method, partition or label verifies for no other."""
    parts = [str(int(run_id)), str(method), str(int(partition_id)), str(label)]
    if any("\x00" in p for p in parts):
        raise ValueError("a key statement's fields must not contain NUL")
    return STATEMENT_DOMAIN + b"\x00" + "\x00".join(parts).encode() + b"\x00" + bytes(public_key)


def derive_identity_key(secret: bytes, partition_id: int) -> bytes:
    """Client ``partition_id``'s Ed25519 private key (raw 32 bytes) from the simulation's
    provisioning secret: HMAC-SHA256(secret, "fedgraph identity key" || partition id)."""
    return hmac.new(
        bytes(secret),
        b"fedgraph identity key\x00" + str(int(partition_id)).encode(),
        hashlib.sha256,
    ).digest()


def ensure_simulation_secret(environ: MutableMapping[str, str] | None = None) -> str:
    """The simulation launcher's provisioning step: ``$FEDGRAPH_IDENTITY_SECRET``, set to 32
    random bytes from ``os.urandom`` (hex) when absent, before the client processes start (they
    inherit it). Returns it. Call it from a launcher, never from server code."""
    env = os.environ if environ is None else environ
    if not env.get(IDENTITY_ENV):
        env[IDENTITY_ENV] = os.urandom(32).hex()
    return env[IDENTITY_ENV]


class _DerivedDirectory(Mapping):
    """The simulation's directory: partition ``i`` (``0 <= i < n``) -> the Ed25519 public key
    of :func:`derive_identity_key`, derived when first looked up."""

    def __init__(self, secret: bytes, n: int):
        self._secret, self._n, self._keys = secret, n, {}

    def __getitem__(self, pid) -> bytes:
        pid = int(pid)
        if not 0 <= pid < self._n:
            raise KeyError(pid)
        if pid not in self._keys:
            self._keys[pid] = (
                Ed25519PrivateKey.from_private_bytes(derive_identity_key(self._secret, pid))
                .public_key()
                .public_bytes_raw()
            )
        return self._keys[pid]

    def __contains__(self, pid) -> bool:
        return isinstance(pid, int) and 0 <= pid < self._n

    def __iter__(self):
        return iter(range(self._n))

    def __len__(self) -> int:
        return self._n


def _load_private(value: str) -> bytes:
    if re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        return bytes.fromhex(value.strip())
    path = Path(value).expanduser()
    if not path.is_file():
        raise IdentityError(
            f"node config {IDENTITY_KEY_NODE!r}: no file {str(path)!r} (give "
            "the path of the client's Ed25519 private key, PEM or 32 raw "
            "bytes, or its 64-hex-digit seed)"
        )
    data = path.read_bytes()
    if len(data) == 32:
        return data
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as err:
        raise IdentityError(
            f"node config {IDENTITY_KEY_NODE!r}: {str(path)!r} is not an "
            f"Ed25519 private key ({err})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(
            f"node config {IDENTITY_KEY_NODE!r}: {str(path)!r} holds a "
            f"{type(key).__name__}, not an Ed25519 key"
        )
    return key.private_bytes_raw()


def _load_directory(value: str) -> dict[int, bytes]:
    path = Path(str(value)).expanduser()
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise IdentityError(
            f"node config {IDENTITY_DIRECTORY_NODE!r}: cannot read {str(path)!r} as JSON ({err})"
        ) from None
    items = (
        enumerate(raw) if isinstance(raw, list) else raw.items() if isinstance(raw, dict) else None
    )
    if items is None:
        raise IdentityError(
            f"node config {IDENTITY_DIRECTORY_NODE!r}: {str(path)!r} must "
            "hold a list or an object of hex Ed25519 public keys"
        )
    out = {}
    for pid, hexkey in items:
        key = bytes.fromhex(str(hexkey))
        if len(key) != PUBLIC_BYTES:
            raise IdentityError(
                f"node config {IDENTITY_DIRECTORY_NODE!r}: the key of partition "
                f"{pid} is not a 32-byte Ed25519 public key"
            )
        out[int(pid)] = key
    return out


def client_identity(node_config: Mapping | None, partition_id: int, num_clients: int) -> Identity:
    """Client ``partition_id``'s :class:`Identity`: from the node config
    (``identity-key`` and ``identity-directory``, a deployment), else from
    ``$FEDGRAPH_IDENTITY_SECRET`` (a simulation: keys and the directory of partitions
    ``0..num_clients-1`` derived from it).

    Raises:
        IdentityError: nothing provisioned, only one of the two node-config keys, a short
            secret, or a directory without this client's own public key.
    """
    nc = node_config or {}
    key_v, dir_v = nc.get(IDENTITY_KEY_NODE), nc.get(IDENTITY_DIRECTORY_NODE)
    if key_v not in (None, "") or dir_v not in (None, ""):
        if key_v in (None, "") or dir_v in (None, ""):
            raise IdentityError(
                f"secure aggregation: the node config names only one of "
                f"{IDENTITY_KEY_NODE!r} and {IDENTITY_DIRECTORY_NODE!r}; a "
                "client needs both (its key, and every client's public key)"
            )
        ident = Identity(int(partition_id), _load_private(str(key_v)), _load_directory(dir_v))
    else:
        secret = os.environ.get(IDENTITY_ENV, "")
        if not secret:
            raise IdentityError(
                f"secure aggregation needs identity keys provisioned outside the server: set "
                f"the node config keys {IDENTITY_KEY_NODE!r} and {IDENTITY_DIRECTORY_NODE!r} "
                f"(flower-supernode --node-config), or, in a simulation, the environment "
                f"variable {IDENTITY_ENV} of the client processes (`fedgraph run` creates it; "
                f"under `flwr run` export it first, e.g. python -c 'import secrets; "
                f"print(secrets.token_hex(32))')"
            )
        if len(secret) < MIN_SECRET_LENGTH:
            raise IdentityError(
                f"${IDENTITY_ENV} has {len(secret)} characters; use at least "
                f"{MIN_SECRET_LENGTH} random ones"
            )
        ident = Identity(
            int(partition_id),
            derive_identity_key(secret.encode(), partition_id),
            _DerivedDirectory(secret.encode(), int(num_clients)),
        )
    if ident.directory.get(ident.partition_id) != ident.public_key:
        raise IdentityError(
            f"secure aggregation: the identity directory does not hold client "
            f"{ident.partition_id}'s own public key (wrong directory or key)"
        )
    return ident


__all__ = [
    "IDENTITY_ENV",
    "IDENTITY_KEY_NODE",
    "IDENTITY_DIRECTORY_NODE",
    "Identity",
    "IdentityError",
    "client_identity",
    "derive_identity_key",
    "ensure_simulation_secret",
    "key_label",
    "key_statement",
]
