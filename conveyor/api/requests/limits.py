"""Request → JobSpec: the limits that need the tokenizer or the settings (pydantic checks ranges).

Every error names the field (in the dialect's own words) and the limit.
"""

from __future__ import annotations

import time

from conveyor.api.errors import ValidationError
from conveyor.api.jobpath.store import new_job_id
from conveyor.api.requests import choices
from conveyor.api.requests.chat_template import ChatTemplate, ChatTemplateError
from conveyor.api.requests.grammar import from_tgi
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.settings import Settings
from conveyor.wire.job import JobKind, JobSpec, SamplingSpec, StoppingSpec
from conveyor.wire.tgi import GenerateParameters


def check_prompt_length(settings: Settings, n: int, field: str = "inputs") -> None:
    if n > settings.max_input_tokens:
        raise ValidationError(
            f"`{field}` must have less than {settings.max_input_tokens} tokens. Given: {n}",
            param=field, code="context_length_exceeded",
        )


def resolve_max_new_tokens(settings: Settings, input_length: int, requested: int | None,
                           field: str = "max_new_tokens", prompt_field: str = "inputs",
                           default: int | None = None) -> int:
    """The request's max new tokens, checked; none requested: `default` (else the
    default_max_new_tokens setting), within what the context leaves."""
    room = settings.max_total_tokens - input_length
    if requested is None:
        return max(1, min(default or settings.default_max_new_tokens, room))
    if input_length + requested > settings.max_total_tokens:
        raise ValidationError(
            f"`{prompt_field}` tokens + `{field}` must be <= {settings.max_total_tokens}. "
            f"Given: {input_length} `{prompt_field}` tokens and {requested} `{field}`",
            param=field,
        )
    return requested


def check_stop(settings: Settings, stop: list[str]) -> None:
    if len(stop) > settings.max_stop_sequences:
        raise ValidationError(
            f"`stop` supports up to {settings.max_stop_sequences} stop sequences. Given: {len(stop)}",
            param="stop",
        )


def check_top_n(settings: Settings, n: int | None, field: str = "top_n_tokens") -> None:
    if n is not None and n > settings.max_top_n_tokens:
        raise ValidationError(f"`{field}` must be <= {settings.max_top_n_tokens}. Given: {n}", param=field)


def unsupported(field: str, advice: str) -> ValidationError:
    return ValidationError(f"`{field}` is not supported by this server: {advice}", param=field)


def check_tgi(settings: Settings, p: GenerateParameters, stream: bool = False) -> None:
    choices.check_tgi(settings, p.best_of or 1, p.samples, p.seed, stream)
    if p.watermark:
        raise unsupported("watermark", "send watermark=false")
    if p.adapter_id is not None:
        raise unsupported("adapter_id", "remove the field")
    if p.truncate is not None and p.truncate > settings.max_input_tokens:
        raise ValidationError(
            f"`truncate` must be strictly positive and less than {settings.max_input_tokens}. "
            f"Given: {p.truncate}", param="truncate",
        )
    check_stop(settings, p.stop)
    check_top_n(settings, p.top_n_tokens)


def render_chat(template: ChatTemplate | None, messages: list[dict], field: str = "messages",
                tools: list[dict] | None = None) -> str:
    if template is None:
        raise ValidationError(f"`{field}`: this model has no chat template; use /v1/completions or "
                              "/generate with a raw prompt", param=field)
    try:
        return template.render(messages, tools=tools)
    except ChatTemplateError as exc:
        raise ValidationError(f"`{field}`: {exc}", param=field) from exc


def tgi_prompt(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None,
               inputs: str) -> str:
    """What the model sees for TGI `inputs`: see the `generate_prompt_format` setting."""
    if settings.generate_prompt_format == "raw" or template is None or tokenizer.has_special_tokens(inputs):
        return inputs
    return render_chat(template, [{"role": "user", "content": inputs}], "inputs")


def new_spec(prompt_ids: list[int], sampling: SamplingSpec, stopping: StoppingSpec, tenant: str,
             kind: JobKind) -> JobSpec:
    return JobSpec(id=new_job_id(), tenant=tenant, created_at=time.time(), prompt_ids=prompt_ids,
                   sampling=sampling, stopping=stopping, kind=kind)


def tgi_job(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None, inputs: str,
            p: GenerateParameters, tenant: str = "default", stream: bool = False) -> JobSpec:
    check_tgi(settings, p, stream)
    prompt_ids = tokenizer.encode(tgi_prompt(settings, tokenizer, template, inputs))
    if p.truncate is not None and len(prompt_ids) > p.truncate:
        prompt_ids = prompt_ids[-p.truncate :]  # TGI keeps the end of the prompt
    check_prompt_length(settings, len(prompt_ids))
    max_new_tokens = resolve_max_new_tokens(settings, len(prompt_ids), p.max_new_tokens)
    best_of = p.best_of or 1
    choices.check_tokens(settings, best_of, len(prompt_ids), max_new_tokens, "best_of", "max_new_tokens")
    sampling = SamplingSpec(
        do_sample=p.samples,
        temperature=p.temperature if p.temperature is not None else 1.0,
        top_k=p.top_k or 0,
        top_p=p.top_p if p.top_p is not None else 1.0,
        typical_p=p.typical_p if p.typical_p is not None else 1.0,
        repetition_penalty=p.repetition_penalty if p.repetition_penalty is not None else 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        presence_penalty=p.presence_penalty or 0.0,
        seed=p.seed,
        top_n_tokens=p.top_n_tokens or 0,
        grammar=from_tgi(settings, p.grammar) if p.grammar is not None else None,
        prompt_logprobs=0 if p.decoder_input_details else None,  # TGI's `details.prefill`
        speculate=p.speculate,
    )
    # As TGI: a matched stop sequence ends `generated_text` (OpenAI's `stop` cuts it off).
    stopping = StoppingSpec(max_new_tokens=max_new_tokens, stop=p.stop, include_stop_str_in_output=True)
    spec = new_spec(prompt_ids, sampling, stopping, tenant, "generate")
    spec.best_of = best_of if best_of > 1 else None
    return spec
