"""What publishing costs: engine-only throughput vs the same workload through a worker and Redis.

    .venv/bin/python benchmarks/publish.py                  # 32 requests × 64 prompt × 64 new tokens
    .venv/bin/python benchmarks/publish.py --requests 64 --rounds 6

(a) engine only: every request added, then `step()` until all finish, in a thread of its own.
(b) through the worker: the same requests written to the jobs stream exactly as the api writes them
    (conveyor.api.jobpath.store.JobStore), then one Worker (engine thread + asyncio publishing: one pipeline per step,
    XADD to each job's event stream + PUBLISH, nobody listening) runs them against a real
    valkey-server; timed from the worker's start to the last job's acknowledgement.
Both use the default model (fp32 on CPU), greedy, EOS ignored, one shared model runner, a fresh
engine (no prefix cache carried over) per round. Reports output tokens/s of each and (b)/(a):
the target is ≥ 0.95. Rounds alternate the order of (a) and (b); the best of each is compared, so a
burst of other load on the machine hurts neither side alone (the median of the rounds' own ratios
is printed too). Also printed: the share of (b)'s time its engine spent outside `step()` — what the
worker adds around the engine, whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis  # noqa: E402

from conveyor.api.jobpath.store import JobStore  # noqa: E402
from conveyor.engine.config import EngineConfig  # noqa: E402
from conveyor.engine.engine import Engine  # noqa: E402
from conveyor.engine.loader import eos_token_ids, load_tokenizer, resolve_model  # noqa: E402
from conveyor.engine.model_runner import ModelRunner  # noqa: E402
from conveyor.engine.params import SamplingParams, StoppingParams  # noqa: E402
from conveyor.jobqueue.keys import Keys  # noqa: E402
from conveyor.launcher.redis_server import EmbeddedRedis  # noqa: E402
from conveyor.settings import Settings  # noqa: E402
from conveyor.wire.job import JobSpec, StoppingSpec  # noqa: E402
from conveyor.worker.runner import Worker  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        source = resolve_model(None)
        self.config = EngineConfig(kv_cache_memory=args.kv_cache_mib << 20)
        log(f"loading {source.model_id}")
        self.runner = ModelRunner.from_pretrained(source.path, self.config)
        self.tokenizer = load_tokenizer(source.path)
        self.eos = eos_token_ids(source.path)
        rng = random.Random(0)
        vocab = len(self.tokenizer)
        self.prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)]
                        for _ in range(args.requests)]
        self.new_tokens = args.new_tokens

    def engine(self) -> Engine:
        max_model_len = getattr(self.runner, "max_model_len", None)
        return Engine(self.runner, self.tokenizer, self.config, self.eos, max_model_len)

    def engine_only(self, requests: int | None = None, new_tokens: int | None = None) -> float:
        """In a thread of its own, as the worker runs its engine, so both sides compute alike."""
        result: list[float] = []
        thread = threading.Thread(target=lambda: result.append(self._engine_only(requests, new_tokens)))
        thread.start()
        thread.join()
        return result[0]

    def _engine_only(self, requests: int | None, new_tokens: int | None) -> float:
        engine = self.engine()
        stopping = StoppingParams(max_new_tokens=new_tokens or self.new_tokens, ignore_eos=True)
        start = time.perf_counter()
        for i, prompt in enumerate(self.prompts[:requests]):
            engine.add(f"r{i}", prompt, SamplingParams(), stopping)
        tokens = 0
        while engine.has_unfinished():
            tokens += sum(e.token_id is not None for e in engine.step())
        return tokens / (time.perf_counter() - start)

    async def through_worker(self, redis_url: str) -> tuple[float, float]:
        """(output tokens/s, share of the time the engine was not inside a step)."""
        keys = Keys(f"bench{uuid.uuid4().hex[:8]}")
        settings = Settings(redis_url=redis_url, key_prefix=keys.prefix, max_concurrent_requests=100_000)
        redis = Redis.from_url(redis_url, decode_responses=True)
        store = JobStore(redis, keys, settings)
        stopping = StoppingSpec(max_new_tokens=self.new_tokens, ignore_eos=True)
        for prompt in self.prompts:  # queued before the worker starts: it pulls them by capacity
            await store.submit(JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=prompt,
                                       stopping=stopping))
        engine = self.engine()
        in_steps = [0.0]
        step = engine.step

        def timed_step():  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return step()
            finally:
                in_steps[0] += time.perf_counter() - started

        engine.step = timed_step  # type: ignore[method-assign]
        worker_redis = Redis.from_url(redis_url, decode_responses=True)
        worker = Worker(settings, engine, worker_redis, "bench")
        start = time.perf_counter()
        task = asyncio.create_task(worker.run())
        # an entry is deleted when its job is acknowledged
        while sum([await redis.xlen(stream) for stream in keys.jobs_streams]):
            await asyncio.sleep(0.02)
        seconds = time.perf_counter() - start
        worker.stop()
        await task
        await redis.aclose()
        await worker_redis.aclose()
        return len(self.prompts) * self.new_tokens / seconds, 1 - in_steps[0] / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    args = parser.parse_args()
    bench = Bench(args)
    log("warm-up (engine only, 4 requests)")
    bench.engine_only(requests=4, new_tokens=8)
    engine_tps: list[float] = []
    worker_tps: list[float] = []
    outside: list[float] = []
    with EmbeddedRedis(Path(tempfile.mkdtemp(prefix="conveyor-bench-"))) as server:
        for round_ in range(1, args.rounds + 1):
            # Alternate the order, so a drift in the machine's speed favours neither side.
            for side in ("engine", "worker") if round_ % 2 else ("worker", "engine"):
                if side == "engine":
                    engine_tps.append(bench.engine_only())
                    log(f"round {round_}/{args.rounds}: engine only    {engine_tps[-1]:8.1f} output tok/s")
                else:
                    tps, idle = asyncio.run(bench.through_worker(server.url))
                    worker_tps.append(tps)
                    outside.append(idle)
                    log(f"round {round_}/{args.rounds}: through worker {tps:8.1f} output tok/s "
                        f"(engine outside a step {idle:.1%} of the time)")
    best_engine, best_worker = max(engine_tps), max(worker_tps)
    paired = statistics.median(w / e for w, e in zip(worker_tps, engine_tps, strict=True))
    print(f"\n{args.requests} requests × {args.prompt_tokens} prompt × {args.new_tokens} new tokens, "
          f"best of {args.rounds}: engine only {best_engine:.1f} tok/s, through worker + Redis "
          f"{best_worker:.1f} tok/s: ratio {best_worker / best_engine:.3f} (target ≥ 0.95); "
          f"median of the rounds' ratios {paired:.3f}; the worker's engine spent "
          f"{statistics.median(outside):.1%} of the time between steps (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
