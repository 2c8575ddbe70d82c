"""Pairwise-masked secure aggregation of real-valued rows (SecAgg, Bonawitz et al., CCS 2017,
Sections 3-4 "masking with one-time pads" and "pairwise masks"; SecAgg+, Bell et al., CCS 2020),
without dropout recovery.

Protocol (one run):

1. Each client generates an X25519 key pair (:func:`generate_key_pair`, OS randomness), signs
   its *public* key under its long-term Ed25519 identity key (:mod:`fedgraph.identity`: the
   statement binds the run id, the method, the client's partition id and the key exchange's
   label) and sends key, partition id and signature through the server; the server relays
   them all to every client in a fixed order (client index ``0..n-1``) with the client's own
   index. The private keys never leave the client.
2. Before it masks anything, each client verifies the list it was relayed
   (:func:`verify_key_list`) against the directory of identity public keys that it got from
   the provisioning, never from the server: every signature, one key per partition id, no key
   repeated, its own key and partition id at its index, as many keys as the protocol needs. A
   list it cannot verify is refused (``ValueError``) and nothing is released.
3. Each pair of clients ``(i, j)`` derives the same 32-byte key without the server:
   X25519(sk_i, pk_j) = X25519(sk_j, pk_i), then HKDF-SHA256 bound to a context string (run,
   PMA graph, hop, purpose) and to both public keys (:func:`pairwise_keys`), so no mask is ever
   used twice.
4. Each pairwise key is expanded with the ChaCha20 keystream into one ``uint64`` per row
   element (:func:`mask_stream`), indexed by the row's public id (a node id), so both clients
   of a pair draw the same mask for the same row.
5. A client quantizes its rows to fixed point in the ring Z / 2^64 (:func:`quantize`) and adds,
   for every peer ``j`` that also sends that row, ``+mask_ij`` if ``i < j`` and ``-mask_ij``
   otherwise (:func:`mask_rows`). The server adds the masked rows of a row id over its
   contributors modulo 2^64: the masks cancel exactly and it gets the sum of the quantized rows
   (:func:`unmask_sum`), which it dequantizes.

Who contributes which row (federated GAP's PMA): a row is a node ``w``; every client except
``w``'s owner sends one, so the masks of row ``w`` must cancel over the clients other than
``owner(w)``: pairs of clients both different from ``owner(w)``. The ownership map (node id ->
client index) is public here: every supernode computes the partition from the public run
config, and the server learns it at setup. PrivGNN's ensemble histograms have no owner: every
client sends every row. A client counts the contributors of its rows itself, from the keys it
verified (:meth:`VerifiedKeys.contributors`), and only that count may lower its noise share.

What it protects, against whom, assuming what:

* The server, even one that deviates from the protocol within its message schema (relays
  substituted, replayed, reordered or missing keys; lies about an owner), cannot unmask an
  individual client's row without a colluding client. It sees, per client and row,
  ``q(x) + sum of masks`` with masks from ChaCha20 under keys derived from X25519 shared
  secrets between *verified* peers, which it cannot compute: it cannot insert a public key
  whose private key it knows, because it cannot sign for any identity in the clients'
  directory. Each masked row is uniform on Z / 2^64 whatever the client's data, as long as at
  least one other contributor of that row is honest (not colluding with the server). Any set
  of masked rows whose masks cancel holds the rows of every contributor of the row (an
  owner the server misreports only leaves a mask that never cancels), so the server learns
  at most the sum over all contributors. With 2 clients a row has one contributor and no
  mask: the "sum" is the row itself (masking cannot hide it, and the client counts 1
  contributor).
* Assumed: identity keys are provisioned outside the server (a deployment's node config,
  like certificates and a trust store; :mod:`fedgraph.identity`); no Sybil clients (every
  identity in the directory is a distinct real client that does not collude with the
  server); the other contributors add their noise shares (a client cannot see them). In the
  simulation every client derives every identity key from one provisioning secret in the
  process environment (``$FEDGRAPH_IDENTITY_SECRET``), an artifact of simulating, like
  ``$FEDGRAPH_NOISE_SECRET``; the server code never reads it.
* Not covered: a server colluding with clients (their masks are known to them: a coalition
  of all but one contributor of a row recovers that row), and dropouts: there is no secret
  sharing of the masks (SecAgg's Shamir recovery), so a missing contributor leaves its masks
  in the sum, and the round fails (:func:`unmask_sum` raises, as does the strategy when a
  reply is missing): a deviating server can always deny service.

Quantization: ``q(x) = round(clip(x, -B, B) * 2^FRAC_BITS)`` with ``FRAC_BITS = 24`` and the
public clip bound ``B = 2^(62 - FRAC_BITS) / contributors`` (:func:`clip_bound`), so the sum
of the contributors' rows stays below ``2^62`` in absolute value and never wraps. Rounding to
nearest: each element of the recovered sum differs from the exact sum of the clipped rows by at
most ``contributors * 2^-(FRAC_BITS + 1)`` (:func:`quantization_error_bound`; 2.7e-7 for 9
contributors), orders of magnitude below any noise std GAP calibrates. Clipping and rounding act
on the already noised rows: post-processing, no effect on differential privacy.

Do not derive masks with Flower's ``secaggplus_utils.pseudo_rand_gen``: it folds the seed to 32
bits (``np.random.RandomState``), so a server could try every seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRAC_BITS = 24  #: fixed-point fraction bits: quantization step 2^-24 (6.0e-8)
KEY_BYTES = 32  #: X25519 key and ChaCha20 key size
_SCALE = float(2**FRAC_BITS)


def generate_key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair from the OS's randomness: ``(private 32 bytes, public 32
    bytes)``. Keep the private key on the client; send only the public key."""
    sk = X25519PrivateKey.generate()
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


