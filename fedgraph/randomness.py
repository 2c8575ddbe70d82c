"""Where a client's randomness comes from: generators the server cannot reconstruct.

Every noise draw, sample and shuffle a client makes (GAP's PMA noise, degree sampling and DP-SGD
with its Poisson sampling; PrivGNN's Poisson samples, teachers and Laplace noise; PPGNN's
PPM/ESW/multi-bit/one-bit/Laplace/Gaussian draws and randomized response) comes from the
generator :func:`client_generator` returns. Every release gets its own key,
``HMAC-SHA256(root, run digest | partition id | purpose)``; the run config's ``noise-source``
picks the root, which never comes from the run config (the server holds it):

``os`` (default)
    256 bits of fresh OS entropy (``os.urandom``) drawn at the client's first release of a run
    and kept in its Flower ``context.state``; runs are not reproducible.
``secret``
    reproducible simulations: the root is the client's own secret,
    ``node_config["noise-secret"]`` (a deployed ``flower-supernode --node-config
    "noise-secret='...'"``), else the environment variable ``FEDGRAPH_NOISE_SECRET`` of the
    client's process (a simulation: Ray's workers inherit the driver's environment, so one
    master secret serves every simulated client, an artifact of simulating; deployments give
    each supernode its own). The run digest covers every run-config key that changes what is
    released (all but :data:`NOT_RELEASE_KEYS`), so two runs that release different values
    never share noise; the same secret and config give the same release bit for bit.
``secure``
    the root of ``os``, but each release draws from a cryptographically secure generator
    (:class:`SecureRandom`: a ChaCha20 keystream under the release's key) for deployments;
    Gaussian noise is drawn as Opacus's ``secure_mode`` draws it (the sum of four Gaussians
    halved, arXiv 2107.10138 Sec. 5.1), DP-SGD included. Opacus's own secure mode needs
    ``torchcsprng``, which no longer builds for current PyTorch, so the CSPRNG is ours.

Why not ``torch.Generator().manual_seed(os_entropy)``: PyTorch's CPU generator (MT19937) keeps
only the low 32 bits of a seed, so a server could try all 2^32 seeds against a row it knows to
be pure noise. :func:`torch_generator` fills the whole 19,937-bit state from a 256-bit key.
MT19937 is still no CSPRNG (its state follows from 624 exact outputs, which a client never
releases: every output is added to private data): use ``secure`` where that matters.

Threat model: an honest-but-curious server (it follows the protocol and reads everything it
receives). Within a run one purpose gets one stream, so a request repeated with the same inputs
gets the same release back (no fresh noise to average); a malicious server that repeats a
request with other inputs would learn the difference of the two noise-free values (nothing
refuses a repeated purpose yet).

The draw functions :func:`rand`, :func:`randn`, :func:`randint` and :func:`randperm` take either
kind of generator; with a :class:`torch.Generator` they are exactly ``torch.rand(...,
generator=...)`` and friends, so seeded runs are unchanged.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from typing import Union

import numpy as np
import torch
from torch import Tensor

NOISE_SOURCES = ("os", "secret", "secure")
from .secret import SECRET_ENV, SECRET_NODE_KEY, check_secret  # noqa: F401 (re-exported)
#: run-config fields that do not change what a client releases (same noise across them)
NOT_RELEASE_KEYS = frozenset({"device", "output_dir", "run_name", "timeout"})


class SecureRandom:
    """A cryptographically secure random source: the ChaCha20 keystream (``cryptography``) under
    a 256-bit key (``None``: 32 bytes of ``os.urandom``; :func:`client_generator` passes a key
    derived for one release).

    Uniforms take the top 53 (float64) or 24 (other dtypes) bits of 64-bit words, so they lie on
    the grid ``k 2^-53`` in ``[0, 1)`` exactly; :func:`randint` rejects instead of reducing
    modulo (no bias). Limit: 2^32 blocks of 64 bytes (256 GiB) per instance.
    """

    def __init__(self, key: bytes | None = None):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        if key is None:  # a fresh key: any nonce will do
            key = os.urandom(32)
        if len(key) != 32:
            raise ValueError(f"key: 32 bytes needed, got {len(key)}")
        # 32-bit block counter from 0; the nonce is fixed because every key is used once
        # (client_generator derives one key per release)
        nonce = b"\0" * 16
        self._stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words (``uint64 [n]``)."""
        return np.frombuffer(self._stream.update(bytes(8 * int(n))), dtype=np.uint64).copy()

    def __repr__(self) -> str:  # never show the key
        return "SecureRandom(ChaCha20)"


