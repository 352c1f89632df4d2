"""Shared fixtures: real Redis servers (the embedded valkey binary) on free ports, and the whole
service (api + worker as real processes) for end-to-end tests.

Two servers, so that no test wipes state a running service uses: `redis_server` is for the tests
that own their state for one test (the `redis` fixture flushes it before each); `services_redis`
holds the session- and module-scoped services (each under its own key prefix) and is never
flushed.

CONVEYOR_TEST_REDIS=cluster makes both a 3-node Redis Cluster on loopback
(conveyor/launcher/redis_cluster.py),
and every client of them a cluster client: the suite of tests/test_cluster.py (CLUSTER_MODULES) runs
so, in `make test` and alone with `make test-cluster`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch

from conveyor.launcher.redis_cluster import LocalCluster
from conveyor.launcher.redis_server import EmbeddedRedis, free_port
from tests.readiness import BIND_CONFLICT, answers, wait_until, without_polls

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("CONVEYOR_TEST_REDIS") == "cluster"
# Without a GPU the Triton attention kernels (conveyor/engine/attention/triton_kernels.py) run under
# Triton's CPU interpreter; it is chosen when a kernel is defined, so before anything imports them.
# With one they run compiled (tests/engine/test_attention_cuda.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def new_redis_server(data_dir: Path) -> EmbeddedRedis | LocalCluster:
    """A started server for the tests: one node, or a 3-node cluster under CONVEYOR_TEST_REDIS=cluster."""
    return LocalCluster(data_dir).start() if CLUSTER else EmbeddedRedis(data_dir).start()


def async_client(url: str):  # type: ignore[no-untyped-def]
    """An asyncio client of a test server, strings decoded (RedisCluster for a cluster's URL)."""
    from conveyor.jobqueue.client import make_client
    from conveyor.settings import Settings

    return make_client(Settings(redis_url=url, redis_cluster=CLUSTER), decode_responses=True)


def sync_client(url: str):  # type: ignore[no-untyped-def]
    """A blocking client of a test server, strings decoded (RedisCluster for a cluster's URL)."""
    from conveyor.jobqueue.client import make_sync_client
    from conveyor.settings import Settings

    return make_sync_client(Settings(redis_url=url, redis_cluster=CLUSTER), decode_responses=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The Redis of per-test state: flushed by `redis` before each test that asks for it; a
    long-lived service must not use it (see `services_redis`)."""
    server = new_redis_server(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def services_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The Redis of the services that outlive one test; nothing flushes it."""
    server = new_redis_server(tmp_path_factory.mktemp("services-redis"))
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_server: EmbeddedRedis):  # type: ignore[no-untyped-def]
    """An async client of `redis_server`, emptied first: the test starts from nothing."""
    client = async_client(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


@dataclass
class RunningService:
    """The api (`base_url`), engine workers `worker<i>` and webhook processes `webhooks<i>` as real
    processes under one key prefix; logs in `log_dir/<name>.log`."""

    base_url: str
    redis_url: str
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]]
    log_dir: Path
    metrics_ports: dict[str, int]  # worker name → its /metrics port
    starts: dict[str, int] = field(default_factory=dict)  # name → times started
    log_starts: dict[str, int] = field(default_factory=dict)  # name → its log's size when last started

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{without_polls(p.read_text())[-3000:]}"
                         for p in sorted(self.log_dir.glob("*.log")))

    def spawn(self, name: str) -> None:
        """Starts `name` (its role: the name without the number), picking its port only now: a port
        picked free can be taken by anyone until it is bound."""
        own: dict[str, str] = {}
        if name == "api":
            port = free_port()
            self.env["CONVEYOR_PORT"] = str(port)
            self.base_url = f"http://127.0.0.1:{port}"
        elif name in self.metrics_ports:
            self.metrics_ports[name] = free_port()
            own = {"CONVEYOR_WORKER_METRICS_PORT": str(self.metrics_ports[name])}
        else:
            own = {"CONVEYOR_WEBHOOK_METRICS_PORT": "0"}
        path = self.log_dir / f"{name}.log"
        self.log_starts[name] = path.stat().st_size if path.exists() else 0
        self.starts[name] = self.starts.get(name, 0) + 1
        log = open(path, "ab")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen([sys.executable, "-m", "conveyor", name.rstrip("0123456789")],
                                                env={**self.env, **own}, cwd=REPO, stdout=log, stderr=log)

    def respawn(self, name: str) -> bool:
        """Starts `name` again on another port when it exited because its port was taken (another
        process on the machine bound it between our pick and its bind); at most 3 times."""
        with open(self.log_dir / f"{name}.log", "rb") as log:
            log.seek(self.log_starts[name])
            conflict = BIND_CONFLICT.search(log.read().decode(errors="replace"))
        if not conflict or self.starts[name] >= 3:
            return False
        self.spawn(name)
        return True

    def workers_ready(self) -> int:
        """Workers with a live heartbeat, as the api's /ready counts them (0: none or no answer)."""
        try:
            answer = httpx.get(self.base_url + "/ready", timeout=5)
        except httpx.HTTPError:
            return 0
        return int(answer.json().get("workers") or 0) if answer.status_code == 200 else 0

    def wait_ready(self, workers: int = 1) -> None:
        """Until /ready counts `workers` live workers (theirs or others' on the same prefix)."""
        wait_until(lambda: self.workers_ready() >= workers, f"{workers} worker(s) ready (/ready)",
                   self.processes, self.logs, respawn=self.respawn)


