"""Where a client's randomness comes from: generators the server cannot reconstruct.

Every noise draw, sample and shuffle a client makes (GAP's PMA noise, degree sampling and DP-SGD
with its Poisson sampling; PrivGNN's Poisson samples, teachers and Laplace noise; PPGNN's
PPM/ESW/multi-bit/one-bit/Laplace/Gaussian draws and randomized response) comes from the
generator :func:`client_generator` returns. Every release gets its own key,
``HMAC-SHA256(root, run digest | data digest | partition id | purpose)`` (the data digest:
:func:`client_data_digest` of what the client holds); the run config's ``noise-source``
picks the root, which never comes from the run config (the server holds it):

``secure`` (default)
    256 bits of fresh OS entropy (``os.urandom``) drawn at the client's first release of a run
    and kept in its Flower ``context.state`` (runs are not reproducible); each release draws
    from a cryptographically secure generator, :class:`SecureRandom` (the AES-256-CTR
    keystream under the release's key, ``cryptography``/OpenSSL).
``secret``
    the same CSPRNG, for reproducible simulations: the root is the client's own secret,
    ``node_config["noise-secret"]`` (a deployed ``flower-supernode --node-config
    "noise-secret='...'"``), else the environment variable ``FEDGRAPH_NOISE_SECRET`` of the
    client's process (a simulation: Ray's workers inherit the driver's environment, so one
    master secret serves every simulated client, an artifact of simulating; deployments give
    each supernode its own). The run digest covers every run-config key that changes what is
    released (all but :data:`NOT_RELEASE_KEYS`) and the key also covers a digest of the
    client's data (:func:`client_data_digest`), so two runs on different configs or on data
    that differ in one edge, node or label never share noise (separate runs are separate
    releases: their epsilons compose). The same secret, config and data give the same noise
    draws; the released values are equal up to floating-point summation order (PyTorch's
    multithreaded reductions: differences of order 1e-6 seen between two identical GAP runs),
    not bit for bit.
``mt19937`` (explicit opt-in only; issue 28, fault 4)
    the root of ``secure``, but each release draws from PyTorch's CPU generator (MT19937) whose
    whole 19,937-bit state is filled from the release's key (:func:`torch_generator`; what
    ``os``, the default before, did). **MT19937 is not a CSPRNG**: its state is a linear
    function of 624 consecutive outputs, and a client releases raw outputs: 88.7% (3 louvain
    clients, Cora) to 96.3% (10 clients) of the remote rows a GAP client releases cover no
    edge and are exactly ``sigma * randn()`` with ``sigma`` in the public plan, tens of
    thousands of consecutive outputs per release. A server that recovers the state removes the
    noise of every draw of that release. Use it only to compare with PyTorch's generator.
``os`` (refused)
    the old default (MT19937 from OS entropy): a config naming it is refused with a
    :class:`~fedgraph.config.ConfigError` that says so, so nobody gets MT19937 without asking.

Opacus's own secure mode needs ``torchcsprng``, which no longer builds for current PyTorch,
so the CSPRNG is ours. Its cost: ``bench/noise_cost.py`` (GAP's PMA at 1e5 and 1e6 nodes).

Gaussian noise and floating-point attacks (Mironov, CCS 2012; Jin et al., "Are We There Yet?
Timing and Floating-Point Attacks on Differential Privacy Systems", IEEE S&P 2022, arXiv
2112.05307): a noisy value computed and rounded in the precision it is released in leaks the
private value's low bits (the set of reachable outputs depends on it). :func:`add_gaussian`
therefore adds the noise in float64 and rounds once to the release's dtype: a float32 release
(GAP's PMA rows, DP-SGD's gradients) is the rounding of a value whose float64 structure lies
29 bits below the release's resolution, i.e. a post-processing of the Gaussian mechanism up to
that perturbation (the float64 grid shows only where the result falls below ``2^-29`` of the
summands, probability at most ``2^-28 max_t t phi(t)``, about ``1e-9``, per coordinate, and
there too the Box-Muller image on 52-bit uniforms is dense: of the order of ``2^53 |v| phi(v)``
preimages per float64 value ``v``, against Mironov's ``ln(U)``, which skips most floats).
:class:`SecureRandom` draws every Gaussian by Box-Muller in float64 from two 52-bit uniforms
(both outputs used; support ``|z| <= 8.49``, the tail beyond it has mass ``2e-17``). Where the
noise is released in float64 (or its dtype asks for float64: ``draw_dtype``), the sampler's
precision is the release's, which is the setting of Jin et al.'s attack, and four such draws
are summed and halved as Opacus's ``secure_mode`` does (Holohan and Braghin, arXiv 2107.10138
Sec. 5.1: inverting the sampler costs ``2^159``); DP-SGD and the PPGNN Gaussian mechanism draw
float64 noise and get it (small tensors). Float32 noise (GAP's PMA rows, by far the most
Gaussians: N e per client and hop; PrivGNN's votes) gets one draw: the sum of four costs 4x
(far over the budget of 10% of the PMA phase: ``bench/noise_cost.py`` times it too) and
protects nothing a float32 release exposes once the addition is done in float64. This is a change: ``secure`` used to sum
four for every draw but rounded the noise to float32 before a float32 addition, which is the
exposed case.

Threat model: a server that may deviate from the protocol (``docs/explanations/threat-model.md``).
Every release key binds, beyond the data, the client's transcript of the run (every request it
received, in order: :mod:`fedgraph.client_authority`), so a release on a different input draws
fresh noise; a second request under a purpose the client already spent is answered with the
same release if it is identical and refused otherwise (the client's own ledger,
:class:`fedgraph.client_authority.ClientAuthority`), so the server never gets two releases of one
purpose to subtract.

The draw functions :func:`rand`, :func:`randn`, :func:`add_gaussian`, :func:`randint` and
:func:`randperm` take either kind of generator; with a :class:`torch.Generator` they are exactly
``torch.rand(..., generator=...)`` and friends, so seeded runs are unchanged. Code that calls
``torch.rand(..., generator=g)`` itself (a custom mechanism) fails with a ``TypeError`` under
``secure``/``secret``: call these functions instead.

Laplace noise and comparison samplers (issue 60, faults 5 and 7; Mironov 2012): Laplace noise
is drawn in float64 from 53-bit uniform integers (:func:`laplace`) and added in float64 with
one rounding (:func:`add_laplace`), as Gaussian noise is. A sampler that compares a uniform
with a probability (randomized response, the 1-bit signs, ESW, Poisson sampling) compares a
53-bit uniform integer (:func:`uniform_bits`) with an integer threshold (:func:`bernoulli_bits`,
:func:`bernoulli`), so each event's probability is exactly ``t / 2^53``; the mechanisms round
their thresholds in the private direction and refuse an epsilon the grid cannot carry
(:mod:`fedgraph.mechanisms.thresholds`). A float32 uniform against a float32 threshold, what
this replaces, made randomized response's effective epsilon 16.03 at a nominal 16 and infinite
from 19.1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os

import numpy as np
import torch
from torch import Tensor

#: accepted ``noise-source`` values; the first is the default (``os``: refused, see the docs)
NOISE_SOURCES = ("secure", "secret", "mt19937")
#: the sources drawing from :class:`SecureRandom` (a CSPRNG)
CSPRNG_SOURCES = ("secure", "secret")
from .secret import SECRET_ENV, SECRET_NODE_KEY, check_secret  # noqa: F401, E402 (re-exported)

#: run-config fields that do not change what a client releases (same noise across them)
NOT_RELEASE_KEYS = frozenset({"device", "output_dir", "run_name", "timeout"})


#: 64-bit words per keystream call of :class:`SecureRandom` (256 KiB): large enough that the
#: microseconds of overhead of each numpy/torch call stay small beside its work (2^13: 25%
#: slower here), small enough that its buffers stay in cache (2^17: 10% slower)
CHUNK = 1 << 15
#: bytes one :class:`SecureRandom` may draw: 2^48 AES blocks (4 PiB; CTR's counter has 2^128),
#: where AES-CTR's distance from a random stream is still below 2^-32 (q^2 / 2^129 for q blocks)
_MAX_STREAM_BYTES = 16 * 2**48
_ZEROS = memoryview(bytes(8 * CHUNK))
#: the bits of float64 1.0: ``(w >> 12) | _ONE`` is a float64 in [1, 2) on the 2^-52 grid
_ONE = np.uint64(0x3FF0000000000000)


class SecureRandom:
    """A cryptographically secure random source: the AES-256-CTR keystream (``cryptography``,
    OpenSSL; AES-NI where the CPU has it, else OpenSSL's constant-time code) under a 256-bit key
    (``None``: 32 bytes of ``os.urandom``; :func:`client_generator` passes a key derived for one
    release), read in chunks of :data:`CHUNK` words into one reused buffer and converted in bulk
    (numpy, torch): no Python loop over elements. AES in counter mode under a secret random key
    is the CSPRNG of NIST SP 800-90A's CTR_DRBG and of ``torchcsprng`` (Opacus's secure mode);
    ChaCha20 (``cryptography`` too) gave the same streams' quality at 2-3x the cost here (3.4-4.6
    ns per 64-bit word against 1.3-1.8 with AES-NI), in a budget of 10% of GAP's PMA phase.

    Uniforms (:func:`rand`) take the top 53 (float64) or 24 (other dtypes) bits of 64-bit words,
    so they lie on the grid ``k 2^-53`` in ``[0, 1)`` exactly; :func:`randint` rejects instead
    of reducing modulo (no bias). Gaussians (:meth:`gaussians`): Box-Muller in float64 on
    52-bit uniforms, both outputs used (module docs: the floating-point defence). Limit: 2^48
    blocks of 16 bytes per instance, checked (one PMA release at 1e6 nodes and 16 dimensions
    reads 128 MB).
    """

    def __init__(self, key: bytes | None = None):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        if key is None:  # a fresh key: any nonce will do
            key = os.urandom(32)
        if len(key) != 32:
            raise ValueError(f"key: 32 bytes needed, got {len(key)}")
        # the 128-bit counter block from 0: fixed because every key is used once
        # (client_generator derives one key per release)
        self._stream = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
        self._used = 0
        # update_into wants room for a cipher block beyond the input
        self._raw = bytearray(8 * CHUNK + 64)
        # float64 views of the keystream buffer and work buffers, sliced once here: a torch
        # slice costs microseconds, which per chunk would be a third of the draw's time
        self._d = torch.from_numpy(
            np.frombuffer(self._raw, dtype=np.uint64, count=CHUNK).view(np.float64)
        )
        self._r = torch.empty(CHUNK // 2, dtype=torch.float64)
        self._t = torch.empty(CHUNK // 2, dtype=torch.float64)
        self._z = torch.empty(CHUNK, dtype=torch.float64)
        self._acc = None  # the sum of four's (float64 noise only)
        self._full = self._views(CHUNK)

    def _keystream(self, n: int) -> np.ndarray:
        """The next ``n <= CHUNK`` words of keystream: a view of the buffer, valid until the
        next call."""
        self._used += 8 * n
        if self._used > _MAX_STREAM_BYTES:
            raise RuntimeError("SecureRandom: 2^48 AES blocks (4 PiB) drawn under one key")
        self._stream.update_into(_ZEROS[: 8 * n], self._raw)
        return np.frombuffer(self._raw, dtype=np.uint64, count=n)

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words (``uint64 [n]``)."""
        n = int(n)
        out = np.empty(n, dtype=np.uint64)
        for s in range(0, n, CHUNK):
            m = min(CHUNK, n - s)
            out[s : s + m] = self._keystream(m)
        return out

    def _views(self, n: int) -> tuple:
        m = (n + 1) // 2
        z, r, t = self._z, self._r, self._t
        return (
            m,
            self._d[:m].numpy(),
            self._d[m : 2 * m].numpy(),
            r[:m],
            r[:m].numpy(),
            r[: n - m].numpy(),
            t[:m],
            t[:m].numpy(),
            t[: n - m],
            z[:m],
            z[:m].numpy(),
            z[m:n],
            z[m:n].numpy(),
            z[:n],
            n,
        )

    def _box_muller(self, views: tuple, scale: float) -> Tensor:
        """``n`` standard normals (times ``scale``) in float64 (:meth:`gaussians`): ``m =
        ceil(n / 2)`` pairs ``(u1, u2)`` of 52-bit uniforms from ``2m`` words, ``r =
        sqrt(-2 ln(1 - u1))`` (``1 - u1`` in ``(0, 1]``: finite), ``z[:m] = r cos(2 pi u2)``,
        ``z[m:] = r sin(2 pi u2)`` (the sines of the first ``n - m`` pairs). numpy for the
        arithmetic, torch (SLEEF) for log, cos and sin: the fastest of each here."""
        m, d1, d2, r, rn, rn2, t, tn, t2, z1, zn1, z2, zn2, z, _ = views
        w = self._keystream(2 * m)
        np.right_shift(w, np.uint64(12), out=w)
        np.bitwise_or(w, _ONE, out=w)  # d = 1 + u, u = k 2^-52 in [0, 1), exact
        np.subtract(2.0, d1, out=rn)  # 1 - u1 in (0, 1], exact
        torch.log(r, out=r)
        np.multiply(rn, -2.0, out=rn)
        np.sqrt(rn, out=rn)  # sqrt(-2 ln(1 - u1))
        if scale != 1.0:
            np.multiply(rn, scale, out=rn)
        np.multiply(d2, 2.0 * math.pi, out=tn)  # 2 pi (1 + u2): the angle 2 pi u2, plus 2 pi
        torch.cos(t, out=z1)
        np.multiply(zn1, rn, out=zn1)
        torch.sin(t2, out=z2)
        np.multiply(zn2, rn2, out=zn2)
        return z

    def gaussians(self, n: int, four: bool = False, scale: float = 1.0) -> Tensor:
        """``n <= CHUNK`` standard normals times ``scale``, float64 (a view of a buffer, valid
        until the next call): one Box-Muller draw each, or (``four``) the sum of four halved
        (Opacus's ``secure_mode``, for noise released in float64; module docs)."""
        views = self._full if n == CHUNK else self._views(int(n))
        z = self._box_muller(views, scale)
        if not four:
            return z
        if self._acc is None:
            self._acc = torch.empty(CHUNK, dtype=torch.float64)
        acc = self._acc[: views[-1]]
        acc.copy_(z)
        for _ in range(3):
            acc.add_(self._box_muller(views, scale))
        return acc.mul_(0.5)

    def __repr__(self) -> str:  # never show the key
        return "SecureRandom(AES-256-CTR)"


