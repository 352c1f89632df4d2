"""conveyor.engine.loader: the packaged SmolLM2 GGUF converted once, local HF directories, errors."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.engine.loader import (
    SUPPORTED_MODEL_TYPES,
    ModelError,
    ModelSource,
    default_cache_dir,
    eos_token_ids,
    load_tokenizer,
    model_info,
    packaged_gguf,
    resolve_model,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("conveyor-models")
    yield path
    shutil.rmtree(path, ignore_errors=True)  # ~540 MB; pytest would keep it for 3 runs


@pytest.fixture(scope="session")
def converted(cache_dir: Path) -> ModelSource:
    """The default model, converted from the packaged GGUF once per session (~20 s on 2 CPUs)."""
    return resolve_model(None, cache_dir=cache_dir, progress=False)


def test_packaged_gguf_is_found() -> None:
    path = packaged_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("CONVEYOR_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "conveyor" / "models"


def test_conversion_writes_a_complete_hf_directory(converted: ModelSource, cache_dir: Path) -> None:
    assert converted.converted
    assert converted.model_id == "SmolLM2-135M-Instruct"
    assert converted.origin == packaged_gguf()
    assert converted.path.parent == cache_dir
    names = {p.name for p in converted.path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert any(n.endswith(".safetensors") for n in names)
    # Nothing half-written is left next to the result.
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    config = json.loads((converted.path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert "quantization_config" not in config  # else transformers would treat it as GGUF again


def test_model_info(converted: ModelSource) -> None:
    info = model_info(converted)
    assert info["model_type"] == "llama"
    assert info["architectures"] == ["LlamaForCausalLM"]
    assert (info["hidden_size"], info["num_hidden_layers"]) == (576, 30)
    assert (info["num_attention_heads"], info["num_key_value_heads"], info["head_dim"]) == (9, 3, 64)
    assert info["vocab_size"] == 49152
    assert info["max_position_embeddings"] == 8192
    assert 130e6 < info["parameters"] < 140e6  # "135M"
    assert info["dtype"] == "float32"
    assert info["eos_token"] == "<|im_end|>"
    assert info["chat_template"] is True


def test_tokenizer_round_trip_and_chat_template(converted: ModelSource) -> None:
    tok = load_tokenizer(converted.path)
    ids = tok("Hello, world!").input_ids
    assert tok.decode(ids) == "Hello, world!"
    assert tok.chat_template
    prompt = str(tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False))
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok.model_max_length == 8192


def test_eos_ids_include_im_end(converted: ModelSource) -> None:
    tok = load_tokenizer(converted.path)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in eos_token_ids(converted.path)
    gen = json.loads((converted.path / "generation_config.json").read_text())
    assert im_end in (gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])


def test_second_resolve_hits_the_cache(converted: ModelSource, cache_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in converted.path.iterdir()}
    dir_mtime = converted.path.stat().st_mtime_ns
    start = time.monotonic()
    again = resolve_model("default", cache_dir=cache_dir)
    elapsed = time.monotonic() - start
    assert not again.converted
    assert again.path == converted.path
    assert converted.path.stat().st_mtime_ns == dir_mtime
    assert {p.name: p.stat().st_mtime_ns for p in converted.path.iterdir()} == before
    assert elapsed < 2.0, f"cache hit took {elapsed:.2f} s"
    assert resolve_model("smollm2", cache_dir=cache_dir).path == converted.path


def test_converted_model_answers_paris(converted: ModelSource) -> None:
    """The behaviour the product depends on: greedy fp32 generation through the chat template."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(converted.path)
    model = AutoModelForCausalLM.from_pretrained(
        str(converted.path), dtype=torch.float32, local_files_only=True
    )
    prompt = str(tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False))
    input_ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=20, do_sample=False)
    answer = tok.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True)
    print(f"generated: {answer!r}")
    assert "Paris" in answer, answer


def test_changed_gguf_gets_a_new_cache_entry(tmp_path: Path) -> None:
    from conveyor.engine import loader

    gguf = tmp_path / "m.Q8_0.gguf"
    gguf.write_bytes(b"x" * 64)
    key = loader._cache_key(gguf)
    os.utime(gguf, ns=(1, 1))
    assert loader._cache_key(gguf) != key


def test_local_hf_directory_resolves_without_conversion(converted: ModelSource, tmp_path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = tmp_path / "tiny-llama"
    tok = load_tokenizer(converted.path)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cache = tmp_path / "cache"

    source = resolve_model(str(model_dir), cache_dir=cache)
    assert source == ModelSource(path=model_dir, model_id="tiny-llama", origin=model_dir, converted=False)
    assert not cache.exists()
    info = model_info(source)
    assert (info["model_type"], info["num_hidden_layers"], info["hidden_size"]) == ("llama", 2, 32)
    assert info["parameters"] == sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert eos_token_ids(model_dir) == {tok.eos_token_id}


def test_unsupported_model_type_names_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError) as err:
        resolve_model(str(tmp_path))
    assert "bert" in str(err.value)
    assert all(name in str(err.value) for name in SUPPORTED_MODEL_TYPES)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError):  # ModelError is a ValueError for callers that catch broadly
        resolve_model("meta-llama/Llama-3.2-1B")  # a hub id: never downloaded


def test_directory_without_config_points_at_its_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"model\.Q4_0\.gguf"):
        resolve_model(str(tmp_path))


def test_corrupt_gguf_leaves_no_cache_entry(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all" * 100)
    cache = tmp_path / "cache"
    for _ in range(2):  # a retry fails the same way instead of loading a half directory
        with pytest.raises(ModelError, match="corrupt"):
            resolve_model(str(bad), cache_dir=cache, progress=False)
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_truncated_gguf_is_a_model_error(tmp_path: Path) -> None:
    truncated = tmp_path / "trunc.gguf"
    with open(packaged_gguf(), "rb") as f:
        truncated.write_bytes(f.read(4_000_000))
    with pytest.raises(ModelError, match="download it again"):
        resolve_model(str(truncated), cache_dir=tmp_path / "cache", progress=False)


def test_stale_temp_dir_from_an_interrupted_conversion_is_ignored(tmp_path: Path) -> None:
    from conveyor.engine import loader

    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"junk")
    cache = tmp_path / "cache"
    stale = cache / f".tmp-broken-{loader._cache_key(gguf)}-x1"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    with pytest.raises(ModelError):
        resolve_model(str(gguf), cache_dir=cache, progress=False)
    assert not stale.exists()  # cleaned up under the lock, never used as a model
