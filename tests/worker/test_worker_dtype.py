"""The dtype a worker reports (/info's model_dtype, the console): the GEMMs' too when they differ."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conveyor.worker.runner import _dtype


@dataclass
class _Runner:
    dtype: torch.dtype
    gemm_dtype_name: str = ""


def test_the_gemms_dtype_is_named_only_when_it_differs() -> None:
    assert _dtype(_Runner(torch.float32)) == "float32"
    assert _dtype(_Runner(torch.bfloat16)) == "bfloat16"
    assert _dtype(_Runner(torch.float32, "bfloat16")) == "float32 (bfloat16 GEMMs)"
