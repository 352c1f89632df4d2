"""A job's events as Redis carries them: several per stream entry and per live message.

A worker writes a job's new events of a step — and of several steps when they come faster than the
stream interval — as one entry: one XADD and one publish for many tokens (issue 40). The entry's
ID follows the batch's last index (`event_entry_id`), so reading "every event after index k" is still
one XRANGE from `event_entry_id(k + 1)`; its first entry may hold events at or before k, which the
reader drops.

Two encodings, chosen per batch by the writer; the reader takes either, and a single JSON object
(what workers wrote before batches):
- **columns**, for a run of plain tokens (consecutive indices, choice 0, no alternatives, not the
  end): `{"i": first index, "id": [...], "t": [texts], "l": [logprobs], "s": [special],
  "at": first stamp, "d": [ms after it]}`, `s` only when a token is special and `l` only when a
  token has a logprob: about 40 bytes a token instead of 150 — a finished job's events live in
  Redis for the replay window, so this is memory as much as traffic;
- **a JSON array** of events without their default fields, for anything else.
An api must be upgraded before its workers (docs/operations/deploy.md#upgrading): an older api reads
arrays and objects, not columns.

A live message goes to one api process and carries the new events of every job of one worker step
that the api follows: `{"JOB ID": <a batch as above>, ...}` (`dump_live`, `load_live`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import from_json, to_json

from conveyor.wire.job import JobEvent

_BATCH = TypeAdapter(list[JobEvent])


def dump_events(events: Sequence[JobEvent]) -> str:
    if _plain_run(events):
        return _dump_columns(events)
    return "[" + ",".join(event.model_dump_json(exclude_defaults=True) for event in events) + "]"


def load_events(raw: str | bytes) -> list[JobEvent]:
    """The events of one entry or message, in order."""
    text = (raw.decode() if isinstance(raw, bytes) else raw).lstrip()
    if text.startswith("["):
        return _BATCH.validate_json(text)
    if text.startswith('{"i":'):
        return _load_columns(from_json(text))
    return [JobEvent.model_validate_json(text)]


def dump_live(batches: dict[str, str]) -> str:
    """One live message: job id → its batch as dump_events wrote it (no batch is encoded twice)."""
    return "{" + ",".join(f'"{job_id}":{batch}' for job_id, batch in batches.items()) + "}"


def load_live(raw: str | bytes) -> dict[str, list[JobEvent]]:
    """A live message's events by job id, parsed in one pass."""
    return {job_id: _load_python(batch) for job_id, batch in from_json(raw).items()}


def _load_python(batch: Any) -> list[JobEvent]:
    if isinstance(batch, list):
        return _BATCH.validate_python(batch)
    if "i" in batch and "id" in batch:
        return _load_columns(batch)
    return [JobEvent.model_validate(batch)]


def events_after(entries: Sequence[tuple[str, dict[str, str]]], after: int) -> list[JobEvent]:
    """The events with index > after of a job's event stream entries (XRANGE's answer)."""
    return [event for _id, fields in entries for event in load_events(fields["e"]) if event.index > after]


def _plain_run(events: Sequence[JobEvent]) -> bool:
    if not events:
        return False
    first = events[0].index
    return all(
        e.token is not None and e.index == first + n and not e.top_tokens and not e.final
        and e.result is None and e.prompt is None and e.choice == 0 and e.choice_end is None
        and e.at is not None
        for n, e in enumerate(events)
    )


def _dump_columns(events: Sequence[JobEvent]) -> str:
    tokens = [e.token for e in events if e.token is not None]
    stamps = [e.at for e in events if e.at is not None]
    columns: dict[str, Any] = {"i": events[0].index, "id": [t.id for t in tokens],
                               "t": [t.text for t in tokens]}
    if any(t.logprob is not None for t in tokens):
        columns["l"] = [t.logprob for t in tokens]
    if any(t.special for t in tokens):
        columns["s"] = [int(t.special) for t in tokens]
    columns["at"] = stamps[0]
    columns["d"] = [round((at - stamps[0]) * 1000) for at in stamps]
    return to_json(columns, inf_nan_mode="constants").decode()


def _load_columns(columns: dict[str, Any]) -> list[JobEvent]:
    ids, texts, first, at = columns["id"], columns["t"], columns["i"], columns["at"]
    logprobs = columns.get("l") or [None] * len(ids)
    special = columns.get("s") or [0] * len(ids)
    # Dicts validated at once, not models built one by one: on this, the relay's hot path, pydantic's
    # own loop costs half as much (and JobEvent.model_construct ~40x more).
    return _BATCH.validate_python([
        {"index": first + n, "token": {"id": ids[n], "text": texts[n], "logprob": logprobs[n],
                                       "special": bool(special[n])},
         "at": round(at + delta / 1000, 3)}
        for n, delta in enumerate(columns["d"])
    ])
