"""The Batch API's Lua scripts (conveyor/api/batch/): a batch's status moves and line claims, each a
conditional step on the batch's hash, so api processes that cancel, advance or claim lines of one
batch never overwrite each other; and the lease that lets one api process advance a batch at a time."""

from __future__ import annotations

from conveyor.jobqueue.scripts import Script

# Moves the batch to a new status (and stamps `<status>_at`) only from one of the statuses given.
MOVE = Script(
    keys=("the batch",),
    argv=("new status", "now", "the statuses it may move from..."),
    returns="1: moved, 0: not from one of those statuses (or no batch)",
    source="""
local s = redis.call('HGET', KEYS[1], 'status')
if not s then return 0 end
for i = 3, #ARGV do
  if s == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
    return 1
  end
end
return 0
""",
)

# Claims the batch's next line into its window of lines queued or running at once.
CLAIM_LINE = Script(
    keys=("the batch", "its window"),
    argv=("window size",),
    returns="the line's index; -1: every line is claimed; -2: the window is full",
    source="""
local n = tonumber(redis.call('HGET', KEYS[1], 'next_line') or '0')
if n >= tonumber(redis.call('HGET', KEYS[1], 'total') or '0') then return -1 end
if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[1]) then return -2 end
redis.call('HSET', KEYS[1], 'next_line', n + 1)
redis.call('HSET', KEYS[2], n, 1)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end  -- the window lives no longer than its batch
return n
""",
)

# Takes the batch's lease, or renews it for its owner.
LEASE = Script(
    keys=("the lease",),
    argv=("owner", "ms"),
    returns="1: held by this owner now (taken or renewed), 0: another owner's",
    source="""
local v = redis.call('GET', KEYS[1])
if v == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
""",
)

# Hands the lease back, if it is still this owner's.
RELEASE = Script(
    keys=("the lease",),
    argv=("owner",),
    returns="1: released, 0: not this owner's",
    source="""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
)
