"""The api renders chat templates with transformers' own renderer (no torch in the api process); it
must match `apply_chat_template` exactly, including the Jinja features Hub templates use."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conveyor.api.requests.chat_template import ChatTemplate, ChatTemplateError
from conveyor.api.requests.limits import tgi_prompt
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.settings import Settings
from tests.conftest import REPO

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
]


def test_matches_transformers_apply_chat_template(default_model_dir) -> None:  # type: ignore[no-untyped-def]
    from conveyor.engine.loader import load_tokenizer

    template = ChatTemplate.from_model_dir(default_model_dir)
    assert template is not None
    reference = load_tokenizer(default_model_dir)
    for messages in CONVERSATIONS:
        for add in (True, False):
            expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
            assert template.render(messages, add_generation_prompt=add) == expected


def test_loop_controls_render() -> None:
    """`{% break %}` needs jinja's loopcontrols extension, which transformers' renderer enables."""
    template = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'stop' %}{% break %}{% endif %}[{{ m.content }}]{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}", {})
    messages = [{"role": "user", "content": "a"}, {"role": "stop", "content": "x"},
                {"role": "user", "content": "b"}]
    assert template.render(messages) == "[a]>"
    assert template.render(messages, add_generation_prompt=False) == "[a]"


def test_tools_and_tojson_as_transformers_renders_them() -> None:
    """`tools` reach the template, and `tojson` does not HTML-escape (Jinja's own filter would turn
    `<` into `\\u003c`)."""
    template = ChatTemplate(
        "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}{{ bos_token }}{{ m.content }}{% endfor %}", {"bos_token": "<s>"})
    tool = {"type": "function", "function": {"name": "lookup", "description": "a <b> & c"}}
    rendered = template.render([{"role": "user", "content": "hi"}], tools=[tool])
    assert rendered == '<tools>{"type": "function", "function": {"name": "lookup", "description": ' \
                       '"a <b> & c"}}</tools><s>hi'
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>hi"


def test_generation_blocks_and_raise_exception() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", {})
    assert template.render([{"role": "assistant", "content": "ok"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="no tools here"):
        template.render([{"role": "tool", "content": "x"}])


def test_a_template_that_does_not_parse_fails_at_load() -> None:
    with pytest.raises(Exception, match="endfor|end of template"):
        ChatTemplate("{% for m in messages %}", {})


def test_the_api_tokenizer_matches_transformers(default_model_dir) -> None:  # type: ignore[no-untyped-def]
    from conveyor.engine.loader import load_tokenizer

    tokenizer = PromptTokenizer(default_model_dir)
    reference = load_tokenizer(default_model_dir)
    for text in ("Paris", "Paris is nice", "<|im_start|>user\nhi<|im_end|>\n", "naïve café 東京 🙂"):
        assert tokenizer.encode(text) == reference.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_templated_inputs_are_recognised_and_left_as_they_are(default_model_dir) -> None:  # type: ignore[no-untyped-def]
    """`generate_prompt_format=auto`: bare TGI inputs go through the chat template as one user
    message; inputs that hold special tokens (already templated) and `raw` are left as they are."""
    tokenizer = PromptTokenizer(default_model_dir)
    template = ChatTemplate.from_model_dir(default_model_dir)
    templated = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.has_special_tokens(templated)
    assert not tokenizer.has_special_tokens("What is the capital of France?")
    auto, raw = Settings(generate_prompt_format="auto"), Settings(generate_prompt_format="raw")
    assert tgi_prompt(auto, tokenizer, template, templated) == templated
    wrapped = tgi_prompt(auto, tokenizer, template, "hi")
    assert wrapped == template.render([{"role": "user", "content": "hi"}]) and wrapped.endswith(templated)
    assert tgi_prompt(raw, tokenizer, template, "hi") == "hi"


def test_the_api_process_loads_no_torch(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Building the app, tokenizing and rendering a template import no torch (it is ~1 GB of memory
    and seconds of start-up in every api process)."""
    script = textwrap.dedent(f"""
        import sys
        from conveyor.api.app import create_app
        from conveyor.api.requests.chat_template import ChatTemplate
        from conveyor.api.requests.tokenizer import PromptTokenizer
        from conveyor.settings import Settings
        model = {str(tiny_model_dir)!r}
        create_app(Settings(redis_url="redis://127.0.0.1:1"), model, "tiny")
        text = ChatTemplate.from_model_dir(model).render([{{"role": "user", "content": "hi"}}])
        assert PromptTokenizer(model).encode(text)
        print("torch" in sys.modules, "transformers.utils.chat_template_utils" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout  # rendered by transformers, without torch
