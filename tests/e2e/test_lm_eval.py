"""lm-evaluation-harness against `conveyor serve` (default model), as a user runs it: a loglikelihood
task through `local-completions` (echo + logprobs, max_tokens 1) whose per-request loglikelihoods
equal the `hf` backend's on the same converted model, and a generative one through
`local-chat-completions`. lm-eval lives in its own virtualenv (`make lm-eval-venv`); without it the
test skips, except under CI=true, where it builds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conveyor.launcher.redis_server import free_port
from tests.e2e.test_serve import wait_serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-lmeval"
TASKS = ROOT / "tests" / "lmeval"
TOL = 1e-3


@pytest.fixture(scope="module")
def lm_eval() -> Path:
    exe = VENV / "bin" / "lm_eval"
    if not (VENV / ".installed").exists():
        if os.environ.get("CI") != "true":
            pytest.skip("lm-evaluation-harness's venv is absent: run `make lm-eval-venv`")
        subprocess.run(["make", "lm-eval-venv"], cwd=ROOT, check=True)
    return exe


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("lm-eval-serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log_path = tmp / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--port", str(port), "--data-dir", str(tmp),
             "--model", str(default_model_dir), "--kv-cache-memory", "256MiB"],
            env=env, stdout=log, stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(proc, base + "/ready", log_path)
        until_worker(base)
        yield base, httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
    finally:
        proc.terminate()
        proc.wait(60)


def until_worker(base: str, timeout: float = 300) -> None:
    """/ready answers before a worker is up (jobs would wait for it): wait for its heartbeat."""
    deadline = time.monotonic() + timeout
    while httpx.get(base + "/ready", timeout=10).json()["workers"] < 1:
        assert time.monotonic() < deadline, "no worker heartbeat"
        time.sleep(0.3)


def run(lm_eval: Path, out: Path, task: str, model: str, model_args: str, *extra: str) -> list[dict]:
    """One lm_eval run (from the repository root: the task's data file is relative to it), its
    `--log_samples` records in doc order."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(out / "datasets"),
               TOKENIZERS_PARALLELISM="false", OPENAI_API_KEY="none")
    cmd = [str(lm_eval), "--model", model, "--model_args", model_args, "--tasks", task,
           "--include_path", str(TASKS), "--output_path", str(out), "--log_samples", *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    [samples] = out.rglob(f"samples_{task}_*.jsonl")
    return sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda s: s["doc_id"])


def loglikelihoods(samples: list[dict]) -> list[float]:
    return [float(resp[0][0]) for s in samples for resp in s["resps"]]


def test_lm_eval_loglikelihoods_equal_hf_and_chat_generates(  # type: ignore[no-untyped-def]
        lm_eval, serve, default_model_dir, tmp_path) -> None:
    base, model_id = serve
    served = run(lm_eval, tmp_path / "conveyor", "conveyor_tiny_mc", "local-completions",
                 f"model={model_id},base_url={base}/v1/completions,tokenizer_backend=huggingface,"
                 f"tokenizer={default_model_dir},tokenized_requests=True,num_concurrent=4,max_retries=1")
    hf = run(lm_eval, tmp_path / "hf", "conveyor_tiny_mc", "hf",
             f"pretrained={default_model_dir},dtype=float32", "--device", "cpu", "--batch_size", "1")
    got, want = loglikelihoods(served), loglikelihoods(hf)
    assert len(got) == len(want) == 32  # 8 questions x 4 choices
    assert all(w < 0 for w in want)  # a wrong server answers 0.0 (the bug this test guards)
    diffs = [abs(g - w) for g, w in zip(got, want, strict=True)]
    assert max(diffs) <= TOL, list(zip(got, want, strict=True))
    assert [s["acc"] for s in served] == [s["acc"] for s in hf]

    chat = run(lm_eval, tmp_path / "chat", "conveyor_tiny_gen", "local-chat-completions",
               f"model={model_id},base_url={base}/v1/chat/completions,num_concurrent=4,max_retries=1",
               "--apply_chat_template")
    assert len(chat) == 4 and all(s["resps"][0][0].strip() for s in chat), chat
