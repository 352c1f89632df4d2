"""Placement across a fleet of worker processes — the priority part: does a high-priority job
overtake a queue of low ones? (The affinity part, `benchmarks/fleet.py affinity`: benchmarks/fleet_affinity.py.)

    .venv/bin/python benchmarks/fleet.py priority                     # 200 low + 10 high, 2 workers
    .venv/bin/python benchmarks/fleet.py priority --low 400 --workers 3 --shards 3
    nice -n 10 .venv/bin/python benchmarks/fleet.py affinity          # 1, 2, 3 workers, affinity on vs off

One run, one valkey-server, N worker processes (`conveyor worker`) on a tiny random Llama (2 layers,
the default model's tokenizer: the real engine path, fast on CPU), each with `--max-batch-size`
slots so the queue backs up behind the fleet's capacity. Twice, the same workers:
  bands on:  `priority_bands=true` (the default): low jobs (priority -10) in the low band, high jobs
             (priority 10) in the high band; workers read the high band first.
  bands off: `priority_bands=false`: every job in the normal band, first in first out.
Each time, `--low` low jobs are written (as the api writes them, conveyor.api.jobpath.store.JobStore), then `--high`
high ones; reported: the high jobs' TTFT (record's first_token_at − created_at) p50 / p99 / max,
the low jobs' TTFT p50 and the wall time of the whole queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from redis.asyncio import Redis  # noqa: E402

from conveyor.api.jobpath.store import JobStore  # noqa: E402
from conveyor.jobqueue.keys import Keys  # noqa: E402
from conveyor.launcher.redis_server import EmbeddedRedis  # noqa: E402
from conveyor.settings import Settings  # noqa: E402
from conveyor.wire.job import JobResult, JobSpec, JobStatus, RecordField, SamplingSpec, StoppingSpec  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tiny_model(path: Path, hidden: int = 64, layers: int = 2) -> Path:
    """The tests' tiny random Llama (tests/conftest.py `tiny_model_dir`); wider or deeper if asked."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from conveyor.engine.loader import resolve_model

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=49152, max_position_embeddings=4096)
    LlamaForCausalLM(config).save_pretrained(path)
    source = resolve_model(None).path
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, path / name)
    return path


def default_model() -> Path:
    from conveyor.engine.loader import resolve_model

    return resolve_model(None).path


def block_bytes(model: Path) -> int:
    """Bytes of one 16-token fp32 KV block of the model, as the engine sizes its cache."""
    import json

    import torch

    from conveyor.engine.kv_cache import bytes_per_block

    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return bytes_per_block(cfg["num_hidden_layers"], 16, cfg["num_key_value_heads"], head_dim, torch.float32)


def spec(i: int, priority: int, new_tokens: int) -> JobSpec:
    return JobSpec(id=uuid.uuid4().hex, created_at=time.time(), prompt_ids=[1000 + i % 500, 2000 + i, 3000],
                   stopping=StoppingSpec(max_new_tokens=new_tokens, ignore_eos=True), sampling=SamplingSpec(),
                   priority=priority)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def finished(redis: Redis, keys: Keys, job_id: str, timeout: float = 600) -> tuple[JobResult, float]:
    deadline = time.monotonic() + timeout
    while True:
        record = await redis.hgetall(keys.job(job_id))
        status = record.get(RecordField.STATUS)
        if status and JobStatus(status).is_terminal:
            if status != JobStatus.SUCCEEDED:
                raise RuntimeError(f"job {job_id} ended {status}: {record.get(RecordField.RESULT)}")
            ttft = float(record[RecordField.FIRST_TOKEN_AT]) - float(record[RecordField.CREATED_AT])
            return JobResult.model_validate_json(record[RecordField.RESULT]), ttft
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} not done after {timeout}s")
        await asyncio.sleep(0.01)


async def ttfts(redis: Redis, keys: Keys, ids: list[str]) -> list[float]:
    return [(await finished(redis, keys, job_id))[1] for job_id in ids]


