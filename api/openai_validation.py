"""OpenAI chat completion / completion requests → JobSpec (OpenAI's semantics: temperature 0 is
greedy, no temperature is 1.0 and samples; one choice per request)."""

from __future__ import annotations

from typing import Any

from api.chat_template import ChatTemplate
from api.errors import ValidationError
from api.tokenizer import PromptTokenizer
from api.validation import (
    check_prompt_length,
    check_stop,
    check_top_n,
    new_spec,
    render_chat,
    resolve_max_new_tokens,
    unsupported,
)
from schemas.job import JobSpec, SamplingSpec, StoppingSpec
from schemas.openai import ChatCompletionRequest, CompletionRequest, _Sampling
from schemas.settings import Settings


def _sampling(body: _Sampling, top_n_tokens: int) -> SamplingSpec:
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
    )


def _check_common(settings: Settings, body: _Sampling) -> None:
    if body.logit_bias:
        raise unsupported("logit_bias", "remove the field")
    check_stop(settings, body.stop_list)


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
    return out


def chat_job(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None,
             body: ChatCompletionRequest, tenant: str) -> JobSpec:
    _check_common(settings, body)
    if body.tools:
        raise unsupported("tools", "tool calls are not generated; remove the field")
    if body.response_format is not None and body.response_format.type != "text":
        raise unsupported("response_format", f"type {body.response_format.type!r}; only 'text'")
    if body.top_logprobs and not body.logprobs:
        raise ValidationError("`top_logprobs` needs `logprobs` set to true", param="top_logprobs")
    top_n = (body.top_logprobs or 0) if body.logprobs else 0
    check_top_n(settings, top_n, "top_logprobs")
    prompt = render_chat(template, [_message(i, m) for i, m in enumerate(body.messages)])
    prompt_ids = tokenizer.encode(prompt)
    check_prompt_length(settings, len(prompt_ids), "messages")
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_new = resolve_max_new_tokens(settings, len(prompt_ids), body.max_completion_tokens or body.max_tokens,
                                     field=field, prompt_field="messages")
    stopping = StoppingSpec(max_new_tokens=max_new, stop=body.stop_list, ignore_eos=body.ignore_eos)
    return new_spec(prompt_ids, _sampling(body, top_n), stopping, tenant, "chat")


def completion_prompt_ids(tokenizer: PromptTokenizer, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise ValidationError(f"`prompt`: one prompt per request is supported. Given: {len(prompt)}",
                                  param="prompt")
        prompt = prompt[0]  # type: ignore[assignment]
    if isinstance(prompt, str):
        if not prompt:
            raise ValidationError("`prompt` must not be empty", param="prompt")
        return tokenizer.encode(prompt)
    ids = [int(t) for t in prompt]  # type: ignore[arg-type]  # token ids
    if not ids:
        raise ValidationError("`prompt` must not be empty", param="prompt")
    vocab = tokenizer.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValidationError(f"`prompt`: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})",
                              param="prompt")
    return ids


def completion_job(settings: Settings, tokenizer: PromptTokenizer, body: CompletionRequest,
                   tenant: str) -> JobSpec:
    _check_common(settings, body)
    if body.suffix:
        raise unsupported("suffix", "insertion is not supported; remove the field")
    check_top_n(settings, body.logprobs, "logprobs")
    prompt_ids = completion_prompt_ids(tokenizer, body)
    check_prompt_length(settings, len(prompt_ids), "prompt")
    max_new = resolve_max_new_tokens(settings, len(prompt_ids), body.max_tokens, field="max_tokens",
                                     prompt_field="prompt")
    stopping = StoppingSpec(max_new_tokens=max_new, stop=body.stop_list, ignore_eos=body.ignore_eos)
    return new_spec(prompt_ids, _sampling(body, body.logprobs or 0), stopping, tenant, "completion")
