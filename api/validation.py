"""Request → JobSpec: the limits that need the tokenizer or the settings (pydantic checks ranges)."""

from __future__ import annotations

import time

from api.chat_template import ChatTemplate, ChatTemplateError
from api.errors import ValidationError
from api.jobs import new_job_id
from api.tokenizer import PromptTokenizer
from schemas.job import JobSpec, SamplingSpec, StoppingSpec
from schemas.settings import Settings
from schemas.tgi import GenerateParameters


def check_prompt_length(settings: Settings, n: int) -> None:
    if n > settings.max_input_tokens:
        raise ValidationError(
            f"`inputs` must have less than {settings.max_input_tokens} tokens. Given: {n}"
        )


def resolve_max_new_tokens(settings: Settings, input_length: int, requested: int | None) -> int:
    room = settings.max_total_tokens - input_length
    if requested is None:
        return max(1, min(settings.default_max_new_tokens, room))
    if input_length + requested > settings.max_total_tokens:
        raise ValidationError(
            f"`inputs` tokens + `max_new_tokens` must be <= {settings.max_total_tokens}. "
            f"Given: {input_length} `inputs` tokens and {requested} `max_new_tokens`"
        )
    return requested


def check_common(settings: Settings, p: GenerateParameters) -> None:
    if p.best_of is not None and p.best_of > settings.max_best_of:
        raise ValidationError(
            f"`best_of` must be <= {settings.max_best_of} (best_of > 1 is not supported). Given: {p.best_of}"
        )
    if p.watermark:
        raise ValidationError("`watermark` is not supported by this server: send watermark=false")
    if p.grammar is not None:
        raise ValidationError("`grammar` is not supported by this server: remove the field")
    if p.adapter_id is not None:
        raise ValidationError("`adapter_id` is not supported by this server: remove the field")
    if p.decoder_input_details:
        raise ValidationError(
            "`decoder_input_details` (prompt logprobs) is not supported by this server: send false"
        )
    if len(p.stop) > settings.max_stop_sequences:
        raise ValidationError(
            f"`stop` supports up to {settings.max_stop_sequences} stop sequences. Given: {len(p.stop)}"
        )
    if p.top_n_tokens is not None and p.top_n_tokens > settings.max_top_n_tokens:
        raise ValidationError(
            f"`top_n_tokens` must be <= {settings.max_top_n_tokens}. Given: {p.top_n_tokens}"
        )


def tgi_prompt(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None,
               inputs: str) -> str:
    """What the model sees for TGI `inputs`: see the `generate_prompt_format` setting."""
    if settings.generate_prompt_format == "raw" or template is None or tokenizer.has_special_tokens(inputs):
        return inputs
    try:
        return template.render([{"role": "user", "content": inputs}])
    except ChatTemplateError as exc:
        raise ValidationError(f"inputs: {exc}") from exc


def tgi_job(settings: Settings, tokenizer: PromptTokenizer, template: ChatTemplate | None, inputs: str,
            p: GenerateParameters, tenant: str = "default") -> JobSpec:
    check_common(settings, p)
    prompt_ids = tokenizer.encode(tgi_prompt(settings, tokenizer, template, inputs))
    if p.truncate is not None and len(prompt_ids) > p.truncate:
        prompt_ids = prompt_ids[-p.truncate :]  # TGI keeps the end of the prompt
    check_prompt_length(settings, len(prompt_ids))
    max_new_tokens = resolve_max_new_tokens(settings, len(prompt_ids), p.max_new_tokens)
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
    )
    return JobSpec(
        id=new_job_id(),
        tenant=tenant,
        created_at=time.time(),
        prompt_ids=prompt_ids,
        sampling=sampling,
        stopping=StoppingSpec(max_new_tokens=max_new_tokens, stop=p.stop),
    )
