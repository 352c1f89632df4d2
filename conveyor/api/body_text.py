"""Every string of a JSON body is text: an unpaired surrogate escape (`"\\ud800"`) decodes to a Python
str that cannot be encoded, tokenized or stored, so it is refused with a 422 naming its JSON path,
before any model or job sees it.

One check of the decoded body (the routers' dependency), rather than a validator on each field:
it covers every field, extensions and unknown keys included.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request

from conveyor.api.auth import tenant
from conveyor.api.errors import ValidationError


def _printable(key: str) -> str:
    """A key as the error message can carry it (a surrogate in it is shown as its escape)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _bad(text: str) -> int | None:
    """Index of the first unpaired surrogate in the string, or None. (JSON's valid pairs were joined
    into one code point when decoded: any surrogate left is unpaired.)"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def unpaired_surrogate(body: Any) -> ValidationError | None:
    """The error naming the first string (value or key) in the body with an unpaired surrogate."""
    todo: list[tuple[list[str], Any]] = [([], body)]
    while todo:  # depth first, in document order; iterative: deep nesting must not exhaust the stack
        path, value = todo.pop()
        if isinstance(value, dict):
            for key in value:
                at = _bad(key)
                if at is not None:
                    return _error([*path, _printable(key)], key, at, "key")
            todo.extend(([*path, key], item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            todo.extend(([*path, str(i)], item) for i, item in reversed(list(enumerate(value))))
        elif isinstance(value, str):
            at = _bad(value)
            if at is not None:
                return _error(path, value, at, "string")
    return None


def _error(path: list[str], text: str, at: int, what: str) -> ValidationError:
    field = ".".join(path)
    code = f"U+{ord(text[at]):04X}"
    message = (f"{field or 'body'}: contains an unpaired surrogate ({code}) at character {at} of the {what}; "
               "send text as UTF-8, or escape characters outside the BMP as a surrogate pair")
    return ValidationError(message, param=field or None)


async def unicode_body(request: Request, _tenant: str = Depends(tenant)) -> None:
    """Router dependency: 422 for a body string with an unpaired surrogate. It depends on `tenant`
    so that a caller without a valid key still gets 401 first."""
    if not await request.body():
        return
    try:
        body = await request.json()  # decoded once: FastAPI reads the same cached body
    except (ValueError, RecursionError):
        return  # not JSON: the route's own parsing answers 400 or 422
    error = unpaired_surrogate(body)
    if error is not None:
        raise error

