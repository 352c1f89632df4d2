"""The api's Lua scripts on a job: admit it, place it, claim its Idempotency-Key, end it in the queue;
count the queue's jobs; and the two that read or annotate a job record outside the job path (the
console, the webhooks)."""

from __future__ import annotations

from conveyor.jobqueue.keys import FOLLOWED
from conveyor.jobqueue.scripts import Script
from conveyor.wire.job import JobStatus as S
from conveyor.wire.job import RecordField as F

# Counts a job against one admission cap (conveyor/api/jobpath/admission.py): the count and the add
# are one step, so the cap holds exactly under bursts and across api processes.
ADMIT = Script(
    keys=("the cap's set of admitted jobs",),
    argv=("job id", "created_at (its score)", "cap", "ttl"),
    returns="1: admitted (or was already), 0: the set is full",
    source="""
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
""",
)

# Queues a job on the own stream of the worker holding its prefix (conveyor/api/jobpath/placement.py),
# or on the shared stream if the own stream is gone (its worker left and the fleet deleted it, FORGET):
# both streams are in the shard's slot, so no job lands on a stream nobody reads.
ENQUEUE = Script(
    keys=("a worker's own stream", "the shared stream of the same shard",
          "the shard's doorbell (Keys.placed)"),
    argv=("field, value, ...",),
    returns="1: queued on the own stream (and the doorbell rung), 0: it is gone, queued on the shared one",
    source="""
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[2], '*', unpack(ARGV))
  return 0
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV))
redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'w', KEYS[1])
return 1
""",
)

# An Idempotency-Key whose job expired is claimed anew only if it still holds what was read.
RECLAIM = Script(
    keys=("the Idempotency-Key",),
    argv=("the claim read", "the new claim", "ttl"),
    returns="1: claimed, 0: it changed meanwhile",
    source="""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
""",
)

# A refused submit gives its Idempotency-Key back only if the key is still its own.
UNCLAIM = Script(
    keys=("the Idempotency-Key",),
    argv=("this submit's claim",),
    returns="1: given back, 0: not its own",
    source="""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
)


# queued → a terminal state, by the api, for a job no worker holds yet (cancelled, expired): the
# record (its final event's index 0), the final event, the TTLs (the record's, the events' shorter
# one: docs/operations/redis.md#memory-per-job). Atomic with the worker's TAKE: a worker that reads
# the job later finds it ended and only acknowledges it. It answers who follows the job, whom the
# api then sends the final event live (JobStore.end_queued; a follower that misses it reads it from
# the event stream at its next keep-alive).
END_QUEUED = Script(
    keys=("job record", "job event stream"),
    argv=("status", "result JSON", "now", "final event JSON", "record ttl", "maxlen",
          "final event's entry id", "events ttl"),
    returns="the record's `watched` ('' for none) if it ended the job; nil if the job was not queued",
    source=f"""
if redis.call('HGET', KEYS[1], '{F.STATUS}') ~= '{S.QUEUED}' then return false end
redis.call('HSET', KEYS[1], '{F.STATUS}', ARGV[1], '{F.RESULT}', ARGV[2], '{F.FINISHED_AT}', ARGV[3],
           '{F.FINAL}', 0)
redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], ARGV[7], 'e', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[8])
return redis.call('HGET', KEYS[1], '{F.WATCHED}') or ''
""",
)


# The jobs waiting and running in one shard (conveyor/jobqueue/depth.py): its streams read in one step,
# so a job moving from waiting to running is never counted twice or not at all.
DEPTH = Script(
    keys=("the streams of one shard: its bands, then its workers' own streams...",),
    argv=("group",),
    returns="{length, pending} of each stream in KEYS' order (0, 0 for a stream that is gone)",
    source="""
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local pending = 0
  local summary = redis.pcall('XPENDING', key, ARGV[1])  -- an error (no stream, no group yet): none
  if type(summary) == 'table' and not summary.err then pending = summary[1] end
  out[#out + 1] = redis.call('XLEN', key)
  out[#out + 1] = pending
end
return out
""",
)


# The console's overview of a job (conveyor/api/routes/console.py): the result's token count is read
# inside Redis, so no generated text crosses the wire.
JOB_STATS = Script(
    keys=("job record",),
    argv=(),
    returns="{status, finished_at, completion tokens}; status nil if the record is gone",
    source=f"""
local v = redis.call('HMGET', KEYS[1], '{F.STATUS}', '{F.FINISHED_AT}',
                     '{F.RESULT}')
local tokens = 0
if v[3] then
  local ok, r = pcall(cjson.decode, v[3])
  if ok and type(r) == 'table' and type(r.usage) == 'table' then
    tokens = tonumber(r.usage.completion_tokens) or 0
  end
end
return {{v[1] or false, v[2] or false, tokens}}
""",
)

# A field of a job record, written only while the record lives: a webhook's delivery state
# (conveyor/webhooks/delivery.py; one retried past result_ttl must not re-create it).
HSET_IF_EXISTS = Script(
    keys=("job record",),
    argv=("field", "value"),
    returns="nil",
    source="if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end",
)

# The relay's `watched` mark: the api process's id added to the record's (space-separated) set, only
# while the record lives (a follow of an unknown or expired job must not create a record without a
# TTL). It is announced on the control channel the first time, and again whenever the relay asks (it
# missed live events: `again` 1), so the job's worker publishes its tokens live to that api and
# writes what it holds to the event stream at its next step, where the relay reads what it did not
# see live (conveyor/worker/coalesce.py). A record marked at submit announces nothing: its worker
# reads the mark when it takes the job.
WATCH = Script(
    keys=("job record",),
    argv=("control channel", "api id", "job id", "again (0/1)"),
    returns="1 if announced, else 0",
    source=f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local watched = redis.call('HGET', KEYS[1], '{F.WATCHED}')
local new = not watched or not string.find(' ' .. watched .. ' ', ' ' .. ARGV[2] .. ' ', 1, true)
if new then
  redis.call('HSET', KEYS[1], '{F.WATCHED}', watched and (watched .. ' ' .. ARGV[2]) or ARGV[2])
elseif ARGV[4] ~= '1' then
  return 0
end
redis.call('PUBLISH', ARGV[1], '{FOLLOWED}' .. ARGV[3] .. ' ' .. ARGV[2])
return 1
""",
)
