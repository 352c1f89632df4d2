"""Logging for every role: a readable line per event on a terminal, or one JSON object per line.

`log_format=json` writes `{"time", "level", "logger", "message", "role", "worker_id", "job_id",
"tenant", ...}` (what a log pipeline indexes); `human` writes the same event as a line with the job
fields appended. Job-level lines pass `extra={"job_id": ..., "tenant": ...}`; the role and the
worker id are added to every line of the process by a filter (`bind`).

No secret reaches a line: every line, at every level and from every logger (uvicorn's access log
included: it logs the query string), is passed through `redact`, which masks the values of secret
query parameters (`?api_key=...`), `Bearer`/`Basic` credentials, `whsec_` webhook secrets, URL
passwords (`redis://:pw@host`) and the process's own configured secrets (`redact_values`).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from urllib.parse import unquote_plus

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

CONTEXT_FIELDS = ("worker_id", "job_id", "tenant", "webhook_id")
REDACTED = "[REDACTED]"
# Query parameters whose value is a credential (compared lower-case, after URL-decoding the name).
SECRET_PARAMS = frozenset({
    "api_key", "apikey", "api-key", "x-api-key", "key", "token", "access_token", "refresh_token",
    "id_token", "auth", "authorization", "secret", "client_secret", "webhook_secret", "password",
    "passwd", "pwd", "signature", "sig", "session", "sessionid",
})
MIN_SECRET_LEN = 8  # shorter configured values are not masked verbatim (they would mask ordinary words)
_STOP = r"&;#\s\"'<>\\"  # what ends a query value in a log line (quotes and JSON's escapes included)
_QUERY = re.compile(rf"(?P<lead>[?&;])(?P<name>[^=&;#\s\"'<>\\]+)=(?P<value>[^{_STOP}]*)")
_PATTERNS = (  # a credential is 8+ characters: ordinary words after "Basic" stay
    (re.compile(r"\b([Bb]earer|Basic)(\s+)[A-Za-z0-9._~+/-]{8,}=*"), rf"\1\2{REDACTED}"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), f"whsec_{REDACTED}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@/\s]+@"), rf"\1:{REDACTED}@"),
)
_known: set[str] = set()


def redact_values(values: Iterable[str]) -> None:
    """Masks these exact values (this process's API keys, webhook secrets) wherever they appear."""
    _known.update(v for v in values if v and len(v) >= MIN_SECRET_LEN)


def _query_value(match: re.Match[str]) -> str:
    if unquote_plus(match["name"]).lower() not in SECRET_PARAMS or not match["value"]:
        return match[0]
    return f"{match['lead']}{match['name']}={REDACTED}"


def redact(text: str) -> str:
    """The text with every secret it holds masked (see the module's docstring)."""
    for value in sorted(_known, key=len, reverse=True):  # longest first: no half-masked key
        if value in text:
            text = text.replace(value, REDACTED)
    text = _QUERY.sub(_query_value, text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactFilter(logging.Filter):
    """Masks secrets in the record's message before any formatter sees it (uvicorn's access line
    carries the path and query string in its args)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class _Redacting(logging.Formatter):
    """The formatted line masked too: tracebacks, stacks and extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class ContextFilter(logging.Filter):
    """Adds the process's fields (role, worker id) to every record that does not carry them."""

    def __init__(self, **fields: str) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self.fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class _Json(_Redacting, JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class _Human(_Redacting):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{name.removesuffix('_id')}={getattr(record, name)}"
                           for name in CONTEXT_FIELDS if getattr(record, name, None))
        return f"{line} [{context}]" if context else line


def setup_logging(level: str, fmt: str, role: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_Json("{asctime}{levelname}{name}{message}", style="{",
                                   rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                                   reserved_attrs=[*RESERVED_ATTRS, "color_message"]))  # uvicorn's ANSI copy
    else:
        handler.setFormatter(_Human("%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    handler.addFilter(ContextFilter(role=role))
    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def bind(**fields: str) -> None:
    """Adds fields to every later line of this process (e.g. the worker id, once it is known)."""
    for handler in logging.getLogger().handlers:
        for f in handler.filters:
            if isinstance(f, ContextFilter):
                f.fields.update(fields)
