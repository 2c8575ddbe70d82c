"""fedgraph.messaging.array_record: the ArrayRecord of the large payloads (PMA releases and
routed sums, PPGNN reports) built with one copy; it must decode to the same tensors as
Flower's own ``ArrayRecord(tensors)`` through every reader, with the same bytes where Flower
writes C order."""

import pytest
import torch
from flwr.app import ArrayRecord

from fedgraph.messaging import array_record, read_only_tensors, tensors


@pytest.mark.parametrize(
    "value",
    [
        torch.randn(5, 3),
        torch.zeros(0, 16),
        torch.arange(7),
        torch.tensor(3.0),
        torch.ones(2, 2, dtype=torch.float16),
        torch.tensor([True, False]),
        torch.zeros(3, dtype=torch.uint8),
        torch.randn(2, 3, 4, dtype=torch.float64),
    ],
)
def test_same_bytes_and_values_as_flowers_array_record(value):
    ours, flowers = array_record({"x": value}), ArrayRecord({"x": value})
    assert ours["x"].data == flowers["x"].data
    assert ours["x"].dtype == flowers["x"].dtype and ours["x"].shape == flowers["x"].shape
    for read in (tensors, read_only_tensors):
        assert torch.equal(read(ours)["x"], value)
    assert torch.equal(torch.from_numpy(ours["x"].numpy()), value)


def test_a_strided_tensor_is_written_contiguous_with_its_values():
    value = torch.randn(4, 6).t()  # Fortran order for numpy: Flower writes fortran_order
    assert torch.equal(tensors(array_record({"x": value}))["x"], value)
    assert torch.equal(tensors(array_record({"a": value, "b": value[:, 1]}))["b"], value[:, 1])
