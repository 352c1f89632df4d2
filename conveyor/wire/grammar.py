"""A grammar that constrains a job's output, as the job spec carries it (dialect-free).

The api turns OpenAI's `response_format` and TGI's `grammar` into one `GrammarSpec`, validates it
(conveyor/api/requests/grammar.py), and the worker hands it to the engine, which compiles it once per distinct
grammar (conveyor/engine/grammar.py). `value` is text so that equal grammars are equal strings (the cache
key).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

GrammarKind = Literal["json_schema", "json_object", "regex", "lark"]


class GrammarSpec(BaseModel, frozen=True):
    """`json_schema`: `value` is the schema as compact JSON text (keys sorted); `json_object`: any
    JSON object, `value` empty; `regex`: the output matches `value` in full; `lark`: a Lark grammar
    (llguidance's dialect; also the tool-call grammars of conveyor/api/requests/tools.py)."""

    kind: GrammarKind
    value: str = ""


# Separators as json.dumps writes them and no other whitespace: a JSON document then ends within a
# bound wherever the schema bounds its strings, numbers and arrays (flexible whitespace would let a
# model emit newlines forever). A Lark grammar's `%json` carries them as its schema's "x-guidance".
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def llguidance_grammar(kind: str, value: str) -> str:
    """llguidance's grammar text for a spec (the engine compiles it; the api validates it)."""
    import llguidance  # torch-free; imported here so that the job schema needs it only when used

    m = llguidance.LLMatcher
    if kind == "json_schema":
        return m.grammar_from_json_schema(value, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if kind == "json_object":
        return m.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if kind == "regex":
        return m.grammar_from_regex(value)
    if kind == "lark":
        return m.grammar_from_lark(value)
    raise ValueError(f"unknown grammar kind {kind!r}")


def grammar_error(spec: GrammarSpec) -> str | None:
    """Why llguidance cannot compile `spec` (an invalid schema, regex or Lark grammar), or None."""
    import llguidance

    try:
        return llguidance.LLMatcher.validate_grammar(llguidance_grammar(spec.kind, spec.value)) or None
    except Exception as exc:  # noqa: BLE001 - whatever the library raises for this input is a 422, never a 500
        return str(exc) or type(exc).__name__