async def run_priority(args: argparse.Namespace, redis: Redis, keys: Keys, settings: Settings) -> None:
    rows = []
    for bands in (True, False):
        store = JobStore(redis, keys, settings.model_copy(update={"priority_bands": bands}))
        started = time.perf_counter()
        lows = [spec(i, -10, args.low_tokens) for i in range(args.low)]
        for job in lows:
            await store.submit(job)
        highs = [spec(i, 10, args.high_tokens) for i in range(args.high)]
        for job in highs:
            await store.submit(job)
        high = await ttfts(redis, keys, [j.id for j in highs])
        low = await ttfts(redis, keys, [j.id for j in lows])
        wall = time.perf_counter() - started
        rows.append((f"bands {'on' if bands else 'off'}", pct(high, 0.5), pct(high, 0.99), max(high),
                     pct(low, 0.5), wall))
        log(f"{rows[-1][0]}: done")
    print(f"\n{args.low} low jobs (priority -10, {args.low_tokens} tokens), then {args.high} high "
          f"(priority 10, {args.high_tokens} tokens); {args.workers} workers × {args.max_batch_size} slots, "
          f"{args.shards} shard(s)\n")
    print("| mode | high TTFT p50 | high TTFT p99 | high TTFT max | low TTFT p50 | queue wall |")
    print("|---|---|---|---|---|---|")
    for name, p50, p99, top, low50, wall in rows:
        print(f"| {name} | {p50:.3f} s | {p99:.3f} s | {top:.3f} s | {low50:.3f} s | {wall:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["priority", "affinity"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=8, help="slots per worker")
    parser.add_argument("--low", type=int, default=200)
    parser.add_argument("--high", type=int, default=10)
    parser.add_argument("--low-tokens", type=int, default=32)
    parser.add_argument("--high-tokens", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64, help="the random Llama's width")
    parser.add_argument("--layers", type=int, default=2, help="the random Llama's depth")
    parser.add_argument("--model", choices=["tiny", "default"], default="tiny",
                        help="tiny: the random Llama of --hidden/--layers; default: the default model "
                             "(SmolLM2-135M, converted), whose prefill weighs as in production")
    from benchmarks.fleet_affinity import add_arguments, run_affinity

    add_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir, EmbeddedRedis(Path(tmp_dir) / "redis") as server:
        tmp = Path(tmp_dir)
        model = (default_model() if args.model == "default"
                 else tiny_model(tmp / "model", args.hidden, args.layers))
        if args.part == "affinity":
            args.block_bytes = block_bytes(model)
            asyncio.run(run_affinity(args, server.url, model))
            return
        prefix = f"fleet{uuid.uuid4().hex[:8]}"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")},
               "REDIS_URL": server.url, "CONVEYOR_MODEL": str(model), "CONVEYOR_KEY_PREFIX": prefix,
               "CONVEYOR_JOBS_SHARDS": str(args.shards), "CONVEYOR_MAX_BATCH_SIZE": str(args.max_batch_size),
               "CONVEYOR_KV_CACHE_MEMORY": "8MiB", "CONVEYOR_WORKER_METRICS_PORT": "0",
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen([sys.executable, "-m", "conveyor", "worker", "--worker-id", f"w{i}"],
                                  env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in range(args.workers)]
        try:
            asyncio.run(_run(args, server.url, Keys(prefix, args.shards)))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(60)


async def _run(args: argparse.Namespace, url: str, keys: Keys) -> None:
    redis = Redis.from_url(url, decode_responses=True)
    settings = Settings(redis_url=url, key_prefix=keys.prefix, jobs_shards=args.shards,
                        max_concurrent_requests=100_000)
    deadline = time.monotonic() + 300
    for i in range(args.workers):
        while not await redis.exists(keys.worker(f"w{i}")):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not come up")
            await asyncio.sleep(0.1)
    log(f"{args.workers} workers up")
    await run_priority(args, redis, keys, settings)
    await redis.aclose()


if __name__ == "__main__":
    main()
