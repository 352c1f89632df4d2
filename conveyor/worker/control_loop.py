"""Cancels (docs/design.md §1 step 7): the control channel reaches every worker, and the owner of the
job aborts it before the engine's next step. Pub/sub is at-most-once, so the lease loop also reads
the cancel flags of the jobs it owns at every heartbeat (`check_flags`).

The same channel says when an api starts following a job (keys.FOLLOWED), or lost some of its live
events: its owner then publishes its tokens live and writes what it holds to the event stream at its
next step (PublishLoop.followed). A lost notice costs only latency: the job's next durable write
reads the mark anyway (publisher.py), and its interval bounds what the relay waits for."""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis

from conveyor.jobqueue.keys import FOLLOWED, OLD_API, Keys
from conveyor.wire.job import RecordField
from conveyor.worker.engine_thread import EngineThread
from conveyor.worker.owned import InFlight, Owned


class ControlLoop:
    def __init__(self, redis: Redis, keys: Keys, owned: Owned, thread: EngineThread,
                 on_followed: Callable[[InFlight], None]) -> None:
        self.redis = redis
        self.keys = keys
        self.owned = owned
        self.thread = thread
        self.on_followed = on_followed

    async def run(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.control_channel)
        try:
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                data: str = message["data"]
                if data.startswith(FOLLOWED):  # "followed:ID API"; an older api's: "followed:ID"
                    job_id, _, follower = data[len(FOLLOWED) :].partition(" ")
                    if (job := self.owned.get(job_id)) is not None:
                        job.followers.add(follower or OLD_API)
                        self.on_followed(job)
                elif (job := self.owned.get(data)) is not None:
                    self.cancel(job)
        finally:
            await pubsub.aclose()

    async def check_flags(self) -> None:
        """A cancel message lost on the way is caught here, from its flag."""
        jobs = [job for job in self.owned.jobs() if not job.cancel_requested]
        if not jobs:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job in jobs:
            pipe.hget(self.keys.job(job.job_id), RecordField.CANCEL)
        for job, flag in zip(jobs, await pipe.execute(), strict=True):
            if flag:
                self.cancel(job)

    def cancel(self, job: InFlight) -> None:
        job.cancel_requested = True
        self.thread.abort(job.job_id)  # applied before the engine's next step
