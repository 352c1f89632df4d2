"""A job nobody followed gains a follower (conveyor/jobqueue/scripts/jobs.py WATCH, as the api's
relay calls it): the record is marked once, the control channel carries the notice once (again only
when the relay asks: it missed live events), and the owning worker's control loop hands the job to
its publish loop (PublishLoop.followed: live from the next step, what it holds written at once)
without cancelling it. On the real Redis of the tests."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis

from conveyor.jobqueue.keys import FOLLOWED, Keys
from conveyor.jobqueue.scripts.jobs import WATCH
from conveyor.wire.job import RecordField
from conveyor.worker.control_loop import ControlLoop
from conveyor.worker.owned import InFlight, Owned
from tests.readiness import await_until


class NoAbort:
    """The engine thread's place: a follow notice must never abort a job."""

    def abort(self, job_id: str) -> None:
        raise AssertionError(f"job {job_id} was cancelled by a follow notice")


async def test_a_follow_is_announced_once_and_reaches_the_owner(redis: Redis) -> None:
    keys = Keys(f"t{uuid.uuid4().hex[:8]}")
    job = InFlight("j1", entry_id="0-1", created_at=0.0)
    owned = Owned()
    owned.add(job)
    told: list[str] = []

    def on_followed(job: InFlight) -> None:
        told.append(job.job_id)

    loop = asyncio.create_task(ControlLoop(redis, keys, owned, NoAbort(), on_followed).run())  # type: ignore[arg-type]
    heard = redis.pubsub()
    await heard.subscribe(keys.control_channel)

    async def both_subscribed() -> bool:
        [(_, n)] = await redis.pubsub_numsub(keys.control_channel)
        return n == 2

    try:
        await await_until(both_subscribed, "the control loop subscribed", {}, lambda: "")
        watch = redis.register_script(WATCH.source)
        args = [keys.control_channel, "api1", "j1", 0]
        assert await watch(keys=[keys.job("gone")], args=args) == 0  # no record: none created
        assert not await redis.exists(keys.job("gone"))
        await redis.hset(keys.job("j1"), RecordField.STATUS, "running")
        assert await watch(keys=[keys.job("j1")], args=args) == 1
        assert await watch(keys=[keys.job("j1")], args=args) == 0  # already marked: no second notice
        assert await watch(keys=[keys.job("j1")], args=args[:3] + [1]) == 1  # asked again: announced
        assert await watch(keys=[keys.job("j1")], args=["x", "api2", "j1", 0]) == 1  # a second api: new

        async def told_twice() -> bool:
            return told == ["j1", "j1"]

        await await_until(told_twice, "the owner heard both notices", {}, lambda: str(told))
        assert not job.cancel_requested and job.followers == {"api1"}
        notices = []
        for _ in range(5):  # the subscribe confirmation reads as None too: not the end of the messages
            if (message := await heard.get_message(ignore_subscribe_messages=True, timeout=0.5)) is not None:
                notices.append(message["data"])
        assert notices == [FOLLOWED + "j1 api1"] * 2
        assert await redis.hget(keys.job("j1"), RecordField.WATCHED) == "api1 api2"
    finally:
        loop.cancel()
        await heard.aclose()
