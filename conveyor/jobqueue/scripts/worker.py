"""The worker's Lua scripts: the few writes that must check ownership and act in one step.

Each script touches the keys of one job (same hash tag) or of one jobs shard (its band streams
share a hash tag), so the layout keeps working on Redis Cluster. Scripts are loaded once and called
with EVALSHA inside the step pipeline; if Redis lost its script cache (a restart), `execute` loads
them again and re-runs the pipeline, which is safe because every write in it is idempotent (event
IDs follow the token index).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from conveyor.jobqueue.scripts import Script
from conveyor.jobqueue.scripts.jobs import DEPTH
from conveyor.wire.job import JobStatus as S
from conveyor.wire.job import RecordField as F

log = logging.getLogger(__name__)

# Takes ownership of the job (the fence APPEND checks) and, unless it is cancelled, ended or expired
# in the queue, marks it running — atomically, so the api cannot end it as queued meanwhile. Whether
# an api follows it (`watched`) decides whether its first tokens are published live.
TAKE = Script(
    keys=("job record",),
    argv=("worker id", "deliveries", "may start (0/1)", "deadline passed (0/1)", "now"),
    returns="{status before, cancel flag, {started_at, first_token_at, seed, watched}}; nil if the record "
            "is gone",
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
return {{status, cancel, redis.call('HMGET', KEYS[1], '{F.STARTED_AT}', '{F.FIRST_TOKEN_AT}', '{F.SEED}',
                                   '{F.WATCHED}')}}
""",
)


APPEND_FIELDS = ("entry id", "events JSON", "first token (0/1)", "final (0/1)", "status", "result JSON",
                 "final index")  # per job, after the 5 common arguments

# Appends each job's new events (one entry, conveyor/wire/event_batch.py) if this worker still owns
# the job — one ownership check per job per call, and one call per step for all the jobs of a node
# (on a cluster, those of several slots through APPEND_NODE, below): XADD (the ID follows the
# batch's last index, so a duplicate is refused); milestones; on the final event the record (with the
# final event's index, what a replay after the window needs) and the TTLs: the record's `result_ttl`,
# the per-token events' `replay_window` (docs/operations/redis.md#memory-per-job). And it says
# which api processes follow each job (the record's `watched`, Relay.batches), for the worker's live path
# (conveyor/worker/coalesce.py); the live messages themselves go out after it in the same pipeline
# (conveyor/worker/publisher.py). Only a refused duplicate counts as "already there": any other XADD
# error (OOM under maxmemory) is the script's error, so the publisher retries the step instead of
# counting an event unwritten.
_APPEND_BODY = f"""
local jobs = nk / 2
if na ~= 5 + {len(APPEND_FIELDS)} * jobs then
  return redis.error_reply('APPEND: 2 keys and {len(APPEND_FIELDS)} arguments per job')
end
local out, followed = {{}}, {{}}
for j = 1, jobs do
  local record, events, a = K[2 * j - 1], K[2 * j], 5 + {len(APPEND_FIELDS)} * (j - 1)
  local owner = redis.call('HMGET', record, '{F.WORKER}', '{F.WATCHED}')
  local code = 0
  if owner[1] == ARGV[1] then
    code = 1
    local final = ARGV[a + 4] == '1'
    local added = redis.pcall('XADD', events, 'MAXLEN', '~', ARGV[2], ARGV[a + 1], 'e', ARGV[a + 2])
    if type(added) == 'table' and added.err then
      if not string.find(added.err, 'equal or smaller', 1, true) then return redis.error_reply(added.err) end
      if not final then code = 2 end
    end
    if code == 1 then
      if ARGV[a + 3] == '1' then redis.call('HSETNX', record, '{F.FIRST_TOKEN_AT}', ARGV[3]) end
      if final then
        redis.call('HSET', record, '{F.STATUS}', ARGV[a + 5], '{F.RESULT}', ARGV[a + 6],
                   '{F.FINISHED_AT}', ARGV[3], '{F.FINAL}', ARGV[a + 7])
        redis.call('EXPIRE', record, ARGV[4])
        redis.call('EXPIRE', events, ARGV[5])
      end
    end
  end
  out[j] = code
  followed[j] = owner[2] or ''
end
return {{out, followed}}
"""

