"""What a worker says about itself in its heartbeat key (Keys.worker): who it is, what it serves,
and how full its engine is. The api's /info and readiness can read it; tests read the KV stats.

Torch-free on purpose: the engine returns `EngineLoad` from `Engine.stats()`, so the heartbeat, the
worker's metrics and the engine share one type."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class EngineLoad(BaseModel):
    """The engine's counters at the last step (`Engine.stats()`); immutable, so any thread may read
    the one the engine thread last published."""

    model_config = ConfigDict(frozen=True)

    running: int = 0
    waiting: int = 0
    # prompt tokens still to prefill: waiting sequences' whole prompts (prefix-cache hits not yet
    # known) and running ones' unprefilled chunks. Placement weighs it against the prefix it saves.
    prefill_backlog_tokens: int = 0
    blocks_used: int = 0  # KV blocks held by sequences (cached but free blocks are not counted)
    blocks_free: int = 0
    prefix_cache_hit_rate: float = 0.0
    prefix_cache_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache (since start)
    prefix_cache_hit_tokens: int = 0  # of which found there
    preemptions: int = 0
    steps: int = 0
    # Speculative decoding (since start): drafts verified, their tokens, of which accepted.
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class WorkerInfo(BaseModel):
    id: str
    pid: int
    host: str
    model: str  # the model's served name: what requests give in `model`
    aliases: list[str] = []  # other names requests may give for it (model_aliases)
    device: str
    dtype: str
    kv_blocks: int
    block_size: int
    max_batch_size: int
    started_at: float
    heartbeat_at: float
    draining: bool = False  # stopping: reads no new jobs
    jobs: int = 0  # jobs it owns now (read and not yet acknowledged)
    load: EngineLoad = EngineLoad()
