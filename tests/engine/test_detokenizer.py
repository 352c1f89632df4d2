from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerFast

from conveyor.engine.detokenizer import Detokenizer, token_text

MIXED = "Hello 世界! naïve café — 🤖👍🏽 ok. 日本語のテキスト, emoji 🎉🇫🇷 end"


@pytest.fixture()
def tok(smollm2_tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    return smollm2_tokenizer


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def special_ids(tok: PreTrainedTokenizerFast) -> frozenset[int]:
    return frozenset(tok.all_special_ids)


def run(det: Detokenizer, ids: list[int]) -> tuple[list[str], bool]:
    pieces, stopped = [], False
    for token_id in ids:
        piece, stopped = det.push(token_id)
        pieces.append(piece)
        if stopped:
            break
    return pieces, stopped


def test_round_trip_never_breaks_a_character(tok: PreTrainedTokenizerFast) -> None:
    ids = encode(tok, MIXED)
    det = Detokenizer(tok, (), special_ids(tok))
    pieces, stopped = run(det, ids)
    assert not stopped
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # some tokens are only part of a character
    assert "".join(pieces) == MIXED == det.text
    assert det.flush() == ""


def test_stop_sequence_spanning_tokens_is_cut_and_never_released(tok: PreTrainedTokenizerFast) -> None:
    text = "Hello world, stop here and more"
    det = Detokenizer(tok, ("ld, st",), special_ids(tok))
    pieces, stopped = run(det, encode(tok, text))
    assert stopped and det.stopped
    assert pieces == ["Hello", " wor", "", ""]  # "ld" and ", " are held back until " stop" completes it
    assert det.text == "Hello wor" == "".join(pieces)
    assert det.flush() == ""
    assert det.push(encode(tok, " again")[0]) == ("", True)
    assert det.text == "Hello wor"


def test_held_back_text_is_released_when_it_diverges(tok: PreTrainedTokenizerFast) -> None:
    det = Detokenizer(tok, ("world peace",), special_ids(tok))
    pieces, stopped = run(det, encode(tok, "hello world war"))
    assert not stopped
    assert pieces == ["hello", " ", "world war"]
    assert det.text == "hello world war"


def test_flush_releases_held_back_text(tok: PreTrainedTokenizerFast) -> None:
    det = Detokenizer(tok, ("world peace",), special_ids(tok))
    pieces, _ = run(det, encode(tok, "hello world"))
    assert det.text == "hello world"
    tail = det.flush()
    assert tail == "world"
    assert "".join(pieces) + tail == det.text


def test_flush_writes_an_unfinished_character_as_a_replacement(tok: PreTrainedTokenizerFast) -> None:
    ids = encode(tok, "ok 世")
    det = Detokenizer(tok, (), special_ids(tok))
    pieces, _ = run(det, ids[:-1])  # "世" is two tokens: stop after the first
    assert "".join(pieces) == "ok "
    assert det.flush() == "\ufffd"
    assert det.text == "ok \ufffd"


def test_earliest_stop_wins_and_stop_at_start(tok: PreTrainedTokenizerFast) -> None:
    det = Detokenizer(tok, ("here", "stop"), special_ids(tok))
    pieces, stopped = run(det, encode(tok, "Hello world, stop here"))
    assert stopped and det.text == "Hello world, " == "".join(pieces)
    det = Detokenizer(tok, ("Hello",), special_ids(tok))
    assert det.push(encode(tok, "Hello")[0]) == ("", True)
    assert det.text == ""


def test_special_tokens_give_their_text_but_are_not_output(tok: PreTrainedTokenizerFast) -> None:
    det = Detokenizer(tok, ("</s>",), special_ids(tok))
    pieces, _ = run(det, encode(tok, "Hi there"))
    assert det.push(tok.eos_token_id) == ("<|im_end|>", False)
    assert det.text == "Hi there" == "".join(pieces) + det.flush()


def test_resumed_detokenizer_continues_without_repeating(tok: PreTrainedTokenizerFast) -> None:
    text = "Answer: 世界 is held world pea and then world peace, done"
    ids = encode(tok, text)
    stop = ("world peace",)
    fresh = Detokenizer(tok, stop, special_ids(tok))
    pieces, _ = run(fresh, ids)
    assert len(pieces) < len(ids)  # stopped before the last token
    for k in range(len(pieces)):
        resumed = Detokenizer(tok, stop, special_ids(tok), generated=ids[:k])
        partial = Detokenizer(tok, stop, special_ids(tok))
        run(partial, ids[:k])
        assert resumed.text == partial.text
        rest, stopped = run(resumed, ids[k:])
        assert stopped
        assert rest == pieces[k:]
        assert resumed.text == fresh.text == "Answer: 世界 is held world pea and then "


@pytest.mark.parametrize("seed", range(6))
def test_random_tokens_keep_the_invariants(tok: PreTrainedTokenizerFast, seed: int) -> None:
    rng = random.Random(seed)
    # Byte tokens and CJK/emoji pieces mixed with words: many splits inside characters.
    pool = encode(tok, MIXED + " the stop of a story, stop!") + list(range(100, 400))
    ids = [rng.choice(pool) for _ in range(60)]
    full = tok.backend_tokenizer.decode(ids)
    stop = full[rng.randrange(len(full) // 2, len(full)) :][:3] if seed % 2 else "stop"
    det = Detokenizer(tok, (stop,), special_ids(tok))
    pieces, stopped = run(det, ids)
    out = "".join(pieces) + det.flush()
    assert out == det.text
    assert stop not in out
    expected = full[: full.find(stop)] if stop in full else full
    assert (stopped, out) == (stop in full, expected)


def test_token_text_is_cached(tok: PreTrainedTokenizerFast) -> None:
    token_id = encode(tok, " world")[0]
    assert token_text(tok, token_id) == " world"
    hits = token_text.cache_info().hits
    assert token_text(tok, token_id) == " world"
    assert token_text.cache_info().hits == hits + 1
    assert token_text(tok, tok.eos_token_id) == "<|im_end|>"


def test_included_stop_ends_the_text_released_with_its_last_token(tok: PreTrainedTokenizerFast) -> None:
    """TGI's behaviour (include_stop): the stop sequence is part of the output, nothing after it."""
    text = "Hello world, stop here and more"
    det = Detokenizer(tok, ("ld, st",), special_ids(tok), include_stop=True)
    pieces, stopped = run(det, encode(tok, text))
    assert stopped
    assert pieces == ["Hello", " wor", "", "ld, st"]  # held back, then out with the token that completes it
    assert det.text == "Hello world, st" == "".join(pieces)
    assert det.flush() == "" and det.push(encode(tok, " again")[0]) == ("", True)
    det = Detokenizer(tok, ("here", "stop"), special_ids(tok), include_stop=True)
    pieces, stopped = run(det, encode(tok, "Hello world, stop here"))
    assert stopped and det.text == "Hello world, stop" == "".join(pieces)
