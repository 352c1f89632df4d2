"""The stream interval (conveyor/worker/coalesce.py), pure: which of a job's events wait for its next
ones and which go out at once, by a clock the test moves."""

from __future__ import annotations

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


def test_an_unfollowed_job_waits_the_longer_interval_until_it_gains_a_follower() -> None:
    held = Coalescer(interval_s=0.020, unfollowed_s=0.250)
    async_job = InFlight("c", entry_id="0-3", created_at=0.0, followed=False)
    held.step([(A, token(0)), (async_job, token(0))], now=0.0)  # first tokens go out at once, both
    released: list[tuple[str, int]] = []
    for i in range(1, 25):  # 10 ms steps
        released += out(held.step([(A, token(i)), (async_job, token(i))], now=i * 0.010))
    followed = [i for job, i in released if job == "a"]
    unfollowed = [i for job, i in released if job == "c"]
    assert followed and max(followed) >= 20  # the followed job went out every ~20 ms
    assert unfollowed == []  # 240 ms: the unfollowed one still waits
    held.drop("a")
    assert held.next_due() == 0.010 + 0.250  # its token 1's wait
    assert out(held.step([(async_job, token(25))], now=0.250)) == [("c", i) for i in range(1, 26)]
    async_job.followed = True  # the next write said an api follows it now
    held.step([(async_job, token(26))], now=0.260)
    assert out(held.step([(async_job, token(27))], now=0.275)) == [("c", 26), ("c", 27)]


def test_the_unfollowed_interval_is_never_shorter_than_the_stream_interval() -> None:
    assert Coalescer(interval_s=0.100, unfollowed_s=0.050).unfollowed_s == 0.100
