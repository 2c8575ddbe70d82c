"""``fedgraph.simulations.client_state``: a client's large tensors between messages, in the Flower
``Context`` outside Ray and in Ray's object store (a reference in the ``Context``) under it."""

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from fedgraph.simulations import client_state


def _context(node_id: int = 1, run_id: int = 7) -> Context:
    return Context(
        run_id=run_id,
        node_id=node_id,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config={},
    )


def test_outside_ray_the_tensors_stay_in_the_context_and_are_memoized():
    ctx = _context()
    hops = torch.randn(50, 3, 4)
    client_state.put_tensors(ctx, "k", {"hops": hops})
    assert isinstance(ctx.state["k"], ArrayRecord)
    first = client_state.get_tensors(ctx, "k")["hops"]
    assert torch.equal(first, hops)
    assert client_state.get_tensors(ctx, "k")["hops"] is first  # no second decode
    # another process (no memo): decoded from the context itself
    copy = pickle.loads(pickle.dumps(ctx))
    client_state._MEMO.clear()
    assert torch.equal(client_state.get_tensors(copy, "k")["hops"], hops)


def test_the_memo_never_returns_another_put():
    ctx = _context()
    client_state.put_tensors(ctx, "k", {"hops": torch.zeros(3)})
    old = pickle.loads(pickle.dumps(ctx))  # the context as it was after the first put
    client_state.put_tensors(ctx, "k", {"hops": torch.ones(3)})
    assert torch.equal(client_state.get_tensors(ctx, "k")["hops"], torch.ones(3))
    assert torch.equal(client_state.get_tensors(old, "k")["hops"], torch.zeros(3))
    other_node = _context(node_id=2)
    client_state.put_tensors(other_node, "k", {"hops": torch.full((3,), 2.0)})
    assert torch.equal(client_state.get_tensors(ctx, "k")["hops"], torch.ones(3))


def test_missing_and_dropped_state_raise_key_error():
    ctx = _context()
    try:
        client_state.get_tensors(ctx, "nothing")
        raise AssertionError("no KeyError")
    except KeyError as err:
        assert "nothing" in str(err)
    client_state.put_tensors(ctx, "k", {"a": torch.ones(2)})
    client_state.drop(ctx, "k")
    assert "k" not in ctx.state and "k.token" not in ctx.state
    try:
        client_state.get_tensors(ctx, "k")
        raise AssertionError("no KeyError")
    except KeyError:
        pass


def test_the_only_client_actor_keeps_the_tensors_in_its_memory(monkeypatch):
    """keep_in_this_process: under Ray, nothing goes to the object store (no ray.put) and the
    Context names the process; that process reads them back, a put replaces them, a drop
    forgets them, and any other process (or a Context from before a put) fails loudly."""
    import ray

    monkeypatch.setattr(client_state, "in_ray_worker", lambda: True)
    monkeypatch.setitem(client_state._SOLE, "on", False)
    client_state.keep_in_this_process()

    def no_put(*args, **kwargs):
        raise AssertionError("ray.put called by the only client actor")

    monkeypatch.setattr(ray, "put", no_put)
    ctx = _context(run_id=11)
    hops = torch.randn(40, 3, 4)
    client_state.put_tensors(ctx, "k", {"hops": hops})
    record = ctx.state["k"]
    assert isinstance(record, ConfigRecord) and set(record) == {client_state.IN_PROCESS, "token"}
    assert str(record[client_state.IN_PROCESS]) == client_state._process_name()
    assert torch.equal(client_state.get_tensors(ctx, "k")["hops"], hops)
    old = pickle.loads(pickle.dumps(ctx))
    client_state.put_tensors(ctx, "k", {"hops": torch.ones(2)})
    assert torch.equal(client_state.get_tensors(ctx, "k")["hops"], torch.ones(2))
    with pytest.raises(RuntimeError, match=r"only client actor \(pid .*\), but it was replaced"):
        client_state.get_tensors(old, "k")  # replaced since: never the new value
    elsewhere = pickle.loads(pickle.dumps(ctx))
    elsewhere.state["k"] = ConfigRecord(
        {client_state.IN_PROCESS: "pid 1 on another-host", "token": str(ctx.state["k"]["token"])}
    )
    client_state._MEMO.clear()  # as another process, which never held them
    with pytest.raises(
        RuntimeError,
        match="kept in the memory of the simulation's only client "
        "actor \\(pid 1 on another-host\\), but this message runs in pid .* "
        "restarted",
    ):
        client_state.get_tensors(elsewhere, "k")
    client_state.drop(ctx, "k")
    with pytest.raises(KeyError):
        client_state.get_tensors(ctx, "k")
    client_state.keep_in_this_process(False)


