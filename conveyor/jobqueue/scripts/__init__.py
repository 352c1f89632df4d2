"""Every Lua script of Conveyor, each with the legend of what it is called with.

- `worker.py`: a worker's step — take a job, append its events, keep or release its lease, read the
  streams of a shard, forget a gone worker's stream.
- `jobs.py`: the api's side of a job — admission, placement on a worker's own stream, the
  Idempotency-Key, ending a queued job, counting the queue's jobs; the console's reading of a
  record; a webhook's note on it.
- `batches.py`: the Batch API's state moves, line claims and per-batch lease.

Each script touches the keys of one hash slot (the keys it declares, and a job's channel, which
carries the job's hash tag), so the layout runs on Redis Cluster (tests/worker/test_slots.py); one
does not, on purpose: `worker.APPEND_NODE` writes a cluster node's jobs of several slots in one call.
A script called on its own is registered with `redis.register_script(script.source)` (redis-py sends
EVALSHA and loads it on NOSCRIPT). Inside a pipeline redis-py's cluster pipeline refuses its script
helpers, so a script is sent as an EVALSHA command after a SCRIPT LOAD (`worker.Scripts`, which loads
again on NOSCRIPT; the console's overview), or whole with EVAL where the pipeline is the api's submit
(ENQUEUE: nothing there reloads a lost script) or a scrape's (DEPTH).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its legend: KEYS and ARGV in order (a last entry ending in `...` stands for
    all the rest), and what it returns."""

    keys: tuple[str, ...]
    argv: tuple[str, ...]
    returns: str
    source: str
