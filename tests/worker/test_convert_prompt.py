"""A job's prompt logprobs are computed once: the first event carries them, so a resumed job (its
stream already has tokens, event 0 among them) does not score its prompt again; the spec accepts
max_new_tokens 0 only for scoring."""

from __future__ import annotations

import pydantic
import pytest

from conveyor.engine.events import PromptToken, TokenEvent, TopToken
from conveyor.wire.job import JobEvent, JobSpec, SamplingSpec, StoppingSpec
from conveyor.worker.translate import engine_request, to_job_event


def spec(max_new: int = 3, prompt_logprobs: int | None = 1) -> JobSpec:
    return JobSpec(id="j", created_at=0.0, prompt_ids=[1, 2, 3],
                   sampling=SamplingSpec(prompt_logprobs=prompt_logprobs),
                   stopping=StoppingSpec(max_new_tokens=max_new))


def test_a_resumed_job_does_not_score_its_prompt_again() -> None:
    assert engine_request(spec(), None, [], queued=True).sampling.prompt_logprobs == 1
    assert engine_request(spec(), None, [7, 8], queued=False).sampling.prompt_logprobs is None


def test_max_new_tokens_0_needs_prompt_logprobs() -> None:
    assert spec(max_new=0).stopping.max_new_tokens == 0
    with pytest.raises(pydantic.ValidationError, match="prompt_logprobs"):
        spec(max_new=0, prompt_logprobs=None)


def test_the_first_event_carries_the_prompt_through_the_stream_format() -> None:
    top = [TopToken(id=9, text="x", logprob=-0.5, special=False)]
    event = TokenEvent(request_id="j", index=0, token_id=4, text="d", logprob=-1.0, prompt_tokens=[
        PromptToken(id=1, text="a", logprob=None), PromptToken(id=2, text="b", logprob=-2.0, top_tokens=top)])
    wire = JobEvent.model_validate_json(to_job_event(event).model_dump_json(exclude_none=True))
    assert wire.prompt is not None and [(p.id, p.text, p.logprob) for p in wire.prompt] == [
        (1, "a", None), (2, "b", -2.0)]
    assert [(t.id, t.logprob) for t in wire.prompt[1].top_tokens] == [(9, -0.5)]
    assert to_job_event(TokenEvent(request_id="j", index=1, token_id=5)).prompt is None
