"""The worker's Lua scripts: the few writes that must check ownership and act in one step.

Each script touches the keys of one job (same hash tag) or of one jobs shard (its band streams
share a hash tag), so the layout keeps working on Redis Cluster; there APPEND publishes with
SPUBLISH (conveyor/jobqueue/pubsub/publish.py). Scripts are loaded once and called with EVALSHA
inside the step pipeline; if Redis lost its script cache (a restart), `execute` loads them again and
re-runs the pipeline, which is safe because every write in it is idempotent (event IDs follow the
token index).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from conveyor.jobqueue.pubsub.publish import live_publish_command
from conveyor.jobqueue.scripts import PublishCommand, Script
from conveyor.wire.job import JobStatus as S
from conveyor.wire.job import RecordField as F

log = logging.getLogger(__name__)

# Takes ownership of the job (the fence APPEND checks) and, unless it is cancelled, ended or expired
# in the queue, marks it running — atomically, so the api cannot end it as queued meanwhile.
TAKE = Script(
    keys=("job record",),
    argv=("worker id", "deliveries", "may start (0/1)", "deadline passed (0/1)", "now"),
    returns="{status before, cancel flag, {started_at, first_token_at, seed}}; nil if the record is gone",
    source=f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], '{F.WORKER}', ARGV[1], '{F.ATTEMPTS}', ARGV[2])
local status = redis.call('HGET', KEYS[1], '{F.STATUS}')
-- a queued record written on a cluster may keep its provisional TTL (JobStore.enqueue_after)
if status == '{S.QUEUED}' then redis.call('PERSIST', KEYS[1]) end
local cancel = redis.call('HGET', KEYS[1], '{F.CANCEL}')
local waiting = status == '{S.QUEUED}' and ARGV[4] == '0'
if ARGV[3] == '1' and not cancel and (status == '{S.RUNNING}' or waiting) then
  redis.call('HSET', KEYS[1], '{F.STATUS}', '{S.RUNNING}')
  redis.call('HSETNX', KEYS[1], '{F.STARTED_AT}', ARGV[5])
end
return {{status, cancel, redis.call('HMGET', KEYS[1], '{F.STARTED_AT}', '{F.FIRST_TOKEN_AT}', '{F.SEED}')}}
""",
)


def append(publish: PublishCommand) -> Script:
    """Appends one event if this worker still owns the job: XADD (the ID follows the index, so a
    duplicate is refused) + the live publish; milestones; on the final event the record and the TTLs.
    Only a refused duplicate counts as "already there": any other XADD error (OOM under maxmemory)
    is the script's error, so the publisher retries the step instead of counting an event unwritten."""
    return Script(
        keys=("job record", "job event stream"),
        argv=("worker id", "entry id", "event JSON", "maxlen", "job channel", "now", "first token (0/1)",
              "final (0/1)", "status", "result JSON", "ttl"),
        returns="0: not the owner (another worker took the job over), 1: written, 2: was already there",
        source=f"""
if redis.call('HGET', KEYS[1], '{F.WORKER}') ~= ARGV[1] then return 0 end
local added = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], ARGV[2], 'e', ARGV[3])
if type(added) == 'table' and added.err then
  if not string.find(added.err, 'equal or smaller', 1, true) then return redis.error_reply(added.err) end
  if ARGV[8] ~= '1' then return 2 end
else
  redis.call('{publish}', ARGV[5], ARGV[3])
end
if ARGV[7] == '1' then redis.call('HSETNX', KEYS[1], '{F.FIRST_TOKEN_AT}', ARGV[6]) end
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[1], '{F.STATUS}', ARGV[9], '{F.RESULT}', ARGV[10], '{F.FINISHED_AT}', ARGV[6])
  redis.call('EXPIRE', KEYS[1], ARGV[11])
  redis.call('EXPIRE', KEYS[2], ARGV[11])
end
return 1
""",
    )


# For each entry still pending for this worker: renew resets its idle time (the lease); release
# makes it idle past the lease at once, and takes back this delivery's count (a graceful hand-off
# is not a failed attempt).
KEEP = Script(
    keys=("jobs stream",),
    argv=("group", "worker id", "mode (renew | release)", "idle ms", "entry ids..."),
    returns="the entries this worker no longer owns",
    source="""
local lost = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if p[1] and p[1][2] == ARGV[2] then
    if ARGV[3] == 'release' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'IDLE', ARGV[4],
                 'RETRYCOUNT', math.max(0, p[1][4] - 1), 'JUSTID')
    else
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
""",
)

