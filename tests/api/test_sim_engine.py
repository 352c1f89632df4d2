"""The simulated engine through real processes: Redis, the api and a worker with `--engine sim`, over
HTTP. The tokens streamed equal the reference drawn from the documented rule
(tests/engine/sim_reference.py), stop sequences and max_new_tokens end jobs as with a model, and
/info names the device `sim`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.engine.loader import load_tokenizer
from conveyor.launcher.redis_server import EmbeddedRedis
from tests.api.sse import events
from tests.conftest import RunningService, start_service, stop_service
from tests.engine.sim_reference import reference, reference_vocab

PROMPT = "Plan the capacity of a fleet"


@pytest.fixture(scope="module")
def sim_service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                default_model_dir: Path) -> Iterator[RunningService]:
    running = start_service(tmp_path_factory.mktemp("sim"), services_redis.url, {
        "CONVEYOR_MODEL": str(default_model_dir),
        "CONVEYOR_ENGINE": "sim",
        # a 1 ms step: weights and prefill cost nothing, the K/V reads next to nothing
        "CONVEYOR_SIM_STEP_FIXED_MS": "1",
        "CONVEYOR_SIM_WEIGHT_GB": "0",
        "CONVEYOR_SIM_PREFILL_GFLOP_PER_TOKEN": "0",
    })
    yield running
    stop_service(running)


@pytest.fixture(scope="module")
def vocab(default_model_dir: Path) -> list[int]:
    return reference_vocab(load_tokenizer(default_model_dir))


def prompt_ids(service: RunningService) -> list[int]:
    r = httpx.post(service.base_url + "/tokenize", json={"inputs": PROMPT}, timeout=60)
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()]


def stream(service: RunningService, **parameters: object) -> list[dict]:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 24, **parameters}}
    with httpx.stream("POST", service.base_url + "/generate_stream", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [data for _, data in events(r)]


def test_the_streamed_tokens_are_the_rules(sim_service: RunningService, vocab: list[int]) -> None:
    streamed = stream(sim_service)
    assert [d["token"]["id"] for d in streamed] == reference(vocab, prompt_ids(sim_service), 24)
    assert streamed[-1]["details"]["finish_reason"] == "length"
    assert "".join(d["token"]["text"] for d in streamed) == streamed[-1]["generated_text"]
    # a seeded sampled request draws with its seed as the salt, again and again
    seeded = [d["token"]["id"] for d in stream(sim_service, do_sample=True, seed=7)]
    assert seeded == reference(vocab, prompt_ids(sim_service), 24, salt=7) != reference(
        vocab, prompt_ids(sim_service), 24)


def test_a_stop_sequence_ends_the_job(sim_service: RunningService, vocab: list[int]) -> None:
    tokenizer_texts = [d["token"]["text"] for d in stream(sim_service)]
    joined = "".join(tokenizer_texts)
    stop = next(t[-2:] for t in tokenizer_texts[8:] if len(t.strip()) >= 2)
    stopped = stream(sim_service, stop=[stop])
    assert stopped[-1]["details"]["finish_reason"] == "stop_sequence"
    assert stopped[-1]["generated_text"] == joined[: joined.find(stop) + len(stop)]
    assert len(stopped) < 24


def test_info_names_the_simulated_device(sim_service: RunningService) -> None:
    info = httpx.get(sim_service.base_url + "/info", timeout=60).json()
    assert (info["model_device_type"], info["model_dtype"]) == ("sim", "bfloat16"), info
