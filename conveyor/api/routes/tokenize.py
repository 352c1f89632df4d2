"""`POST /tokenize`: TGI's route, and vLLM's body shape on the same path (the keys tell them apart);
`POST /detokenize`: vLLM's.

- TGI: `{inputs, parameters?}` → `[{id, text, start, stop}]`: the tokens `/generate` would run on
  for these inputs (the same `generate_prompt_format` and `truncate`), with character offsets into
  that prompt (with `raw` prompts, into `inputs` itself, exactly as TGI).
- vLLM: `{prompt}` (raw, as `/v1/completions` tokenizes it) or `{messages}` (through the chat
  template, as `/v1/chat/completions`) → `{count, max_model_len, tokens}`; `add_special_tokens`
  false leaves out the tokenizer's own special tokens (a BOS), as vLLM. `/detokenize`: `{tokens}` →
  `{prompt}` (`vllm bench serve` builds its prompts with both). vLLM's bodies may name a `model`
  (conveyor/api/models.py); TGI's run on the default model.

Nothing is queued: tokenizing needs no worker.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.auth import tenant
from conveyor.api.body_text import unicode_body
from conveyor.api.context import ApiContext
from conveyor.api.errors import ValidationError
from conveyor.api.openapi import error_responses
from conveyor.api.requests.limits import render_chat, tgi_prompt
from conveyor.api.requests.openai import _message
from conveyor.wire.openai import ChatMessage
from conveyor.wire.tgi import GenerateParameters

router = APIRouter(tags=["Text Generation Inference"], dependencies=[Depends(unicode_body)])


class TokenizeRequest(BaseModel):
    """Exactly one of `inputs` (TGI), `prompt` or `messages` (vLLM)."""

    model_config = ConfigDict(extra="ignore")

    inputs: str | None = Field(default=None, min_length=1, description="TGI: the text /generate takes.")
    parameters: GenerateParameters = Field(default_factory=GenerateParameters,
                                           description="TGI: only `truncate` matters here.")
    prompt: str | None = Field(default=None, min_length=1, description="vLLM: a raw prompt.")
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, description="vLLM: chat messages.")
    add_special_tokens: bool = Field(default=True, description="vLLM: false leaves out the tokenizer's "
                                     "own special tokens (a BOS).")
    model: str | None = Field(default=None, description="vLLM: whose tokenizer; unset: the default model's.")


class SimpleToken(BaseModel):
    """TGI's token of `/tokenize`: `start`/`stop` are character offsets into the prompt."""

    id: int
    text: str
    start: int
    stop: int


class VllmTokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


@router.post("/tokenize", response_model=list[SimpleToken] | VllmTokenizeResponse,
             responses=error_responses("tgi", 400, 401, 413, 422))
async def tokenize(body: TokenizeRequest, request: Request, _tenant: str = Depends(tenant)) -> JSONResponse:
    """Tokenize a prompt without generating: TGI's answer for `inputs`, vLLM's for `prompt` or
    `messages`."""
    ctx = ApiContext.of(request)
    given = [name for name in ("inputs", "prompt", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise ValidationError("give exactly one of `inputs` (TGI), `prompt` or `messages` (vLLM). "
                              f"Given: {', '.join(given) or 'none'}", param="inputs")
    if body.inputs is not None:
        return JSONResponse([t.model_dump() for t in _tgi(ctx, body.inputs, body.parameters)])
    served = ctx.models.route(body.model)
    if body.prompt is not None:
        text = body.prompt
    else:
        text = render_chat(served.chat_template, [_message(i, m) for i, m in enumerate(body.messages or [])])
    ids = served.tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
    answer = VllmTokenizeResponse(count=len(ids), max_model_len=ctx.settings.max_total_tokens, tokens=ids)
    return JSONResponse(answer.model_dump())


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int] = Field(description="Token ids.")
    model: str | None = Field(default=None, description="Whose tokenizer; unset: the default model's.")


class DetokenizeResponse(BaseModel):
    prompt: str


@router.post("/detokenize", response_model=DetokenizeResponse,
             responses=error_responses("tgi", 400, 401, 413, 422))
async def detokenize(body: DetokenizeRequest, request: Request,
                     _tenant: str = Depends(tenant)) -> DetokenizeResponse:
    """Token ids back to text (vLLM's route): special tokens are written out."""
    tokenizer = ApiContext.of(request).models.route(body.model).tokenizer
    bad = [t for t in body.tokens if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise ValidationError(f"`tokens`: token id {bad[0]} is outside the vocabulary "
                              f"(0..{tokenizer.vocab_size - 1})", param="tokens")
    return DetokenizeResponse(prompt=tokenizer.decode(body.tokens))


def _tgi(ctx: ApiContext, inputs: str, parameters: GenerateParameters) -> list[SimpleToken]:
    prompt = tgi_prompt(ctx.settings, ctx.tokenizer, ctx.chat_template, inputs)
    tokens = ctx.tokenizer.encode_offsets(prompt)
    truncate = parameters.truncate
    if truncate is not None:
        if truncate > ctx.settings.max_input_tokens:
            raise ValidationError(f"`truncate` must be strictly positive and less than "
                                  f"{ctx.settings.max_input_tokens}. Given: {truncate}", param="truncate")
        tokens = tokens[-truncate:]  # as /generate: the end of the prompt is kept
    return [SimpleToken(id=i, text=prompt[start:stop], start=start, stop=stop) for i, start, stop in tokens]