def start_service(tmp: Path, redis_url: str, extra_env: dict[str, str] | None = None,
                  workers: int = 1, webhook_workers: int = 0) -> RunningService:
    """The api, `workers` engine workers and `webhook_workers` webhook delivery processes, under a
    key prefix of their own; returns once the api answers /health and, with workers, once /ready
    counts every one of them."""
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "CONVEYOR_KEY_PREFIX": f"test{uuid.uuid4().hex[:8]}",
        "CONVEYOR_KV_CACHE_MEMORY": "256MiB",
        "CONVEYOR_LOG_LEVEL": "info",
        **(extra_env or {}),
    }
    service = RunningService("", redis_url, env, {}, tmp, {f"worker{i}": 0 for i in range(workers)})
    try:
        for name in [*service.metrics_ports, *(f"webhooks{i}" for i in range(webhook_workers)), "api"]:
            service.spawn(name)
        wait_until(lambda: answers(service.base_url + "/health"), "the api answers /health",
                   service.processes, service.logs, respawn=service.respawn)
        if workers:
            service.wait_ready(workers)
    except BaseException:
        stop_service(service)
        raise
    return service


def stop_service(service: RunningService) -> None:
    for proc in service.processes.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in service.processes.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model, converted once into the shared cache (as `make run` does)."""
    from conveyor.engine.loader import resolve_model

    return resolve_model(None).path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A 2-layer random Llama with the default model's tokenizer: the whole engine path, fast."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_model_dir)


def write_tiny_llama(path: Path, tokenizer_dir: Path) -> Path:
    """The tiny random Llama into `path`, with the tokenizer files of `tokenizer_dir` (also used by
    benchmarks/redis_cost.py)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=49152, max_position_embeddings=4096)
    LlamaForCausalLM(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, path / name)
    return path


TWIN_TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}>> {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<<assistant>>{% endif %}")


def write_twin(path: Path, tiny_model_dir: Path) -> Path:
    """The tiny model with the same tokens numbered backwards (the special tokens keep theirs, so
    BOS/EOS ids hold) and another chat template."""
    import shutil

    shutil.copytree(tiny_model_dir, path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    first, vocab = len(tokenizer["added_tokens"]), tokenizer["model"]["vocab"]
    last = len(vocab) - 1
    tokenizer["model"]["vocab"] = {t: i if i < first else first + last - i for t, i in vocab.items()}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "chat_template.jinja").write_text(TWIN_TEMPLATE)
    return path


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
            default_model_dir: Path) -> Iterator[RunningService]:
    """api + one worker with the real default model."""
    running = start_service(tmp_path_factory.mktemp("service"), services_redis.url,
                            {"CONVEYOR_MODEL": str(default_model_dir)})
    yield running
    stop_service(running)
