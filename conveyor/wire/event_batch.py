"""A job's events as Redis carries them: several per stream entry and per live message.

A worker writes a job's new events of a step — and of several steps when they come faster than the
stream interval — as one JSON array: one XADD and one publish for many tokens (issue 40). The entry's
ID follows the batch's last index (`event_entry_id`), so reading "every event after index k" is still
one XRANGE from `event_entry_id(k + 1)`; its first entry may hold events at or before k, which the
reader drops. A single JSON object (what workers wrote before batches) reads as a batch of one, so an
api upgraded first reads the events of workers not yet upgraded.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from conveyor.wire.job import JobEvent

_BATCH = TypeAdapter(list[JobEvent])


def dump_events(events: Sequence[JobEvent]) -> str:
    return "[" + ",".join(event.model_dump_json(exclude_none=True) for event in events) + "]"


def load_events(raw: str | bytes) -> list[JobEvent]:
    """The events of one entry or message, in order."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text.lstrip().startswith("{"):
        return [JobEvent.model_validate_json(text)]
    return _BATCH.validate_json(text)


def events_after(entries: Sequence[tuple[str, dict[str, str]]], after: int) -> list[JobEvent]:
    """The events with index > after of a job's event stream entries (XRANGE's answer)."""
    return [event for _id, fields in entries for event in load_events(fields["e"]) if event.index > after]
