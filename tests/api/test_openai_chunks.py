"""A streamed OpenAI chunk written from its head once (conveyor/api/responses/openai.py ChunkWriter)
is the chunk model's JSON: chat and completion chunks, with and without usage, with text that needs
escaping."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from conveyor.api.responses.openai import ChunkWriter
from conveyor.wire.openai import (
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionUsage,
)

HEAD = {"id": "chatcmpl-1", "created": 1796687802, "model": 'a "model" é', "system_fingerprint": "conveyor"}
USAGE = CompletionUsage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
CHOICES: list[tuple[type[ChatCompletionChunk] | type[Completion], BaseModel]] = [
    (ChatCompletionChunk, ChunkChoice(index=1, delta=ChunkDelta(content=' "hi"\n 🙂'), finish_reason=None)),
    (ChatCompletionChunk, ChunkChoice(index=0, delta=ChunkDelta(content=None, tool_calls=[{"id": "c"}]),
                                      finish_reason="tool_calls")),
    (Completion, CompletionChoice(index=2, text="\\ text", finish_reason="length")),
]


@pytest.mark.parametrize(("model", "choice"), CHOICES)
@pytest.mark.parametrize(("include_usage", "usage"), [(False, None), (True, None), (True, USAGE)])
def test_a_chunk_is_its_models_json(model: type[ChatCompletionChunk] | type[Completion], choice: BaseModel,
                                    include_usage: bool, usage: CompletionUsage | None) -> None:
    written = ChunkWriter(model, HEAD, include_usage)(choice, usage)
    expected = model(**HEAD, choices=[choice]).model_dump(mode="json", exclude={"usage"})  # type: ignore[list-item]
    if include_usage:
        expected["usage"] = usage and usage.model_dump(mode="json", exclude_none=True)
    assert json.loads(written) == expected
    assert list(json.loads(written)) == list(expected)  # the fields' order too
