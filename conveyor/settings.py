"""One typed settings object per process, read from flags and environment variables.

Every field can be set as `--flag-name` on the `conveyor` CLI or as `CONVEYOR_FIELD_NAME` in the
environment (REDIS_URL is also read without the prefix). Limits carry TGI's launcher names.
`conveyor serve` hands its settings to its children through the environment, so the api, the
workers and the webhook worker of one service always agree.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CONVEYOR_"


def _default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "conveyor"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", validate_default=True)

    # --- where things are -------------------------------------------------------------------
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL", "CONVEYOR_REDIS_URL", "redis_url"),
        description="Redis to use; unset: `conveyor serve` starts the embedded server.",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Embedded Redis data (AOF) lives under DATA_DIR/redis.",
    )
    key_prefix: str = Field(default="conveyor", description="Prefix of every Redis key.")
    redis_max_connections: int | None = Field(
        default=None, ge=1,
        description="Connections in the api's Redis pool (per api process); unset: max(32, 2 × "
        "max_concurrent_requests). A request holds one only for each command, so a burst waits for one "
        "(redis_pool_timeout) instead of failing.",
    )
    redis_pool_timeout: float = Field(
        default=5.0, gt=0,
        description="Seconds an api request waits for a free connection of the pool before it answers "
        "503 with Retry-After.",
    )
    redis_cluster: bool | None = Field(
        default=None,
        description="REDIS_URL is a Redis Cluster (its startup nodes: redis://h1:p1,h2:p2,...); unset: "
        "detected (several hosts in the URL, or `INFO cluster` of the first).",
    )
    submit_replicas: int = Field(
        default=0, ge=0, le=16,
        description="Replicas that must have a job before its submit is answered (Redis WAIT after the "
        "job's write), so that a failover to one of them keeps every job a client was told of; 0: "
        "answered once the primary has it. One primary with replicas (not Redis Cluster).",
    )
    submit_replicas_timeout_ms: int = Field(
        default=1000, ge=1, le=60_000,
        description="How long a submit waits for submit_replicas; past it the submit answers 503: the "
        "job is queued on the primary and may run, so retry with the same Idempotency-Key.",
    )
    webhook_redis_url: str | None = Field(
        default=None,
        description="A plain Redis for RQ's webhook queue; unset: REDIS_URL. Needed on a Redis Cluster, "
        "where RQ does not run (without it webhooks are off there).",
    )
    model: str | None = Field(
        default=None,
        description="Local HF model directory (Llama family) or .gguf path; unset: SmolLM2-135M-Instruct.",
    )
    served_model_name: str | None = Field(
        default=None, description="Model name reported by /info and /v1/models (default: from the model)."
    )
    models: str | None = Field(
        default=None,
        description="More models than `model`, as NAME=PATH pairs, comma-separated (PATH: a model "
        "directory or .gguf, as for `model`); requests pick one by `model`, each runs on workers started "
        "with --worker-model NAME. Unset: one model, and requests' `model` is ignored (as TGI does).",
    )
    model_aliases: str | None = Field(
        default=None,
        description="Other names requests may give in `model`, as ALIAS=NAME pairs, comma-separated "
        "(NAME: the default model's served name or a NAME of `models`).",
    )
    worker_model: str | None = Field(
        default=None,
        description="The model a worker runs: a NAME of `models`; unset: the default model (`model`). "
        "`conveyor serve` sets it for the workers it starts for each of `models`.",
    )
    model_cache_dir: Path | None = Field(
        default=None, description="Where GGUF models are converted once (default ~/.cache/conveyor/models)."
    )
    host: str = Field(default="127.0.0.1", description="Address the api (and metrics endpoints) bind to.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port the api listens on.")
    workers: int = Field(default=1, ge=0, le=64,
                         description="Engine workers `conveyor serve` starts for each model (see `models`).")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["human", "json"] = Field(
        default="human",
        description="human: one readable line per event for a terminal; json: one JSON object per line "
        "(time, level, logger, message, role, worker_id, job_id, tenant) for a log pipeline.",
    )

    generate_prompt_format: Literal["auto", "raw"] = Field(
        default="auto",
        description="auto: TGI `inputs` without special tokens are sent as one user message through the "
        "model's chat template (an instruct model then answers); raw: as given, like TGI.",
    )

    # --- access -----------------------------------------------------------------------------
    api_keys: str | None = Field(
        default=None,
        description="API keys as KEY=TENANT pairs, comma-separated (a bare KEY is tenant 'default'). "
        "Prefer the environment or api_keys_file: flags show in `ps`.",
    )
    api_keys_file: Path | None = Field(
        default=None, description="JSON file {\"KEY\": \"TENANT\", ...}; read at start-up, with api_keys."
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve without API keys on a non-loopback host (without keys the api refuses to).",
    )
    admin_tenants: str | None = Field(
        default=None,
        description="Tenants whose API keys may use the operator endpoints (`/v1/admin/*`: dead letters) "
        "and the console's operator pages, comma-separated; with no API keys configured everyone may.",
    )

    # --- request limits (TGI names) ---------------------------------------------------------
    max_concurrent_requests: int = Field(
        default=128, ge=1, description="Jobs queued or running at once before 429 'Model is overloaded'."
    )
    max_concurrent_requests_per_tenant: int | None = Field(
        default=None, ge=1, description="Jobs one tenant may have queued or running; unset: no own cap."
    )
    max_concurrent_requests_per_model: int | None = Field(
        default=None, ge=1, description="Jobs each model (of `models`, and the default one) may have queued "
        "or running; unset: no own cap, the models share max_concurrent_requests.",
    )
    payload_limit: int = Field(
        default=2_000_000, ge=1024, description="Largest request body in bytes; larger: 413."
    )
    max_input_tokens: int = Field(default=4095, ge=1, description="Prompt tokens per request.")
    max_total_tokens: int = Field(
        default=4096, ge=2, description="Prompt + max_new_tokens per request."
    )
    max_best_of: int = Field(
        default=4, ge=1,
        description="Sequences per request: OpenAI n and best_of, TGI best_of (TGI's default is 2).",
    )
    max_stop_sequences: int = Field(default=4, ge=0, description="Stop sequences per request.")
    max_top_n_tokens: int = Field(
        default=20, ge=0,
        description="Alternatives per token (top_n_tokens, top_logprobs); TGI's default is 5."
    )
    max_grammar_bytes: int = Field(
        default=65536, ge=0,
        description="Size of a request's grammar (JSON schema, regex, tools' schemas) in bytes; 0: none."
    )
    default_max_new_tokens: int = Field(
        default=100, ge=1,
        description="max_new_tokens when a TGI request does not give one (an OpenAI chat without "
        "max_tokens may use the rest of max_total_tokens, as OpenAI and vLLM).",
    )
    json_undeclared_keys: Literal["forbid", "allow"] = Field(
        default="forbid",
        description="An object schema (response_format, tools, TGI grammar) that declares properties and "
        "says nothing of additionalProperties: forbid: only its declared keys (OpenAI strict, vLLM); "
        "allow: any extra key too (JSON Schema's reading).",
    )

    # --- batching (TGI names) ---------------------------------------------------------------
    max_batch_prefill_tokens: int = Field(
        default=2048, ge=1, description="Prompt tokens one engine step may prefill (chunked prefill)."
    )
    max_batch_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Sum of context lengths in the batch; unset: bounded by the KV cache.",
    )
    max_batch_size: int = Field(default=256, ge=1, description="Running sequences per worker.")
    admission_order: Literal["shortest", "arrival"] = Field(
        default="shortest",
        description="Order of waiting requests of one priority: shortest prefill first (a request is "
        "passed only until its own length of prefill has been served), or arrival.",
    )
    # TGI decides with these when to pause decoding to prefill waiting requests. Conveyor's
    # scheduler admits waiting requests in every step as prefill chunks beside the decodes, so
    # waiting requests never wait for a batch to drain; the values are validated and shown in
    # /info, and a non-default value is reported as having no effect at start-up.
    max_waiting_tokens: int = Field(default=20, ge=1, description="TGI compatibility; no effect.")
    waiting_served_ratio: float = Field(default=1.2, ge=0, description="TGI compatibility; no effect.")

    # --- engine -----------------------------------------------------------------------------
    block_size: int = Field(default=16, ge=1, le=1024, description="Tokens per KV block.")
    kv_cache_memory: str | None = Field(
        default=None, description="KV cache budget, e.g. '2GiB'; unset: from kv_cache_fraction."
    )
    kv_cache_fraction: float | None = Field(
        default=None, gt=0, le=0.95,
        description="On CUDA vLLM's gpu_memory_utilization: the share of the GPU's total memory the "
        "worker may fill (weights and whatever else is in use counted), the KV cache the rest of that "
        "share; on CPU the share of available RAM for the KV cache. Unset: 0.9 on CUDA and in the "
        "simulated engine, 0.3 on CPU.",
    )
    kv_cache_dtype: Literal["auto", "bfloat16"] = Field(
        default="auto",
        description="KV cache element type (TGI's name). auto: the model's dtype (float32 on CPU); "
        "bfloat16: half the memory per token, faster decode attention, no longer bit-equal to HF fp32.",
    )
    enable_prefix_caching: bool = True
    device: str = Field(default="auto", description="auto, cpu or cuda.")
    attention: Literal["auto", "flash-attn", "triton", "torch"] = Field(
        default="auto",
        description="Attention kernels. auto: on CUDA flash-attn if installed, else Triton's; on CPU "
        "the C++ kernels (torch where they cannot be built); torch: plain torch on any device.",
    )
    gemm_dtype: Literal["auto", "bfloat16"] = Field(
        default="auto",
        description="The layers' GEMMs. auto: the model's dtype; bfloat16 (float32 model on a CPU with "
        "AVX512_BF16 or AMX): ~1.6x faster GEMMs, no longer bit-equal to HF fp32.",
    )
    cuda_graphs: str | None = Field(
        default=None,
        pattern=r"^\d+(,\d+)*$",
        description="Decode batch sizes captured as CUDA graphs, e.g. '1,2,4,8' (TGI's name); '0': "
        "none; unset: 1, 2, 4, 8, then every 16 up to max_batch_size.",
    )
    speculate: int = Field(
        default=0, ge=0, le=16,
        description="Draft tokens per decode by prompt lookup (speculative decoding, TGI's name); 0: off. "
        "Greedy requests without penalties or grammar; output unchanged.",
    )
    prompt_lookup_min: int = Field(default=1, ge=1, description="Shortest n-gram the lookup matches (vLLM).")
    prompt_lookup_max: int = Field(default=3, ge=1, description="Longest n-gram the lookup matches (vLLM).")

    # --- the simulated engine (docs/operations/simulated-engine.md) -------------------------
    engine: Literal["model", "sim"] = Field(
        default="model",
        description="model: run the model. sim: a simulated engine for capacity planning and tests: the "
        "real scheduler, KV accounting and detokenizer, no weights, a step that takes the time the sim_* "
        "figures model, tokens drawn deterministically from the tokenizer's vocabulary.",
    )
    sim_step_fixed_ms: float = Field(
        default=1.5, ge=0, description="sim: fixed time of every step (launches, sampling, host), ms.")
    sim_weight_gb: float = Field(
        default=16.06, ge=0, description="sim: weights read per step, GB (8B parameters in bfloat16).")
    sim_kv_bytes_per_token: int = Field(
        default=131072, ge=1,
        description="sim: K/V bytes per context token (32 layers × 8 KV heads × 128 × 2 × 2 bytes); "
        "also sizes the simulated KV cache.")
    sim_memory_bandwidth_gbs: float = Field(
        default=3120, gt=0, description="sim: achieved memory bandwidth, GB/s (65 % of an H200's 4.8 TB/s).")
    sim_prefill_gflop_per_token: float = Field(
        default=16.06, ge=0, description="sim: prefill compute per prompt token, GFLOP (2 × parameters).")
    sim_tflops: float = Field(
        default=545, gt=0, description="sim: achieved prefill TFLOP/s (55 % of an H200's 989 dense bf16).")
    sim_gpu_memory_gb: float = Field(
        default=141, gt=0,
        description="sim: GPU memory, GB; kv_cache_fraction takes its share of what the weights leave.")

    # --- jobs -------------------------------------------------------------------------------
    result_ttl: int = Field(default=3600, ge=1, description="Seconds a finished job's record (status, "
                            "result) lives.")
    replay_window: int = Field(
        default=600, ge=1,
        description="Seconds a finished job's per-token events live (at most result_ttl); after it, a "
        "replay of the job is its one final event with the whole result, read from its record.",
    )
    stream_interval_ms: float = Field(
        default=20, ge=0, le=1000,
        description="Longest a followed job's token waits in the worker to go out live with its next ones "
        "(one live message for several steps' tokens, as SGLang's --stream-interval); first tokens and "
        "ends never wait. 0: every step's tokens go out at the step's end.",
    )
    durable_interval_ms: float = Field(
        default=250, ge=0, le=10000,
        description="Longest a job's events wait in the worker before they are written to its event "
        "stream (the durable copy that resumes, replays and late followers read; never shorter than "
        "stream_interval_ms). Followed jobs' tokens go out live every stream_interval_ms meanwhile. A "
        "worker that dies loses at most this much computed output, which the job's next owner computes "
        "again.",
    )
    event_stream_maxlen: int = Field(
        default=16384, ge=16,
        description="Cap of a job's event stream; must exceed max_total_tokens so a job can be resumed.",
    )
    idempotency_ttl: int = Field(
        default=86400, ge=1, description="Seconds an Idempotency-Key keeps answering with its job."
    )
    sse_keepalive_s: float = Field(
        default=15.0, ge=0,
        description="Seconds without an event before an SSE stream gets a `: keep-alive` comment; 0: "
                    "never (for clients that choke on a lone comment, e.g. `vllm bench serve`).",
    )

    # --- batches (OpenAI's Batch API: /v1/files, /v1/batches) ------------------------------
    max_batch_file_bytes: int = Field(
        default=50_000_000, ge=1024,
        description="Largest file accepted by POST /v1/files, in bytes (files live in Redis); larger: 413.",
    )
    max_batch_requests: int = Field(
        default=50_000, ge=1, description="Request lines in one batch input file; more: 422.",
    )
    batch_file_ttl: int = Field(
        default=7 * 86400, ge=60,
        description="Seconds an uploaded file, a batch's output and error files and the batch itself live.",
    )
    batch_window: int = Field(
        default=32, ge=1,
        description="Lines of one batch queued or running at once: a batch is expanded into jobs this many "
        "at a time (lowest priority), so an interactive request waits behind at most this many of its lines.",
    )

    # --- worker fleet -----------------------------------------------------------------------
    job_lease_ms: int = Field(
        default=30_000, ge=100,
        description="A job whose worker has not renewed it for this long (the worker died or hung) is "
        "reclaimed by another worker and resumed from its events; also the heartbeat key's TTL.",
    )
    heartbeat_interval_ms: int = Field(
        default=5_000, ge=10,
        description="How often a worker writes its heartbeat, renews its jobs' leases and looks for "
        "abandoned jobs; at most a third of job_lease_ms.",
    )
    max_attempts: int = Field(
        default=3, ge=1,
        description="Deliveries of a job (first run and resumes after a worker died) before it is "
        "moved to the dead-letter stream as failed: a job that kills its worker must not loop.",
    )
    jobs_shards: int = Field(
        default=1, ge=1, le=256,
        description="Shards of the jobs queue, each with its own hash tag (one slot on Redis Cluster); a "
        "job goes to the shard of a hash of its id. Every api and worker must agree; change it only with "
        "an empty queue.",
    )
    priority_bands: bool = Field(
        default=True,
        description="Queue jobs by priority band (high: 1..100, normal: 0, low: -99..-1, batch: -100), "
        "workers reading the highest non-empty band first; false: every job in the normal band, first in "
        "first out across the fleet (the engine still orders what it holds by priority).",
    )
    band_starvation_every: int = Field(
        default=8, ge=0,
        description="Every Nth read of a worker starts one band lower (the lower bands in turn), so low "
        "and batch jobs keep moving under a steady stream of higher ones; 0: strictly highest first.",
    )
    affinity: bool = Field(
        default=True,
        description="Prefix-affinity placement: a job whose leading prompt blocks a live worker holds in "
        "its prefix cache is queued on that worker's own stream (others take it after affinity_wait_ms).",
    )
    affinity_wait_ms: int = Field(
        default=200, ge=1, le=60_000,
        description="How long a job queued on a worker's own stream waits for that worker before any "
        "worker may take it (it is full, hung or dead).",
    )
    affinity_min_blocks: int = Field(
        default=4, ge=1,
        description="Prompt blocks (block_size tokens each) a worker must hold of a job's prefix for the "
        "job to be placed on it.",
    )
    drain_timeout: float = Field(
        default=30.0, ge=0,
        description="Seconds a worker keeps running its jobs after SIGTERM/SIGINT (it reads no new "
        "ones); what is left is handed to other workers, which resume it. A second signal exits now.",
    )
    worker_stall_timeout: float = Field(
        default=120.0, gt=0,
        description="Seconds a worker's engine step loop or asyncio loop may go without progress before "
        "its /health (on worker_metrics_port) answers 503; idle loops still progress. Longer than the "
        "slowest engine step (a long prefill on CPU).",
    )

    # --- webhooks ---------------------------------------------------------------------------
    webhook_secret: str | None = Field(
        default=None,
        description="The deployment's webhook signing secret (`whsec_` + base64), for tenants without "
        "their own; with none for a tenant, its jobs cannot ask for webhooks (422).",
    )
    webhook_secrets: str | None = Field(
        default=None, description="Per-tenant signing secrets as TENANT=whsec_... pairs, comma-separated."
    )
    webhook_secrets_file: Path | None = Field(
        default=None,
        description="JSON file {\"TENANT\": \"whsec_...\"}; read at start-up, with webhook_secrets.",
    )
    webhook_allow: str | None = Field(
        default=None,
        description="Webhook targets allowed although internal: CIDRs (127.0.0.0/8, 10.1.2.0/24) and host "
        "names (hooks.internal, or .internal for every name under it), comma-separated. Without it, URLs "
        "that resolve to loopback, private, link-local, metadata or other non-public addresses are refused.",
    )
    webhook_timeout: float = Field(default=10.0, gt=0, le=60, description="Seconds per delivery attempt.")
    webhook_retry_schedule: str = Field(
        default="10,40,160,640,2560",
        description="Seconds before each retry (a failed attempt: network error, timeout, 429 or 5xx), "
        "comma-separated; each waits a random 50-100 % of its value, or Retry-After if longer (capped at "
        "the largest value). Default: 6 attempts over about an hour.",
    )
    webhook_workers: int = Field(
        default=2, ge=1, le=16,
        description="Webhook delivery processes `conveyor serve` starts (each delivers one at a time).",
    )

    # --- observability ----------------------------------------------------------------------
    worker_metrics_port: int = Field(
        default=9400, ge=0, le=65535,
        description="Port of an engine worker's /metrics (`conveyor serve`: worker i gets port + i); "
        "0: none.",
    )
    webhook_metrics_port: int = Field(
        default=9300, ge=0, le=65535,
        description="Port of a webhook process's /metrics (`conveyor serve`: process i gets port + i); "
        "0: none.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CONVEYOR_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
                                      "otlp_endpoint"),
        description="OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318): traces on; unset: off.",
    )

    def cuda_graph_sizes(self) -> tuple[int, ...] | None:
        if self.cuda_graphs is None:
            return None
        return tuple(n for n in (int(x) for x in self.cuda_graphs.split(",")) if n > 0)

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        if self.max_input_tokens >= self.max_total_tokens:
            raise ValueError(
                f"max_input_tokens ({self.max_input_tokens}) must be < max_total_tokens "
                f"({self.max_total_tokens})"
            )
        if self.event_stream_maxlen <= self.max_total_tokens:
            raise ValueError(
                f"event_stream_maxlen ({self.event_stream_maxlen}) must be > max_total_tokens "
                f"({self.max_total_tokens}): a resumed job needs all its events; raise it"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if self.heartbeat_interval_ms * 3 > self.job_lease_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be at most a third of "
                f"job_lease_ms ({self.job_lease_ms}), or a healthy worker's jobs could be taken over; "
                "lower the interval or raise the lease"
            )
        if not (self.api_keys or self.api_keys_file or self.allow_unauthenticated or is_loopback(self.host)):
            raise ValueError(
                f"host {self.host} is not a loopback address and no API keys are configured: set api_keys "
                "or api_keys_file, or allow_unauthenticated=true to serve without authentication"
            )
        self.webhook_retry_delays  # noqa: B018 - raises on a bad schedule
        extra = self.extra_models  # raises on a bad entry
        if self.worker_model is not None and self.worker_model not in extra:
            raise ValueError(f"worker_model {self.worker_model!r} is not a NAME of `models` "
                             f"({', '.join(extra) or 'none set'}): add {self.worker_model}=PATH "
                             "to models, or unset worker_model for the default model")
        self.model_alias_map  # noqa: B018 - raises on a bad alias
        return self

    @property
    def extra_models(self) -> dict[str, str]:
        """`models` as NAME → PATH (conveyor/jobqueue/models.py); raises ValueError naming the fix."""
        out: dict[str, str] = {}
        for name, path, where in read_string_map(self.models, None, "models", "", ("NAME", "PATH")):
            check_model_name(name, where)
            if not path.strip():
                raise ValueError(f"{where}: model {name!r} has no PATH; give NAME=PATH")
            if name in out:
                raise ValueError(f"{where}: model {name!r} is named twice; give each model once")
            out[name] = path.strip()
        return out

    @property
    def model_alias_map(self) -> dict[str, str]:
        """`model_aliases` as ALIAS → NAME; raises ValueError naming the fix."""
        out: dict[str, str] = {}
        for alias, name, where in read_string_map(self.model_aliases, None, "model_aliases", "",
                                                  ("ALIAS", "NAME")):
            check_model_name(alias, where)
            if alias in out or alias in self.extra_models:
                raise ValueError(f"{where}: {alias!r} already names a model or an alias; pick another alias")
            out[alias] = name.strip()
        return out

    @property
    def webhook_retry_delays(self) -> list[float]:
        """The retry schedule: seconds before retry 1, 2, ...; its length bounds the attempts."""
        try:
            delays = [float(p) for p in self.webhook_retry_schedule.split(",") if p.strip()]
        except ValueError:
            delays = [-1.0]
        if any(d < 0 for d in delays) or len(delays) > 20:
            raise ValueError(f"webhook_retry_schedule {self.webhook_retry_schedule!r}: give up to 20 "
                             "non-negative numbers of seconds, comma-separated, e.g. 10,40,160")
        return delays

    @property
    def events_ttl(self) -> int:
        """Seconds a finished job's per-token events live: `replay_window`, never past its record."""
        return min(self.replay_window, self.result_ttl)

    @property
    def kv_cache_bytes(self) -> int | None:
        return parse_bytes(self.kv_cache_memory) if self.kv_cache_memory else None

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process build these same settings."""
        env: dict[str, str] = {}
        for name, value in self.model_dump(exclude_none=True).items():
            env[ENV_PREFIX + name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
        return env


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


def check_model_name(name: str, where: str) -> None:
    """A model name is part of Redis keys (conveyor/jobqueue/keys.py) and of `A=B,C=D` settings: no
    braces (hash tags), spaces, commas or `=`."""
    if not MODEL_NAME.fullmatch(name):
        raise ValueError(f"{where}: model name {name!r} must be 1-128 letters, digits and ._:/@+- "
                         "(starting with a letter or digit)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to be loopback
        return False


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    """'2GiB', '512MB', '1000000' → bytes."""
    s = text.strip().lower().replace(" ", "")
    number = s.rstrip("kmgib")
    unit = s[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(f"cannot read {text!r} as a size: use e.g. 2GiB, 512MiB or a byte count")
    return int(float(number) * _UNITS[unit])


def read_string_map(pairs: str | None, path: Path | None, pairs_name: str, file_name: str,
                    shape: tuple[str, str], bare_value: str | None = None) -> list[tuple[str, str, str]]:
    """Entries of a `A=B,C=D` setting and of a JSON-object file setting, in that order, as
    (key, value, where) — `where` names the setting for error messages. A bare `A` (no `=`) takes
    `bare_value`, or is an error when that is None. Raises ValueError naming the setting."""
    entries: list[tuple[str, str, str]] = []
    for i, item in enumerate(p.strip() for p in (pairs or "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not key.strip() or (not sep and bare_value is None):
            raise ValueError(f"{pairs_name}: entry {i} is not {shape[0]}={shape[1]}")
        entries.append((key.strip(), value if sep else bare_value or "", f"{pairs_name} entry {i}"))
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{file_name} {path}: {exc}") from exc
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(
                f'{file_name} {path}: must be a JSON object {{"{shape[0]}": "{shape[1]}", ...}} of strings'
            )
        for key, value in data.items():
            if not key.strip():
                raise ValueError(f"{file_name} {path}: an empty key")
            entries.append((key.strip(), value, f"{file_name} {path}"))
    return entries

