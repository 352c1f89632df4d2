"""A Redis outage shorter than the lease moves no job: two worker processes, a valkey-server of the
test's own that is paused (SIGSTOP … SIGCONT) for the lease less two heartbeats, or killed and
restarted on the same port from its AOF for half the lease. Redis counts an entry's idle time on
through the outage, so right after it the live workers' jobs may look abandoned; each worker renews
its own leases first and the sweeper claims only entries it saw idle past the lease one heartbeat
earlier too, so no job changes owner or runs twice."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff

from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.job import JobStatus, RecordField
from tests.worker.conftest import Fleet, new_fleet

pytestmark = pytest.mark.slow


class Server:
    """A valkey-server the test may pause or kill (no other test uses it); AOF fsynced on every
    write, so a restart loses nothing the workers were told is written."""

    def __init__(self, data_dir: Path) -> None:
        self.redis = EmbeddedRedis(data_dir, appendfsync="always").start()

    @property
    def pid(self) -> int:
        process = self.redis.process
        if process is None:
            raise RuntimeError("the server is not running")
        return process.pid

    async def pause(self, seconds: float) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        try:
            for _ in range(500):  # the signal is delivered asynchronously
                if self._state() == "T":
                    break
                await asyncio.sleep(0.01)
            assert self._state() == "T", f"valkey-server did not stop (state {self._state()})"
            await asyncio.sleep(seconds)  # the fault itself: how long Redis is gone
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def _state(self) -> str:
        return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    async def restart(self, seconds: float) -> None:
        before = self.pid
        os.kill(before, signal.SIGKILL)
        await asyncio.to_thread(self.redis.process.wait)  # type: ignore[union-attr]
        await asyncio.sleep(seconds)  # the fault itself: how long Redis is gone
        await asyncio.to_thread(self.redis.start)  # same port, same data directory: replays the AOF
        assert self.pid != before

    def stop(self) -> None:
        if self.redis.process is not None and self.redis.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
        self.redis.stop()


@pytest.fixture
async def outage(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[Fleet, Server]]:
    server = Server(tmp_path / "redis")
    # The test's own client rides out the restart (redis-py's from_url clients do not retry by default).
    client = Redis.from_url(server.redis.url, decode_responses=True, retry=Retry(ConstantBackoff(0.1), 100))
    fleet = new_fleet(client, server.redis.url, tiny_model_dir, tmp_path)
    try:
        yield fleet, server
    finally:
        await asyncio.to_thread(fleet.stop)
        await client.aclose()
        server.stop()


@pytest.mark.parametrize("fault", ["pause", "restart"])
async def test_an_outage_shorter_than_the_lease_moves_no_job(outage, make_spec, fault: str) -> None:  # type: ignore[no-untyped-def]
    fleet, server = outage
    fleet.start("w0", "w1")
    await fleet.wait_ready()
    lease_s = int(fleet.env["CONVEYOR_JOB_LEASE_MS"]) / 1000
    n = 1500
    specs = [make_spec([1000 + i, 2000 + i, 3000 + i], max_new_tokens=n) for i in range(12)]
    for spec in specs:
        await fleet.submit(spec)
    for spec in specs:  # every job read and running before the fault: no read reply can be lost
        await fleet.wait_events(spec.id, 5)
    owners = {s.id: (await fleet.record(s.id))[RecordField.WORKER] for s in specs}
    assert set(owners.values()) == {"w0", "w1"}, f"one worker took every job: {owners}"
    pending = await fleet.pending_rows()
    assert sorted(row["consumer"] for row in pending) == sorted(owners.values())
    written = [len(await fleet.events(s.id)) for s in specs]

    # An entry was last renewed up to a heartbeat before the outage, and its worker renews it at most
    # a heartbeat after (a loaded machine's scheduling included): outage + 2 heartbeats is the lease
    # (at 0.9 of the lease a loaded CI run read 2.05 s idle and the renew came a sweep too late). A
    # restart's own start-up (process, AOF replay) adds to the time Redis is gone: it waits less.
    heartbeat_s = int(fleet.env["CONVEYOR_HEARTBEAT_INTERVAL_MS"]) / 1000
    gone_s = lease_s - 2 * heartbeat_s
    await (server.pause(gone_s) if fault == "pause" else server.restart(0.5 * lease_s))
    results = [await fleet.result(s.id) for s in specs]

    assert max(written) < n, "a job finished before the outage: make them longer"
    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * len(specs), fleet.logs()
    for spec in specs:
        await fleet.check_events(spec.id, n)  # every index once: nothing recomputed and rewritten
        record = await fleet.record(spec.id)
        # Delivery count 1 (the record's attempts) and the same owner: no job was reclaimed.
        assert (record[RecordField.WORKER], record[RecordField.ATTEMPTS]) == (owners[spec.id], "1"), \
            fleet.logs()
    logs = fleet.logs()
    assert "reclaimed" not in logs and "taken over" not in logs, logs
    if fault == "restart":
        assert "Redis cannot serve" in logs  # the workers did see it go
    assert await fleet.pending() == 0
