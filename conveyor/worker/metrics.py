"""The worker's Prometheus metrics, on its own port (`worker_metrics_port`).

A worker knows what the api cannot: each job's queue wait, inference time and token counts (TGI's
request histograms, observed when a job's final record is written — like TGI, on success), every
engine step's duration (`tgi_batch_inference_duration{method}`: a step that prefills anything is a
`prefill` step), and its batch and KV cache (read from the engine thread's stats at scrape time, so
a scrape costs the engine nothing). `conveyor_worker_info{model}` names the model it runs (one per
process), so a query can group any worker metric by model (`* on(instance) group_left(model)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from conveyor.engine.engine import StepInfo
from conveyor.jobqueue.redis_errors import error_code
from conveyor.telemetry.prom import new_registry
from conveyor.wire.heartbeat import EngineLoad
from conveyor.wire.job import JobResult, JobStatus

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STEP_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
TOKEN_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000, 8000, 16000, 32000)
FAILURE_ERR = {JobStatus.FAILED: "generation", JobStatus.CANCELLED: "cancelled", JobStatus.EXPIRED: "expired"}


class _Engine(Collector):
    """Gauges of the engine at scrape time."""

    def __init__(self, stats: Callable[[], EngineLoad], jobs: Callable[[], int], block_size: int) -> None:
        self.stats = stats
        self.jobs = jobs
        self.block_size = block_size

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        yield gauge("tgi_batch_current_size", "Sequences in the running batch", s.running)
        yield gauge("tgi_batch_current_max_tokens", "KV token slots the running batch holds "
                    "(blocks used x block size)", s.blocks_used * self.block_size)
        yield gauge("tgi_queue_size", "Jobs this worker took that wait in its engine for room", s.waiting)
        kv = GaugeMetricFamily("conveyor_kv_blocks", "KV cache blocks by state", labels=["state"])
        kv.add_metric(["used"], s.blocks_used)
        kv.add_metric(["free"], s.blocks_free)
        yield kv
        yield gauge("conveyor_prefix_cache_hit_rate", "Share of prompt blocks found in the prefix cache",
                    s.prefix_cache_hit_rate)
        tokens = CounterMetricFamily("conveyor_prefix_cache_tokens", "Prompt tokens looked up in the prefix "
                                     "cache (result: queried), and found there (hit)", labels=["result"])
        tokens.add_metric(["queried"], s.prefix_cache_queried_tokens)
        tokens.add_metric(["hit"], s.prefix_cache_hit_tokens)
        yield tokens
        yield gauge("conveyor_worker_jobs", "Jobs this worker owns (read, not yet acknowledged)", self.jobs())
        yield CounterMetricFamily("conveyor_preemptions", "Sequences preempted (KV dropped, recomputed "
                                  "later)", value=s.preemptions)
        yield CounterMetricFamily("conveyor_engine_steps", "Engine steps that ran a forward", value=s.steps)
        # vLLM's spec_decode counters: the acceptance rate is accepted / draft tokens.
        yield CounterMetricFamily("conveyor_spec_decode_num_drafts", "Draft proposals verified (speculative "
                                  "decoding)", value=s.spec_drafts)
        yield CounterMetricFamily("conveyor_spec_decode_num_draft_tokens", "Draft tokens verified",
                                  value=s.spec_draft_tokens)
        yield CounterMetricFamily("conveyor_spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                  value=s.spec_accepted_tokens)


class WorkerMetrics:
    def __init__(self, stats: Callable[[], EngineLoad], jobs: Callable[[], int], block_size: int,
                 model: str) -> None:
        r = self.registry = new_registry()
        # An info metric, not a label on every series: a worker runs one model for its whole life.
        info = Info("conveyor_worker", "The model this worker runs (its served name)", registry=r)
        info.info({"model": model})
        self.success = Counter("tgi_request_success", "Jobs that succeeded", registry=r)
        self.failure = Counter("tgi_request_failure", "Jobs that ended otherwise (err: generation = "
                               "failed, cancelled, expired)", ["err"], registry=r)
        self.duration = Histogram("tgi_request_duration", "Seconds from submission to the final record",
                                  buckets=SECONDS, registry=r)
        self.queue_duration = Histogram("tgi_request_queue_duration", "Seconds from submission until a "
                                        "worker started the job", buckets=SECONDS, registry=r)
        self.inference_duration = Histogram("tgi_request_inference_duration", "Seconds from start to the "
                                            "final record", buckets=SECONDS, registry=r)
        self.time_per_token = Histogram("tgi_request_mean_time_per_token_duration", "Inference seconds "
                                        "per generated token", buckets=TOKEN_SECONDS, registry=r)
        self.input_length = Histogram("tgi_request_input_length", "Prompt tokens per job", buckets=TOKENS,
                                      registry=r)
        self.generated_tokens = Histogram("tgi_request_generated_tokens", "Generated tokens per job",
                                          buckets=TOKENS, registry=r)
        self.ttft = Histogram("conveyor_time_to_first_token_seconds", "Seconds from submission to the "
                              "first token (every job that had one)", buckets=SECONDS, registry=r)
        self.batch_inference = Histogram("tgi_batch_inference_duration", "Seconds per engine step (method: "
                                         "prefill if it prefilled anything, else decode)", ["method"],
                                         buckets=STEP_SECONDS, registry=r)
        for method in ("prefill", "decode"):
            self.batch_inference.labels(method)
        self.finished = Counter("conveyor_jobs_finished", "Jobs this worker ended, by status", ["status"],
                                registry=r)
        self.reclaimed = Counter("conveyor_jobs_reclaimed", "Jobs taken over from workers that died or "
                                 "hung", registry=r)
        self.dead_lettered = Counter("conveyor_jobs_dead_lettered", "Jobs moved to the dead-letter stream",
                                     registry=r)
        self.webhooks = Counter("conveyor_webhooks_enqueued", "Webhooks handed to the webhook queue",
                                ["event"], registry=r)
        self.redis_errors = Counter("conveyor_redis_errors", "Transient Redis errors this worker waited "
                                    "out, by code (OOM, CLUSTERDOWN, READONLY, ConnectionError, ...): a "
                                    "rising count means Redis is degraded", ["code"], registry=r)
        self.placement = Counter("conveyor_jobs_placed", "Jobs read from the queue, by placement outcome "
                                 "(affinity_hit: from this worker's own stream, stolen: from another's, "
                                 "shared: from the shared bands)", ["outcome"], registry=r)
        for outcome in ("affinity_hit", "stolen", "shared"):
            self.placement.labels(outcome)
        r.register(_Engine(stats, jobs, block_size))

    def redis_error(self, exc: BaseException) -> None:
        self.redis_errors.labels(error_code(exc)).inc()

    def placed(self, outcome: str) -> None:
        self.placement.labels(outcome).inc()

    def step(self, info: StepInfo) -> None:
        """On the engine thread, after each forward."""
        self.batch_inference.labels(info.method).observe(info.seconds)

    def ended(self, result: JobResult) -> None:
        self.finished.labels(result.status.value).inc()
        t = result.timings
        if t is not None and t.ttft_s is not None:
            self.ttft.observe(t.ttft_s)
        if result.status is not JobStatus.SUCCEEDED:
            self.failure.labels(FAILURE_ERR[result.status]).inc()
            return
        self.success.inc()
        usage = result.usage
        if usage is not None:
            self.input_length.observe(usage.prompt_tokens)
            self.generated_tokens.observe(usage.completion_tokens)
        if t is None:
            return
        self.duration.observe(t.total_s)
        if t.queue_s is not None:
            self.queue_duration.observe(t.queue_s)
            inference = max(0.0, t.total_s - t.queue_s)
            self.inference_duration.observe(inference)
            if usage is not None and usage.completion_tokens > 0:
                self.time_per_token.observe(inference / usage.completion_tokens)
