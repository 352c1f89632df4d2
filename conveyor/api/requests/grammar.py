"""Structured output in the dialects' shapes → one `GrammarSpec` (conveyor/wire/grammar.py), validated.

An object schema that declares properties allows only those (see `closed`; the
`json_undeclared_keys` setting restores JSON Schema's reading).

OpenAI `response_format`: `{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
{name, schema, strict}}` (the schema is always enforced, strict or not), and TGI's form on its chat
route, `{"type": "json_object" | "json" | "regex", "value": ...}`. TGI `parameters.grammar`:
`{"type": "json" | "json_object", "value": schema (an object or its JSON text)}`, `{"type": "regex",
"value": "..."}`, `{"type": "json_schema", "value": {"name"?, "schema"}}`. An invalid schema or
regex, or one over `max_grammar_bytes`, answers 422 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.api.errors import ValidationError
from conveyor.settings import Settings
from conveyor.wire.grammar import GrammarSpec, grammar_error


def parsed_schema(settings: Settings, schema: Any, field: str) -> dict[str, Any]:
    """A JSON schema (an object, or its JSON text) as a dict, closed to undeclared keys unless the
    `json_undeclared_keys` setting allows them."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValidationError(f"`{field}`: the schema is not valid JSON ({exc})", param=field) from exc
    if not isinstance(schema, dict):
        raise ValidationError(f"`{field}`: a JSON schema is an object; given {type(schema).__name__}",
                              param=field)
    return closed(schema) if settings.json_undeclared_keys == "forbid" else schema


def json_schema(settings: Settings, schema: Any, field: str) -> GrammarSpec:
    """A JSON schema as a checked grammar. Its compact text is the cache key; key order is kept,
    since the output writes properties in the order the schema declares them."""
    value = json.dumps(parsed_schema(settings, schema, field), separators=(",", ":"), ensure_ascii=False)
    return checked(settings, GrammarSpec(kind="json_schema", value=value), field)


# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = ("additionalProperties", "items", "not", "contains", "if", "then", "else", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LIST = ("anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any, in_all_of: bool = False) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that declares properties
    and says nothing of it (what vLLM's guidance backend does with disable_additional_properties).
    Only schema positions are walked, never `const`, `enum` or `default` values. The members of an
    `allOf` stay open: each declares a part of one object, closing them would leave nothing valid."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed(s, in_all_of=True) for s in out["allOf"]]
    declares = "properties" in out or "patternProperties" in out
    if declares and "additionalProperties" not in out and not in_all_of:
        out["additionalProperties"] = False
    return out


def _regex(value: Any, field: str) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"`{field}`: a regex grammar's `value` is a non-empty string", param=field)
    return GrammarSpec(kind="regex", value=value)


def checked(settings: Settings, spec: GrammarSpec, field: str) -> GrammarSpec:
    """`spec` if it is within `max_grammar_bytes` and compiles; else a 422 naming `field`."""
    size = len(spec.value.encode())
    if size > settings.max_grammar_bytes:
        raise ValidationError(f"`{field}`: the grammar is {size} bytes; at most {settings.max_grammar_bytes} "
                              "(max_grammar_bytes)", param=field)
    error = grammar_error(spec)
    if error:
        what = spec.kind.replace("_", " ")
        raise ValidationError(f"`{field}`: invalid {what}: {error.strip()}", param=field)
    return spec


def from_response_format(settings: Settings, rf: dict[str, Any] | None) -> GrammarSpec | None:
    """OpenAI's `response_format` (or TGI's chat form of it); None for plain text."""
    field = "response_format"
    kind = (rf or {}).get("type", "text")
    if kind == "text":
        return None
    if kind in ("json_object", "json") and "value" in rf:  # type: ignore[operator]
        return json_schema(settings, rf["value"], field)  # type: ignore[index]
    if kind == "json_object":
        return checked(settings, GrammarSpec(kind="json_object"), field)
    if kind == "regex":
        return checked(settings, _regex(rf.get("value"), field), field)  # type: ignore[union-attr]
    if kind == "json_schema":
        spec = rf.get("json_schema")  # type: ignore[union-attr]
        if not isinstance(spec, dict):
            raise ValidationError("`response_format.json_schema` is required with type json_schema: "
                                  '{"name": ..., "schema": {...}}', param="response_format.json_schema")
        if "schema" not in spec:
            return checked(settings, GrammarSpec(kind="json_object"), field)
        return json_schema(settings, spec["schema"], "response_format.json_schema.schema")
    raise ValidationError(f"`response_format`: type {kind!r} is not one of text, json_object, json_schema",
                          param=field)


def from_tgi(settings: Settings, grammar: dict[str, Any]) -> GrammarSpec:
    """TGI's `parameters.grammar`."""
    field = "grammar"
    kind, value = grammar.get("type"), grammar.get("value")
    if kind in ("json", "json_object"):
        return json_schema(settings, value, field)
    if kind == "json_schema":
        schema = value.get("schema") if isinstance(value, dict) else None
        return json_schema(settings, schema, field)
    if kind == "regex":
        return checked(settings, _regex(value, field), field)
    raise ValidationError(f"`grammar`: type {kind!r} is not one of json, regex, json_schema", param=field)
