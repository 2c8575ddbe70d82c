"""Start the local Ray cluster of ``fedgraph run`` while the driver is still importing and
running its preflight, instead of after (Flower's simulation engine starts Ray only when
``run_simulation`` is called, and only if Ray is not running yet: it then uses ours).

``ray.init`` spends its 2-4 s mostly waiting for its own processes (GCS, raylet, agents) to
come up; the driver's imports (torch, PyG, Flower: 3-5 s on 2 cores) and preflight run
meanwhile. The arguments are those Flower's ``RayBackend.init_ray`` would pass (the
backend's ``init_args``, ``include_dashboard`` off by default, and the driver's ``sys.path``
as the workers' ``PYTHONPATH``), so the cluster is the one Flower would have started.

The thread that called ``ray.init`` stays alive until :meth:`EarlyRay.release`: Ray starts
its GCS and raylet with ``PR_SET_PDEATHSIG``, which Linux fires when the *thread* that forked
them ends (the whole cluster was killed a moment after a returning thread's ``ray.init``).

Once Ray is up, the same thread also creates the run's client actors (:func:`prestart_actors`):
Flower's own ``ClientAppActor``, as many as its pool will hold, with the resources it would ask
for, each importing the ClientApp and the modules its method's first message needs
(:func:`warm_client`: torch, Flower, fedgraph, the accountants' libraries; 1.5-2 s on 2 cores)
while the driver is still importing. Flower's pool then takes these actors instead of creating
its own (:func:`take_prestarted`); it creates any the pool needs beyond them, and those left
over are ended with the run. Without it a fresh worker started importing only when the first
message was sent and the driver waited idle meanwhile (issue 16: client setup 3.1 s vs 0.9 s in
one process).

At the end, ``ray.shutdown`` (called by Flower) ends the cluster's processes one after another,
each with a second's grace; it ends the GCS before the autoscaler's monitor, whose SIGTERM
handler then waits on the dead GCS to publish an error nobody reads, so every run waited the full
second for it. :func:`_end_monitor_first` kills that monitor first (a local, fixed-size cluster
has nothing to autoscale).

Only for a local cluster: with ``RAY_ADDRESS`` (an existing cluster) Flower connects as before.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

#: what the first message of each method's client imports beyond the ClientApp module
#: (:func:`warm_client`); a custom strategy's clients get the ClientApp module only
WARM_IMPORTS = {
    "gap": (
        "fedgraph.methods.gap.client",
        "fedgraph.mechanisms",
        "fedgraph.accounting.calibrate",
        "dp_accounting.rdp",
        "scipy.stats",
    ),
    "ppgnn": ("fedgraph.methods.ppgnn",),
    "privgnn": ("fedgraph.methods.privgnn", "fedgraph.mechanisms", "dp_accounting.pld"),
    "progap": (
        "fedgraph.methods.progap.client",
        "fedgraph.accounting.calibrate",
        "dp_accounting.rdp",
        "scipy.stats",
    ),
}
#: what ``fedgraph run``'s server imports late: ``torch._dynamo`` at its first optimizer step
#: (about 1 s; every method trains on the server), the accountants' libraries for the report's
#: privacy summary (about 0.8 s). ``fedgraph.simulations.simulate`` imports them in a background thread while
#: the run starts (the driver then waits for its clients' setup, and a core is free), instead
#: of in the first round and after the last one.
SERVER_WARM_IMPORTS = (
    "torch._dynamo",
    "scipy.optimize",
    "scipy.stats",
    "dp_accounting",
    "prv_accountant",
)
#: prestarted actors not yet taken by Flower's pool: ``(client_resources, actor handle)``
_PRESTARTED: list = []
#: how many prestarted actors Flower's pool took in this process (the report's
#: ``host.prestarted_actors``), and whether the one actor was told it is the only one
#: (``sole``; the report's ``host.client_state``)
TAKEN = {"count": 0, "sole": False}


class EarlyRay:
    """``ray.init(**init_args)`` in a background thread; :meth:`wait` joins it and re-raises
    its error (a Ray that fails to start is reported, not left for Flower to hang on)."""

    def __init__(
        self, init_args: dict, client_resources: dict | None = None, method: str = ""
    ) -> None:
        self.init_args = dict(init_args)
        self.client_resources, self.method = client_resources, method
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._init, name="fedgraph-early-ray", daemon=True)

    def start(self) -> EarlyRay:
        self._thread.start()
        return self

    def _init(self) -> None:
        try:
            import ray

            if ray.is_initialized():
                return
            args = dict(self.init_args)
            args.setdefault("include_dashboard", False)
            env = worker_env()
            ray.init(runtime_env={"env_vars": env}, **args)
            _end_monitor_first()
            # before ready: Flower's pool must find them (or would compete for the resources)
            if self.client_resources is not None:
                prestart_actors(self.client_resources, self.method)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = err
            return
        finally:
            self._ready.set()
        self._release.wait()  # Ray's processes die with this thread (module docs)

    def release(self) -> None:
        """End the prestarted actors Flower did not take and let the thread end (after the
        run: Ray has been shut down, or is being ended)."""
        release_prestarted()
        self._release.set()

    def wait(self, timeout: float | None = 300.0) -> None:
        """Block until Ray is up.

        Raises:
            RuntimeError: Ray did not start (its error as the cause) or not within ``timeout``.
        """
        if not self._ready.wait(timeout):
            raise RuntimeError(f"Ray did not start within {timeout:.0f} s")
        if self.error is not None:
            raise RuntimeError(
                f"Ray did not start: {type(self.error).__name__}: {self.error}"
            ) from self.error


def worker_env() -> dict[str, str]:
    """The environment the simulation's Ray workers need from the driver, also on an existing
    cluster (whose workers do not inherit it): the driver's ``sys.path`` (as flwr's
    ``RayBackend.init_ray``, which sets ``PYTHONPATH`` here too), the clients' own run config
    (:data:`fedgraph.simulations.client_guard.OWN_CONFIG_ENV`) and their identity provisioning
    (:data:`fedgraph.identity.IDENTITY_ENV`)."""
    from fedgraph.identity import IDENTITY_ENV
    from fedgraph.simulations.client_guard import OWN_CONFIG_ENV

    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    env = {"PYTHONPATH": pythonpath}
    for name in (OWN_CONFIG_ENV, IDENTITY_ENV):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def start_early_ray(
    init_args: dict, client_resources: dict | None = None, method: str = ""
) -> EarlyRay | None:
    """An :class:`EarlyRay` started for a local cluster; ``None`` with ``RAY_ADDRESS`` (an
    existing cluster: Flower connects to it itself) or ``FEDGRAPH_EARLY_RAY=0``.
    ``client_resources`` (Flower's backend ``client_resources``): also prestart the client
    actors (:func:`prestart_actors`) for ``method``'s clients."""
    TAKEN["count"], TAKEN["sole"] = 0, False  # this run's
    if os.environ.get("RAY_ADDRESS") or os.environ.get("FEDGRAPH_EARLY_RAY", "1") == "0":
        return None
    return EarlyRay(init_args, client_resources, method).start()


def import_quietly(*names: str) -> None:
    """Import ``names``; one that fails is left to the code that needs it (its error is
    reported there)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported by the code that imports it
            pass


def warm_client(method: str = "", sole: bool = False) -> None:
    """Run in each prestarted actor's ``__init__``: import the ClientApp module and
    :data:`WARM_IMPORTS` ``[method]`` (:func:`import_quietly`); ``sole``: this actor is the
    pool's only one, so the clients' state stays in its memory
    (:func:`fedgraph.simulations.client_state.keep_in_this_process`)."""
    import_quietly("fedgraph.simulations.client_app", *WARM_IMPORTS.get(method, ()))
    if sole:
        from fedgraph.simulations import client_state

        client_state.keep_in_this_process()


def prestart_actors(client_resources: dict, method: str = "") -> int:
    """Create Flower's ``ClientAppActor`` as many times as Flower's pool will (its
    ``pool_size_from_resources``), with ``client_resources`` and :func:`warm_client` as their
    init function, for :func:`take_prestarted`; returns how many (0 where this Flower's pool
    cannot take them: Flower then starts its own, as without this). One actor: it is told it
    is the only one (:func:`warm_client` ``sole``), unless ``FEDGRAPH_CLIENT_STATE=object-store``
    (the clients' state then goes to Ray's object store, as with several actors)."""
    try:
        from flwr.simulation.ray_transport.ray_actor import ClientAppActor, pool_size_from_resources

        if not _install_hand_over():
            return 0
        count = pool_size_from_resources(dict(client_resources))
        sole = count == 1 and os.environ.get("FEDGRAPH_CLIENT_STATE", "") != "object-store"
        init = functools.partial(warm_client, method, sole)
        TAKEN["sole"] = sole
        for _ in range(count):
            actor = ClientAppActor.options(**client_resources).remote(on_actor_init_fn=init)
            _PRESTARTED.append((dict(client_resources), actor))
        return count
    except Exception as err:  # noqa: BLE001 - an optimisation: Flower's own start remains
        log.debug("no prestarted client actors: %s: %s", type(err).__name__, err)
        return 0


def take_prestarted(client_resources: dict):
    """A prestarted actor created with ``client_resources``, removed from the list, or
    ``None``."""
    for i, (resources, actor) in enumerate(_PRESTARTED):
        if resources == dict(client_resources):
            del _PRESTARTED[i]
            TAKEN["count"] += 1
            return actor
    return None


def release_prestarted() -> None:
    """End the prestarted actors Flower's pool did not take (after the run)."""
    while _PRESTARTED:
        _, actor = _PRESTARTED.pop()
        try:
            import ray

            if ray.is_initialized():
                ray.kill(actor)
        except Exception:  # noqa: BLE001 - Ray is already down: the actor with it
            pass


_POOL_INIT_PARAMS = ["self", "actor_type", "client_resources", "actor_kwargs"]


def _install_hand_over() -> bool:
    """Make Flower's ``BasicActorPool`` create its actors from :func:`take_prestarted` first
    (only ``ClientAppActor`` without actor arguments, as Flower's Ray backend creates them);
    ``False`` (nothing changed) where its constructor takes other arguments or its pool has no
    ``create_actor_fn``."""
    from flwr.simulation.ray_transport import ray_actor

    pool = ray_actor.BasicActorPool
    if getattr(pool, "_fedgraph_hand_over", False):
        return True
    original = pool.__init__
    if list(inspect.signature(original).parameters) != _POOL_INIT_PARAMS:
        return False

    @functools.wraps(original)
    def __init__(self, actor_type, client_resources, actor_kwargs):
        original(self, actor_type, client_resources, actor_kwargs)
        create = getattr(self, "create_actor_fn", None)
        if create is None or actor_type is not ray_actor.ClientAppActor or actor_kwargs:
            return

        def create_actor_fn():
            actor = take_prestarted(client_resources)
            return create() if actor is None else actor

        self.create_actor_fn = create_actor_fn

    pool.__init__ = __init__
    pool._fedgraph_hand_over = True
    return True


def _end_monitor_first() -> bool:
    """Make this driver's ``ray.shutdown`` kill the autoscaler's monitor at once, before the
    other processes (module docs); ``False`` (nothing changed) where Ray's ``Node`` has no
    such process type or methods."""
    try:
        from ray._private import ray_constants
        from ray._private.node import Node
    except ImportError:
        return False
    monitor = getattr(ray_constants, "PROCESS_TYPE_MONITOR", None)
    original = getattr(Node, "kill_all_processes", None)
    if monitor is None or original is None or not hasattr(Node, "_kill_process_type"):
        return False
    if getattr(original, "_fedgraph_monitor_first", False):
        return True

    @functools.wraps(original)
    def kill_all_processes(self, *args, **kwargs):
        if monitor in getattr(self, "all_processes", {}):
            self._kill_process_type(monitor, check_alive=False, allow_graceful=False)
        return original(self, *args, **kwargs)

    kill_all_processes._fedgraph_monitor_first = True
    Node.kill_all_processes = kill_all_processes
    return True
