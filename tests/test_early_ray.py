"""``fedgraph run`` starts Ray while it imports and checks (fedgraph.simulations.early_ray), and exits
without the interpreter's finalization (fedgraph.simulations.cli.main): the failure paths."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from fedgraph.simulations import early_ray

ROOT = Path(__file__).resolve().parents[1]


def test_a_ray_that_fails_to_start_is_reported_not_waited_for(monkeypatch):
    import ray

    def broken(**kwargs):
        raise OSError("no room for the object store")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", broken)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    early = early_ray.start_early_ray({"num_cpus": 1})
    with pytest.raises(RuntimeError, match="Ray did not start: OSError: no room"):
        early.wait(timeout=30)
    early.release()


def test_no_early_start_for_an_existing_cluster_or_when_switched_off(monkeypatch):
    monkeypatch.setitem(early_ray.TAKEN, "count", 3)  # a previous run's in this process
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert early_ray.start_early_ray({"address": "127.0.0.1:1"}) is None
    assert early_ray.TAKEN["count"] == 0  # the report counts this run's only
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("FEDGRAPH_EARLY_RAY", "0")
    assert early_ray.start_early_ray({"num_cpus": 1}) is None


def test_the_console_script_keeps_its_exit_codes_and_messages():
    """main() ends ``run`` with os._exit: the code and the message still come out."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv = ['fedgraph', 'run', "
            "'--set', 'budgets=-1']; from fedgraph.simulations.cli import main; main()",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "budgets: every epsilon must be finite and > 0" in proc.stderr


class _FakeActorType:
    """Stands in for Flower's ClientAppActor: ``options(...).remote(...)`` makes a new name;
    ``inits``: each actor's init function (``on_actor_init_fn``), if it was given one."""

    made: list = []
    inits: list = []

    @classmethod
    def options(cls, **resources):
        class _Remote:
            @staticmethod
            def remote(**kwargs):
                cls.made.append(resources)
                if "on_actor_init_fn" in kwargs:
                    cls.inits.append(kwargs["on_actor_init_fn"])
                return f"flower-made-{len(cls.made)}"

        return _Remote


def test_flowers_pool_takes_the_prestarted_actors_first_then_makes_its_own(monkeypatch):
    """The hand-over (early_ray._install_hand_over): Flower's BasicActorPool gets the actors
    created with its own resources first, makes the rest itself, and leaves actors made with
    other resources (or other actor types) alone; release_prestarted ends those left over."""
    from flwr.simulation.ray_transport import ray_actor

    assert early_ray._install_hand_over()  # this Flower's pool can take them
    monkeypatch.setattr(ray_actor, "ClientAppActor", _FakeActorType)
    monkeypatch.setattr(ray_actor, "pool_size_from_resources", lambda resources: 2)
    monkeypatch.setattr(
        early_ray,
        "_PRESTARTED",
        [({"num_cpus": 1, "num_gpus": 0.0}, "ours-1"), ({"num_cpus": 2, "num_gpus": 0.0}, "other")],
    )
    monkeypatch.setitem(early_ray.TAKEN, "count", 0)
    _FakeActorType.made = []
    resources = {"num_cpus": 1, "num_gpus": 0.0}
    pool = ray_actor.BasicActorPool(
        actor_type=_FakeActorType, client_resources=resources, actor_kwargs={}
    )
    pool.add_actors_to_pool(pool.actors_capacity)
    assert pool.pool == ["ours-1", "flower-made-1"] and _FakeActorType.made == [resources]
    assert early_ray.TAKEN["count"] == 1
    # Flower's pool with actor arguments (e.g. its TensorFlow init) makes its own
    pool = ray_actor.BasicActorPool(
        actor_type=_FakeActorType,
        client_resources={"num_cpus": 2, "num_gpus": 0.0},
        actor_kwargs={"on_actor_init_fn": print},
    )
    pool.add_actors_to_pool(1)
    assert pool.pool == ["flower-made-2"] and early_ray.TAKEN["count"] == 1

    import ray

    killed = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "kill", killed.append)
    early_ray.release_prestarted()
    assert killed == ["other"] and early_ray._PRESTARTED == []


def test_a_prestart_that_cannot_run_leaves_flower_to_start_its_actors(monkeypatch):
    from flwr.simulation.ray_transport import ray_actor

    def no_cluster(resources):
        raise ValueError("ActorPool is empty")

    monkeypatch.setattr(ray_actor, "pool_size_from_resources", no_cluster)
    monkeypatch.setattr(early_ray, "_PRESTARTED", [])
    assert early_ray.prestart_actors({"num_cpus": 1}, "gap") == 0
    assert early_ray._PRESTARTED == []


