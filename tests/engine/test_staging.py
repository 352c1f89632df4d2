"""staging.to_device: on CPU exactly torch.tensor's result (no pinning, no copy); on CUDA the same
values, copied from pinned memory (that part skips without a GPU)."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.staging import to_device


def test_on_cpu_it_is_the_host_tensor() -> None:
    cpu = torch.device("cpu")
    got = to_device([[3, 1], [4, 1]], torch.int32, cpu)
    assert torch.equal(got, torch.tensor([[3, 1], [4, 1]], dtype=torch.int32)) and got.dtype == torch.int32
    assert not got.is_pinned()
    host = torch.arange(5)
    assert to_device(host, torch.long, cpu) is host  # nothing copied
    assert to_device(host, torch.int32, cpu).dtype == torch.int32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_it_copies_the_values() -> None:
    cuda = torch.device("cuda")
    got = to_device([5, 9, 2], torch.long, cuda)
    assert got.device.type == "cuda" and got.cpu().tolist() == [5, 9, 2]
    assert to_device(torch.tensor([1, 2]), torch.int32, cuda).cpu().tolist() == [1, 2]
