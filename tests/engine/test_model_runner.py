"""ModelRunner against the transformers model's own full forward, on tiny random models (CPU, fp32)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from conveyor.engine import kv_cache
from conveyor.engine.config import EngineConfig
from conveyor.engine.model import row_padding
from conveyor.engine.model_runner import ModelRunner, resolve_kv_dtype
from conveyor.engine.native import paged_attention
from conveyor.engine.sequence import Sequence
from conveyor.engine.step_plan import ScheduledChunk

VOCAB = 256
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    # Large weights make attention peaky, so reading the wrong context changes the logits a lot.
    initializer_range=0.3,
)


def _model(cls: type, config_cls: type, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(config_cls(**SHAPE, **extra)).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return _model(LlamaForCausalLM, LlamaConfig)


def _runner(
    hf: torch.nn.Module, block_size: int = 4, num_blocks: int = 512, kv_cache_dtype: str = "auto",
    gemm_dtype: str = "auto",
) -> ModelRunner:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, device="cpu")
    config.kv_cache_dtype, config.gemm_dtype = kv_cache_dtype, gemm_dtype
    return ModelRunner(hf, config)


class Allocator:
    """Hands out blocks in shuffled order, so no sequence's blocks are contiguous or ascending."""

    def __init__(self, runner: ModelRunner, seed: int = 0) -> None:
        self.free = list(range(runner.num_blocks))
        random.Random(seed).shuffle(self.free)
        self.block_size = runner.block_size

    def cover(self, seq: Sequence, upto: int) -> None:
        while len(seq.block_table) * self.block_size < upto:
            seq.block_table.append(self.free.pop())


