"""Resource checks before Ray starts: the CPUs and GPUs asked per client and where the
clients' state waits (:func:`check_resources`) and the Ray cluster named by ``RAY_ADDRESS``
(:func:`check_ray_address`, :func:`cluster_gpus`)."""

from __future__ import annotations

import os
import threading


def check_resources(num_cpus: int | None, cpus_per_client: float, gpus_per_client: float) -> None:
    """Refuse, before Ray starts, resource requests no client could get on this machine (Ray
    would leave every client unscheduled: "ActorPool is empty"). With ``RAY_ADDRESS`` (an
    existing cluster) the cluster's resources decide, so only the numbers are checked.

    Raises:
        fedgraph.config.ConfigError: naming the option and the allowed values.
    """
    import math

    from fedgraph.config import ConfigError

    if not math.isfinite(cpus_per_client) or cpus_per_client <= 0:
        raise ConfigError(
            f"--cpus-per-client: must be a finite number > 0 (each client needs "
            f"some CPU), got {cpus_per_client}"
        )
    if not math.isfinite(gpus_per_client) or gpus_per_client < 0:
        raise ConfigError(f"--gpus-per-client: must be a finite number >= 0, got {gpus_per_client}")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"--num-cpus: must be >= 1, got {num_cpus}")
    state = os.environ.get("FEDGRAPH_CLIENT_STATE", "")
    if state not in ("", "auto", "object-store"):
        raise ConfigError(
            f"$FEDGRAPH_CLIENT_STATE: unknown value {state!r}; allowed: auto (the "
            "default: the only client actor keeps its clients' state in its "
            "memory) or object-store (always Ray's object store)"
        )
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address(os.environ["RAY_ADDRESS"])
        if gpus_per_client > 0:
            gpus = cluster_gpus(os.environ["RAY_ADDRESS"])
            if gpus < gpus_per_client:
                raise ConfigError(
                    f"--gpus-per-client: {gpus_per_client} asked but the Ray "
                    f"cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']!r} has "
                    f"{gpus:g} GPU(s); no client could start: use 0 (CPU) or a "
                    "cluster with GPUs"
                )
        return
    cores = os.cpu_count() or 1
    if num_cpus is not None and num_cpus > cores:
        # Flower's pool starts one client actor (a Python process with torch) per
        # cpus-per-client of them: 64 on 2 cores filled 30 GiB and no client started
        raise ConfigError(
            f"--num-cpus: {num_cpus} is more than the {cores} CPU"
            f"{'' if cores == 1 else 's'} of this machine (allowed: 1 to "
            f"{cores}; Ray would start a client process per CPU); for a larger "
            "pool, set RAY_ADDRESS to a Ray cluster"
        )
    cpus = num_cpus or cores
    if cpus_per_client > cpus:
        raise ConfigError(
            f"--cpus-per-client: {cpus_per_client:g} is more than the {cpus} "
            f"CPU{'' if cpus == 1 else 's'} Ray may use here (--num-cpus); no "
            "client could start"
        )
    if gpus_per_client > 0:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ConfigError(
                f"--gpus-per-client: {gpus_per_client} asked but this machine "
                "has no GPU that torch can see; use 0 (CPU), or set RAY_ADDRESS "
                "to a Ray cluster with GPUs"
            )
        if gpus_per_client > gpus:
            raise ConfigError(
                f"--gpus-per-client: {gpus_per_client} is more than the {gpus} "
                "GPU(s) of this machine; no client could start"
            )


def cluster_gpus(address: str) -> float:
    """GPUs of the Ray cluster at ``address`` (``ray.cluster_resources()``, with a driver
    connected for the question only and disconnected after it)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return float(ray.cluster_resources().get("GPU", 0.0))
    finally:
        ray.shutdown()


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Refuse a ``RAY_ADDRESS`` behind which no Ray cluster answers within ``timeout``
    seconds: for ``auto`` and ``host[:port]``, Ray's own lookup and then its GCS client
    (which Ray itself would retry for ever, the run waiting on clients that never start); for
    ``ray://host:port`` (Ray Client), a TCP connection.

    Raises:
        fedgraph.config.ConfigError: naming ``RAY_ADDRESS``, the address and what to do.
    """
    import socket

    from fedgraph.config import ConfigError

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            f"RAY_ADDRESS={address!r}: {why}; start a cluster (`ray start --head "
            "--port=PORT`) and use its address (host:port, ray://host:port for Ray Client, "
            "or auto), or unset RAY_ADDRESS to run on a local Ray started for this run"
        )

    def connect(host_port: str) -> None:
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError) as err:
            raise refuse(
                f"nothing answers there ({getattr(err, 'strerror', None) or err})"
            ) from None

    target = address.strip()
    scheme, sep, rest = target.partition("://")
    if sep and scheme != "ray":
        raise refuse(f"unknown scheme {scheme + '://'!r}")
    if sep:  # Ray Client: its server, not the GCS
        _, colon, port = rest.rpartition(":")
        if not colon or not port.isdigit():
            raise refuse("Ray Client addresses are ray://host:port")
        connect(rest)
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address
        from ray._raylet import GcsClient
    except ImportError:  # another Ray: left to it
        return
    try:
        gcs = canonicalize_bootstrap_address(target)
    except Exception as err:  # noqa: BLE001 - e.g. auto without a cluster
        raise refuse(str(err).splitlines()[0]) from None
    if not gcs:
        raise refuse("no Ray cluster found there")
    connect(gcs)
    outcome: dict = {}

    def probe() -> None:  # blocks ~35 s when something that is not Ray's GCS answers
        try:
            GcsClient(address=gcs)
            outcome["ok"] = True
        except Exception as err:  # noqa: BLE001
            outcome["error"] = err

    thread = threading.Thread(target=probe, daemon=True, name="fedgraph-ray-address-check")
    thread.start()
    thread.join(timeout)
    if not outcome.get("ok"):
        raise refuse(
            f"something answers at {gcs} but not Ray's GCS within {timeout:g} s"
            + (f" ({outcome['error']})" if "error" in outcome else "")
        )
