"""TGI's per-token stream chunk, written without building a StreamResponse (the api's hot path,
conveyor/api/routes/tgi.py `_token_chunk`), is byte for byte what the model would write: text that
needs escaping, non-ASCII and lone surrogates' replacement, logprobs absent, finite or infinite,
special tokens, alternatives."""

from __future__ import annotations

import math

import pytest

from conveyor.api.routes.tgi import _token, _token_chunk
from conveyor.wire.job import EventToken, JobEvent
from conveyor.wire.tgi import StreamResponse

TOKENS = [
    EventToken(id=0, text="plain"),
    EventToken(id=1, text=' "quoted" \\ back\nline\ttab\u0001', logprob=-0.125),
    EventToken(id=2, text="é 中文 🙂", logprob=-1.2345678901234567),
    EventToken(id=3, text="</s>", logprob=0.0, special=True),
    EventToken(id=4, text="\ufffd", logprob=-math.inf),
    EventToken(id=5, text="", logprob=1e-300),
]


@pytest.mark.parametrize("token", TOKENS, ids=lambda t: str(t.id))
@pytest.mark.parametrize("tops", [0, 2])
def test_a_token_chunk_is_the_models_json(token: EventToken, tops: int) -> None:
    event = JobEvent(index=7, token=token, top_tokens=TOKENS[:tops], at=1.0)
    model = StreamResponse(index=event.index, token=_token(token),
                           top_tokens=[_token(t) for t in event.top_tokens])
    assert _token_chunk(event, token) == model.model_dump_json()
