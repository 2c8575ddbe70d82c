"""``fedgraph.messaging.bulk_record``: a message's large tensors by Ray's object store in a Ray
simulation (issue 31), an ArrayRecord otherwise. Outside Ray nothing changes; under Ray
(a subprocess with its own cluster, GAP's PMA handler in two actors) the reader gets the same
rows as inline, without a copy, and each release is freed once read. Also exercised by every
Ray run of GAP and ProGAP (``tests/test_gap_federated.py``'s Flower run, ``bench/scale.py``)."""

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedgraph import messaging
from fedgraph.errors import ClientFailure


def test_without_a_slot_it_is_the_array_record_and_reads_back():
    t = {"ids": torch.arange(5), "sums": torch.randn(5, 3)}
    rec = messaging.bulk_record(t)
    assert isinstance(rec, ArrayRecord) and not messaging.is_bulk_record(rec)
    assert dict(rec.items()).keys() == dict(messaging.array_record(t).items()).keys()
    back = messaging.bulk_tensors(rec)
    assert torch.equal(back["ids"], t["ids"]) and torch.equal(back["sums"], t["sums"])


def test_a_slot_outside_a_ray_cluster_is_refused_and_a_reference_cannot_be_read():
    assert not messaging.object_store_available()
    with pytest.raises(RuntimeError, match="Ray cluster"):
        messaging.bulk_record({"sums": torch.ones(2)}, slot=("s", 1))
    fake = ConfigRecord({messaging.OBJECT_REF: b"not a reference"})
    assert messaging.is_bulk_record(fake)
    with pytest.raises(RuntimeError, match="not connected to a Ray cluster"):
        messaging.bulk_tensors(fake)
    messaging.release_bulk(("s", 1))  # nothing held: no error, no Ray import needed


def test_check_finite_reply_still_reads_array_records():
    bad = messaging.array_record({"sums": torch.tensor([float("inf")])})
    with pytest.raises(ClientFailure, match="partial_sums"):
        messaging.check_finite_reply({"partial_sums": bad}, "node 1")


# GAP's PMA handler run hop by hop in two Ray actors, one told the server reads the object
# store and one not; the driver (the server) reads each hop's reply before it sends the next
# hop, as strategies.gap does (a release is freed when the next one is put).
_RAY_SCRIPT = r"""
import json, os, sys, tempfile
import ray, torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedgraph import messaging

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
         _temp_dir=tempfile.mkdtemp(prefix="fgbulk-", dir="/tmp"))
RUN = {"method": "gap", "dataset": "cora", "num-clients": 2, "hops": 2, "encoder-dim": 8,
       "noise-source": "secret"}


@ray.remote(num_cpus=0)
class Client:
    def __init__(self, shared):
        os.environ["FEDGRAPH_NOISE_SECRET"] = "bulk-record-test-secret-0123"
        from flwr.supercore.task_identity import TaskIdentity
        from fedgraph.config import parse_run_config
        from fedgraph.federation import client_view
        from fedgraph.methods.gap.models import build_encoder

        for attr in ("_run_id", "_task_id", "_node_id"):
            setattr(TaskIdentity, attr, 1)
        torch.set_num_threads(1)
        self.cfg = parse_run_config(RUN)
        view = client_view(self.cfg, 0)
        torch.manual_seed(0)
        self.encoder = ArrayRecord(build_encoder(self.cfg, view.statistics["num_features"],
                                                 view.statistics["num_classes"]).state_dict())
        self.ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0},
                           state=RecordDict(), run_config=dict(RUN))  # its own config
        self.shared = shared

    def in_actor(self):
        from fedgraph.simulations import client_state
        return client_state.in_ray_worker()

    def hop(self, k, incoming):
        from fedgraph.simulations import client_app

        records = {"config": ConfigRecord({"json": json.dumps(self.cfg.model_dump())}),
                   "pma": ConfigRecord({"hop": k, "graph": "all", "object-store": self.shared}),
                   "encoder": self.encoder, "incoming": incoming}
        msg = Message(content=RecordDict(records), dst_node_id=1, message_type="query.gap_pma")
        return client_app.gap_pma(msg, self.ctx).content["partial_sums"]


def freed(record):
    ref = ray.cloudpickle.loads(bytes(record[messaging.OBJECT_REF]))
    try:
        ray.get(ref, timeout=5)
        return False
    except (ray.exceptions.RayError, TimeoutError):
        return True


from fedgraph.config import parse_run_config
from fedgraph.federation import client_view

ids = client_view(parse_run_config(RUN), 0).graph.node_ids[:2]
bulk, inline = Client.remote(True), Client.remote(False)
assert ray.get(bulk.in_actor.remote())
out, previous = {}, None
for k in (1, 2, 3):
    rows = {"ids": ids, "sums": torch.full((2, 8), float(k))}  # the server's routed sums
    a = ray.get(bulk.hop.remote(k, messaging.bulk_record(rows, slot=("server", k))), timeout=120)
    b = ray.get(inline.hop.remote(k, messaging.array_record(rows)), timeout=120)
    out[f"hop{k}-bulk"] = messaging.is_bulk_record(a)
    out[f"hop{k}-inline-bulk"] = messaging.is_bulk_record(b)
    ta, tb = messaging.bulk_tensors(a), messaging.tensors(b)
    out[f"hop{k}-same"] = ta.keys() == tb.keys() and all(torch.equal(ta[n], tb[n]) for n in ta)
    out[f"hop{k}-rows"] = int(ta["sums"].shape[0])
    if out[f"hop{k}-bulk"]:
        arrays = messaging._bulk_arrays(a)  # what Ray maps: the object store's shared memory
        out[f"hop{k}-read-only"] = not arrays["sums"].flags.writeable
        out[f"hop{k}-no-copy"] = ta["sums"].data_ptr() == arrays["sums"].ctypes.data
        del arrays
    if previous is not None:  # the previous hop's release, read already, is freed
        out[f"hop{k - 1}-freed"] = freed(previous)
    previous = a if out[f"hop{k}-bulk"] else None
    del ta, tb  # the server keeps no view of a reply past its hop (strategies.gap)
    messaging.release_bulk(("server", k))
print(json.dumps(out))
"""


def test_a_ray_client_sends_the_same_rows_by_the_object_store_as_inline(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "bulk_ray.py"
    script.write_text(_RAY_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    }
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # hops 1-2 release rows (by the object store, read-only views); hop 3 only finishes
    assert out["hop1-bulk"] and out["hop2-bulk"] and not out["hop3-bulk"]
    assert not any(out[f"hop{k}-inline-bulk"] for k in (1, 2, 3))
    assert all(out[f"hop{k}-same"] for k in (1, 2, 3)), out
    assert out["hop1-rows"] > 0 and out["hop3-rows"] == 0
    assert out["hop1-read-only"] and out["hop2-read-only"]
    assert out["hop1-no-copy"] and out["hop2-no-copy"]
    assert out["hop1-freed"] and out["hop2-freed"]  # hop 2's at the last hop
