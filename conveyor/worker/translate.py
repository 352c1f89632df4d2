"""Between the queue's shapes (schemas/) and the engine's: a job spec becomes an engine request, a
token event becomes a job event. Final results are made by `JobResult.final` (conveyor/wire/job.py),
which the api uses too for the jobs it ends in the queue."""

from __future__ import annotations

from conveyor.engine.events import TokenEvent
from conveyor.engine.params import Grammar, SamplingParams, StoppingParams
from conveyor.engine.sequence import FinishReason
from conveyor.wire.job import EventToken, JobEvent, JobResult, JobSpec, JobStatus, PromptEventToken, Usage
from conveyor.worker.choices import Choices
from conveyor.worker.engine_thread import AddCommand
from conveyor.worker.owned import InFlight

_STATUS_BY_REASON = {
    FinishReason.EOS: JobStatus.SUCCEEDED,
    FinishReason.LENGTH: JobStatus.SUCCEEDED,
    FinishReason.STOP_SEQUENCE: JobStatus.SUCCEEDED,
    FinishReason.ABORTED: JobStatus.CANCELLED,
    FinishReason.EXPIRED: JobStatus.EXPIRED,
}


def engine_params(spec: JobSpec, seed: int | None,
                  resumed: bool = False) -> tuple[SamplingParams, StoppingParams]:
    """`resumed`: the job's stream already has its first event, and with it the prompt's logprobs."""
    s = spec.sampling
    sampling = SamplingParams(
        do_sample=s.do_sample, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
        typical_p=s.typical_p, repetition_penalty=s.repetition_penalty,
        frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
        seed=seed, top_n_tokens=s.top_n_tokens, logit_bias=tuple(sorted(s.logit_bias.items())),
        grammar=Grammar(s.grammar.kind, s.grammar.value) if s.grammar else None,
        prompt_logprobs=None if resumed else s.prompt_logprobs, speculate=s.speculate,
    )
    stopping = StoppingParams(
        max_new_tokens=spec.stopping.max_new_tokens,
        stop=tuple(spec.stopping.stop),
        ignore_eos=spec.stopping.ignore_eos,
        include_stop_str_in_output=spec.stopping.include_stop_str_in_output,
    )
    return sampling, stopping


def engine_request(spec: JobSpec, seed: int | None, generated: list[int], queued: bool,
                   choices: Choices | None = None) -> AddCommand:
    """`generated`: tokens already in the job's event stream (a resumed job continues after them);
    for a multi-choice job, `choices` says which choices are left and their tokens."""
    resumed = choices.unfinished() if choices is not None and choices.next_index else None
    sampling, stopping = engine_params(spec, seed, resumed=bool(generated) or resumed is not None)
    return AddCommand(
        spec.id, spec.prompt_ids, sampling, stopping, spec.priority,
        # A deadline bounds the wait in the queue; a job that another worker started has left it.
        deadline=spec.deadline if queued else None, generated=generated, n=spec.width, resumed=resumed,
    )


def to_job_event(event: TokenEvent, choices: Choices | None = None) -> JobEvent:
    """The job event of an engine event; of a multi-choice job, numbered in its stream by `choices`."""
    token = None
    if event.token_id is not None:
        token = EventToken(id=event.token_id, text=event.text, logprob=event.logprob, special=event.special)
    result = None
    if event.finish_reason is not None:
        result = JobResult.final(
            _STATUS_BY_REASON[event.finish_reason],
            reason=event.finish_reason.value,
            generated_text=event.generated_text or "",
            usage=Usage(
                prompt_tokens=event.num_prompt_tokens,
                completion_tokens=event.num_generated_tokens,
                cached_tokens=event.num_cached_tokens,
            ),
            seed=event.seed,
        )
    job_event = JobEvent(
        index=event.index,
        token=token,
        top_tokens=[EventToken(id=t.id, text=t.text, logprob=t.logprob, special=t.special)
                    for t in event.top_tokens],
        final=result is not None,
        result=result,
        prompt=_prompt(event),
    )
    return job_event if choices is None else choices.track(event.choice, job_event)


def _prompt(event: TokenEvent) -> list[PromptEventToken] | None:
    if event.prompt_tokens is None:
        return None
    return [PromptEventToken(id=p.id, text=p.text, logprob=p.logprob, top_tokens=[
        EventToken(id=t.id, text=t.text, logprob=t.logprob, special=t.special) for t in p.top_tokens])
        for p in event.prompt_tokens]


def refused(job: InFlight, reason: str) -> JobEvent:
    """The final event of a job the engine refused (it can never fit): `failed`, with the engine's
    message."""
    if job.choices is not None:
        return JobEvent.ending(job.next_index, job.choices.result(JobStatus.FAILED, reason))
    return JobEvent.ending(job.tokens, JobResult.final(JobStatus.FAILED, error=reason))