# Reads new entries (XREADGROUP >, no BLOCK) from each stream in turn until `count` are read, so a
# worker takes exactly what it has room for, from the first streams first, in one round trip. The
# first `free` streams (this worker's own stream if `own` is 1, then the bands) are read at once,
# the rest (other workers' own streams, prefix-affinity placement) only for entries that waited
# `wait` ms there unread (Redis's clock: entry ids are its milliseconds).
READ = Script(
    keys=("the streams of one shard (one hash tag), in the order to read them...",),
    argv=("group", "consumer", "count", "free", "wait ms", "own (0/1)"),
    returns="{{stream, entries} for each stream read from}, the ms until an unread entry of another "
            "worker's stream may be taken (-1: none waits), the own stream's last delivered id (or nil)",
    source="""
local function delivered(key)
  if redis.call('EXISTS', key) == 0 then return false end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == ARGV[1] then return f['last-delivered-id'] end
  end
  return false
end
local out, left = {}, tonumber(ARGV[3])
local free, wait, soonest, now = tonumber(ARGV[4]), tonumber(ARGV[5]), -1, nil
for i = 1, #KEYS do
  if left <= 0 then break end
  local count = left
  if i > free then
    count = 0
    local last = delivered(KEYS[i])
    if last then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      count = #redis.call('XRANGE', KEYS[i], '(' .. last, tostring(now - wait), 'COUNT', left)
      if count == 0 then
        local nxt = redis.call('XRANGE', KEYS[i], '(' .. last, '+', 'COUNT', 1)
        if nxt[1] then
          local due = math.max(0, tonumber(string.match(nxt[1][1], '^(%d+)')) + wait - now)
          if soonest < 0 or due < soonest then soonest = due end
        end
      end
    end
  end
  if count > 0 then
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', KEYS[i], '>')
    if reply and #reply[1][2] > 0 then
      out[#out + 1] = {KEYS[i], reply[1][2]}
      left = left - #reply[1][2]
    end
  end
end
local seen = false
if ARGV[6] == '1' then seen = delivered(KEYS[1]) end
return {out, soonest, seen}
""",
)

# The fleet cleans up after a gone worker: deletes its stream, and its name from the set, only if
# nothing is queued or pending there. Atomic with the api's enqueue (which falls back to the shared
# stream once the own stream is gone), so no job is ever left on a stream nobody reads.
FORGET = Script(
    keys=("a worker's own stream", "its shard's owners set"),
    argv=("group", "worker id"),
    returns="1: forgotten, 0: something is still queued or pending there",
    source="""
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1])
if type(p) == 'table' and not p.err and tonumber(p[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
""",
)


def worker_scripts(publish: PublishCommand) -> dict[str, Script]:
    """The worker's scripts by name, APPEND publishing with `publish`."""
    return {"take": TAKE, "append": append(publish), "keep": KEEP, "read": READ, "forget": FORGET}


class Scripts:
    """The worker's scripts on one client: loaded once, called with EVALSHA inside a pipeline."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._sha: dict[str, str] = {}

    async def load(self) -> None:
        for name, script in worker_scripts(live_publish_command(self.redis)).items():
            self._sha[name] = await self.redis.script_load(script.source)

    def call(self, pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
        # Not pipe.evalsha: redis-py's cluster pipeline refuses that method, not the command (it
        # routes EVALSHA by its keys); a NOSCRIPT is handled by `execute` on both.
        pipe.execute_command("EVALSHA", self._sha[name], len(keys), *keys, *args)

    async def execute(self, build: Callable[[Pipeline], None]) -> list[Any]:
        """Builds and runs one pipeline; results in order, errors as exception values."""
        if not self._sha:
            await self.load()
        results = await self._run(build)
        if any(isinstance(r, NoScriptError) for r in results):
            log.warning("Redis lost the worker's scripts (restarted?): loading them again")
            await self.load()
            results = await self._run(build)
        return results

    async def _run(self, build: Callable[[Pipeline], None]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        build(pipe)
        return list(await pipe.execute(raise_on_error=False))
