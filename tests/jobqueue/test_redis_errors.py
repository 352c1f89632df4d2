"""conveyor/jobqueue/redis_errors.py: which Redis errors a process waits out and which it reports
with a fix — on errors as redis-py builds them, and on the real server's own answers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import redis
from redis import exceptions as rx

from conveyor.jobqueue.redis_errors import fix_for, is_redis_error, is_transient
from conveyor.launcher.redis_server import EmbeddedRedis

TRANSIENT = [
    rx.ConnectionError("Connection closed by server."),
    rx.TimeoutError("Timeout reading from socket"),
    ConnectionResetError(104, "Connection reset by peer"),
    rx.BusyLoadingError("Redis is loading the dataset in memory"),
    rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    rx.ReadOnlyError("You can't write against a read only replica."),
    rx.ClusterDownError("The cluster is down"),
    rx.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    rx.TryAgainError("Multiple keys request during rehashing of slot"),
    rx.MovedError("3999 127.0.0.1:6381"),
    rx.SlotNotCoveredError("Slot 42 not covered by the cluster."),
    rx.MaxConnectionsError("Too many connections"),
    rx.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN."),
    rx.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's unable to persist."),
    rx.ResponseError("NOREPLICAS Not enough good replicas to write."),
    # A worker's XREADGROUP BLOCK on a primary that a manual CLUSTER FAILOVER demotes:
    rx.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed "
                     "(master -> replica?)"),
]
PERMANENT = [
    rx.AuthenticationError("invalid username-password pair or user is disabled."),
    rx.NoPermissionError("this user has no permissions to run the 'xadd' command"),
    rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    rx.ResponseError("ERR Error running script, user_script:3: attempt to index a nil value"),
    rx.DataError("Invalid input of type: 'NoneType'."),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__ + ":" + str(e)[:12])
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc) and is_redis_error(exc)


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__ + ":" + str(e)[:12])
def test_permanent_with_a_fix(exc: BaseException) -> None:
    assert not is_transient(exc) and is_redis_error(exc)
    assert fix_for(exc)


def test_not_a_redis_error() -> None:
    assert not is_transient(ValueError("x")) and not is_redis_error(ValueError("x"))
    assert "REDIS_URL" in fix_for(rx.AuthenticationError("WRONGPASS"))
    assert "KEY_PREFIX" in fix_for(rx.ResponseError("WRONGTYPE Operation against a key"))


def test_the_servers_own_errors_are_classified() -> None:
    """OOM from a command, from inside a script and from a transaction; WRONGTYPE and an unknown
    command from a script: as a real valkey-server words them."""
    server = EmbeddedRedis(Path(tempfile.mkdtemp())).start()
    try:
        r = redis.Redis.from_url(server.url)
        r.set("a-string", "x")
        caught: dict[str, BaseException] = {}
        for name, call in [("wrongtype", lambda: r.eval("return redis.call('HSET', KEYS[1], 'f', 'v')", 1,
                                                         "a-string")),
                           ("unknown", lambda: r.eval("return redis.call('NOPE')", 0))]:
            with pytest.raises(rx.RedisError) as info:
                call()
            caught[name] = info.value
        r.config_set("maxmemory", "1mb")
        r.config_set("maxmemory-policy", "noeviction")
        with pytest.raises(rx.OutOfMemoryError):
            for i in range(100_000):
                r.set(f"fill-{i}", "x" * 100)
        xadd = "return redis.call('XADD', KEYS[1], '*', 'a', 'b')"
        for name, call in [("oom", lambda: r.xadd("s", {"a": "b"})),
                           ("oom-script", lambda: r.eval(xadd, 1, "s")),
                           ("oom-multi", lambda: r.pipeline().set("x", "y").xadd("s", {"a": "b"}).execute())]:
            with pytest.raises(rx.RedisError) as info:
                call()
            caught[name] = info.value
    finally:
        server.stop()
    assert all(is_transient(caught[name]) for name in ("oom", "oom-script", "oom-multi")), caught
    assert not is_transient(caught["wrongtype"]) and not is_transient(caught["unknown"])