@dataclass(frozen=True)
class VerifiedKeys:
    """A key list a client verified (:func:`verify_key_list`): every client's X25519 public key
    by index, the partition id each one is signed for, and this client's index. Only
    :func:`verify_key_list` makes one."""

    public_keys: tuple[bytes, ...]
    partition_ids: tuple[int, ...]
    index: int

    def contributors(self, owned: bool) -> int:
        """How many verified clients' rows add up in one summed row, by the masking rule of
        :func:`mask_rows`: every client but the row's owner (``owned``: GAP's and ProGAP's
        remote rows), or every client (PrivGNN's ensemble histograms, no owner). At least 1."""
        n = len(self.public_keys)
        return max(n - 1, 1) if owned else n


def verify_key_list(
    record: Mapping, private_key: bytes | None, identity, *, run_id: int, method: str, required: int
) -> VerifiedKeys:
    """A client's check of the key list the server relays (a request's ``secagg`` record:
    ``public-keys``, ``partition-ids``, ``signatures``, ``index``), before it masks anything.

    Every entry ``j`` must carry a valid Ed25519 signature of
    :func:`fedgraph.identity.key_statement` ``(run_id, method, partition_ids[j],
    public_keys[j], key_label(method))`` under the identity key that the client's *own*
    directory (``identity``, a :class:`fedgraph.identity.Identity` from the provisioning, never
    from the server) holds for ``partition_ids[j]``.

    Args:
        record: the request's ``secagg`` record.
        private_key: this client's X25519 private key from its key exchange (``None``: it made
            none, and refuses).
        identity: this client's :class:`~fedgraph.identity.Identity`.
        run_id, method: the run and the method the keys must be signed for.
        required: how many keys the protocol needs (every client of the run: the masks of a
            row cancel only over all of its contributors).

    Returns:
        :class:`VerifiedKeys`.
    Raises:
        ValueError: a missing field or private key, lists of different lengths, fewer (or more)
            keys than ``required``, a partition id repeated or not in the directory, a key
            repeated or not 32 bytes, a bad signature, or an entry at this client's index that
            is not its own key and partition id (or its own partition id at another index).
            The message says "refusing to release": the caller releases nothing.
    """
    from .identity import key_label, key_statement

    def refuse(why: str) -> ValueError:
        return ValueError(
            f"secure aggregation: the key list the server relayed cannot be "
            f"verified ({why}); refusing to release"
        )

    if private_key is None:
        raise refuse("this client made no key exchange for it: it holds no private key")
    missing = [
        k for k in ("public-keys", "partition-ids", "signatures", "index") if k not in record
    ]
    if missing:
        raise refuse(f"missing {missing}")
    pks = [bytes(k) for k in record["public-keys"]]
    pids = [int(p) for p in record["partition-ids"]]
    sigs = [bytes(s) for s in record["signatures"]]
    me = int(record["index"])
    if not len(pks) == len(pids) == len(sigs):
        raise refuse(f"{len(pks)} keys, {len(pids)} partition ids, {len(sigs)} signatures")
    if len(pks) != int(required):
        raise refuse(
            f"{len(pks)} keys, the protocol needs one from each of the {int(required)} clients"
        )
    if not 0 <= me < len(pks):
        raise refuse(f"this client's index {me} is outside the {len(pks)} keys")
    if len(set(pids)) != len(pids):
        raise refuse("a partition id appears twice (a key of one identity at two indices)")
    if len(set(pks)) != len(pks) or any(len(k) != KEY_BYTES for k in pks):
        raise refuse("the public keys are not distinct 32-byte X25519 keys")
    own = X25519PrivateKey.from_private_bytes(bytes(private_key)).public_key().public_bytes_raw()
    if pids[me] != identity.partition_id or pks[me] != own:
        raise refuse(
            f"index {me} does not hold this client's own key and partition id "
            f"{identity.partition_id}"
        )
    label = key_label(method)
    for j, (pk, pid, sig) in enumerate(zip(pks, pids, sigs)):
        if pid not in identity.directory:
            raise refuse(
                f"key {j} claims partition {pid}, which is not in this client's "
                f"directory of identities"
            )
        if not identity.verifies(pid, key_statement(run_id, method, pid, pk, label), sig):
            raise refuse(
                f"key {j}'s signature does not verify under partition {pid}'s "
                f"identity key (run {run_id}, method {method!r}): a key the server "
                f"substituted or replayed"
            )
    return VerifiedKeys(tuple(pks), tuple(pids), me)


