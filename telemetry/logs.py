"""Logging for every role: a readable line per event on a terminal, or one JSON object per line.

`log_format=json` writes `{"time", "level", "logger", "message", "role", "worker_id", "job_id",
"tenant", ...}` (what a log pipeline indexes); `human` writes the same event as a line with the job
fields appended. Job-level lines pass `extra={"job_id": ..., "tenant": ...}`; the role and the
worker id are added to every line of the process by a filter (`bind`).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

CONTEXT_FIELDS = ("worker_id", "job_id", "tenant", "webhook_id")


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


class _Json(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class _Human(logging.Formatter):
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