RAY_SCRIPT = textwrap.dedent("""
    import json, pickle, tempfile, time
    import ray, torch
    from flwr.app import ConfigRecord, Context, RecordDict
    from fedgraph.simulations import client_state

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="fgcs-", dir="/tmp"))

    @ray.remote(num_cpus=0)
    class Worker:
        def put(self, ctx, seed):
            torch.manual_seed(seed)
            client_state.put_tensors(ctx, "hops", {"hops": torch.randn(20000, 3, 16)})
            return ctx, float(client_state.get_tensors(ctx, "hops")["hops"].sum())

        def drop(self, ctx):
            client_state.drop(ctx, "hops")
            return ctx

        def get(self, ctx, fresh=False):
            if fresh:  # as an actor that never read them
                client_state._MEMO.clear()
            try:
                return float(client_state.get_tensors(ctx, "hops")["hops"].sum())
            except RuntimeError as err:
                return str(err)

    a, b, c = Worker.remote(), Worker.remote(), Worker.remote()
    ctx = Context(run_id=1, node_id=3, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    ctx, total = ray.get(a.put.remote(ctx, 0))
    out = {"total": total, "state_types": sorted(type(v).__name__ for v in ctx.state.values()),
           "context_bytes": len(pickle.dumps(ctx)), "on_b": ray.get(b.get.remote(ctx)),
           "on_a": ray.get(a.get.remote(ctx))}
    from ray._private import internal_api

    def plasma_objects():  # how many objects the object store holds, after a moment
        time.sleep(1)
        summary = internal_api.memory_summary(  # this instance's, not any other on the host
            address=ray.get_runtime_context().gcs_address, stats_only=True)
        return int(summary.split("Plasma memory usage")[1].split(",")[1].split()[0])

    out["objects_1"] = plasma_objects()
    replaced_on_b, total_b = ray.get(b.put.remote(ctx, 1))  # b replaces what a put
    out["total_b"], out["new_on_c"] = total_b, ray.get(c.get.remote(replaced_on_b, True))
    out["objects_replaced"] = plasma_objects()  # a's object, owned by a, is freed by b
    ray.get(c.drop.remote(replaced_on_b))
    out["objects_dropped"] = plasma_objects()
    ctx = Context(run_id=1, node_id=4, node_config={"partition-id": 1}, state=RecordDict(),
                  run_config={})
    ctx, out["total_4"] = ray.get(a.put.remote(ctx, 2))
    out["kept_on_c"] = ray.get(c.get.remote(ctx, True))
    ray.kill(a)
    try:  # wait until the owner is gone
        ray.get(a.get.remote(ctx))
    except ray.exceptions.RayActorError:
        pass
    for _ in range(150):  # Ray frees the owner's objects shortly after its death
        out["owner_gone"] = ray.get(c.get.remote(ctx, True))
        if isinstance(out["owner_gone"], str):
            break
        time.sleep(0.2)
    ray.shutdown()
    print(json.dumps(out))
""")


def test_under_ray_the_context_carries_a_reference_that_any_actor_resolves():
    res = subprocess.run(
        [sys.executable, "-c", RAY_SCRIPT], capture_output=True, text=True, timeout=180
    )
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["state_types"] == ["ConfigRecord"]  # no ArrayRecord travels with the context
    assert out["context_bytes"] < 10_000  # the tensors are 3.8 MB
    assert out["on_b"] == out["total"] and out["on_a"] == out["total"]
    assert "lost with the Ray worker" in str(out["owner_gone"]), out["owner_gone"]
    assert out["kept_on_c"] == out["total_4"]  # an object nobody replaced resolves until then
    # a put under the same key frees the object it replaces (owned by another actor), and a
    # drop frees the one it forgets: neither stays pinned until its owner exits
    assert out["new_on_c"] == out["total_b"] != out["total"]
    assert (out["objects_1"], out["objects_replaced"], out["objects_dropped"]) == (1, 1, 0), out


def test_derived_is_built_once_per_context_and_rebuilt_for_a_new_one():
    """client_state.derived memoizes what a client derives (GAP's edge sums between PMA hops)
    for one node's run; a new Context with the same run and node ids (an in-process
    simulation may reuse them) or a dropped key builds again, so a stale value from another
    run is never returned."""
    calls = []

    def build(value):
        def b():
            calls.append(value)
            return value

        return b

    ctx = _context()
    assert client_state.derived(ctx, "k", build("a")) == "a"
    assert client_state.derived(ctx, "k", build("b")) == "a" and calls == ["a"]
    assert "k.derived" in ctx.state  # a token only
    assert client_state.derived(_context(), "k", build("c")) == "c"  # same ids, new Context
    assert client_state.derived(ctx, "k", build("d")) == "d"  # the memo holds one per slot
    client_state.drop(ctx, "k")
    assert "k.derived" not in ctx.state
    assert client_state.derived(ctx, "k", build("e")) == "e"
    assert client_state.derived(_context(run_id=8), "k", build("f")) == "f"
    assert all(slot[0] == 8 for slot in client_state._DERIVED)  # other runs forgotten