Generator = Union[torch.Generator, SecureRandom, None]


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
    raw[24:24 + 624 * 8] = np.frombuffer(words.astype(np.uint64).tobytes(), dtype=np.uint8)
    gen.set_state(state)
    return gen


def run_digest(cfg) -> str:
    """SHA-256 of the run config's fields that change what a client releases (public: it is a
    function of the run config only)."""
    fields = {k: v for k, v in cfg.model_dump().items() if k not in NOT_RELEASE_KEYS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def derive_key(secret: bytes, digest: str, partition_id: int, purpose: str) -> bytes:
    """``HMAC-SHA256(secret, "<digest>|<partition id>|<purpose>")``: 32 bytes. Without the
    secret these keys are indistinguishable from random (HMAC is a PRF), whatever the server
    knows of the other inputs."""
    msg = f"{digest}|{int(partition_id)}|{purpose}".encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


#: ``context.state`` key of the client's run key (``os``/``secure``; never leaves the client)
RUN_KEY_STATE = "fedgraph.noise-run-key"


def _run_key(state) -> bytes:
    """A 256-bit key drawn from ``os.urandom`` on the client's first release of the run and kept
    in its ``context.state`` (client-side only), so that one purpose gets one stream within the
    run (e.g. the same degree-bounded edges at every PMA hop) and the next run a fresh one."""
    from flwr.app import ConfigRecord

    if RUN_KEY_STATE not in state:
        state[RUN_KEY_STATE] = ConfigRecord({"key": os.urandom(32)})
    return bytes(state[RUN_KEY_STATE]["key"])


def client_generator(cfg, context, partition_id: int, purpose: str) -> Generator:
    """The generator of one client release (called by the ClientApp for every draw site).

    Every source derives one key per release, ``HMAC-SHA256(root, run digest | partition id |
    purpose)`` (:func:`derive_key`), from a root key the server never sees: ``os``/``secure``:
    256 bits of ``os.urandom`` drawn on the client's first release of the run (kept in its
    ``context.state``); ``secret``: the client's own secret (``node_config["noise-secret"]``,
    else ``$FEDGRAPH_NOISE_SECRET``).

    Args:
        cfg: the run config (its ``noise_source``: ``os``, ``secret`` or ``secure``).
        context: the client's Flower ``Context`` (``node_config``: a deployed client's
            ``noise-secret``; ``state``: the run key).
        partition_id: this client's index.
        purpose: a name unique to the release within the run (e.g. ``gap:pma1``,
            ``privgnn:3``); the same purpose gets the same stream within a run (a repeated
            request gets the same release back, not fresh noise to average).

    Returns:
        ``os``/``secret``: a CPU :class:`torch.Generator` (:func:`torch_generator`);
        ``secure``: a :class:`SecureRandom` (ChaCha20 under the derived key).

    Raises:
        ConfigError: ``secret`` without a secret (names the node-config key and the variable),
            or an unknown source (names the allowed values).
    """
    from .config import ConfigError

    source = cfg.noise_source
    if source not in NOISE_SOURCES:
        raise ConfigError(f"noise-source: unknown {source!r}; allowed: {list(NOISE_SOURCES)}")
    root = check_secret(context.node_config) if source == "secret" else _run_key(context.state)
    key = derive_key(root, run_digest(cfg), partition_id, purpose)
    return SecureRandom(key) if source == "secure" else torch_generator(key)


def describe(source: str) -> str:
    """One line for the report: where the clients' randomness came from (no secret in it)."""
    return {"os": "fresh OS entropy per run and client (os.urandom -> HMAC-SHA256 per release -> "
                  "MT19937 state); not reproducible",
            "secret": f"HMAC-SHA256 of each client's own secret (node config {SECRET_NODE_KEY!r}"
                      f" or ${SECRET_ENV}; never in the run config) -> MT19937 state",
            "secure": "ChaCha20 CSPRNG keyed from os.urandom; Gaussian noise as Opacus "
                      "secure_mode (sum of 4 halved)"}[source]


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
    u = (w >> np.uint64(64 - bits)).astype(np.float64) * 2.0 ** -bits
    return torch.from_numpy(u).reshape(shape).to(dtype)


def randn(shape, generator: Generator = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal of ``shape`` on the CPU: ``torch.randn``, or from a
    :class:`SecureRandom`: Box-Muller on 53-bit uniforms, four such draws summed and halved
    (still N(0, 1); Opacus's ``secure_mode`` defence against floating-point attacks)."""
    if not isinstance(generator, SecureRandom):
        return torch.randn(shape, generator=generator, dtype=dtype)
    shape = _shape(shape)
    total = torch.zeros(shape, dtype=torch.float64)
    for _ in range(4):
        u1 = 1.0 - rand(shape, generator, torch.float64)  # (0, 1]: log is finite
        u2 = rand(shape, generator, torch.float64)
        total += torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return (total / 2.0).to(dtype)


def randint(low: int, high: int, shape, generator: Generator = None) -> Tensor:
    """Integers uniform in ``[low, high)`` (long, CPU): ``torch.randint``, or from a
    :class:`SecureRandom` by rejection sampling (exactly uniform)."""
    if not isinstance(generator, SecureRandom):
        return torch.randint(int(low), int(high), shape, generator=generator)
    shape = _shape(shape)
    n, span = math.prod(shape), int(high) - int(low)
    if span < 1:
        raise ValueError(f"randint: empty range [{low}, {high})")
    limit = (2 ** 64 // span) * span  # accept words below the largest multiple of span
    out = np.empty(0, dtype=np.uint64)
    while out.size < n:
        w = generator.words(n - out.size)
        out = np.concatenate([out, w[w < np.uint64(limit)] if limit < 2 ** 64 else w])
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
    return torch.Generator(device=device).manual_seed(int(randint(0, 2 ** 62, (1,), generator)))


def dp_optimizer(optimizer, *, noise_multiplier: float, max_grad_norm: float,
                 expected_batch_size: int, generator: Generator, device: torch.device):
    """Opacus's :class:`~opacus.optimizers.DPOptimizer` (``loss_reduction="mean"``) whose
    Gaussian noise (std ``noise_multiplier * max_grad_norm`` per coordinate of the summed
    clipped gradient) comes from ``generator``: a torch generator on ``device``
    (:func:`device_generator`), or a :class:`SecureRandom` (:func:`randn`, then moved)."""
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    if not isinstance(generator, SecureRandom):
        return DPOptimizer(optimizer, noise_multiplier=noise_multiplier,
                           max_grad_norm=max_grad_norm, expected_batch_size=expected_batch_size,
                           loss_reduction="mean",
                           generator=device_generator(generator, torch.device(device)))

    class _SecureDPOptimizer(DPOptimizer):
        def add_noise(self):
            std = self.noise_multiplier * self.max_grad_norm
            for p in self.params:
                _check_processed_flag(p.summed_grad)
                g = p.summed_grad
                noise = std * randn(g.shape, generator, torch.float64)
                p.grad = (g + noise.to(g.device, g.dtype)).view_as(p)
                _mark_as_processed(p.summed_grad)

    return _SecureDPOptimizer(optimizer, noise_multiplier=noise_multiplier,
                              max_grad_norm=max_grad_norm,
                              expected_batch_size=expected_batch_size, loss_reduction="mean")
