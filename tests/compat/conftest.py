"""The compatibility suite's service and its two kinds of verdict.

`conveyor serve` (the project's interpreter: CONVEYOR_PYTHON, as `make compat` sets it) runs the
default model on free ports with an embedded Redis in a temporary directory; the libraries under
test, installed in this client virtualenv only, talk to it as they would to OpenAI, vLLM or TGI.

A protocol error (a field a client cannot parse, a wrong finish_reason, call JSON in content) is a
failed assertion. What the small default model could not produce (no tool call under `auto`, junk
JSON under `json_object`) is `quality_miss`: an xfail with the reason, listed in the summary.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

# No network beyond loopback: LiteLLM reads its bundled cost map, the Agents SDK sends no traces.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_API_KEY", "unused")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MAX_TOKENS = 48  # every request names it: a chat without max_tokens may run to the context's end


def quality_miss(what: str) -> None:
    """The model, not the protocol: reported, not failed."""
    pytest.xfail(f"model quality: {what}")


def no_call_json(content: str | None) -> None:
    """OpenAI never answers a tool call as text: clients would take it for the final answer."""
    text = (content or "").lstrip()
    assert not text.startswith(("<tool_call>", '[{"name"', '{"name"')), f"call JSON in content: {content!r}"


@dataclass(frozen=True)
class Service:
    base_url: str
    model: str
    model_dir: Path

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _project_python() -> str:
    python = os.environ.get("CONVEYOR_PYTHON")
    if not python:
        pytest.exit("CONVEYOR_PYTHON: the project's interpreter (run `make compat`)", returncode=2)
    return python


@pytest.fixture(scope="session")
def conveyor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    python, tmp = _project_python(), tmp_path_factory.mktemp("conveyor")
    port = _free_port()
    env = {**os.environ, "CONVEYOR_PORT": str(port), "CONVEYOR_DATA_DIR": str(tmp),
           "CONVEYOR_WORKER_METRICS_PORT": "0", "CONVEYOR_WEBHOOK_METRICS_PORT": "0",
           "CONVEYOR_WEBHOOK_WORKERS": "1", "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_DRAIN_TIMEOUT": "5"}
    env.pop("REDIS_URL", None)
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed at the end of the session
    process = subprocess.Popen([python, "-m", "conveyor", "serve"], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # the first run converts the default model
        while True:
            if process.poll() is not None:
                pytest.exit(f"conveyor serve exited with {process.returncode}:\n"
                            f"{(tmp / 'serve.log').read_text()[-3000:]}", returncode=3)
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.exit("conveyor serve was not ready within 600 s", returncode=3)
            time.sleep(0.5)
        model = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        where = "from conveyor.engine.loader import resolve_model; print(resolve_model(None).path)"
        model_dir = subprocess.run([python, "-c", where], capture_output=True, text=True,
                                   check=True).stdout.strip()
        yield Service(base, model, Path(model_dir))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        if process.returncode not in (0, -signal.SIGTERM):
            print(f"conveyor serve ended with {process.returncode}", file=sys.stderr)
