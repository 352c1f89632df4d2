"""A multi-choice job taken over from a dead worker (conveyor/worker/choices.py): each choice resumes from
its own tokens in the one event stream, a choice that had ended is not run again, every
(choice, token) is written exactly once, and the result is what an uninterrupted run gives."""

from __future__ import annotations

import pytest

from conveyor.wire.job import JobEvent, JobStatus, SamplingSpec
from tests.worker.test_intake import PROMPT, dead_worker_takes

N, WIDTH = 12, 3


def per_choice(events: list[JobEvent]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in events:
        if e.token is not None:
            out.setdefault(e.choice, []).append(e.token.id)
    return out


def spec(make_spec, sampling: SamplingSpec):  # type: ignore[no-untyped-def]
    return make_spec(PROMPT, max_new_tokens=N, n=WIDTH).model_copy(update={"sampling": sampling})


@pytest.mark.parametrize("cut", ["mid", "after_a_choice_ended"])
async def test_a_reclaimed_multi_choice_job_resumes_each_choice(local, make_spec, cut: str) -> None:  # type: ignore[no-untyped-def]
    sampling = SamplingSpec(do_sample=True, temperature=1.0, seed=11)
    async with local.worker():
        reference_id = await local.submit(spec(make_spec, sampling))
        reference = await local.result(reference_id)
    reference_events = await local.events(reference_id)
    assert reference.status is JobStatus.SUCCEEDED and reference.choices is not None
    assert [e.index for e in reference_events] == list(range(WIDTH * N))
    ends = [e.index for e in reference_events if e.choice_end is not None]
    k = 10 if cut == "mid" else ends[0] + 1  # the dead worker wrote k events, the last unpublished
    assert cut == "mid" or reference_events[k - 1].choice_end is not None

    job_id = await local.submit(spec(make_spec, sampling))
    await dead_worker_takes(local, job_id, reference_events[:k])
    await local.wait_idle_past_lease(local.settings.job_lease_ms)
    async with local.worker():
        result = await local.result(job_id)

    events = await local.events(job_id)
    assert [e.index for e in events] == list(range(WIDTH * N)), "one stream, no gap, no duplicate"
    assert per_choice(events) == per_choice(reference_events)  # each choice's tokens exactly once
    assert sorted(e.choice for e in events if e.choice_end is not None) == list(range(WIDTH))
    assert [e.final for e in events] == [False] * (WIDTH * N - 1) + [True]
    assert result.status is JobStatus.SUCCEEDED
    assert result.choices is not None
    # Texts, seeds, token counts exact; a logprob recomputed by the resume's prefill may differ in
    # the last bits from the decode step's.
    assert [c.model_copy(update={"logprob": 0}) for c in result.choices] == \
        [c.model_copy(update={"logprob": 0}) for c in reference.choices]
    expected = [c.logprob for c in reference.choices]
    assert [c.logprob for c in result.choices] == pytest.approx(expected, abs=1e-3)
    assert result.usage is not None and result.usage.completion_tokens == WIDTH * N
    assert await local.pending() == 0
