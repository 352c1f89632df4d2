"""benchmarks/gpu_check.py's part (a): the engine's greedy output against Hugging Face's, on a small
random-weight Llama, and the engine against itself across batch compositions and CUDA graphs.

The reference is a greedy loop over the transformers model's full forward (no KV cache): the
logits of the last position given the whole prefix. The engine runs the same prompts through
ModelRunner.execute (one prefill step for all prompts, then one decode step per token), on block
tables handed out in shuffled order. Tokens are compared while both paths agree; where they part,
the reference's top-2 margin at that step says whether it was a near-tie (rounding may pick
either), and the logits are compared only over the steps where the prefixes were equal.
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from conveyor.engine.config import EngineConfig
from conveyor.engine.model_runner import ModelRunner
from conveyor.engine.sequence import Sequence
from conveyor.engine.step_plan import ScheduledChunk

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class SmallShape:
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 1024
    prompts: int = 8
    new_tokens: int = 32
    max_prompt_len: int = 600  # some prompts pass the decode kernel's 256-key split


@dataclass(slots=True)
class Greedy:
    """One prompt's greedy continuation and the float32 logits of each of its steps."""

    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


def small_llama(shape: SmallShape, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=2 * shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        # Larger than Llama's 0.02: peaked logits, so that greedy ties (which rounding may break
        # either way) are rare and reading the wrong context changes the output.
        initializer_range=0.1,
    )
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def make_prompts(shape: SmallShape, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [rng.randint(2, shape.max_prompt_len) for _ in range(shape.prompts)]
    lengths[0] = 1  # a one-token prompt: its prefill chunk has the length of a decode row
    return [[rng.randrange(shape.vocab) for _ in range(n)] for n in lengths]


@torch.no_grad()
def hf_greedy(hf: Any, prompt: list[int], new_tokens: int) -> Greedy:
    out, ids = Greedy(), list(prompt)
    for _ in range(new_tokens):
        x = torch.tensor([ids], device=hf.device)
        row = hf(x).logits[0, -1].float()
        out.logits.append(row)
        out.tokens.append(int(row.argmax()))
        ids.append(out.tokens[-1])
    return out


def small_runner(hf: Any, shape: SmallShape, device: str, dtype: str, attention: str) -> ModelRunner:
    blocks = shape.prompts * (-(-(shape.max_prompt_len + shape.new_tokens) // BLOCK_SIZE))
    config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=blocks,
        device=device,
        dtype=dtype,
        attention=attention,
        max_batch_size=shape.prompts,
        cuda_graphs=(1, 2, 4, 8, shape.prompts),
    )
    return ModelRunner(hf, config)


def engine_greedy(
    runner: ModelRunner, prompts: list[list[int]], new_tokens: int, seed: int = 0
) -> list[Greedy]:
    """All prompts as one batch: one prefill step, then decode steps, greedy on the engine's logits."""
    free = list(range(runner.num_blocks))
    random.Random(seed).shuffle(free)  # scattered, descending and ascending block tables
    seqs = [Sequence(f"p{i}", list(p)) for i, p in enumerate(prompts)]
    outs = [Greedy() for _ in prompts]
    for _ in range(new_tokens):
        chunks = []
        for s in seqs:
            start = s.num_computed_tokens
            while len(s.block_table) * runner.block_size < s.num_tokens:
                s.block_table.append(free.pop())
            chunks.append(ScheduledChunk(s, start, s.num_tokens - start))
        logits = runner.execute(chunks)
        for i, (s, row) in enumerate(zip(seqs, logits, strict=True)):
            s.num_computed_tokens = s.num_tokens
            outs[i].logits.append(row)
            outs[i].tokens.append(int(row.argmax()))
            s.append_token(outs[i].tokens[-1])
    return outs


def compare_to_reference(
    ref: list[Greedy], got: list[Greedy], tolerance: float, truth: list[torch.Tensor] | None = None
) -> dict[str, Any]:
    """Tokens until the paths part; logits over the steps whose prefixes are equal, against the
    reference and (bf16) against the fp32 `truth` along the reference's path. Passes when the
    logits are within `tolerance` (of the truth when given, else of the reference) and every
    parting is at a near-tie of the reference (top-2 margin <= 2 x tolerance)."""
    identical, equal_tokens, diff, diff_truth, divergences = 0, 0, 0.0, 0.0, []
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        same = next(
            (t for t, (a, b) in enumerate(zip(r.tokens, g.tokens, strict=True)) if a != b), len(r.tokens)
        )
        identical += same == len(r.tokens)
        equal_tokens += same
        steps = min(same + 1, len(r.tokens))  # step `same` still had equal prefixes
        mine = torch.stack(g.logits[:steps]).to(r.logits[0].device)
        diff = max(diff, float((torch.stack(r.logits[:steps]) - mine).abs().max()))
        if truth is not None:
            diff_truth = max(diff_truth, float((truth[i][:steps] - mine).abs().max()))
        if same < len(r.tokens):
            top2 = r.logits[same].topk(2).values
            divergences.append({"prompt": i, "step": same, "hf_top2_margin": float(top2[0] - top2[1])})
    checked = diff if truth is None else diff_truth
    out = {
        "prompts": len(ref),
        "new_tokens": len(ref[0].tokens),
        "prompts_token_identical": identical,
        "tokens_equal": equal_tokens,
        "tokens_total": len(ref) * len(ref[0].tokens),
        "max_abs_logit_diff": diff,
        "logit_tolerance": tolerance,
        "divergences": divergences,
        "passed": checked <= tolerance and all(d["hf_top2_margin"] <= 2 * tolerance for d in divergences),
    }
    if truth is not None:
        out["max_abs_logit_diff_vs_fp32"] = diff_truth
    return out


def same_tokens(a: list[Greedy], b: list[Greedy]) -> dict[str, Any]:
    """The engine against itself, exactly: whether the tokens are equal, how many agree (until each
    prompt's paths part), and the logits' largest difference over the steps whose prefixes agree."""
    seen = compare_to_reference(a, b, float("inf"))
    differing = sorted({d["prompt"] for d in seen["divergences"]})
    return {
        "equal": not differing,
        "prompts_differing": differing,
        "tokens_equal": seen["tokens_equal"],
        "tokens_total": seen["tokens_total"],
        "max_abs_logit_diff": seen["max_abs_logit_diff"],
    }


def judged_like_hf(
    ref: list[Greedy],
    a: list[Greedy],
    b: list[Greedy],
    tolerance: float,
    truth: list[torch.Tensor] | None,
) -> dict[str, Any]:
    """Two runs of the engine over other batch compositions (prompts alone vs together, graphs on
    vs off): b passes as a run against Hugging Face does (logits within tolerance, partings only
    at near-ties), since in bf16 a row's rounding may follow its batch (cuBLAS picks other kernels
    for 1 and 8 rows, graphs pad the batch, decode splits follow it); exact equality with a is
    reported, not required. In fp32 the tolerance is tight enough that this still catches a wrong
    row."""
    exact = same_tokens(a, b)
    judged = compare_to_reference(ref, b, tolerance, truth)
    return {
        **exact,
        "vs_hf_tokens_equal": judged["tokens_equal"],
        "vs_hf_max_abs_logit_diff": judged["max_abs_logit_diff"],
        "vs_hf_divergences": judged["divergences"],
        "passed": judged["passed"],
    }


def check_backend(
    hf: Any,
    ref: list[Greedy],
    prompts: list[list[int]],
    shape: SmallShape,
    device: torch.device,
    dtype: torch.dtype,
    attention: str,
    tolerance: float,
    truth: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """One attention backend: vs HF, all-together vs one-by-one, CUDA graphs on vs off."""
    runner = small_runner(hf, shape, device.type, str(dtype).removeprefix("torch."), attention)
    together = engine_greedy(runner, prompts, shape.new_tokens)
    result: dict[str, Any] = {
        "attention": runner.attention.name,
        "dtype": str(runner.dtype),
        "vs_hf": compare_to_reference(ref, together, tolerance, truth),
    }
    alone = [engine_greedy(runner, [p], shape.new_tokens, seed=i)[0] for i, p in enumerate(prompts)]
    result["alone_vs_together"] = judged_like_hf(ref, together, alone, tolerance, truth)
    graphs = runner.graphs
    if graphs is None:
        why = "no CUDA device" if device.type != "cuda" else f"{runner.attention.name} captures no graphs"
        result["graphs_on_vs_off"] = {"skipped": why}
    else:
        runner.graphs = None
        try:
            eager = engine_greedy(runner, prompts, shape.new_tokens)
            eager_alone = [
                engine_greedy(runner, [p], shape.new_tokens, seed=i)[0] for i, p in enumerate(prompts)
            ]
        finally:
            runner.graphs = graphs
        # Graphs on vs off for the batch of all prompts, and for each prompt alone (batch 1).
        both = None if truth is None else truth + truth
        result["graphs_on_vs_off"] = judged_like_hf(
            ref + ref, together + alone, eager + eager_alone, tolerance, both
        )
    result["passed"] = (
        result["vs_hf"]["passed"]
        and result["alone_vs_together"]["passed"]
        and result["graphs_on_vs_off"].get("passed", True)
    )
    return result


@torch.no_grad()
def fp32_truth(hf: Any, prompts: list[list[int]], ref: list[Greedy]) -> tuple[list[torch.Tensor], float]:
    """The same weights' fp32 logits along HF's bf16 path, and how far HF's own bf16 logits are
    from them: the rounding noise any bf16 forward has, the scale of an honest tolerance."""
    model = copy.deepcopy(hf).float()
    truth, noise = [], 0.0
    for p, r in zip(prompts, ref, strict=True):
        ids = torch.tensor([p + r.tokens[:-1]], device=hf.device)
        truth.append(model(ids).logits[0, len(p) - 1 :].float())
        noise = max(noise, float((truth[-1] - torch.stack(r.logits)).abs().max()))
    del model
    return truth, noise


def run(shape: SmallShape, device: torch.device, backends: list[str], log: Any,
        dtype: torch.dtype | None = None) -> dict[str, Any]:  # fmt: skip
    """Part (a); dtype: bf16 on CUDA, fp32 on CPU unless given."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    hf = small_llama(shape, device, dtype)
    prompts = make_prompts(shape)
    log(
        f"correctness: HF greedy reference, {len(prompts)} prompts x {shape.new_tokens} tokens, "
        f"prompt lengths {[len(p) for p in prompts]}"
    )
    ref = [hf_greedy(hf, p, shape.new_tokens) for p in prompts]
    out: dict[str, Any] = {
        "shape": asdict(shape),
        "device": device.type,
        "dtype": str(dtype),
        "max_abs_logit": max(float(r.abs().max()) for g in ref for r in g.logits),
    }
    # fp32: engine and HF differ only in the order of their sums (~1e-6). bf16: the engine must be
    # about as close to the fp32 logits as HF's own bf16 forward is (1.5x its worst error).
    tolerance, truth = 1e-3, None
    if dtype == torch.bfloat16:
        truth, noise = fp32_truth(hf, prompts, ref)
        out["hf_bf16_vs_fp32_max_abs_logit_diff"] = noise
        tolerance = max(tolerance, 1.5 * noise)
    out["backends"] = {}
    for name in backends:
        log(f"correctness: engine attention={name} on {device.type}")
        try:
            out["backends"][name] = check_backend(
                hf, ref, prompts, shape, device, dtype, name, tolerance, truth
            )
        except Exception as exc:  # noqa: BLE001 - a failing backend must not hide the others' results
            out["backends"][name] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
        r = out["backends"][name]
        log(
            f"correctness: {name}: passed={r['passed']} "
            + (_brief(r) if "vs_hf" in r else r.get("error", ""))
        )
    out["passed"] = all(b["passed"] for b in out["backends"].values())
    return out


def _brief(r: dict[str, Any]) -> str:
    v, pairs = r["vs_hf"], []
    for name in ("alone_vs_together", "graphs_on_vs_off"):
        o = r[name]
        seen = "skipped" if "skipped" in o else f"passed {o['passed']}, equal {o['equal']}"
        pairs.append(f"{name}: {seen}")
    return (
        f"vs HF {v['prompts_token_identical']}/{v['prompts']} prompts identical, max |dlogit| "
        f"{v['max_abs_logit_diff']:.3g} (tol {v['logit_tolerance']:.3g}); " + "; ".join(pairs)
    )
