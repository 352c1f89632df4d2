"""OpenAI chat completion / completion requests → JobSpec (OpenAI's semantics: temperature 0 is
greedy, no temperature is 1.0 and samples; one choice per job; a completion with several prompts
is one job per prompt)."""

from __future__ import annotations

from typing import Any

from conveyor.api.errors import ValidationError
from conveyor.api.requests import choices
from conveyor.api.requests.chat_template import ChatTemplate
from conveyor.api.requests.grammar import from_response_format
from conveyor.api.requests.limits import (
    check_prompt_length,
    check_stop,
    check_top_n,
    new_spec,
    render_chat,
    resolve_max_new_tokens,
    unsupported,
)
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.api.requests.tools import (
    check_replies,
    grammar_for,
    template_tools,
    tool_calls_in,
    tool_messages,
)
from conveyor.settings import Settings
from conveyor.wire.grammar import GrammarSpec
from conveyor.wire.job import JobSpec, SamplingSpec, StoppingSpec
from conveyor.wire.openai import ChatCompletionRequest, CompletionRequest, ResponseFormat, _Sampling


def _logit_bias(body: _Sampling, vocab: int) -> dict[int, float]:
    """`logit_bias` keys as token ids, each inside the vocabulary (ranges: conveyor/wire/openai.py)."""
    out: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        token = int(key)
        if not 0 <= token < vocab:
            raise ValidationError(f"`logit_bias`: token id {token} is outside the vocabulary "
                                  f"(0..{vocab - 1})", param="logit_bias")
        out[token] = value
    return out


def _sampling(body: _Sampling, top_n_tokens: int, vocab: int,
              grammar: GrammarSpec | None = None) -> SamplingSpec:
    temperature = 1.0 if body.temperature is None else body.temperature
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    return SamplingSpec(
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=top_k,
        top_p=body.top_p if body.top_p is not None else 1.0,
        repetition_penalty=body.repetition_penalty if body.repetition_penalty is not None else 1.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        seed=body.seed,
        top_n_tokens=top_n_tokens,
        logit_bias=_logit_bias(body, vocab),
        grammar=grammar,
        speculate=body.speculate,
    )


def _dumped(rf: ResponseFormat | None) -> dict[str, Any] | None:
    return rf.model_dump() if rf is not None else None


def _check_common(settings: Settings, body: _Sampling) -> None:
    check_stop(settings, body.stop_list)
    choices.check_openai(settings, body.n, getattr(body, "best_of", None), body.stream)


def _with_choices(spec: JobSpec, settings: Settings, body: _Sampling, field: str) -> JobSpec:
    """n and best_of on the job; their tokens against the batch budget."""
    best_of = getattr(body, "best_of", None)
    width = max(body.n, best_of or 1)
    choices.check_tokens(settings, width, len(spec.prompt_ids), spec.stopping.max_new_tokens,
                         "best_of" if width > body.n else "n", field)
    spec.n = body.n
    spec.best_of = best_of if width > body.n else None
    return spec


def _message(i: int, message: Any) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.type != "text" or part.text is None:
                raise ValidationError(f"`messages.{i}.content.{j}`: only text parts are supported "
                                      f"(given type {part.type!r})", param=f"messages.{i}.content")
            texts.append(part.text)
        content = "".join(texts)
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": content or ""}
    if message.name is not None:
        out["name"] = message.name
    extra = message.model_extra or {}
    if message.role == "assistant" and extra.get("tool_calls"):
        out["tool_calls"] = tool_calls_in(i, extra["tool_calls"])
    if message.role == "tool" and extra.get("tool_call_id") is not None:
        out["tool_call_id"] = extra["tool_call_id"]
    return out


