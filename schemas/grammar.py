"""A grammar that constrains a job's output, as the job spec carries it (dialect-free).

The api turns OpenAI's `response_format` and TGI's `grammar` into one `GrammarSpec`, validates it
(api/grammar.py), and the worker hands it to the engine, which compiles it once per distinct
grammar (engine/grammar.py). `value` is text so that equal grammars are equal strings (the cache key).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

GrammarKind = Literal["json_schema", "json_object", "regex", "lark"]


class GrammarSpec(BaseModel, frozen=True):
    """`json_schema`: `value` is the schema as compact JSON text (keys sorted); `json_object`: any
    JSON object, `value` empty; `regex`: the output matches `value` in full; `lark`: a Lark grammar
    (llguidance's dialect; also the tool-call grammars of api/tools.py)."""

    kind: GrammarKind
    value: str = ""
