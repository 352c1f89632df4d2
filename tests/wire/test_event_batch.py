"""A job's events as Redis carries them (conveyor/wire/event_batch.py): a run of plain tokens as
columns, anything else as an array, and every encoding read back to the same events — also the
forms workers wrote before (a JSON object per event, an array with every field); a live message
carries several jobs' batches, each read back as it went in."""

from __future__ import annotations

import json

import pytest

from conveyor.wire.event_batch import dump_events, dump_live, events_after, load_events, load_live
from conveyor.wire.job import (
    ChoiceResult,
    EventToken,
    JobEvent,
    JobResult,
    JobStatus,
    PromptEventToken,
    Usage,
)

STAMP = 1796640000.125


def plain(index: int, text: str = " hello", logprob: float | None = -0.1234567891234, special: bool = False,
          at: float = STAMP) -> JobEvent:
    token = EventToken(id=1000 + index, text=text, logprob=logprob, special=special)
    return JobEvent(index=index, token=token, at=at)


def same(a: list[JobEvent], b: list[JobEvent]) -> bool:
    return [e.model_dump() for e in a] == [e.model_dump() for e in b]


def test_a_run_of_plain_tokens_goes_as_columns_and_comes_back_the_same() -> None:
    events = [plain(5 + n, at=round(STAMP + n * 0.015, 3)) for n in range(8)]
    raw = dump_events(events)
    assert json.loads(raw)["i"] == 5 and json.loads(raw)["d"] == [15 * n for n in range(8)]
    assert same(load_events(raw), events)
    every_field = "[" + ",".join(e.model_dump_json() for e in events) + "]"  # what workers wrote before
    assert len(raw) * 3 < len(every_field)  # the point of columns: a third of the bytes, or less


@pytest.mark.parametrize("tokens", [
    [(" a", None, False), (" b", -1.5, False)],  # a logprob only on some tokens
    [("</s>", -0.5, True), ("x", -0.25, False)],  # a special token
    [("日本", -2.0, False), ('"\\\n', -3.0, False), ("\ufffd", -4.0, False)],  # UTF-8, escapes
])
def test_columns_keep_every_token_field(tokens: list[tuple[str, float | None, bool]]) -> None:
    events = [plain(n, text, logprob, special) for n, (text, logprob, special) in enumerate(tokens)]
    raw = dump_events(events)
    assert raw.startswith('{"i":')
    assert same(load_events(raw), events)
    assert same(load_events(raw.encode()), events)


def final_event(index: int) -> JobEvent:
    result = JobResult.final(JobStatus.SUCCEEDED, reason="length", generated_text="ab",
                             usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))
    return JobEvent(index=index, token=EventToken(id=7, text="b", logprob=-0.5), final=True, result=result,
                    at=STAMP)


@pytest.mark.parametrize("events", [
    [plain(0), final_event(1)],  # the end
    [plain(0).model_copy(update={"top_tokens": [EventToken(id=3, text="c", logprob=-2.0)]})],  # alternatives
    [plain(0).model_copy(update={"prompt": [PromptEventToken(id=1, text="p")]})],  # prompt logprobs
    [plain(0).model_copy(update={"choice": 1}), plain(1)],  # several choices
    [plain(0).model_copy(update={"choice_end": ChoiceResult(index=0, finish_reason="length")})],
    [plain(0), plain(2)],  # not consecutive
    [plain(0).model_copy(update={"at": None})],  # no stamp
    [JobEvent.ending(4, JobResult.final(JobStatus.CANCELLED))],  # an end without a token
], ids=["final", "top-tokens", "prompt", "choices", "choice-end", "gap", "no-stamp", "ending"])
def test_anything_else_goes_as_an_array_without_default_fields(events: list[JobEvent]) -> None:
    raw = dump_events(events)
    assert raw.startswith("[") and '"top_tokens":[]' not in raw and '"choice":0' not in raw
    assert same(load_events(raw), events)


def test_the_forms_older_workers_wrote_are_still_read() -> None:
    events = [plain(0), plain(1)]
    one_object = events[0].model_dump_json(exclude_none=True)
    array = "[" + ",".join(e.model_dump_json(exclude_none=True) for e in events) + "]"
    assert same(load_events(one_object), events[:1])
    assert same(load_events(array), events)


def test_events_after_drops_what_the_reader_has_across_encodings() -> None:
    entries = [("0-1", {"e": dump_events([plain(0), plain(1), plain(2)])}),
               ("0-4", {"e": dump_events([plain(3), final_event(4)])})]
    assert [e.index for e in events_after(entries, 1)] == [2, 3, 4]
    assert [e.index for e in events_after(entries, 3)] == [4]
    assert events_after(entries, 4) == []


def test_a_live_message_carries_each_jobs_batch_in_every_encoding() -> None:
    one_object = plain(7).model_dump_json(exclude_none=True)
    batches = {"a": [plain(0), plain(1, logprob=float("-inf"))], "b": [plain(3), final_event(4)]}
    encoded = {job_id: dump_events(events) for job_id, events in batches.items()}
    message = dump_live(encoded | {"c": one_object})
    json.loads(message.replace("-Infinity", "0"))  # one JSON object (bar -Infinity, as in columns)
    loaded = load_live(message)
    assert list(loaded) == ["a", "b", "c"]
    assert same(loaded["a"], batches["a"]) and same(loaded["b"], batches["b"])
    assert same(loaded["c"], [plain(7)])
    assert load_live(dump_live({})) == {}