def advertise(
    node_config, partition_id: int, run_id: int, method: str, num_clients: int
) -> tuple[bytes, dict]:
    """A client's side of the key exchange (``query.<method>_keys``): a fresh X25519 key pair
    (:func:`generate_key_pair`) and its public key signed under the client's identity key
    (:func:`fedgraph.identity.client_identity`, from its node config or the simulation's
    provisioning). Returns ``(private key, reply fields)``: keep the private key, send
    ``{"public-key", "partition-id", "signature"}``.

    Raises:
        fedgraph.identity.IdentityError: no identity provisioned."""
    from .identity import client_identity, key_label, key_statement

    identity = client_identity(node_config, partition_id, num_clients)
    private, public = generate_key_pair()
    signature = identity.sign(
        key_statement(run_id, method, partition_id, public, key_label(method))
    )
    return private, {
        "public-key": public,
        "partition-id": int(partition_id),
        "signature": signature,
    }


def verify_relayed(
    record: Mapping,
    private_key: bytes | None,
    node_config,
    partition_id: int,
    run_id: int,
    method: str,
    num_clients: int,
) -> VerifiedKeys:
    """:func:`verify_key_list` with the client's own identity directory
    (:func:`fedgraph.identity.client_identity`, from its node config or the simulation's
    provisioning, never from the server) and every one of the ``num_clients`` keys
    required."""
    from .identity import client_identity

    return verify_key_list(
        record,
        private_key,
        client_identity(node_config, partition_id, num_clients),
        run_id=run_id,
        method=method,
        required=num_clients,
    )