def _rest_of_context(settings: Settings, prompt_tokens: int, n: int) -> int:
    """A chat's max tokens when it gives none: the rest of the context, as OpenAI and vLLM (agent
    frameworks rarely send max_tokens); with n choices, no more than the batch budget leaves each."""
    budget = settings.max_batch_total_tokens
    if n > 1 and budget is not None:
        return max(1, min(settings.max_total_tokens, (budget - prompt_tokens) // n))
    return settings.max_total_tokens


def chat_job(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None,
             body: ChatCompletionRequest, tenant: str) -> JobSpec:
    _check_common(settings, body)
    if body.top_logprobs and not body.logprobs:
        raise ValidationError("`top_logprobs` needs `logprobs` set to true", param="top_logprobs")
    top_n = (body.top_logprobs or 0) if body.logprobs else 0
    check_top_n(settings, top_n, "top_logprobs")
    tool_grammar = grammar_for(settings, body)
    messages = [_message(i, m) for i, m in enumerate(body.messages)]
    check_replies(messages)
    tools = template_tools(body)
    if template is not None and not template.handles_tools:
        messages, tools = tool_messages(messages, tools), None
    prompt = render_chat(template, messages, tools=tools)
    prompt_ids = tokenizer.encode(prompt)
    check_prompt_length(settings, len(prompt_ids), "messages")
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_new = resolve_max_new_tokens(settings, len(prompt_ids), body.max_completion_tokens or body.max_tokens,
                                     field=field, prompt_field="messages",
                                     default=_rest_of_context(settings, len(prompt_ids), body.n))
    stopping = StoppingSpec(max_new_tokens=max_new, stop=body.stop_list, ignore_eos=body.ignore_eos)
    grammar = from_response_format(settings, _dumped(body.response_format))
    if grammar is not None and tool_grammar is not None:
        raise ValidationError("`response_format`: a forced tool call (`tool_choice` required or a named "
                              "function) sets the output's format; send one or the other",
                              param="response_format")
    sampling = _sampling(body, top_n, tokenizer.vocab_size, grammar or tool_grammar)
    return _with_choices(new_spec(prompt_ids, sampling, stopping, tenant, "chat"), settings, body, field)


def completion_prompts(body: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completion body: a string, a list of token ids, or a list of either
    (OpenAI's and vLLM's forms). Each becomes one job."""
    prompt = body.prompt
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        return [prompt]  # type: ignore[list-item]
    if not prompt:
        raise ValidationError("`prompt` must not be empty", param="prompt")
    return list(prompt)  # type: ignore[arg-type]


def _prompt_ids(tokenizer: PromptTokenizer, prompt: str | list[int], field: str) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValidationError(f"`{field}` must not be empty", param=field)
        return tokenizer.encode(prompt)
    ids = [int(t) for t in prompt]  # token ids
    if not ids:
        raise ValidationError(f"`{field}` must not be empty", param=field)
    vocab = tokenizer.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValidationError(f"`{field}`: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})",
                              param=field)
    return ids


def completion_prompt_ids(tokenizer: PromptTokenizer, body: CompletionRequest) -> list[int]:
    """The token ids of a completion body with one prompt (an async job runs one prompt)."""
    prompts = completion_prompts(body)
    if len(prompts) != 1:
        raise ValidationError(f"`prompt`: one prompt per job. Given: {len(prompts)}; send one job per "
                              "prompt, or several prompts to /v1/completions", param="prompt")
    return _prompt_ids(tokenizer, prompts[0], "prompt")


def _check_completion(settings: Settings, body: CompletionRequest) -> None:
    _check_common(settings, body)
    if body.suffix:
        raise unsupported("suffix", "insertion is not supported; remove the field")
    if body.max_tokens == 0 and not body.echo:
        raise ValidationError("`max_tokens` must be >= 1 (0 only with `echo`, to score the prompt). Given: 0",
                              param="max_tokens")
    check_top_n(settings, body.logprobs, "logprobs")


def _completion_spec(settings: Settings, tokenizer: PromptTokenizer, body: CompletionRequest,
                     prompt_ids: list[int], tenant: str, field: str) -> JobSpec:
    check_prompt_length(settings, len(prompt_ids), field)
    max_new = resolve_max_new_tokens(settings, len(prompt_ids), body.max_tokens, field="max_tokens",
                                     prompt_field=field)
    stopping = StoppingSpec(max_new_tokens=max_new, stop=body.stop_list, ignore_eos=body.ignore_eos)
    grammar = from_response_format(settings, _dumped(body.response_format))
    sampling = _sampling(body, body.logprobs or 0, tokenizer.vocab_size, grammar)
    if body.echo and (body.logprobs is not None or max_new == 0):
        # The echoed prompt's logprobs (a scoring-only request computes them whatever it shows).
        sampling.prompt_logprobs = body.logprobs or 0
    return _with_choices(new_spec(prompt_ids, sampling, stopping, tenant, "completion"), settings, body,
                         "max_tokens")


def completion_job(settings: Settings, tokenizer: PromptTokenizer, body: CompletionRequest,
                   tenant: str) -> JobSpec:
    """One job for a one-prompt body (what `/v1/jobs` takes)."""
    _check_completion(settings, body)
    prompt_ids = completion_prompt_ids(tokenizer, body)
    return _completion_spec(settings, tokenizer, body, prompt_ids, tenant, "prompt")


def completion_jobs(settings: Settings, tokenizer: PromptTokenizer, body: CompletionRequest,
                    tenant: str) -> list[JobSpec]:
    """One job per prompt; errors name the prompt (`prompt.1`) when there are several."""
    _check_completion(settings, body)
    prompts = completion_prompts(body)
    # Each prompt is a job: more than max_concurrent_requests could never all be admitted.
    if len(prompts) > settings.max_concurrent_requests:
        raise ValidationError(f"`prompt`: at most {settings.max_concurrent_requests} prompts per request "
                              f"(max_concurrent_requests). Given: {len(prompts)}", param="prompt")
    fields = ["prompt"] if len(prompts) == 1 else [f"prompt.{i}" for i in range(len(prompts))]
    return [_completion_spec(settings, tokenizer, body, _prompt_ids(tokenizer, p, f), tenant, f)
            for p, f in zip(prompts, fields, strict=True)]


def check_stream_options(body: _Sampling) -> None:
    """OpenAI refuses `stream_options` on a request that does not stream (async jobs ignore both)."""
    if body.stream_options is not None and not body.stream:
        raise ValidationError("`stream_options` is only allowed when `stream` is true",
                              param="stream_options")
