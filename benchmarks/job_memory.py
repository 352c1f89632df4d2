"""What a finished job keeps in Redis, and how many jobs/s a given maxmemory sustains.

    python -m benchmarks.job_memory                          # 8 and 256 tokens, maxmemory 1536mb
    python -m benchmarks.job_memory --tokens 8,64 --prompt-tokens 200 --maxmemory-mb 4096
    python -m benchmarks.job_memory --redis-url redis://host:6379/0   # an existing Redis
    python -m benchmarks.job_memory --per-entry 2            # tokens coalesced two to an entry

Each job goes through the real code on a fresh valkey-server: the api's submit (JobStore.submit:
record + queue entry), the worker's TAKE and its Publisher (the APPEND script, one pipeline per
step, the final record and the TTLs), the entry acknowledged. The tokens are fixed (" w000",
" w001", ..., greedy logprobs), so the bytes do not drift between runs: what varies is only what
the code writes. `MEMORY USAGE key SAMPLES 0` of the job's record and event stream, once the job
has ended (during the replay window) and once the per-token events have expired (after it), and
the record's `OBJECT ENCODING` (listpack or hashtable: a value over hash-max-listpack-value, 64
bytes, makes a hash a hashtable, hundreds of bytes more).

The capacity column: in a steady state a finished job holds its record for `result_ttl` and its
events for their TTL (the replay window, as read back), so a node at maxmemory M sustains
M / (record * result_ttl + events * window) finished jobs/s (queued and running jobs, and the
server's own memory, come on top: an upper bound).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from conveyor.api.jobpath.store import JobStore, new_job_id
from conveyor.jobqueue.keys import Keys
from conveyor.jobqueue.queue import ensure_group
from conveyor.jobqueue.scripts.worker import Scripts
from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.settings import Settings
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobSpec, JobStatus, StoppingSpec, Usage
from conveyor.worker.owned import InFlight
from conveyor.worker.publisher import Publisher

WORKER = "bench-worker-0"


@dataclass(frozen=True, slots=True)
class Retained:
    tokens: int
    text_bytes: int
    record: int  # MEMORY USAGE of the job record once the job ended
    encoding: str  # the record's OBJECT ENCODING
    events: int  # ... of its event stream, while it lives
    events_ttl_s: int  # the event stream's TTL once the job ended: the replay window


def token_text(i: int) -> str:
    return f" w{i:03d}"


async def one_job(redis: Redis, store: JobStore, publisher: Publisher, scripts: Scripts, tokens: int,
                  prompt_tokens: int, per_entry: int = 1) -> Retained:
    """Submits one chat job through the api's path and finishes it through the worker's."""
    keys = store.keys
    spec = JobSpec(id=new_job_id(), created_at=time.time(), kind="chat",
                   prompt_ids=[1000 + i for i in range(prompt_tokens)],
                   stopping=StoppingSpec(max_new_tokens=tokens))
    await store.submit(spec)
    now = time.time()
    await scripts.execute(
        lambda pipe: scripts.call(pipe, "take", [keys.job(spec.id)], [WORKER, 1, 1, 0, now]))
    job = InFlight(job_id=spec.id, entry_id="", created_at=spec.created_at, started_at=now, spec=spec)
    text = "".join(token_text(i) for i in range(tokens))
    events = [JobEvent(index=i, token=EventToken(id=2000 + i, text=token_text(i), logprob=-0.5))
              for i in range(tokens)]
    events[-1].final = True
    events[-1].result = JobResult.final(JobStatus.SUCCEEDED, reason="length", generated_text=text,
                                        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=tokens))
    for first in range(0, tokens, per_entry):  # a publish's events of one job are one entry
        published = await publisher.publish([(job, event) for event in events[first:first + per_entry]])
        if published.lost:
            raise RuntimeError("the benchmark's worker lost its job")
    record, events = keys.job(spec.id), keys.events(spec.id)
    return Retained(tokens, len(text.encode()), await redis.memory_usage(record, samples=0) or 0,
                    await redis.object("encoding", record), await redis.memory_usage(events, samples=0) or 0,
                    await redis.ttl(events))


async def measure(url: str, token_counts: list[int], prompt_tokens: int, listpack_value: int | None = None,
                  repeat: int = 1, per_entry: int = 1) -> tuple[Settings, list[Retained]]:
    settings = Settings(redis_url=url)
    redis = Redis.from_url(url, decode_responses=True)
    if listpack_value is not None:
        await redis.config_set("hash-max-listpack-value", listpack_value)
    keys = Keys(settings.key_prefix, settings.jobs_shards)
    store = JobStore(redis, keys, settings)
    await ensure_group(redis, keys)
    scripts = Scripts(redis)
    publisher = Publisher(redis, keys, WORKER, scripts, settings.result_ttl, settings.event_stream_maxlen,
                          events_ttl=settings.events_ttl)
    try:
        return settings, [await one_job(redis, store, publisher, scripts, n, prompt_tokens, per_entry)
                          for n in token_counts for _ in range(repeat)]
    finally:
        await redis.aclose()


def print_table(settings: Settings, rows: list[Retained], maxmemory_mb: int) -> None:
    budget = maxmemory_mb * 2**20
    print(f"result_ttl {settings.result_ttl} s, maxmemory {maxmemory_mb} MiB; bytes: MEMORY USAGE SAMPLES 0")
    print("| tokens | text B | record B | encoding | events B (TTL s) | during window B | after window B "
          "| after, beyond text B | jobs/s at maxmemory |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tokens in dict.fromkeys(r.tokens for r in rows):
        same = [r for r in rows if r.tokens == tokens]
        records, events = sorted(r.record for r in same), sorted(r.events for r in same)
        record, ev, r = records[len(same) // 2], events[len(same) // 2], same[0]  # medians
        spread = f" ({records[0]}-{records[-1]})" if records[0] != records[-1] else ""
        rate = budget / (record * settings.result_ttl + ev * r.events_ttl_s)
        print(f"| {tokens} | {r.text_bytes} | {record}{spread} | {r.encoding} | {ev} ({r.events_ttl_s}) | "
              f"{record + ev} | {record} | {record - r.text_bytes} | {rate:.0f} |")
    print("(median of the jobs of each size; in brackets the records' range: timestamps vary in length)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="8,256", help="generated tokens per job, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--maxmemory-mb", type=int, default=1536,
                        help="the node's maxmemory for the jobs/s column (the shipped chart: 1536mb)")
    parser.add_argument("--redis-url", default=None,
                        help="an existing Redis (default: a fresh valkey-server)")
    parser.add_argument("--repeat", type=int, default=20, help="jobs of each size (medians reported)")
    parser.add_argument("--hash-max-listpack-value", type=int, default=None,
                        help="CONFIG SET it first (default: the server's own, 64 unless configured)")
    parser.add_argument("--per-entry", type=int, default=1,
                        help="tokens per event stream entry (a GPU worker's steps coalesced by "
                             "stream_interval_ms: about 2 at 15 ms steps; default 1, the most entries)")
    args = parser.parse_args()
    counts = [int(n) for n in args.tokens.split(",")]
    listpack = args.hash_max_listpack_value
    if args.redis_url:
        settings, rows = asyncio.run(measure(args.redis_url, counts, args.prompt_tokens, listpack,
                                             args.repeat, args.per_entry))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            server = EmbeddedRedis(Path(tmp)).start()
            try:
                settings, rows = asyncio.run(measure(server.url, counts, args.prompt_tokens, listpack,
                                                     args.repeat, args.per_entry))
            finally:
                server.stop()
    print_table(settings, rows, args.maxmemory_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