def pairwise_keys(
    private_key: bytes, public_keys: list[bytes], me: int, context: str
) -> dict[int, bytes]:
    """One 32-byte key per peer: HKDF-SHA256 (no salt) of the X25519 shared secret with
    ``info = context || 0x00 || pk_lo || pk_hi`` (the pair's public keys in index order).

    Args:
        private_key: this client's raw X25519 private key (32 bytes).
        public_keys: every client's raw public key, by client index.
        me: this client's index; ``public_keys[me]`` must be its own public key.
        context: what the key is for (run, graph, hop, purpose): a different context gives an
            independent key, so masks are never reused. No NUL character.

    Returns:
        ``{peer index: key}`` for every peer ``j != me``; the peer derives the same key.
    Raises:
        ValueError: ``public_keys[me]`` is not this client's key, a key is malformed or
            repeated, or ``context`` has a NUL.
    """
    if "\x00" in context:
        raise ValueError("context must not contain NUL")
    if not 0 <= me < len(public_keys):
        raise ValueError(f"client index {me} outside the {len(public_keys)} public keys")
    if len(set(public_keys)) != len(public_keys) or any(len(k) != KEY_BYTES for k in public_keys):
        raise ValueError("public keys must be distinct 32-byte X25519 keys")
    sk = X25519PrivateKey.from_private_bytes(private_key)
    if sk.public_key().public_bytes_raw() != public_keys[me]:
        raise ValueError(f"public key {me} is not this client's key")
    out = {}
    for j, pk in enumerate(public_keys):
        if j == me:
            continue
        shared = sk.exchange(X25519PublicKey.from_public_bytes(pk))
        lo, hi = sorted((me, j))
        info = context.encode() + b"\x00" + public_keys[lo] + public_keys[hi]
        out[j] = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(
            shared
        )
    return out


def mask_stream(key: bytes, num_rows: int, dim: int) -> np.ndarray:
    """``[num_rows, dim]`` ``uint64`` mask: the ChaCha20 keystream of ``key`` (nonce 0: each
    key is used for one stream only), 8 bytes per element, row-major; row ``r`` is the mask of
    the row with public id ``r``."""
    cipher = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    raw = cipher.update(bytes(8 * num_rows * dim))
    return np.frombuffer(raw, dtype="<u8").reshape(num_rows, dim)


def clip_bound(contributors: int) -> float:
    """Public clip bound ``B = 2^(62 - FRAC_BITS) / contributors`` of every quantized element:
    the sum of ``contributors`` quantized rows stays in ``(-2^62, 2^62)``, no wrap-around."""
    if contributors < 1:
        raise ValueError(f"contributors must be >= 1, got {contributors}")
    return 2.0 ** (62 - FRAC_BITS) / contributors


def quantization_error_bound(contributors: int) -> float:
    """Largest error of one element of a recovered sum against the exact sum of the clipped
    rows: ``contributors * 2^-(FRAC_BITS + 1)`` (each row rounded to nearest)."""
    return contributors * 2.0 ** -(FRAC_BITS + 1)


