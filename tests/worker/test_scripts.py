"""The worker's Lua scripts survive Redis losing its script cache (a restart, a failover, SCRIPT
FLUSH): the next call answers NOSCRIPT, the worker loads its scripts again and carries on. Here the
cache is flushed between two jobs of one running worker; the second job must take, stream and
finish as the first did, and the scripts must be back in the cache — loaded again by the worker,
the only one that loads them."""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis

from conveyor.jobqueue.scripts.worker import worker_scripts

PROMPT = [101, 2024, 318, 257]
N = 12
SCRIPTS = len(worker_scripts())


def shas(redis: Redis) -> list[str]:
    """The SHAs of the scripts as the worker loads them."""
    scripts = worker_scripts().values()
    return [hashlib.sha1(script.source.encode()).hexdigest() for script in scripts]


async def cached(redis: Redis) -> list[bool]:
    """Which of the worker's scripts Redis has (by SHA: other tests share this server's cache)."""
    return list(await redis.script_exists(*shas(redis)))


async def test_the_next_call_after_script_flush_still_works(local, make_spec) -> None:  # type: ignore[no-untyped-def]
    async with local.worker("w-scripts"):
        first = await local.submit(make_spec(PROMPT, max_new_tokens=N))
        assert (await local.result(first)).status == "succeeded"
        await local.check_events(first, N)
        assert await cached(local.redis) == [True] * SCRIPTS  # the worker loaded its scripts

        await local.redis.script_flush()
        assert await cached(local.redis) == [False] * SCRIPTS

        second = await local.submit(make_spec(PROMPT, max_new_tokens=N))
        result = await local.result(second)
        assert result.status == "succeeded" and result.usage.completion_tokens == N
        await local.check_events(second, N)  # every index once: the re-run pipeline duplicated none
        assert await cached(local.redis) == [True] * SCRIPTS  # loaded again after NOSCRIPT