def _prompt(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


@torch.no_grad()
def _reference(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    return hf(torch.tensor([tokens], device=hf.device)).logits[0, -1].float()


def _drive(
    runner: ModelRunner, hf: torch.nn.Module, plans: list[tuple[int, int, int, int]], seed: int = 0
) -> int:
    """Runs sequences through steps and checks every sampled row against the reference.

    A plan is (prompt length, prefill chunk size, first step, tokens to generate). Each step, every
    active sequence gets one chunk: the next piece of its prompt, or one decode token. Greedy tokens
    come from the reference so both sides stay on the same path. Returns the number of rows checked.
    """
    rng = random.Random(seed)
    alloc = Allocator(runner, seed)
    seqs = [Sequence(f"r{i}", _prompt(n, rng)) for i, (n, _, _, _) in enumerate(plans)]
    checked, step = 0, 0
    while any(s.num_generated < plan[3] for s, plan in zip(seqs, plans, strict=True)):
        chunks = []
        for s, (_, chunk, first, gen) in zip(seqs, plans, strict=True):
            if step < first or s.num_generated >= gen:
                continue
            length = min(chunk, s.num_uncomputed)
            alloc.cover(s, s.num_computed_tokens + length)
            chunks.append(ScheduledChunk(s, s.num_computed_tokens, length))
        rng.shuffle(chunks)  # chunk order must not matter
        logits = runner.execute(chunks)
        sampling = [c for c in chunks if c.sample]
        assert logits.shape == (len(sampling), VOCAB)
        assert logits.dtype == torch.float32
        for c in chunks:
            c.seq.num_computed_tokens += c.length
        for c, row in zip(sampling, logits, strict=True):
            ref = _reference(hf, c.seq.token_ids)
            torch.testing.assert_close(row, ref, atol=1e-4, rtol=1e-4)
            c.seq.append_token(int(ref.argmax()))
            checked += 1
        step += 1
    return checked


def test_mixed_prompt_lengths_in_one_call(llama: LlamaForCausalLM) -> None:
    runner = _runner(llama)
    rng = random.Random(1)
    alloc = Allocator(runner, 1)
    seqs = [Sequence(f"r{n}", _prompt(n, rng)) for n in (1, 2, 7, 16, 33)]
    for s in seqs:
        alloc.cover(s, s.num_tokens)
    logits = runner.execute([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
    for s, row in zip(seqs, logits, strict=True):
        torch.testing.assert_close(row, _reference(llama, s.token_ids), atol=1e-4, rtol=1e-4)


def test_decode_steps_after_prefill(llama: LlamaForCausalLM) -> None:
    assert _drive(_runner(llama), llama, [(5, 64, 0, 6), (12, 64, 0, 6), (3, 64, 0, 6)]) == 18


def test_chunked_prefill_while_others_decode(llama: LlamaForCausalLM) -> None:
    # r0 decodes from step 1 on while r1's 37-token prompt arrives in chunks of 6 and r2 joins late.
    checked = _drive(_runner(llama), llama, [(4, 64, 0, 10), (37, 6, 0, 3), (9, 4, 3, 4)])
    assert checked == 17


@pytest.mark.parametrize("block_size", [1, 3, 5, 16])
def test_block_sizes_that_do_not_divide_lengths(llama: LlamaForCausalLM, block_size: int) -> None:
    _drive(_runner(llama, block_size=block_size), llama, [(11, 7, 0, 3), (2, 64, 1, 4), (19, 64, 0, 2)])


def test_many_decode_rows(llama: LlamaForCausalLM) -> None:
    # More decode rows than one attention gather group, with uneven context lengths.
    _drive(_runner(llama, num_blocks=1024), llama, [(2 + i % 9, 64, 0, 3) for i in range(37)])


def test_qwen2_attention_bias() -> None:
    hf = _model(Qwen2ForCausalLM, Qwen2Config)
    assert hf.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():  # random biases: zero ones would not test that they are applied
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 1)
    _drive(_runner(hf), hf, [(9, 4, 0, 4), (3, 64, 0, 5)])


def test_mistral_sliding_window() -> None:
    hf = _model(MistralForCausalLM, MistralConfig, sliding_window=5)
    runner = _runner(hf)
    assert all(layer.window == 5 for layer in runner.model.layers)
    _drive(runner, hf, [(13, 4, 0, 6), (3, 64, 0, 9), (8, 64, 2, 3)])


def _trace(runner: ModelRunner, prompt_lens: list[int], steps: int) -> list[torch.Tensor]:
    """Greedy steps of every sequence at once (whole prompts, then decodes); the first one's logits."""
    rng = random.Random(3)
    alloc = Allocator(runner, 3)
    seqs = [Sequence(f"r{i}", _prompt(n, rng)) for i, n in enumerate(prompt_lens)]
    first = []
    for _ in range(steps):
        chunks = [ScheduledChunk(s, s.num_computed_tokens, s.num_uncomputed) for s in seqs]
        for c in chunks:
            alloc.cover(c.seq, c.start + c.length)
        logits = runner.execute(chunks[::-1]).flip(0)  # the first sequence last in the call
        for c, row in zip(chunks, logits, strict=True):
            c.seq.num_computed_tokens += c.length
            c.seq.append_token(int(row.argmax()))
        first.append(logits[0].clone())
    return first


def test_logits_do_not_depend_on_the_batch(llama: LlamaForCausalLM) -> None:
    # fp32 on CPU: the same sequence gets bitwise the same logits whatever runs beside it
    # (different row counts, neighbours with longer contexts in the same attention call).
    alone = _trace(_runner(llama), [11], 5)
    for others in ([3], [20, 5], [7] * 20, [2, 40, 9, 9, 1]):
        together = _trace(_runner(llama), [11, *others], 5)
        assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True)), others


def test_steps_padded_to_any_count_from_the_exact_rows_give_the_same_logits(llama: LlamaForCausalLM) -> None:
    # The count a step is padded to is chosen by speed at load (row_padding.py): free only because
    # every count from the exact one up gives the same bits; a lone decode row is the padded case.
    model = _runner(llama).model
    assert model.exact_rows <= model.min_rows <= max(model.exact_rows, row_padding.MOST_TRIED)
    traces = []
    for rows in (model.exact_rows, model.min_rows, 16):
        runner = _runner(llama)
        runner.model.min_rows = rows
        traces.append(_trace(runner, [11], 5))
    assert all(torch.equal(a, b) for trace in traces[1:] for a, b in zip(traces[0], trace, strict=True))


def test_sampling_rows_only(llama: LlamaForCausalLM) -> None:
    runner = _runner(llama)
    rng = random.Random(2)
    alloc = Allocator(runner, 2)
    a, b = Sequence("a", _prompt(10, rng)), Sequence("b", _prompt(6, rng))
    alloc.cover(a, 10)
    alloc.cover(b, 6)
    # a's first chunk does not reach the end of its tokens: no logits for it.
    logits = runner.execute([ScheduledChunk(a, 0, 4), ScheduledChunk(b, 0, 6)])
    assert logits.shape == (1, VOCAB)
    torch.testing.assert_close(logits[0], _reference(llama, b.token_ids), atol=1e-4, rtol=1e-4)
    assert runner.execute([]).shape == (0, VOCAB)


def test_from_pretrained_with_tied_embeddings(tmp_path) -> None:
    hf = _model(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    runner = ModelRunner.from_pretrained(tmp_path, EngineConfig(block_size=4, num_blocks=64, device="cpu"))
    assert runner.model.tied_embeddings
    assert (runner.device.type, runner.dtype, runner.vocab_size) == ("cpu", torch.float32, VOCAB)
    _drive(runner, hf, [(7, 3, 0, 3), (2, 64, 0, 3)])


def test_cache_geometry(llama: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    per_block = kv_cache.bytes_per_block(2, 16, 2, 16, torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 16 * 4
    runner = ModelRunner(llama, EngineConfig(kv_cache_memory=per_block * 10 + 5, device="cpu"))
    assert runner.num_blocks == 10
    assert runner.kv_cache_summary() == f"10 blocks = 160 tokens ({per_block * 10 / 2**30:.2f} GiB, float32)"
    # A bfloat16 cache: half the bytes per block, so the same budget holds twice the blocks.
    config = EngineConfig(kv_cache_memory=per_block * 10 + 5, device="cpu", kv_cache_dtype="bfloat16")
    runner = ModelRunner(llama, config)
    assert (runner.num_blocks, runner.cache.k[0].dtype) == (20, torch.bfloat16)
    assert runner.kv_cache_summary().endswith("GiB, bfloat16)")
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: per_block * 100)
    runner = ModelRunner(llama, EngineConfig(kv_cache_fraction=0.25, device="cpu"))
    assert runner.num_blocks == 25
    assert ModelRunner(llama, EngineConfig(device="cpu")).num_blocks == 30  # CPU's default share
    with pytest.raises(ValueError, match="no block"):
        ModelRunner(llama, EngineConfig(kv_cache_memory=per_block - 1, device="cpu"))


def test_the_kv_fraction_on_cuda_is_vllms_gpu_memory_utilization(monkeypatch: pytest.MonkeyPatch) -> None:
    """fraction × total − in use (weights, context, other processes), as vLLM; 0.9 by default."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 * gib, 80 * gib))  # 20 GiB in use
    cuda = torch.device("cuda")
    assert kv_cache.fraction_budget(None, cuda) == kv_cache.fraction_budget(0.9, cuda) == 52 * gib
    assert kv_cache.fraction_budget(0.2, cuda) == -4 * gib  # too little room: plan_num_blocks says so
    with pytest.raises(ValueError, match="kv_cache_fraction must be in"):
        kv_cache.fraction_budget(1.5, cuda)


def test_short_block_table_is_rejected(llama: LlamaForCausalLM) -> None:
    runner = _runner(llama)
    seq = Sequence("a", list(range(9)), block_table=[0, 1])
    with pytest.raises(ValueError, match="block table"):
        runner.execute([ScheduledChunk(seq, 0, 9)])


def test_unsupported_model_type_is_rejected() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(ValueError, match="not supported"):
        _runner(hf)


@pytest.mark.parametrize(
    ("cls", "config_cls", "extra"),
    [(LlamaForCausalLM, LlamaConfig, {}), (MistralForCausalLM, MistralConfig, {"sliding_window": 6})],
)
def test_triton_backend_matches_transformers(cls: type, config_cls: type, extra: dict) -> None:
    """The CUDA default backend, its kernels under Triton's CPU interpreter (tests/conftest.py)."""
    pytest.importorskip("triton")
    hf = _model(cls, config_cls, **extra)
    runner = ModelRunner(hf, EngineConfig(block_size=4, num_blocks=512, device="cpu", attention="triton"))
    assert runner.attention.name == "triton" and runner.graphs is None  # graphs: CUDA only
    _drive(runner, hf, [(13, 5, 0, 5), (3, 64, 0, 8), (1, 64, 2, 3), (40, 40, 1, 4)])


def test_attention_choice_that_cannot_run_names_the_reason(
    llama: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton cannot run: .*CUDA device.*--attention auto"):
        ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu", attention="triton"))
    with pytest.raises(ValueError, match="flash-attn cannot run: not a CUDA device"):
        ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu", attention="flash-attn"))
    with pytest.raises(ValueError, match="attention must be one of auto, flash-attn, triton, torch"):
        ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu", attention="sdpa"))
    with pytest.raises(ValueError, match="gemm_dtype must be auto or bfloat16, got 'fp8'"):
        ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu", gemm_dtype="fp8"))
    # auto on CPU: the C++ kernels where they are built; torch: plain torch, no C++ kernels.
    built = ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu")).attention.name
    assert built == ("cpu" if paged_attention.load() is not None else "torch")
    torch_only = ModelRunner(llama, EngineConfig(num_blocks=8, device="cpu", attention="torch"))
    assert torch_only.attention.name == "torch"


def test_bf16_kv_cache_keeps_logits_independent_of_the_batch(llama: LlamaForCausalLM) -> None:
    """kv_cache_dtype bfloat16: keys and values rounded once as they are written; a sequence's
    logits stay the same bits whatever runs beside it, close to the fp32 cache's but not equal."""
    runner = _runner(llama, kv_cache_dtype="bfloat16")
    assert runner.cache.k[0].dtype == torch.bfloat16 and runner.attention.name == "cpu"
    alone = _trace(runner, [11], 5)
    for others in ([3], [7] * 20, [2, 40, 9, 9, 1]):
        together = _trace(_runner(llama, kv_cache_dtype="bfloat16"), [11, *others], 5)
        assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True)), others
    fp32 = _trace(_runner(llama), [11], 5)
    assert not torch.equal(alone[-1], fp32[-1])
    for a, b in zip(alone, fp32, strict=True):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05 * float(b.abs().max()))


@pytest.mark.parametrize(
    "name,dtype,device,expected",
    [
        ("auto", torch.float32, "cpu", torch.float32),
        ("auto", torch.bfloat16, "cuda", torch.bfloat16),
        ("bfloat16", torch.float32, "cpu", torch.bfloat16),
        ("bfloat16", torch.bfloat16, "cuda", torch.bfloat16),
    ],
)
def test_kv_cache_dtype_resolves(name: str, dtype: torch.dtype, device: str, expected: torch.dtype) -> None:
    assert resolve_kv_dtype(name, dtype, torch.device(device)) == expected


def test_kv_cache_dtype_refusals_name_the_fix() -> None:
    with pytest.raises(ValueError, match="float32 model on cuda is not supported: use it on CPU"):
        resolve_kv_dtype("bfloat16", torch.float32, torch.device("cuda"))
    with pytest.raises(ValueError, match="must be auto or bfloat16, got 'fp8'"):
        resolve_kv_dtype("fp8", torch.float32, torch.device("cpu"))


def test_bf16_gemms_keep_logits_independent_of_the_batch(llama: LlamaForCausalLM, bf16_gemms: None) -> None:
    """gemm_dtype bfloat16: other numbers than fp32's, close to them, and still the same bits
    for a sequence whatever runs beside it."""
    runner = _runner(llama, gemm_dtype="bfloat16")
    assert runner.model.layers[0].qkv.bf16 and not runner.model.lm_head.bf16
    alone = _trace(runner, [11], 5)
    for others in ([3], [7] * 20, [2, 40, 9, 9, 1]):
        together = _trace(_runner(llama, gemm_dtype="bfloat16"), [11, *others], 5)
        assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True)), others
    fp32 = _reference(llama, _prompt(11, random.Random(3)))  # _trace's first prompt, prefilled
    assert not torch.equal(alone[0], fp32)
    torch.testing.assert_close(alone[0], fp32, rtol=0.05, atol=0.05 * float(fp32.abs().max()))
