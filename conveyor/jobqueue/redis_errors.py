"""One classification of Redis errors, for every process: transient or permanent.

Transient: Redis cannot serve now but will without anyone's help — the connection dropped or timed
out, the server is loading its data (`LOADING`), full (`OOM` under `maxmemory` with noeviction,
`MISCONF` when it cannot persist), running a long script (`BUSY`), or a cluster is moving
(`CLUSTERDOWN`, `MASTERDOWN`, `TRYAGAIN`, `READONLY` on a replica just demoted, `UNBLOCKED`: a
blocking read released by a primary's demotion, `MOVED`/`ASK` storms, a slot no node covers
yet). The caller waits and retries with backoff that stays inside the lease (a worker) or answers
503 with `Retry-After` (the api), and shows itself degraded.

Permanent: retrying cannot help — a wrong password or ACL (`WRONGPASS`, `NOAUTH`, `NOPERM`), a key
of the wrong type, a script error, a command the server does not know. The caller stops with an
error that names the fix.

redis-py maps most prefixes to classes (also for an error raised by `redis.call` inside a script);
a few (BUSY, MISCONF, NOREPLICAS) arrive as a plain ResponseError, so the prefix is read too.
"""

from __future__ import annotations

from redis import exceptions as rx

# Prefixes of server errors that say "not now" rather than "never".
TRANSIENT_PREFIXES = ("OOM", "LOADING", "BUSY", "MISCONF", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN",
                      "READONLY", "UNBLOCKED", "NOREPLICAS", "MOVED", "ASK", "EXECABORT")

_PERMANENT_CLASSES: tuple[type[BaseException], ...] = (
    rx.AuthenticationError, rx.AuthorizationError, rx.NoPermissionError, rx.DataError,
)
_TRANSIENT_CLASSES: tuple[type[BaseException], ...] = (
    rx.ConnectionError,  # incl. BusyLoadingError and a full pool's MaxConnectionsError
    rx.TimeoutError,
    rx.OutOfMemoryError,
    rx.ReadOnlyError,
    rx.ClusterError,  # incl. ClusterDownError, MasterDownError
    rx.TryAgainError,
    rx.AskError,  # incl. MovedError: the client follows one; a storm of them outlasts its retries
    rx.ExecAbortError,  # a transaction refused at queue time: under maxmemory, a queued write's OOM
    rx.RedisClusterException,  # a slot not covered, the cluster unreachable
    OSError,
)


def error_code(exc: BaseException) -> str:
    """The server's error code (`OOM`, `CLUSTERDOWN`, ...) or, for an error of the connection, its
    class (`ConnectionError`, `TimeoutError`): a bounded label for metrics."""
    code = getattr(exc, "status_code", None) or _CODES.get(type(exc))
    if code:
        return str(code)
    if isinstance(exc, rx.ResponseError) and _prefix(exc).isupper():
        return _prefix(exc)
    return type(exc).__name__


# redis-py's class of each server error code (what redis-py < 8 does not keep on the error itself).
_CODES: dict[type[BaseException], str] = {
    rx.OutOfMemoryError: "OOM", rx.BusyLoadingError: "LOADING", rx.ReadOnlyError: "READONLY",
    rx.ClusterDownError: "CLUSTERDOWN", rx.MasterDownError: "MASTERDOWN", rx.TryAgainError: "TRYAGAIN",
    rx.MovedError: "MOVED", rx.AskError: "ASK", rx.ExecAbortError: "EXECABORT",
}


def _prefix(exc: BaseException) -> str:
    """The server's error code: `OOM`, `BUSY`, ... (redis-py >= 8 parses it, also out of a script's
    error; older ones leave it as the message's first word)."""
    code = getattr(exc, "status_code", None)
    if code:
        return str(code)
    text = str(exc.args[0]) if exc.args else ""
    return text.lstrip("-").split(" ", 1)[0]


def is_transient(exc: BaseException) -> bool:
    """Whether waiting and retrying can get past `exc` (see the module's docstring)."""
    if isinstance(exc, _PERMANENT_CLASSES):
        return False
    if isinstance(exc, _TRANSIENT_CLASSES):
        return True
    if isinstance(exc, rx.ResponseError):
        return _prefix(exc) in TRANSIENT_PREFIXES
    return False


def is_redis_error(exc: BaseException) -> bool:
    """Any error that came from talking to Redis (transient or not)."""
    return isinstance(exc, rx.RedisError | rx.RedisClusterException | OSError)


def fix_for(exc: BaseException) -> str:
    """What an operator should do about a permanent error, in one sentence."""
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError):
        return "check the user and password in REDIS_URL (redis://user:password@host:port)"
    if isinstance(exc, rx.NoPermissionError):
        return ("grant this Redis user the commands and keys Conveyor uses (ACL: `+@all` on the "
                "deployment's key prefix, `~<prefix>*`)")
    if "WRONGTYPE" in str(exc):
        return ("another program writes keys under Conveyor's key prefix: give Conveyor its own "
                "CONVEYOR_KEY_PREFIX or database")
    if "unknown command" in str(exc).lower():
        return "use Redis 7 or Valkey 8 or newer (Conveyor needs Streams and Lua scripting)"
    return "this is a bug in Conveyor or a Redis it does not support: please report it with this line"
