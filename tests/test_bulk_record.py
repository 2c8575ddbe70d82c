"""``fedgraph.messaging.bulk_record``: a message's large tensors by Ray's object store in a Ray
simulation (issue 31), an ArrayRecord otherwise. Outside Ray nothing changes; under Ray the
reader gets the same tensors without a copy (exercised by every Ray run of GAP and ProGAP:
``tests/test_gap_federated.py``'s Flower run with secure aggregation, ``bench/scale.py``)."""
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
