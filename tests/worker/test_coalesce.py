"""The stream interval (conveyor/worker/coalesce.py), pure: which of a job's events wait for its next
ones and which go out at once, by a clock the test moves."""

from __future__ import annotations

import math

from conveyor.wire.job import EventToken, JobEvent, JobResult, JobStatus
from conveyor.worker.coalesce import Coalescer
from conveyor.worker.owned import InFlight

A, B = InFlight("a", entry_id="0-1", created_at=0.0), InFlight("b", entry_id="0-2", created_at=0.0)


def token(i: int, final: bool = False) -> JobEvent:
    result = JobResult(status=JobStatus.SUCCEEDED, generated_text="x", finish_reason="length")
    return JobEvent(index=i, token=EventToken(id=i, text="x"), final=final, result=result if final else None)


def out(items: list[tuple[InFlight, JobEvent]]) -> list[tuple[str, int]]:
    return [(job.job_id, event.index) for job, event in items]


def test_tokens_wait_at_most_the_interval_and_go_out_together() -> None:
    held = Coalescer(interval_s=0.020)
    assert out(held.step([(A, token(0))], now=0.000)) == [("a", 0)]  # a first token never waits
    assert out(held.step([(A, token(1))], now=0.005)) == []
    assert held.next_due() == 0.005 + 0.020
    assert out(held.step([(A, token(2))], now=0.010)) == []  # 5 ms steps: 10 ms waited, 5 more is fine
    assert out(held.step([(A, token(3))], now=0.015)) == []
    # waited 15 ms: the next step (5 ms away) would take token 1 to the interval: out now, all of them
    assert out(held.step([(A, token(4))], now=0.020)) == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    assert held.next_due() is None and len(held) == 0


def test_a_final_event_takes_what_its_job_held_and_leaves_other_jobs_waiting() -> None:
    held = Coalescer(interval_s=0.020)
    held.step([(A, token(0)), (B, token(0))], now=0.0)
    held.step([(A, token(1)), (B, token(1))], now=0.001)
    assert out(held.step([(A, token(2, final=True)), (B, token(2))], now=0.002)) == [("a", 1), ("a", 2)]
    assert out(held.due(now=0.0209)) == []
    assert out(held.due(now=0.021)) == [("b", 1), ("b", 2)]  # no step came: the interval ran out


def test_steps_slower_than_the_interval_or_interval_zero_hold_nothing() -> None:
    slow = Coalescer(interval_s=0.020)
    slow.step([(A, token(0))], now=0.0)
    assert out(slow.step([(A, token(1))], now=0.050)) == [("a", 1)]  # 50 ms steps: waiting helps nobody
    off = Coalescer(interval_s=0.0)
    off.step([(A, token(0))], now=0.0)
    assert out(off.step([(A, token(1))], now=0.001)) == [("a", 1)]


def test_drop_forgets_a_lost_job_and_take_all_empties() -> None:
    held = Coalescer(interval_s=1.0)
    held.step([(A, token(0)), (B, token(0))], now=0.0)
    held.step([(A, token(1)), (B, token(1))], now=0.001)
    held.drop("a")
    assert out(held.take_all()) == [("b", 1)] and len(held) == 0


def test_an_expedited_job_goes_out_at_the_next_step_or_at_once() -> None:
    """A relay that started following a job needs what the worker holds in the event stream now
    (PublishLoop.followed): its held events go out at the next step, or at once with no step."""
    durable = Coalescer(interval_s=0.250)
    durable.step([(A, token(0)), (B, token(0))], now=0.0)
    for i in range(1, 5):  # 10 ms steps: both wait the 250 ms
        assert out(durable.step([(A, token(i)), (B, token(i))], now=i * 0.010)) == []
    durable.expedite("a")
    durable.expedite("gone")  # a job it holds nothing of: nothing to do
    assert out(durable.step([(A, token(5)), (B, token(5))], now=0.050)) == [("a", i) for i in range(1, 6)]
    assert durable.next_due() == 0.010 + 0.250  # b still waits its interval
    durable.step([(A, token(6))], now=0.060)
    durable.expedite("a")
    assert durable.next_due() == -math.inf  # due now: the publish loop wakes without a step
    assert out(durable.due(now=0.061)) == [("a", 6)]
