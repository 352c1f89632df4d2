"""The load generator's pure parts: seeded exact-length workloads, arrival schedules, percentiles,
SLO parsing and goodput (no server)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from conveyor.bench.arrival import schedule
from conveyor.bench.metrics import meets, parse_slo, percentile, summarize
from conveyor.bench.record import Record
from conveyor.bench.workloads import (
    SENTENCES,
    HFTokenizer,
    copy_workload,
    jsonl_workload,
    parse_length,
    random_workload,
    stream_client_workload,
)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> HFTokenizer:
    return HFTokenizer(tiny_model_dir)


def test_random_prompts_are_seeded_and_reencode_to_their_exact_length(tok: HFTokenizer) -> None:
    a = random_workload(tok, 8, "17-40", "5-9", seed=3)
    assert a == random_workload(tok, 8, "17-40", "5-9", seed=3)
    assert a != random_workload(tok, 8, "17-40", "5-9", seed=4)
    lengths = {r.prompt_len for r in a}
    assert len(lengths) > 1 and all(17 <= n <= 40 for n in lengths)
    for r in a:
        assert isinstance(r.prompt, str) and len(tok.encode(r.prompt)) == r.prompt_len
        assert 5 <= r.output_len <= 9


def test_fixed_lengths_and_token_id_prompts(tok: HFTokenizer) -> None:
    reqs = random_workload(tok, 4, 32, 16, as_ids=True)
    assert [len(r.prompt) for r in reqs] == [32] * 4 and {r.output_len for r in reqs} == {16}
    assert not set().union(*map(set, (r.prompt for r in reqs))) & tok.special_ids


def test_shared_prefix_prompts_start_alike(tok: HFTokenizer) -> None:
    reqs = random_workload(tok, 3, 20, 4, prefix_len=24, as_ids=True)
    assert all(len(r.prompt) == 44 for r in reqs)
    assert reqs[0].prompt[:20] == reqs[1].prompt[:20] == reqs[2].prompt[:20]
    assert reqs[0].prompt[24:] != reqs[1].prompt[24:]


def test_copy_prompts_hold_documents_of_known_sentences_at_least_their_length(tok: HFTokenizer) -> None:
    reqs = copy_workload(tok, 6, "64-128", 96, seed=3)
    assert reqs == copy_workload(tok, 6, "64-128", 96, seed=3)  # seeded
    assert reqs != copy_workload(tok, 6, "64-128", 96, seed=4)
    for req in reqs:
        assert isinstance(req.prompt, str) and req.output_len == 96
        assert 64 <= req.prompt_len == len(tok.encode(req.prompt)) < 128 + 40  # + at most one sentence
        head, document = req.prompt.split("\n\n", 1)
        assert "word for word" in head
        rest = document
        for _ in range(len(document)):  # every word of the document is one of the sentences'
            rest = rest.lstrip()
            if not rest:
                break
            sentence = next(s for s in SENTENCES if rest.startswith(s))
            rest = rest[len(sentence):]
        assert rest == ""


def test_stream_client_workload_follows_its_recipe() -> None:
    # the recipe of the module's docstring, written out: all lengths first, then the ids
    rng = random.Random(0)
    lens = [(rng.randint(32, 512), rng.randint(16, 256)) for _ in range(16)]
    prompts = [([rng.randrange(100, 1000 - 100) for _ in range(li)], lo) for li, lo in lens]
    ours = stream_client_workload(1000, 16, mixed=True)
    assert [(r.prompt, r.output_len) for r in ours] == prompts
    assert all(r.prompt_len == len(r.prompt) for r in ours)
    assert len({r.prompt_len for r in ours}) > 1 and all(32 <= r.prompt_len <= 512 for r in ours)
    fixed = stream_client_workload(1000, 3, mixed=False, input_len=7, output_len=5, seed=1)
    assert [(len(r.prompt), r.output_len) for r in fixed] == [(7, 5)] * 3
    assert fixed != stream_client_workload(1000, 3, mixed=False, input_len=7, output_len=5, seed=2)


def test_jsonl_prompts_and_chats(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "max_tokens": 3}) + "\n\n"
                    + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n")
    reqs = jsonl_workload(path, 3, "7")
    assert [r.output_len for r in reqs] == [3, 7, 3]
    assert reqs[1].messages == [{"role": "user", "content": "yo"}] and reqs[2].prompt == "hi"


@pytest.mark.parametrize("bad", ["0", "9-3", "x", "1-"])
def test_bad_lengths_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="LOW"):
        parse_length(bad)


def test_arrival_schedules() -> None:
    assert schedule(3, math.inf) == [0.0, 0.0, 0.0]
    assert schedule(4, 2.0, "fixed") == [0.0, 0.5, 1.0, 1.5]
    poisson = schedule(2000, 4.0, "poisson", seed=1)
    assert poisson == schedule(2000, 4.0, "poisson", seed=1) != schedule(2000, 4.0, "poisson", seed=2)
    gaps = np.diff(poisson)
    assert all(gaps >= 0) and 0.23 < gaps.mean() < 0.27  # mean gap 1/rate
    assert 0.9 < gaps.std() / gaps.mean() < 1.1  # exponential: std = mean (fixed: 0)
    with pytest.raises(ValueError):
        schedule(3, 0.0)


def test_percentiles_interpolate_as_numpy() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert math.isnan(percentile([], 50))


def test_slo_parsing() -> None:
    assert parse_slo("ttft=2s,tpot=200ms") == {"ttft": 2.0, "tpot": pytest.approx(0.2)}
    assert parse_slo("e2el=1500") == {"e2el": 1.5}  # bare: ms, as vLLM's --goodput
    assert parse_slo(None) == {}
    for bad in ("ttft=2h", "itl=3s", "ttft"):
        with pytest.raises(ValueError, match="ttft=2s"):
            parse_slo(bad)


def record(ttft: float, e2e: float, tokens: int, ok: bool = True) -> Record:
    r = Record(ok=ok, ttft=ttft, e2e=e2e, output_tokens=tokens, prompt_tokens=10)
    if not ok:
        r.error = "http_429"
    return r


def test_goodput_counts_requests_meeting_every_slo() -> None:
    slo = parse_slo("ttft=2s,tpot=200ms")
    good = record(1.0, 1.0 + 0.1 * 9, 10)  # TPOT 100 ms
    slow_tokens = record(1.0, 1.0 + 0.3 * 9, 10)  # TPOT 300 ms
    late = record(3.0, 3.5, 10)
    failed = record(0.1, 0.2, 10, ok=False)
    assert [meets(r, slo) for r in (good, slow_tokens, late, failed)] == [True, False, False, False]
    s = summarize([good, slow_tokens, late, failed], duration_s=2.0, slo=slo, client_cpu_s=0.4)
    assert s["goodput"] == 0.5 and s["good_requests"] == 1
    assert s["completed"] == 3 and s["errors"] == {"http_429": 1}
    assert s["output_throughput"] == 15.0 and s["total_token_throughput"] == 30.0
    assert s["client_cpu_ms_per_request"] == 100.0
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0)
