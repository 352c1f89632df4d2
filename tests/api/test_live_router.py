"""The relay's router of its process channel (conveyor/api/jobpath/live_router.py), pure: a message's
batches reach the clients of their own job only, in order, one queue item a message, each event
measured once; a signal
reaches every client; a malformed message is dropped, not raised into the reader."""

from __future__ import annotations

from conveyor.api.jobpath.live_router import LiveRouter
from conveyor.jobqueue.pubsub.subscriptions import Listener, Signal
from conveyor.wire.event_batch import dump_events, dump_live
from conveyor.wire.job import EventToken, JobEvent


def token(i: int) -> JobEvent:
    return JobEvent(index=i, token=EventToken(id=i, text="x"), at=1.0)


def queued(listener: Listener) -> list[object]:
    out = []
    while not listener.queue.empty():
        item = listener.queue.get_nowait()
        out.append(item if isinstance(item, Signal) else [event.index for event in item])
    return out


def test_each_job_gets_its_own_events_and_every_job_the_signals() -> None:
    measured: list[int] = []
    router = LiveRouter(on_event=lambda event: measured.append(event.index))
    a1, a2, b = Listener(), Listener(), Listener()
    router.add("a", a1)
    router.add("a", a2)  # two clients of one job
    router.add("b", b)
    assert len(router) == 3 and "a" in router and "c" not in router
    router.message(dump_live({"a": dump_events([token(0), token(1)]), "b": dump_events([token(5)]),
                              "c": dump_events([token(9)])}))  # c: followed by a client gone since
    assert queued(a1) == queued(a2) == [[0, 1]] and queued(b) == [[5]]  # one item a message
    assert sorted(measured) == [0, 1, 5, 9]  # the lag of every live event, once
    router.put(Signal.RESYNC)
    assert queued(a1) == queued(a2) == queued(b) == [Signal.RESYNC]
    router.message("not json")
    assert queued(a1) == []
    router.remove("a", a1)
    router.remove("a", a2)
    router.remove("b", b)
    router.remove("b", b)  # twice: a no-op
    assert len(router) == 0 and "a" not in router
