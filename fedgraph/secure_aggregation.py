"""Pairwise-masked secure aggregation of real-valued rows (SecAgg, Bonawitz et al., CCS 2017,
Sections 3-4 "masking with one-time pads" and "pairwise masks"; SecAgg+, Bell et al., CCS 2020),
without dropout recovery.

Protocol (one run):

1. Each client generates an X25519 key pair (:func:`generate_key_pair`, OS randomness) and sends
   its *public* key through the server; the server broadcasts all public keys in a fixed order
   (client index ``0..n-1``). The private key never leaves the client.
2. Each pair of clients ``(i, j)`` derives the same 32-byte key without the server:
   X25519(sk_i, pk_j) = X25519(sk_j, pk_i), then HKDF-SHA256 bound to a context string (run,
   PMA graph, hop, purpose) and to both public keys (:func:`pairwise_keys`), so no mask is ever
   used twice.
3. Each pairwise key is expanded with the ChaCha20 keystream into one ``uint64`` per row
   element (:func:`mask_stream`), indexed by the row's public id (a node id), so both clients
   of a pair draw the same mask for the same row.
4. A client quantizes its rows to fixed point in the ring Z / 2^64 (:func:`quantize`) and adds,
   for every peer ``j`` that also sends that row, ``+mask_ij`` if ``i < j`` and ``-mask_ij``
   otherwise (:func:`mask_rows`). The server adds the masked rows of a row id over its
   contributors modulo 2^64: the masks cancel exactly and it gets the sum of the quantized rows
   (:func:`unmask_sum`), which it dequantizes.

Who contributes which row (federated GAP's PMA): a row is a node ``w``; every client except
``w``'s owner sends one, so the masks of row ``w`` must cancel over the clients other than
``owner(w)``: pairs of clients both different from ``owner(w)``. The ownership map (node id ->
client index) is public here: every supernode computes the partition from the public run
config, and the server learns it at setup.

What it protects, against whom, assuming what:

* The server (honest-but-curious: it follows the protocol, relays the public keys unchanged,
  and reads everything it receives) sees, per client and row, ``q(x) + sum of masks`` with
  masks from ChaCha20 under keys derived from X25519 shared secrets it cannot compute from the
  public keys: each masked row is uniform on Z / 2^64 whatever the client's data, as long as
  at least one other contributor of that row is honest (not colluding with the server). It
  learns the sum over all contributors, nothing else. With 2 clients a row has one contributor
  and no mask: the "sum" is the row itself (masking cannot hide it).
* Not covered: a server that substitutes public keys (active attack; SecAgg's PKI /
  signatures are not implemented), a server colluding with clients (their masks are known to
  them), and dropouts: there is no secret sharing of the masks (SecAgg's Shamir recovery), so a
  missing contributor leaves its masks in the sum, and the round fails (:func:`unmask_sum`
  raises, as does the strategy when a reply is missing).

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

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRAC_BITS = 24  #: fixed-point fraction bits: quantization step 2^-24 (6.0e-8)
KEY_BYTES = 32  #: X25519 key and ChaCha20 key size
_SCALE = float(2 ** FRAC_BITS)


def generate_key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair from the OS's randomness: ``(private 32 bytes, public 32
    bytes)``. Keep the private key on the client; send only the public key."""
    sk = X25519PrivateKey.generate()
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


def pairwise_keys(private_key: bytes, public_keys: list[bytes], me: int,
                  context: str) -> dict[int, bytes]:
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
        out[j] = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                      info=info).derive(shared)
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
        raise ValueError("secure aggregation: a row to mask is not finite (NaN or inf); "
                         "refusing to release")
    b = clip_bound(contributors)
    return np.rint(np.clip(x, -b, b) * _SCALE).astype(np.int64).view(np.uint64)


def dequantize(q: np.ndarray) -> np.ndarray:
    """Ring elements (``uint64``) -> real values (``float64``), reading them as signed."""
    return np.asarray(q, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE


def mask_rows(rows: np.ndarray, row_ids: np.ndarray, owner: np.ndarray, me: int,
              private_key: bytes, public_keys: list[bytes], context: str) -> np.ndarray:
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
        raise ValueError(f"rows must be [m, e] with m row ids, got {rows.shape} and "
                         f"{row_ids.shape}")
    if row_ids.size and (row_ids.min() < 0 or row_ids.max() >= owner.size
                         or np.unique(row_ids).size != row_ids.size):
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


def unmask_sum(contributions: dict[int, tuple[np.ndarray, np.ndarray]], owner: np.ndarray,
               num_clients: int) -> tuple[np.ndarray, np.ndarray]:
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
            f"and this protocol has no dropout recovery: the round fails")
    return ids, dequantize(total[ids])
