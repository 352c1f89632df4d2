"""The api renders chat templates without transformers; it must match transformers exactly."""

from __future__ import annotations

from api.chat_template import ChatTemplate
from api.tokenizer import PromptTokenizer


def test_matches_transformers_apply_chat_template(default_model_dir) -> None:  # type: ignore[no-untyped-def]
    from engine.loader import load_tokenizer

    template = ChatTemplate.from_model_dir(default_model_dir)
    assert template is not None
    reference = load_tokenizer(default_model_dir)
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ]
    for messages in conversations:
        for add in (True, False):
            expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
            assert template.render(messages, add_generation_prompt=add) == expected


def test_templated_inputs_are_recognised(default_model_dir) -> None:  # type: ignore[no-untyped-def]
    tokenizer = PromptTokenizer(default_model_dir)
    assert tokenizer.has_special_tokens("<|im_start|>user\nhi<|im_end|>\n")
    assert not tokenizer.has_special_tokens("What is the capital of France?")
    assert tokenizer.encode("Paris") == tokenizer.encode("Paris")
    assert tokenizer.decode(tokenizer.encode("Paris is nice")) == "Paris is nice"
