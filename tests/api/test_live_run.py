"""Which live events continue a client's stream (conveyor/api/jobpath/live_run.py), pure: the relay
takes one message's events of a job and every message queued behind it as one batch, dropping what
was sent already and stopping at a gap or at the end."""

from __future__ import annotations

from conveyor.api.jobpath.live_run import Run
from conveyor.wire.job import EventToken, JobEvent


def ev(i: int, final: bool = False) -> JobEvent:
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final)


def indices(events: list[JobEvent]) -> list[int]:
    return [e.index for e in events]


def test_messages_in_order_make_one_batch() -> None:
    run = Run(last=2)
    run.take([ev(3), ev(4)])
    run.take([ev(5)])
    assert indices(run.events) == [3, 4, 5] and run.open and run.last == 5


def test_events_sent_already_are_dropped() -> None:
    run = Run(last=4)
    run.take([ev(3), ev(4), ev(5)])  # 3 and 4 came from the event stream before
    run.take([ev(5), ev(6)])  # published twice
    assert indices(run.events) == [5, 6] and run.open


def test_a_gap_stops_the_batch_and_keeps_the_rest() -> None:
    run = Run(last=0)
    run.take([ev(1), ev(3), ev(4)])
    assert indices(run.events) == [1] and indices(run.gap) == [3, 4] and not run.open
    assert not run.done


def test_the_final_event_ends_the_batch() -> None:
    run = Run(last=0)
    run.take([ev(1), ev(2, final=True), ev(3)])
    assert indices(run.events) == [1, 2] and run.done and not run.open


def test_a_final_event_sent_before_ends_the_stream_without_events() -> None:
    run = Run(last=5)
    run.take([ev(5, final=True)])
    assert run.events == [] and run.done