APPEND = Script(
    keys=("each job's record, then its event stream, ...",),
    argv=("worker id", "maxlen", "now", "record ttl", "events ttl",
          f"per job: {', '.join(APPEND_FIELDS)}, ..."),
    returns="{per job: 0: not the owner (another worker took the job over), 1: written, "
            "2: was already there; per job: the api processes that follow it (`watched`, '' for none)}",
    source="local K, nk, na = KEYS, #KEYS, #ARGV" + _APPEND_BODY,
)

# APPEND for jobs of several hash slots served by one cluster node: a cluster's server refuses
# declared keys of two slots (CROSSSLOT), but lets a script flagged allow-cross-slot-keys touch keys
# of any slot it serves; so only the first job's record is declared (the call goes to its node) and
# the other keys follow APPEND's arguments. A key the node does not serve (its slot moved since the
# worker's map was read) fails the call where it is reached ("non local key"); what it wrote before is
# written again by the per-slot APPEND the publisher falls back to, as idempotently as a re-run
# pipeline.
APPEND_NODE = Script(
    keys=("the first job's record (the call goes to its node)",),
    argv=(*APPEND.argv[:-1], f"per job: {', '.join(APPEND_FIELDS)}; then the other keys (the first job's "
          "event stream, each other job's record and event stream); last, how many keys (KEYS[1] too) ..."),
    returns="as APPEND",
    source="""#!lua flags=allow-cross-slot-keys
local nk = tonumber(ARGV[#ARGV])
local na = #ARGV - nk
local K = {KEYS[1]}
for i = 2, nk do K[i] = ARGV[na + i - 1] end""" + _APPEND_BODY,
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
# first `free` streams (this worker's own stream, then the bands) are read at once, the rest (other
# workers' own streams, prefix-affinity placement) only for entries that waited `wait` ms there
# unread (Redis's clock: entry ids are its milliseconds). Also answers the last id of the shard's
# doorbell (Keys.placed), taken in the same step: a blocking XREAD from it wakes the worker for any
# job placed on an own stream after this read.
READ = Script(
    keys=("the shard's doorbell (Keys.placed)",
          "the streams of one shard (one hash tag), in the order to read them..."),
    argv=("group", "consumer", "count", "free", "wait ms"),
    returns="{{stream, entries} for each stream read from}, the ms until an unread entry of another "
            "worker's stream may be taken (-1: none waits), the doorbell's last id ('0-0': none yet)",
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
local free, wait, soonest, now = tonumber(ARGV[4]) + 1, tonumber(ARGV[5]), -1, nil
local bell = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
for i = 2, #KEYS do
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
return {out, soonest, bell[1] and bell[1][1] or '0-0'}
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


# One worker at a time sweeps the fleet's streams for abandoned jobs (conveyor/worker/lease.py): its
# holder renews its turn at each heartbeat, gives it up when it has no room or drains, and any worker
# takes it once it is free or expired (its holder died).
SWEEP = Script(
    keys=("the sweeper key (Keys.sweeper)",),
    argv=("worker id", "ttl ms", "wants to sweep (0/1)"),
    returns="1: this worker sweeps this round, 0: another does, or nobody",
    source="""
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder then redis.call('DEL', KEYS[1]) end
return 0
""",
)


def worker_scripts() -> dict[str, Script]:
    """The worker's scripts by name."""
    return {"take": TAKE, "append": APPEND, "append_node": APPEND_NODE, "keep": KEEP, "read": READ,
            "forget": FORGET, "sweep": SWEEP, "depth": DEPTH}


class Scripts:
    """The worker's scripts on one client: loaded once, called with EVALSHA inside a pipeline."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._sha: dict[str, str] = {}

    async def load(self) -> None:
        for name, script in worker_scripts().items():
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
