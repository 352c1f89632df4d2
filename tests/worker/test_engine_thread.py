"""The engine thread with a real (tiny) engine: an abort takes effect before the next step and
frees the request's KV blocks; a request the engine can never fit comes back refused, and the
thread keeps running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conveyor.engine.config import EngineConfig
from conveyor.engine.engine import Engine
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sequence import FinishReason
from conveyor.worker.engine_thread import AddCommand, EngineThread, StepOutput


def command(request_id: str, max_new_tokens: int) -> AddCommand:
    return AddCommand(request_id, [101, 2024, 318, 257], SamplingParams(),
                      StoppingParams(max_new_tokens=max_new_tokens, ignore_eos=True))


async def next_output(outputs: asyncio.Queue[StepOutput]) -> StepOutput:
    return await asyncio.wait_for(outputs.get(), 30)


@asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[tuple[EngineThread, asyncio.Queue[StepOutput]]]:
    """The engine in its thread, with its outputs; the thread must not have failed when it stops."""
    outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
    errors: list[BaseException] = []
    thread = EngineThread(engine, asyncio.get_running_loop(), outputs.put_nowait, errors.append)
    thread.start()
    try:
        yield thread, outputs
    finally:
        thread.stop()
    assert not errors


async def test_abort_frees_blocks_before_the_next_step(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_cache_memory=8 << 20))
    async with running(engine) as (thread, outputs):
        thread.add(command("stays", 3000))
        thread.add(command("goes", 3000))
        tokens = 0
        while tokens < 20:
            tokens += sum(e.request_id == "goes" for e in (await next_output(outputs)).events)
        both = thread.stats
        generated_at_abort = engine.scheduler.get("goes").num_generated  # type: ignore[union-attr]
        thread.abort("goes")
        while True:
            output = await next_output(outputs)
            final = [e for e in output.events if e.request_id == "goes" and e.finish_reason is not None]
            if final:
                break
        # Applied between steps: at most the step under way when abort() was called still ran it.
        assert final[0].index <= generated_at_abort + 1
        assert final[0].finish_reason is FinishReason.ABORTED and final[0].token_id is None
        steps = thread.stats.steps
        while thread.stats.steps < steps + 2:  # "stays" keeps decoding
            await next_output(outputs)
        alone = thread.stats
        assert alone.running == 1 and both.running == 2
        assert alone.blocks_used < both.blocks_used
        assert alone.blocks_used == engine.block_manager.blocks_for(
            engine.scheduler.get("stays").num_tokens)  # type: ignore[union-attr]
        thread.abort("stays")
        while thread.stats.blocks_used:
            await next_output(outputs)
        assert thread.stats.running == 0


async def test_a_request_that_can_never_fit_is_refused_not_fatal(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(num_blocks=8))  # 128 tokens of KV
    async with running(engine) as (thread, outputs):
        thread.add(command("huge", 500))
        output = await next_output(outputs)
        assert [request_id for request_id, _ in output.rejected] == ["huge"]
        assert "lower max_new_tokens" in output.rejected[0][1]
        assert thread.capacity() > 0  # the refused add no longer counts against capacity
        thread.add(command("small", 3))
        finals = []
        while not finals:
            finals = [e for e in (await next_output(outputs)).events if e.finish_reason is not None]
        assert finals[0].request_id == "small" and finals[0].finish_reason is FinishReason.LENGTH
