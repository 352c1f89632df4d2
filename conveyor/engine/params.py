"""Per-request generation parameters, as the engine sees them.

Validation of user input happens in `schemas/` (the api rejects bad values with a 422 naming the
field); the engine trusts these values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Grammar:
    """What the output must match (conveyor/engine/grammar.py compiles it). `kind`: json_schema | json_object
    | regex | lark; `value`: the schema as JSON text, the regex, the Lark grammar
    (conveyor/wire/grammar.py)."""

    kind: str
    value: str = ""


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How the next token is chosen. `do_sample=False` (the default) is greedy decoding."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    typical_p: float = 1.0  # 1.0: off
    repetition_penalty: float = 1.0  # HF semantics, over prompt and generated tokens; 1.0: off
    frequency_penalty: float = 0.0  # OpenAI semantics, over generated tokens; 0.0: off
    presence_penalty: float = 0.0  # OpenAI semantics, over generated tokens; 0.0: off
    # Sampling draws token i from a generator seeded by (seed, i): a request gives the same tokens
    # alone or in any batch, and a resumed request continues exactly. The engine picks a random seed
    # when sampling without one, and reports it.
    seed: int | None = None
    top_n_tokens: int = 0  # alternatives reported per generated token
    # (token id, bias) pairs added to the logits before everything else (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Constrains the output (structured output, tool calls): only tokens the grammar allows.
    grammar: Grammar | None = None
    # Prompt logprobs (conveyor/engine/prompt_logprobs.py): None: not computed; k: each prompt token's own
    # logprob and the top k alternatives (0: only its own).
    prompt_logprobs: int | None = None
    # False: no draft tokens for this request even where the engine speculates (speculative/).
    speculate: bool = True

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0.0 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


@dataclass(slots=True, frozen=True)
class StoppingParams:
    """When generation ends (besides abort and deadline)."""

    max_new_tokens: int = 20  # 0 (with prompt_logprobs): score the prompt, generate nothing
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # The matched stop sequence ends the output (TGI) instead of being cut off (OpenAI).
    include_stop_str_in_output: bool = False
