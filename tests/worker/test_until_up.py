"""conveyor/worker/outage.py `until_up`: a worker waits out every transient Redis error (not only
a dropped connection) and stops on a permanent one with the fix in the message."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from conveyor.jobqueue.redis_errors import error_code
from conveyor.worker.outage import RedisMisconfigured, until_up


def failing(*errors: BaseException):  # type: ignore[no-untyped-def]
    """An attempt that raises `errors` in turn, then returns how many tries it took."""
    tries = []

    async def attempt() -> int:
        tries.append(1)
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return len(tries)

    return attempt


async def test_transient_errors_are_waited_out_and_reported() -> None:
    seen: list[BaseException] = []
    attempt = failing(rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
                      rx.ClusterDownError("The cluster is down"), rx.ReadOnlyError("read only replica"),
                      rx.BusyLoadingError("loading"), rx.ResponseError("BUSY Redis is busy running a script"),
                      rx.ConnectionError("Connection closed by server."))
    assert await until_up("test", attempt, cap=0.01, on_error=seen.append) == 7
    assert [error_code(exc) for exc in seen] == ["OOM", "CLUSTERDOWN", "READONLY", "LOADING", "BUSY",
                                                 "ConnectionError"]


async def test_a_permanent_error_stops_with_its_fix() -> None:
    with pytest.raises(RedisMisconfigured, match="REDIS_URL"):
        await until_up("test", failing(rx.AuthenticationError("WRONGPASS invalid password")), cap=0.01)
    with pytest.raises(RedisMisconfigured, match="KEY_PREFIX"):
        await until_up("test", failing(rx.ResponseError("WRONGTYPE Operation against a key")), cap=0.01)


async def test_a_bug_of_ours_is_not_retried() -> None:
    with pytest.raises(KeyError):
        await until_up("test", failing(KeyError("x")), cap=0.01)