Generator = torch.Generator | SecureRandom | None


# --------------------------------------------------------------------------------------------
# A client's generators
# --------------------------------------------------------------------------------------------
def torch_generator(key: bytes) -> torch.Generator:
    """A CPU :class:`torch.Generator` whose whole MT19937 state (624 32-bit words) is
    SHAKE-256(``key``): a 256-bit key gives 2^256 possible streams, not the 2^32 that
    ``manual_seed`` allows (it keeps the seed's low 32 bits).

    Relies on the layout of PyTorch's CPU generator state (seed u64, left i32, seeded i32,
    next u64, 624 words stored as u64); ``tests/test_randomness.py`` checks it round-trips."""
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state().clone()
    words = np.frombuffer(hashlib.shake_256(key).digest(624 * 4), dtype=np.uint32)
    if not words.any():  # MT19937's one forbidden state; probability 2^-19968
        raise ValueError("degenerate key")
    raw = state.numpy()
    raw[24 : 24 + 624 * 8] = np.frombuffer(words.astype(np.uint64).tobytes(), dtype=np.uint8)
    gen.set_state(state)
    return gen


def run_digest(cfg) -> str:
    """SHA-256 of the run config's fields that change what a client releases (public: it is a
    function of the run config only)."""
    fields = {k: v for k, v in cfg.model_dump().items() if k not in NOT_RELEASE_KEYS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def derive_key(
    secret: bytes,
    digest: str,
    partition_id: int,
    purpose: str,
    data_digest: str = "",
    inputs_digest: str = "",
) -> bytes:
    """``HMAC-SHA256(secret, "<digest>|<data digest>|<partition id>|<purpose>[|<inputs
    digest>]")``: 32 bytes. Without the secret these keys are indistinguishable from random
    (HMAC is a PRF), whatever the server knows of the other inputs. ``data_digest``
    (:func:`client_data_digest`) binds the key to what the client holds, ``inputs_digest``
    (:func:`fedgraph.client_authority.transcript`: every request the client received in the
    run, in order, up to this release) to what it received (rows, weights), so that a release
    on a different input never shares noise with another (issue 60, fault 1)."""
    msg = f"{digest}|{data_digest}|{int(partition_id)}|{purpose}"
    if inputs_digest:
        msg += f"|{inputs_digest}"
    return hmac.new(secret, msg.encode(), hashlib.sha256).digest()


#: attribute under which :func:`client_data_digest` caches a graph's digest
_DIGEST_ATTR = "_fedgraph_data_digest"


def client_data_digest(data) -> str:
    """SHA-256 (hex) of everything a client holds in ``data`` (a
    :class:`~fedgraph.data.ClientGraph` or a PyG ``Data``: every tensor field, by name, dtype,
    shape and bytes, in name order; other fields by ``repr``). Mixed into every release key
    (:func:`derive_key`): ``noise-source = "secret"`` runs on data that differ in one edge,
    node, feature or label draw independent noise, so subtracting two releases reveals nothing
    (issue 28, fault 3); identical data give identical keys. Never leaves the client (it is a
    function of private data). Cached on ``data`` (the partition's tensors are not modified).
    """
    cached = getattr(data, _DIGEST_ATTR, None)
    if cached is not None:
        return cached
    if hasattr(data, "__dataclass_fields__"):
        fields = {k: getattr(data, k) for k in data.__dataclass_fields__}
    elif hasattr(data, "to_dict"):  # torch_geometric Data
        fields = dict(data.to_dict())
    else:
        fields = dict(vars(data))
    from .digest import content_digest

    out = content_digest((name, fields[name]) for name in sorted(fields))
    try:
        object.__setattr__(data, _DIGEST_ATTR, out)
    except (AttributeError, TypeError):  # slots / frozen: no cache
        pass
    return out


#: ``context.state`` key of the client's run key (``secure``/``mt19937``; never leaves the client)
RUN_KEY_STATE = "fedgraph.noise-run-key"


def _run_key(state) -> bytes:
    """A 256-bit key drawn from ``os.urandom`` on the client's first release of the run and kept
    in its ``context.state`` (client-side only), so that one purpose gets one stream within the
    run (e.g. the same degree-bounded edges at every PMA hop) and the next run a fresh one."""
    from flwr.app import ConfigRecord

    if RUN_KEY_STATE not in state:
        state[RUN_KEY_STATE] = ConfigRecord({"key": os.urandom(32)})
    return bytes(state[RUN_KEY_STATE]["key"])


def client_generator(
    cfg, context, partition_id: int, purpose: str, data=None, inputs: str = ""
) -> Generator:
    """The generator of one client release (called by the ClientApp for every draw site).

    Every source derives one key per release, ``HMAC-SHA256(root, run digest | partition id |
    purpose)`` (:func:`derive_key`), from a root key the server never sees: ``secure``/
    ``mt19937``: 256 bits of ``os.urandom`` drawn on the client's first release of the run (kept
    in its ``context.state``); ``secret``: the client's own secret
    (``node_config["noise-secret"]``, else ``$FEDGRAPH_NOISE_SECRET``).

    Args:
        cfg: the run config (its ``noise_source``: ``secure``, ``secret`` or ``mt19937``).
        context: the client's Flower ``Context`` (``node_config``: a deployed client's
            ``noise-secret``; ``state``: the run key).
        partition_id: this client's index.
        purpose: a name unique to the release within the run (e.g. ``gap:pma1``,
            ``privgnn:3``); the same purpose gets the same stream within a run (a repeated
            request gets the same release back, not fresh noise to average).
        data: what the client holds (its :class:`~fedgraph.data.ClientGraph`); its digest
            (:func:`client_data_digest`) is part of the key, so ``secret`` runs on different
            data draw independent noise. ``None``: no data bound (only for draws that read no
            private data).
        inputs: a digest of everything the release depends on beyond ``data`` (the requests
            the client received in the run: :func:`fedgraph.client_authority.transcript`);
            ``""``: none (a draw fixed for the run whatever the server sends, such as GAP's
            degree sampling).

    Returns:
        ``secure``/``secret``: a :class:`SecureRandom` (AES-256-CTR under the derived key);
        ``mt19937``: a CPU :class:`torch.Generator` (:func:`torch_generator`).

    Raises:
        ConfigError: ``secret`` without a secret (names the node-config key and the variable),
            ``os`` (says what changed) or an unknown source (names the allowed values).
    """
    from .errors import ConfigError
    from .secret import RETIRED_NOISE_SOURCES

    source = cfg.noise_source
    if source in RETIRED_NOISE_SOURCES:
        raise ConfigError(f"noise-source: {RETIRED_NOISE_SOURCES[source]}")
    if source not in NOISE_SOURCES:
        raise ConfigError(f"noise-source: unknown {source!r}; allowed: {list(NOISE_SOURCES)}")
    root = check_secret(context.node_config) if source == "secret" else _run_key(context.state)
    bound = "" if data is None else client_data_digest(data)
    key = derive_key(root, run_digest(cfg), partition_id, purpose, bound, inputs)
    return SecureRandom(key) if source in CSPRNG_SOURCES else torch_generator(key)


def describe(source: str) -> str:
    """One line for the report: where the clients' randomness came from (no secret in it)."""
    gauss = (
        "Gaussian noise by Box-Muller in float64, added in float64 and rounded once to "
        "the release's dtype (float64 draws, DP-SGD and PPGNN's Gaussian mechanism: the sum "
        "of 4 halved, as Opacus secure_mode)"
    )
    return {
        "secure": "AES-256-CTR CSPRNG under HMAC-SHA256 keys per release from fresh OS entropy "
        f"per run and client (os.urandom); not reproducible; {gauss}",
        "secret": "AES-256-CTR CSPRNG under HMAC-SHA256 keys per release from each client's "
        f"own secret (node config {SECRET_NODE_KEY!r} or ${SECRET_ENV}; never in "
        f"the run config); reproducible; {gauss}",
        "mt19937": "NOT A CSPRNG (explicit opt-in): PyTorch's MT19937, its whole state "
        "from HMAC-SHA256 of fresh OS entropy per release; MT19937's state is a "
        "linear function of 624 consecutive outputs and the clients release raw "
        "outputs (e.g. GAP's remote rows that cover no edge are exactly sigma * "
        "randn), so this does not protect against a server that recovers the "
        "state and removes the noise of every draw of a release; nor against "
        "floating-point attacks (float32 noise added in float32)",
    }[source]


# --------------------------------------------------------------------------------------------
# Draws from either kind of generator
# --------------------------------------------------------------------------------------------
def _shape(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


def rand(shape, generator: Generator = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform ``[0, 1)`` of ``shape`` on the CPU: ``torch.rand(shape, generator=generator,
    dtype=dtype)``, or from a :class:`SecureRandom` (53 bits for float64, else 24)."""
    if not isinstance(generator, SecureRandom):
        return torch.rand(shape, generator=generator, dtype=dtype)
    shape = _shape(shape)
    w = generator.words(math.prod(shape))
    bits = 53 if dtype == torch.float64 else 24
    u = (w >> np.uint64(64 - bits)).astype(np.float64) * 2.0**-bits
    return torch.from_numpy(u).reshape(shape).to(dtype)


# --------------------------------------------------------------------------------------------
# Exact comparison samplers and the float64 Laplace sampler (issue 60, faults 5 and 7)
# --------------------------------------------------------------------------------------------
#: bits of the integer uniforms of :func:`uniform_bits` (a float64 :func:`rand` has as many)
UNIFORM_BITS = 53
#: ``2^53``: the number of values of :func:`uniform_bits`; a threshold ``t`` in ``[0, 2^53]``
#: gives the event ``uniform_bits() < t`` probability exactly ``t / 2^53``
UNIFORM_SPAN = 1 << UNIFORM_BITS


def uniform_bits(shape, generator: Generator = None) -> Tensor:
    """Integers uniform in ``[0, 2^53)`` (int64 ``shape``, CPU): the 53 bits of a float64
    uniform. A :class:`torch.Generator` (or ``None``): ``torch.rand(shape, float64) * 2^53``,
    exact (PyTorch's CPU generator puts float64 uniforms on the grid ``k 2^-53``: the same
    draws as :func:`rand` in float64); a :class:`SecureRandom`: the top 53 bits of a 64-bit
    word. Comparing these integers with an integer threshold (:func:`bernoulli_bits`) makes an
    event of probability exactly ``t / 2^53`` (no rounding of a float threshold; Mironov 2012's
    lesson for samplers that compare)."""
    if not isinstance(generator, SecureRandom):
        u = torch.rand(shape, generator=generator, dtype=torch.float64)
        return u.mul_(float(UNIFORM_SPAN)).long()
    shape = _shape(shape)
    w = generator.words(math.prod(shape)) >> np.uint64(64 - UNIFORM_BITS)
    return torch.from_numpy(w.astype(np.int64)).reshape(shape)


def bernoulli_bits(threshold: Tensor, generator: Generator = None) -> Tensor:
    """``True`` with probability exactly ``threshold / 2^53``, independently per element
    (bool, ``threshold``'s shape and device). ``threshold``: int64 in ``[0, 2^53]``, computed
    by the caller with its rounding in the private direction (e.g.
    :func:`fedgraph.mechanisms.binary_thresholds`, :func:`bernoulli`'s rate rounded down).

    Raises:
        ValueError: ``threshold`` not an integer tensor or outside ``[0, 2^53]``.
    """
    if not isinstance(threshold, Tensor) or threshold.is_floating_point():
        raise ValueError("threshold: an integer tensor in [0, 2^53] is needed")
    if threshold.numel() and (int(threshold.min()) < 0 or int(threshold.max()) > UNIFORM_SPAN):
        raise ValueError(
            f"threshold must lie in [0, 2^53], got [{int(threshold.min())}, {int(threshold.max())}]"
        )
    return uniform_bits(threshold.shape, generator).to(threshold.device) < threshold


def rate_threshold(rate: float) -> int:
    """``floor(rate 2^53)`` clamped to ``[0, 2^53]``: the integer threshold of a sampling rate,
    rounded down, so the event's probability ``threshold / 2^53`` is at most ``rate`` and at
    least ``rate - 2^-53`` (``rate 2^53`` is exact in float64: a power-of-two scaling).

    Raises:
        ValueError: ``rate`` not a number in ``[0, 1]``.
    """
    r = float(rate)
    if not 0.0 <= r <= 1.0:  # NaN fails too
        raise ValueError(f"rate must lie in [0, 1], got {rate!r}")
    return min(int(math.floor(r * UNIFORM_SPAN)), UNIFORM_SPAN)


def bernoulli(rate: float, shape, generator: Generator = None) -> Tensor:
    """Independent coins of probability ``rate`` rounded down to the grid ``2^-53``
    (:func:`rate_threshold`; bool ``shape``, CPU): Poisson sampling (DP-SGD's, PrivGNN's
    subsample) whose real rate never exceeds the one the accountant amplifies with (a lower
    rate only amplifies more). A float32 uniform against a float32 rate, what this replaces,
    rounds the rate to ``2^-24`` in either direction (issue 60, fault 7).

    Raises:
        ValueError: ``rate`` not in ``[0, 1]``.
    """
    t = rate_threshold(rate)
    if t >= UNIFORM_SPAN:
        return torch.ones(_shape(shape), dtype=torch.bool)
    return uniform_bits(shape, generator) < t


def laplace_from_bits(k: Tensor) -> Tensor:
    r"""The Laplace sampler's map (float64, ``k``'s shape): standard Laplace values from 53-bit
    uniform integers ``k`` (:func:`uniform_bits`), the inverse CDF on the grid: below ``2^52``,
    :math:`z = \ln((k + 1) 2^{-52})`; from ``2^52``, :math:`z = -\ln((2^{53} - k) 2^{-52})`.
    Both arguments are exact in ``[2^-52, 1]``, so ``|z| <= 52 ln 2 = 36.04`` (finite), the
    two halves are mirror images (the law is exactly symmetric), and ``z`` is non-decreasing in
    ``k`` (an audit can search the values the sampler reaches by bisection:
    ``tests/test_floating_point_mechanisms.py``)."""
    lower = k < (1 << 52)
    m = torch.where(lower, k + 1, UNIFORM_SPAN - k).double()  # in [1, 2^52], exact
    mag = torch.log(m * 2.0**-52).neg_()
    return torch.where(lower, -mag, mag)


def laplace(shape, generator: Generator = None) -> Tensor:
    """Standard Laplace (scale 1, density ``exp(-|z|) / 2``) of ``shape`` in float64 on the CPU,
    one :func:`uniform_bits` draw each (:func:`laplace_from_bits`; either kind of generator).
    Noise to be added to a value: :func:`add_laplace` (adds before rounding)."""
    return laplace_from_bits(uniform_bits(shape, generator))


def add_laplace(x: Tensor, scale, generator: Generator = None) -> Tensor:
    r"""``x + scale * Lap(1)`` as a new tensor of ``x``'s dtype and device (the Laplace
    mechanism's release): the noise is drawn in float64 (:func:`laplace`, either kind of
    generator), ``x + scale * z`` is computed in float64 and rounded once to ``x.dtype``, as
    :func:`add_gaussian` does (module docs; Mironov, CCS 2012, Sec. 5-6).

    A float32 release is then the rounding of a value whose float64 structure lies 29 bits
    below the release's resolution: every float32 output is reachable from every input, except
    where the result falls below ``2^-29`` of the summands or the noise lies beyond ``|z| >
    22`` (where the sampler's grid, ``2^-52 e^|z|``, is coarser than the release's;
    probability ``e^-22``, ``3e-10``) per coordinate. What this replaces rounded ``z`` to
    float32, multiplied by a float32 scale and added in float32: 11.7 % of the output
    coordinates at ``d = 1433``, ``epsilon = 1``, ``x = +1`` are impossible under ``x = -1``
    (issue 60, fault 5). A float64 release has the sampler's own precision (Mironov's setting;
    his snapping mechanism would be the remedy): release float32, as the clients do.

    Args:
        x: the values ``[...]`` (any float dtype, any device).
        scale: the Laplace scale ``b``: a number or a tensor broadcastable to ``x``, > 0.

    Returns:
        ``fl(x + scale * z)`` with ``z`` standard Laplace, ``x``'s shape, dtype and device.
    """
    z = laplace(x.shape, generator).to(x.device)
    if isinstance(scale, Tensor):
        scale = scale.detach().to(x.device, torch.float64)
    else:
        scale = float(scale)
    return (x.detach().double() + scale * z).to(x.dtype)


def _four(dtype: torch.dtype) -> bool:
    """Whether :class:`SecureRandom` sums four Box-Muller draws for noise of ``dtype``: where
    the release has float64's precision, the sampler's own (module docs)."""
    return torch.finfo(dtype).eps <= 2.0**-52


def _gaussian_chunks(generator: SecureRandom, n: int, four: bool, scale: float = 1.0):
    """``(start, chunk)``: ``n`` standard normals (times ``scale``) in float64 chunks of at most
    :data:`CHUNK` (views of the generator's buffer: use each chunk before the next)."""
    for s in range(0, int(n), CHUNK):
        yield s, generator.gaussians(min(CHUNK, int(n) - s), four, scale)


def randn(shape, generator: Generator = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal of ``shape`` on the CPU: ``torch.randn``, or from a
    :class:`SecureRandom`: Box-Muller in float64 on 52-bit uniforms, rounded to ``dtype``; for
    float64, four such draws summed and halved (still N(0, 1); Opacus's ``secure_mode``).
    Noise to be added to a value: :func:`add_gaussian` (adds before rounding)."""
    if not isinstance(generator, SecureRandom):
        return torch.randn(shape, generator=generator, dtype=dtype)
    shape = _shape(shape)
    out = torch.empty(math.prod(shape), dtype=dtype)
    dst = out.numpy() if dtype in _NUMPY_DTYPES else out
    for s, chunk in _gaussian_chunks(generator, out.numel(), _four(dtype)):
        dst[s : s + chunk.numel()] = chunk.numpy() if dst is not out else chunk
    return out.reshape(shape)


def add_gaussian(
    x: Tensor, sigma, generator: Generator = None, draw_dtype: torch.dtype | None = None
) -> Tensor:
    """``x + sigma * N(0, I)`` as a new tensor of ``x``'s dtype and device (the Gaussian
    mechanism's release). ``sigma``: a number or a tensor broadcastable to ``x``.

    With a :class:`torch.Generator` (or ``None``): the noise ``randn(x.shape, generator,
    draw_dtype or x.dtype)`` (the draws of before), added in the wider of its dtype and
    ``x.dtype`` and rounded once to ``x.dtype`` (a float32 ``x`` with float32 noise: exactly
    ``x + sigma * noise``, as before; float64 noise, PPGNN's Gaussian mechanism, is no longer
    rounded to float32 before the addition: issue 60, fault 5). With a
    :class:`SecureRandom`: the noise is drawn in float64 (:func:`randn`'s sampler for
    ``draw_dtype or x.dtype``: the sum of four for float64), ``x + sigma * z`` is computed in
    float64 and rounded once to ``x.dtype`` (the defence against floating-point attacks: module
    docs), in chunks of :data:`CHUNK` on the CPU (no float64 copy of ``x``).
    """
    if not isinstance(generator, SecureRandom):
        noise = randn(x.shape, generator, draw_dtype or x.dtype).to(x.device)
        if noise.dtype == x.dtype:
            return x + sigma * noise
        wide = torch.promote_types(noise.dtype, x.dtype)
        if isinstance(sigma, Tensor):
            sigma = sigma.to(x.device, wide)
        return (x.to(wide) + sigma * noise.to(wide)).to(x.dtype)  # rounded once
    if x.device.type != "cpu":
        return _secure_add(x, sigma, generator, draw_dtype)
    return _secure_add(
        x, sigma, generator, draw_dtype, torch.empty_like(x, memory_format=torch.contiguous_format)
    )


def add_gaussian_(
    x: Tensor, sigma, generator: Generator = None, draw_dtype: torch.dtype | None = None
) -> Tensor:
    """:func:`add_gaussian` in place (``x`` is returned): the same values, without a new
    tensor's allocation (GAP's PMA sums). A :class:`torch.Generator`: exactly ``x += sigma *
    randn(x.shape, generator, draw_dtype or x.dtype).to(x.device, x.dtype)``, as before, where
    the noise's dtype is ``x``'s (a wider one: :func:`add_gaussian`'s one rounding)."""
    if (
        not isinstance(generator, SecureRandom)
        and torch.promote_types(draw_dtype or x.dtype, x.dtype) != x.dtype
    ):
        return x.copy_(add_gaussian(x, sigma, generator, draw_dtype))
    if not isinstance(generator, SecureRandom):
        x += sigma * randn(x.shape, generator, draw_dtype or x.dtype).to(x.device, x.dtype)
        return x
    if x.device.type != "cpu" or not x.is_contiguous():
        return x.copy_(add_gaussian(x, sigma, generator, draw_dtype))
    return _secure_add(x, sigma, generator, draw_dtype, x)


#: dtypes whose tensors :func:`add_gaussian` and :func:`randn` fill through numpy (fewer
#: microseconds per chunk than torch's slicing)
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def _secure_add(
    x: Tensor, sigma, generator: SecureRandom, draw_dtype, out: Tensor | None = None
) -> Tensor:
    """``fl(x + sigma * z)`` in float64 (module docs) into ``out`` (CPU, contiguous, ``x``'s
    shape and dtype; may be ``x``), chunk by chunk; ``out=None`` (``x`` on a device): the noise
    is drawn on the CPU, the sum made on the device in float64."""
    four = _four(draw_dtype or x.dtype)
    n = x.numel()
    sig, scale = sigma, 1.0
    if isinstance(sigma, Tensor):
        sig = torch.broadcast_to(sigma.detach().to(x.device, torch.float64), x.shape).reshape(-1)
    else:  # a number: folded into the radius of every Box-Muller pair
        sig, scale = None, float(sigma)
    if out is None:
        z = torch.empty(n, dtype=torch.float64)
        for s, chunk in _gaussian_chunks(generator, n, four, scale):
            z[s : s + chunk.numel()].copy_(chunk)
        if sig is not None:
            z = sig * z.to(x.device)
        return (x.detach().reshape(-1).double() + z.to(x.device)).to(x.dtype).reshape(x.shape)
    flat, dst = x.detach().reshape(-1), out.view(-1)
    if x.dtype in _NUMPY_DTYPES:
        flat, dst = flat.numpy(), dst.numpy()
        sig = None if sig is None else sig.numpy()
        for s, chunk in _gaussian_chunks(generator, n, four, scale):
            e, z = s + chunk.numel(), chunk.numpy()
            if sig is not None:
                np.multiply(z, sig[s:e], out=z)
            np.add(z, flat[s:e], out=z)
            dst[s:e] = z  # the one rounding
        return out
    for s, chunk in _gaussian_chunks(generator, n, four, scale):
        e = s + chunk.numel()
        if sig is not None:
            chunk.mul_(sig[s:e])
        chunk.add_(flat[s:e])
        dst[s:e].copy_(chunk)
    return out


def randint(low: int, high: int, shape, generator: Generator = None) -> Tensor:
    """Integers uniform in ``[low, high)`` (long, CPU): ``torch.randint``, or from a
    :class:`SecureRandom` by rejection sampling (exactly uniform)."""
    if not isinstance(generator, SecureRandom):
        return torch.randint(int(low), int(high), shape, generator=generator)
    shape = _shape(shape)
    n, span = math.prod(shape), int(high) - int(low)
    if span < 1:
        raise ValueError(f"randint: empty range [{low}, {high})")
    limit = (2**64 // span) * span  # accept words below the largest multiple of span
    out = np.empty(0, dtype=np.uint64)
    while out.size < n:
        w = generator.words(n - out.size)
        out = np.concatenate([out, w[w < np.uint64(limit)] if limit < 2**64 else w])
    vals = (out % np.uint64(span)).astype(np.int64) + int(low)
    return torch.from_numpy(vals).reshape(shape)


def randperm(n: int, generator: Generator = None) -> Tensor:
    """A uniform permutation of ``0..n-1`` (long, CPU): ``torch.randperm``, or from a
    :class:`SecureRandom` by sorting 64-bit random keys (ties, probability < n^2 2^-65, keep
    index order)."""
    if not isinstance(generator, SecureRandom):
        return torch.randperm(int(n), generator=generator)
    return torch.from_numpy(np.argsort(generator.words(int(n)), kind="stable").astype(np.int64))


def device_generator(generator: Generator, device: torch.device) -> Generator:
    """A generator for draws that must happen on ``device`` (Opacus draws DP-SGD noise on the
    parameters' device): a :class:`torch.Generator` there seeded with 62 bits from ``generator``
    (Philox: a 64-bit key), the generator itself on the CPU, a :class:`SecureRandom` as is."""
    if isinstance(generator, SecureRandom) or generator is None or device.type == "cpu":
        return generator
    return torch.Generator(device=device).manual_seed(int(randint(0, 2**62, (1,), generator)))


def dp_optimizer(
    optimizer,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    expected_batch_size: int,
    generator: Generator,
    device: torch.device,
):
    """Opacus's :class:`~opacus.optimizers.DPOptimizer` (``loss_reduction="mean"``) whose
    Gaussian noise (std ``noise_multiplier * max_grad_norm`` per coordinate of the summed
    clipped gradient) comes from ``generator``: a torch generator on ``device``
    (:func:`device_generator`), or a :class:`SecureRandom` (:func:`add_gaussian` with float64
    noise: Opacus's sum of four, added in float64)."""
    from ._lazy import import_without_root_logging

    import_without_root_logging("opacus")  # before any opacus import (fedgraph._lazy)
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    if not isinstance(generator, SecureRandom):
        return DPOptimizer(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction="mean",
            generator=device_generator(generator, torch.device(device)),
        )

    class _SecureDPOptimizer(DPOptimizer):
        def add_noise(self):
            std = self.noise_multiplier * self.max_grad_norm
            for p in self.params:
                _check_processed_flag(p.summed_grad)
                # float64 noise (the sum of four) added in float64, rounded once
                p.grad = add_gaussian(p.summed_grad, std, generator, torch.float64).view_as(p)
                _mark_as_processed(p.summed_grad)

    return _SecureDPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
    )
