"""A job nobody followed gains a follower (conveyor/jobqueue/scripts/jobs.py WATCH, as the api's
relay calls it): the record is marked once, the control channel carries the notice once, and the
owning worker's control loop switches the job to the stream interval (conveyor/worker/coalesce.py)
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


async def test_a_follow_is_announced_once_and_switches_the_owners_interval(redis: Redis) -> None:
    keys = Keys(f"t{uuid.uuid4().hex[:8]}")
    job = InFlight("j1", entry_id="0-1", created_at=0.0, followed=False)
    owned = Owned()
    owned.add(job)
    loop = asyncio.create_task(ControlLoop(redis, keys, owned, NoAbort()).run())  # type: ignore[arg-type]
    heard = redis.pubsub()
    await heard.subscribe(keys.control_channel)

    async def both_subscribed() -> bool:
        [(_, n)] = await redis.pubsub_numsub(keys.control_channel)
        return n == 2

    try:
        await await_until(both_subscribed, "the control loop subscribed", {}, lambda: "")
        watch = redis.register_script(WATCH.source)
        args = [keys.control_channel, FOLLOWED + "j1"]
        assert await watch(keys=[keys.job("gone")], args=args) == 0  # no record: none created
        assert not await redis.exists(keys.job("gone"))
        await redis.hset(keys.job("j1"), RecordField.STATUS, "running")
        assert await watch(keys=[keys.job("j1")], args=args) == 1
        assert await watch(keys=[keys.job("j1")], args=args) == 0  # already marked: no second notice

        async def followed() -> bool:
            return job.followed

        await await_until(followed, "the owner heard the notice", {}, lambda: "")
        assert not job.cancel_requested
        notices = []
        for _ in range(4):  # the subscribe confirmation reads as None too: not the end of the messages
            if (message := await heard.get_message(ignore_subscribe_messages=True, timeout=0.5)) is not None:
                notices.append(message["data"])
        assert notices == [FOLLOWED + "j1"]
        assert await redis.hget(keys.job("j1"), RecordField.WATCHED) == "1"
    finally:
        loop.cancel()
        await heard.aclose()
