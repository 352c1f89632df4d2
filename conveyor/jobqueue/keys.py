"""The Redis layout, in one place (docs/design.md §3).

Every key shares a prefix. The keys of one job carry the hash tag `{job_id}` so the multi-key
operations of a job stay in one slot and the layout runs on Redis Cluster unchanged. The queue is
`jobs_shards` × priority bands (conveyor/jobqueue/bands.py), one stream each; the bands of one shard share
the shard's hash tag (`shard_tag`), so a worker reads a shard's bands in one command or script.

Each model of the deployment has its own queue (docs/operations/multi-model.md): the default model's
keeps the names it always had (`PREFIX:jobs:{TAG}:...`), another model's lives under
`PREFIX:model:NAME:jobs:{TAG}:...` (`Keys.for_model`), with the same hash tags, so a shard's
streams of every model share one slot. Job, worker and tenant keys are the same for every model.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import zlib
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from conveyor.jobqueue.bands import BANDS, Band, band_of

WORKER_GROUP = "workers"
DEAD_LETTER_MAXLEN = 10_000  # the dead-letter stream keeps about this many newest entries
# The control channel's messages: a bare job id asks its worker to cancel it; FOLLOWED + "ID API"
# tells it the api process API follows the job now, or missed some of its live events (its tokens then
# go out live to that api, and what the worker holds is written: conveyor/worker/coalesce.py).
FOLLOWED = "followed:"
# The `watched` mark of an api from before per-process live channels: it listens on the job's own
# channel (Keys.channel), where workers publish for it until every api is upgraded.
OLD_API = "1"


def event_entry_id(index: int) -> str:
    """Entry ID of event `index` in a job's event stream: `0-(index+1)`.

    IDs that follow the index make the stream reject a second event with the same index (XADD
    needs a growing ID), so a retried pipeline or a resumed job can never write a duplicate.
    """
    return f"0-{index + 1}"


@functools.cache
def shard_tag(shard: int, shards: int) -> str:
    """The hash tag of a shard of the queue: `jobs-S`, or `jobs-S-K` with the smallest K whose slot lies
    in the middle quarter of the S-th of `shards` equal ranges of the cluster's slots. Primaries that
    split the slots evenly (redis-cli --cluster create, managed services) then hold shards/primaries
    shards each, and fewer shards than primaries land on distinct ones; hashing `jobs-S` alone put 6
    shards 3/2/1 on 3 nodes. It depends on `shards` only, so every process agrees whatever the
    cluster's slot map is now; conveyor/jobqueue/spread.py checks the map at start. With one shard
    the tag is `jobs-0`, the name it had before there was a choice."""
    if shards == 1:
        return "jobs-0"
    width = REDIS_CLUSTER_HASH_SLOTS / shards
    low, high = (shard + 0.375) * width, (shard + 0.625) * width
    for k in itertools.count():
        tag = f"jobs-{shard}" if k == 0 else f"jobs-{shard}-{k}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    raise AssertionError("unreachable: itertools.count() never ends")


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "conveyor"
    jobs_shards: int = 1  # the queue's shards (settings.jobs_shards); every process must agree
    model: str | None = None  # whose queue: None for the default model (conveyor/jobqueue/models.py)

    def for_model(self, model: str | None) -> Keys:
        """The same layout with the queue of `model` (None: the default model's)."""
        return self if model == self.model else dataclasses.replace(self, model=model)

    @property
    def queue_root(self) -> str:
        """What every key of this model's queue starts with, before the shard's hash tag."""
        if self.model is None:
            return f"{self.prefix}:jobs:"
        return f"{self.prefix}:model:{self.model}:jobs:"

    def jobs_stream(self, shard: int, band: Band) -> str:
        """Stream of the queued jobs of one shard and priority band; consumer group WORKER_GROUP.
        The bands of a shard share its hash tag (`shard_tag`), so one XREADGROUP (or script) reads a
        shard's bands on Redis Cluster. No TTL: a worker deletes an entry when it acknowledges it,
        so the stream holds only queued and running jobs."""
        return f"{self.shard_prefix(shard)}:{band.value}"

    def shard_prefix(self, shard: int) -> str:
        """What every key of one shard of the queue starts with: `PREFIX:jobs:{TAG}` (another model's:
        `PREFIX:model:NAME:jobs:{TAG}`)."""
        return f"{self.queue_root}{{{shard_tag(shard, self.jobs_shards)}}}"

    def shard_streams(self, shard: int, bands: tuple[Band, ...] = BANDS) -> tuple[str, ...]:
        """A shard's streams, in the order of `bands` (highest first unless told)."""
        return tuple(self.jobs_stream(shard, band) for band in bands)

    @property
    def queue_places(self) -> tuple[tuple[int, Band, str], ...]:
        """(shard, band, stream) of every stream of the queue, shard by shard, highest band first."""
        return tuple((shard, band, self.jobs_stream(shard, band))
                     for shard in range(self.jobs_shards) for band in BANDS)

    @property
    def jobs_streams(self) -> tuple[str, ...]:
        """Every stream of the queue (jobs_shards × bands)."""
        return tuple(stream for _shard, _band, stream in self.queue_places)

    def shard_of(self, job_id: str) -> int:
        """The job's shard: a stable hash of its id (CRC-32), so every api process agrees."""
        return zlib.crc32(job_id.encode()) % self.jobs_shards

    def stream_of(self, job_id: str, priority: int, bands: bool = True) -> str:
        """The stream a job is queued on: its shard's stream of its priority's band."""
        return self.jobs_stream(self.shard_of(job_id), band_of(priority, bands))

    def own_stream(self, shard: int, worker_id: str) -> str:
        """A worker's own stream in a shard (prefix-affinity placement, conveyor/jobqueue/placement.py):
        jobs the
        api placed on it because it holds their prefix; read first by it, by others only once an entry
        waited affinity_wait_ms. Same hash tag as the shard's bands. No TTL: a worker's streams are
        deleted by the fleet once it is gone and they are empty (conveyor/worker/placement.py)."""
        return f"{self.shard_prefix(shard)}:w:{worker_id}"

    def owners(self, shard: int) -> str:
        """Set: the workers with an own stream in the shard. No TTL: bounded by the fleet (a gone
        worker leaves it with its empty streams)."""
        return f"{self.shard_prefix(shard)}:owners"

    def placed(self, shard: int) -> str:
        """Stream: the doorbell of the shard's own streams. The api's ENQUEUE adds an entry whenever it
        places a job on a worker's own stream, so an idle worker blocks on this one key (XREAD) instead
        of polling every owner's stream (conveyor/worker/queue_reader.py). No TTL: one entry at most
        (MAXLEN 1), shard's hash tag."""
        return f"{self.shard_prefix(shard)}:placed"

    @property
    def sweeper(self) -> str:
        """String: the worker that sweeps the fleet's streams for abandoned jobs (conveyor/worker/lease.py),
        one at a time; PX of two heartbeats, renewed by its holder at each of its heartbeats. One per
        model: a model's abandoned jobs are resumed by a worker of that model."""
        if self.model is None:
            return f"{self.prefix}:sweeper"
        return f"{self.prefix}:model:{self.model}:sweeper"

    def prefixes(self, worker_id: str) -> str:
        """String: a worker's prefix-cache summary (conveyor/jobqueue/placement.py); TTL job_lease_ms,
        rewritten
        with each heartbeat."""
        return f"{self.prefix}:prefixes:{worker_id}"

    def untimed(self, key: str) -> bool:
        """A key documented to have no TTL: the fleet keys, the workers' own streams, the owners and the
        doorbell of the own streams, and any key of another model's queue (the same kinds of keys)."""
        own = key.startswith(f"{self.prefix}:jobs:{{jobs-") and (
            ":w:" in key or key.endswith((":owners", ":placed")))
        other_model = re.match(rf"{re.escape(self.prefix)}:model:[^{{}}]+:jobs:{{jobs-", key) is not None
        return key in self.fleet_keys or own or other_model

    @property
    def dead_letter_stream(self) -> str:
        """Jobs given up on (delivered more than max_attempts times, or unreadable). No TTL;
        capped at about DEAD_LETTER_MAXLEN entries."""
        return f"{self.prefix}:jobs:dead"

    @property
    def fleet_keys(self) -> tuple[str, ...]:
        """The keys without a TTL: shared by every job, bounded in size."""
        return (*self.jobs_streams, self.dead_letter_stream)

    @property
    def control_channel(self) -> str:
        """Pub/sub channel for cancel requests and follow notices (FOLLOWED), read by every worker."""
        return f"{self.prefix}:control"

    @property
    def webhook_queue(self) -> str:
        """Name of the RQ queue of webhook deliveries (RQ keeps its own keys: `rq:queue:NAME`, ...)."""
        return f"{self.prefix}-webhooks"

    def job(self, job_id: str) -> str:
        """Hash: the job record (status, timestamps, request, result)."""
        return f"{self.prefix}:job:{{{job_id}}}"

    def events(self, job_id: str) -> str:
        """Stream of the job's token events (capped), for replay and resume."""
        return f"{self.prefix}:job:{{{job_id}}}:events"

    def channel(self, job_id: str) -> str:
        """Pub/sub channel of one job's live events, for an api from before per-process channels."""
        return f"{self.prefix}:job:{{{job_id}}}:live"

    def live(self, api_id: str) -> str:
        """Pub/sub channel of one api process: the live events of every job it follows, one message
        per worker step (conveyor/wire/event_batch.py dump_live)."""
        return f"{self.prefix}:api:{{{api_id}}}:live"

    def worker(self, worker_id: str) -> str:
        """Heartbeat of a worker: its WorkerInfo as JSON, with a TTL of job_lease_ms."""
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def workers_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

    @property
    def worker_beats(self) -> str:
        """Sorted set: worker id → the time of its last heartbeat, so that readiness counts the live
        workers in O(1) (ZCOUNT over the last lease) instead of a SCAN of the keyspace."""
        return f"{self.prefix}:worker-beats"

    def api_probe(self, api_id: str) -> str:
        """String with a short TTL: an api process's readiness write (Redis accepts writes)."""
        return f"{self.prefix}:api:{api_id}:probe"

    def idempotency(self, tenant: str, key: str) -> str:
        """String: `job_id fingerprint` for a tenant's Idempotency-Key (SET NX EX idempotency_ttl)."""
        return f"{self.prefix}:idem:{tenant}:{key}"

    def tenant_jobs(self, tenant: str) -> str:
        """Sorted set: the tenant's jobs by creation time, for listing; TTL refreshed on each submit."""
        return f"{self.prefix}:tenant:{tenant}:jobs"

    @property
    def tenant_jobs_pattern(self) -> str:
        """Every tenant's job index (tenant names hold no ':'), for the console's fleet counts."""
        return f"{self.prefix}:tenant:*:jobs"

    def tenant_active(self, tenant: str) -> str:
        """Sorted set: the tenant's jobs not yet seen terminal, by creation time (per-tenant cap)."""
        return f"{self.prefix}:tenant:{tenant}:active"

    def model_active(self, model: str | None) -> str:
        """Sorted set: a model's jobs not yet seen terminal, by creation time (per-model cap); `model`
        as in `for_model` (None: the default model's)."""
        return f"{self.prefix}:model-active" + (f":{model}" if model is not None else "")

    @property
    def admitted(self) -> str:
        """Sorted set: the jobs admitted under max_concurrent_requests not yet seen terminal, by
        creation time; TTL refreshed on each admit (conveyor/api/jobpath/admission.py)."""
        return f"{self.prefix}:admitted"

    # --- OpenAI's Batch API (conveyor/api/batch/file_store.py, conveyor/api/batch/runner.py); TTL
    # batch_file_ttl -------
    def file(self, file_id: str) -> str:
        """Hash: a file's metadata (FileObject fields, tenant)."""
        return f"{self.prefix}:file:{{{file_id}}}"

    def file_lines(self, file_id: str) -> str:
        """List: a file's lines (JSONL), appended to while a batch writes its output."""
        return f"{self.prefix}:file:{{{file_id}}}:lines"

    def file_invalid(self, file_id: str) -> str:
        """Hash: line index → the error found at upload (BatchLineError JSON)."""
        return f"{self.prefix}:file:{{{file_id}}}:invalid"

    def tenant_files(self, tenant: str) -> str:
        """Sorted set: the tenant's files by creation time, for listing."""
        return f"{self.prefix}:tenant:{tenant}:files"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's state (status, timestamps, counts, cursor)."""
        return f"{self.prefix}:batch:{{{batch_id}}}"

    def batch_window(self, batch_id: str) -> str:
        """Hash: line index → 1 for the batch's lines expanded into jobs and not yet collected."""
        return f"{self.prefix}:batch:{{{batch_id}}}:window"

    def batch_lease(self, batch_id: str) -> str:
        """String: the api process advancing the batch now (SET NX PX), so processes do not race."""
        return f"{self.prefix}:batch:{{{batch_id}}}:lease"

    def tenant_batches(self, tenant: str) -> str:
        """Sorted set: the tenant's batches by creation time, for listing."""
        return f"{self.prefix}:tenant:{tenant}:batches"

    @property
    def batches_active(self) -> str:
        """Set: batches not yet ended, which the api processes advance. No TTL: a batch leaves it when
        it ends."""
        return f"{self.prefix}:batches:active"
