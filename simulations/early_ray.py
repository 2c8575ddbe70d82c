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

Only for a local cluster: with ``RAY_ADDRESS`` (an existing cluster) Flower connects as before.
"""
from __future__ import annotations

import os
import sys
import threading


class EarlyRay:
    """``ray.init(**init_args)`` in a background thread; :meth:`wait` joins it and re-raises
    its error (a Ray that fails to start is reported, not left for Flower to hang on)."""

    def __init__(self, init_args: dict) -> None:
        self.init_args = dict(init_args)
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._init, name="fedgraph-early-ray",
                                        daemon=True)

    def start(self) -> "EarlyRay":
        self._thread.start()
        return self

    def _init(self) -> None:
        try:
            import ray

            if ray.is_initialized():
                return
            args = dict(self.init_args)
            args.setdefault("include_dashboard", False)
            # As flwr's RayBackend.init_ray: the workers get the driver's sys.path.
            pythonpath = os.pathsep.join(sys.path)
            if os.environ.get("PYTHONPATH"):
                pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
            os.environ["PYTHONPATH"] = pythonpath
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **args)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = err
            return
        finally:
            self._ready.set()
        self._release.wait()  # Ray's processes die with this thread (module docs)

    def release(self) -> None:
        """Let the thread end (after the run: Ray has been shut down, or is being ended)."""
        self._release.set()

    def wait(self, timeout: float | None = 300.0) -> None:
        """Block until Ray is up.

        Raises:
            RuntimeError: Ray did not start (its error as the cause) or not within ``timeout``.
        """
        if not self._ready.wait(timeout):
            raise RuntimeError(f"Ray did not start within {timeout:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"Ray did not start: {type(self.error).__name__}: "
                               f"{self.error}") from self.error


def start_early_ray(init_args: dict) -> EarlyRay | None:
    """An :class:`EarlyRay` started for a local cluster; ``None`` with ``RAY_ADDRESS`` (an
    existing cluster: Flower connects to it itself) or ``FEDGRAPH_EARLY_RAY=0``."""
    if os.environ.get("RAY_ADDRESS") or os.environ.get("FEDGRAPH_EARLY_RAY", "1") == "0":
        return None
    return EarlyRay(init_args).start()