def quantize(x: np.ndarray, contributors: int) -> np.ndarray:
    """Real rows -> ring elements (``uint64``, two's complement of
    ``round(clip(x, -B, B) * 2^FRAC_BITS)``, ``B = clip_bound(contributors)``).

    Raises:
        ValueError: a non-finite element (a NaN would otherwise hide in the masked sum).
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError(
            "secure aggregation: a row to mask is not finite (NaN or inf); refusing to release"
        )
    b = clip_bound(contributors)
    return np.rint(np.clip(x, -b, b) * _SCALE).astype(np.int64).view(np.uint64)


def dequantize(q: np.ndarray) -> np.ndarray:
    """Ring elements (``uint64``) -> real values (``float64``), reading them as signed."""
    return np.asarray(q, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE


def mask_rows(
    rows: np.ndarray,
    row_ids: np.ndarray,
    owner: np.ndarray,
    me: int,
    private_key: bytes,
    public_keys: list[bytes],
    context: str,
) -> np.ndarray:
    """One client's masked rows, what it sends the server instead of ``rows``.

    Args:
        rows: ``[m, e]`` real rows (float) to sum securely.
        row_ids: ``[m]`` distinct public ids of the rows (node ids, ``< N``).
        owner: ``[N]`` client index owning each id: that client sends no row for it, every
            other client sends exactly one (the contributors of id ``w`` are the clients
            ``!= owner[w]``); ``-1``: no owner, every one of the ``n`` clients sends a row
            (e.g. PrivGNN's ensemble histograms, one row per query).
        me: this client's index; private_key, public_keys, context: as in
            :func:`pairwise_keys`.

    Returns:
        ``[m, e]`` ``uint64``: ``quantize(rows) + sum_j s_ij * mask_ij[row_ids]`` mod 2^64,
        over the peers ``j`` that also contribute the row (``owner != j``), ``s_ij = +1`` if
        ``me < j`` else ``-1``.
    Raises:
        ValueError: shapes disagree, a row id repeats, is out of range or is owned by this
            client, or a row is not finite.
    """
    rows, row_ids, owner = np.asarray(rows), np.asarray(row_ids, np.int64), np.asarray(owner)
    n = len(public_keys)
    if rows.ndim != 2 or row_ids.shape != (rows.shape[0],):
        raise ValueError(
            f"rows must be [m, e] with m row ids, got {rows.shape} and {row_ids.shape}"
        )
    if row_ids.size and (
        row_ids.min() < 0 or row_ids.max() >= owner.size or np.unique(row_ids).size != row_ids.size
    ):
        raise ValueError(f"row ids must be distinct ids in [0, {owner.size})")
    own = owner[row_ids]
    if ((own < -1) | (own >= n)).any():
        raise ValueError(f"every masked row needs an owner in [0, {n}) or -1 (no owner)")
    if (own == me).any():
        raise ValueError("a client contributes no row for its own nodes")
    out = quantize(rows, n if (own < 0).any() else max(n - 1, 1))
    for j, key in pairwise_keys(private_key, public_keys, me, context).items():
        m = mask_stream(key, owner.size, rows.shape[1])[row_ids]
        m[own == j] = 0  # j owns these rows: it sends none, so the pair adds no mask
        out = out + m if me < j else out - m  # uint64: wraps mod 2^64
    return out


def unmask_sum(
    contributions: dict[int, tuple[np.ndarray, np.ndarray]], owner: np.ndarray, num_clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """The server's step: add the masked rows of each id over its contributors (mod 2^64),
    which cancels the masks, and dequantize.

    Args:
        contributions: client index -> ``(row_ids [m_c], masked [m_c, e] uint64)`` from
            :func:`mask_rows`.
        owner: ``[N]`` client index owning each id (as sent to the clients; ``-1``: no
            owner).
        num_clients: ``n``, the number of clients (of public keys): each id needs ``n - 1``
            contributions (``n`` for an id without owner).

    Returns:
        ``(ids [k], sums [k, e] float64)``: every id some client sent, sorted, with the sum of
        its contributors' rows (up to :func:`quantization_error_bound`).
    Raises:
        ValueError: an id does not have a row from every client other than its owner (a
            dropped or partial reply: the masks do not cancel, and there is no dropout
            recovery), or a client sent a row for its own node or a repeated id.
    """
    owner = np.asarray(owner)
    dims = {np.asarray(r).shape[1] for _, r in contributions.values() if np.asarray(r).size}
    if len(dims) > 1:
        raise ValueError(f"masked rows of different widths {sorted(dims)}")
    dim = dims.pop() if dims else 0
    total = np.zeros((owner.size, dim), dtype=np.uint64)
    count = np.zeros(owner.size, dtype=np.int64)
    for c, (ids, masked) in contributions.items():
        if not 0 <= c < num_clients:
            raise ValueError(f"client index {c} outside [0, {num_clients})")
        ids = np.asarray(ids, np.int64)
        if np.unique(ids).size != ids.size or (ids.size and (owner[ids] == c).any()):
            raise ValueError(f"client {c} sent a repeated id or a row for its own node")
        if ids.size:
            total[ids] += np.asarray(masked, np.uint64)  # wraps mod 2^64
            count[ids] += 1
    ids = np.flatnonzero(count)
    n = num_clients
    need = np.where(owner[ids] < 0, n, n - 1)
    short = ids[count[ids] != need]
    if short.size:
        senders = sorted(contributions)
        raise ValueError(
            f"secure aggregation: {short.size} row(s) (e.g. row {int(short[0])}) have "
            f"{int(count[short[0]])} of the {int(need[count[ids] != need][0])} contributions "
            f"they need (replies from clients {senders}); the pairwise masks cancel only in the "
            f"sum over every contributor (every client other than the row's owner, if any), "
            f"and this protocol has no dropout recovery: the round fails"
        )
    return ids, dequantize(total[ids])
