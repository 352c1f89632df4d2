"""A transaction that replicas confirm: MULTI … EXEC, then WAIT, on one connection.

WAIT counts the replicas that have applied this connection's last write, so it must follow the
writes on the same connection; redis-py's pipelines take a pooled connection per execute and give it
back, so this sends the pipeline's commands itself. On one primary only: on a cluster a job's writes
span nodes, each of which would need its own WAIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError


@dataclass
class ReplicasBehind(Exception):  # noqa: N818 - a state, not a failure of the call: the writes happened
    """The primary applied the transaction, but fewer replicas than asked confirmed it in time."""

    confirmed: int
    wanted: int
    timeout_ms: int

    def __str__(self) -> str:
        return f"{self.confirmed} of {self.wanted} replica(s) confirmed the write within {self.timeout_ms} ms"


async def execute_replicated(redis: Redis, pipe: Pipeline, replicas: int, timeout_ms: int) -> list[Any]:
    """Runs `pipe`'s commands in one MULTI/EXEC and returns EXEC's replies once `replicas` replicas
    have them; raises ReplicasBehind past `timeout_ms` (the writes stay applied on the primary), or
    the error of a command Redis refused (nothing applied)."""
    commands: list[tuple[Any, ...]] = [("MULTI",), *(args for args, _options in pipe.command_stack),
                                       ("EXEC",), ("WAIT", replicas, timeout_ms)]
    pool = redis.connection_pool
    conn = await pool.get_connection()
    try:
        for redial in (True, False):
            try:
                await conn.send_packed_command(conn.pack_commands(commands))
                break
            except ConnectionError:  # a socket Redis closed (it restarted): nothing sent, dial again once
                await conn.disconnect()
                if not redial:
                    raise
        replies = [await conn.read_response() for _ in commands]
    except BaseException:
        await conn.disconnect()  # replies may be left unread on it: it must not serve anyone else
        raise
    finally:
        await pool.release(conn)
    applied, confirmed = replies[-2], int(replies[-1])
    for reply in applied:
        if isinstance(reply, Exception):
            raise reply
    if confirmed < replicas:
        raise ReplicasBehind(confirmed, replicas, timeout_ms)
    return list(applied)