@pytest.mark.parametrize("count, sole", [(1, True), (2, False), (3, False)])
def test_only_a_pool_of_one_actor_keeps_the_clients_state_in_its_process(monkeypatch, count, sole):
    """prestart_actors tells its actor it is the only one (client_state.keep_in_this_process)
    when Flower's pool holds one, never when it holds several (their messages move between
    processes)."""
    from flwr.simulation.ray_transport import ray_actor

    from fedgraph.simulations import client_state

    monkeypatch.setattr(ray_actor, "ClientAppActor", _FakeActorType)
    monkeypatch.setattr(ray_actor, "pool_size_from_resources", lambda resources: count)
    monkeypatch.setattr(early_ray, "_PRESTARTED", [])
    monkeypatch.setattr(early_ray.importlib, "import_module", lambda name: None)
    monkeypatch.setitem(client_state._SOLE, "on", False)
    monkeypatch.setitem(early_ray.TAKEN, "sole", False)
    monkeypatch.delenv("FEDGRAPH_CLIENT_STATE", raising=False)
    _FakeActorType.inits = []
    assert early_ray.prestart_actors({"num_cpus": 1}, "gap") == count
    assert len(_FakeActorType.inits) == count
    for init in _FakeActorType.inits:  # what each actor runs in its __init__
        client_state._SOLE["on"] = False
        init()
        assert client_state._SOLE["on"] is sole
    assert early_ray.TAKEN["sole"] is sole  # the report's host.client_state
    monkeypatch.setenv("FEDGRAPH_CLIENT_STATE", "object-store")  # the switch: never alone
    _FakeActorType.inits = []
    early_ray.prestart_actors({"num_cpus": 1}, "gap")
    for init in _FakeActorType.inits:
        client_state._SOLE["on"] = False
        init()
        assert client_state._SOLE["on"] is False
    assert early_ray.TAKEN["sole"] is False


def test_warm_client_imports_the_client_app_and_the_methods_modules(monkeypatch):
    for method, names in early_ray.WARM_IMPORTS.items():  # every name exists
        for name in names:
            assert importlib.util.find_spec(name) is not None, (method, name)
    imported = []
    monkeypatch.setattr(early_ray.importlib, "import_module", imported.append)
    early_ray.warm_client("gap")
    assert imported == ["fedgraph.simulations.client_app", *early_ray.WARM_IMPORTS["gap"]]
    imported.clear()
    early_ray.warm_client("mypkg.strategy:Custom")  # a custom strategy: the ClientApp only
    assert imported == ["fedgraph.simulations.client_app"]


def test_ray_shutdown_ends_the_autoscaler_monitor_first_without_grace():
    """Ray ends the GCS before the monitor, whose SIGTERM handler then hangs a second on the
    dead GCS: fedgraph run's driver kills the monitor first, at once (early_ray docs)."""
    from ray._private.node import Node

    assert early_ray._end_monitor_first() and early_ray._end_monitor_first()  # idempotent

    class FakeNode:
        def __init__(self):
            self.all_processes = {
                k: [object()] for k in ("raylet", "gcs_server", "monitor", "log_monitor", "reaper")
            }
            self.calls = []

        def _kill_process_type(
            self, process_type, check_alive=True, allow_graceful=False, wait=False
        ):
            self.calls.append((process_type, allow_graceful))
            del self.all_processes[process_type]

    node = FakeNode()
    Node.kill_all_processes(node, check_alive=False, allow_graceful=True)
    assert node.calls[0] == ("monitor", False)
    assert node.calls[1:] == [
        ("raylet", True),
        ("gcs_server", True),
        ("log_monitor", True),
        ("reaper", True),
    ]


def test_ray_starts_early_for_a_secret_run_only_with_the_secret_set(monkeypatch):
    from fedgraph.randomness import SECRET_ENV
    from fedgraph.simulations import simulate

    secret_run = {"method": "gap", "noise-source": "secret"}
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert simulate._early_ray_method(secret_run) is None  # _prepare refuses it before Ray
    monkeypatch.setenv(SECRET_ENV, "s3cret-of-16-chars")
    assert simulate._early_ray_method(secret_run) == "gap"
    assert simulate._early_ray_method({"method": "gap", "client-epsilons": "-1"}) is None  # invalid
