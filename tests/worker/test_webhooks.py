"""Webhooks end to end: an engine worker (this process, tiny model) enqueues, two real webhook
processes (`conveyor webhooks`: RQ SimpleWorkers with RQ's scheduler) deliver to a real receiver on
loopback. Retry schedule 1 s, 1 s (three attempts)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from conveyor.launcher.redis_server import free_port
from conveyor.webhooks.signing import sign
from conveyor.wire.job import JobStatus, RecordField, Webhook, WebhookDelivery
from tests.readiness import answers, wait_until
from tests.receiver import Receiver
from tests.worker.conftest import REPO, new_spec

SECRET = "whsec_" + base64.b64encode(b"alice-secret-0123456789abcdef").decode()
PROMPT = [101, 2024, 318, 257]


@dataclass
class Hooks:
    receiver: Receiver
    procs: list[subprocess.Popen[bytes]]
    metrics_ports: list[int]
    log_dir: Path

    def logs(self) -> str:
        files = sorted(self.log_dir.glob("hooks*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in files)

    def scrape(self) -> dict[str, float]:
        """Samples of every webhook process, summed by name{labels}."""
        out: dict[str, float] = {}
        for port in self.metrics_ports:
            for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = out.get(name, 0.0) + float(value)
        return out


@pytest.fixture
async def hooks(local, redis_server, tmp_path: Path) -> AsyncIterator[Hooks]:  # type: ignore[no-untyped-def]
    receiver = Receiver().start()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")},
        "REDIS_URL": redis_server.url,
        "CONVEYOR_KEY_PREFIX": local.keys.prefix,
        "CONVEYOR_WEBHOOK_SECRETS": f"alice={SECRET}",
        "CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32",
        "CONVEYOR_WEBHOOK_RETRY_SCHEDULE": "1,1",
        "CONVEYOR_LOG_FORMAT": "json",
    }
    running = Hooks(receiver, [], [], tmp_path)
    for i in range(2):
        port = free_port()  # picked just before the process binds it
        log = open(tmp_path / f"hooks{i}.log", "wb")  # noqa: SIM115 - closed with the process
        running.procs.append(subprocess.Popen([sys.executable, "-m", "conveyor", "webhooks"], cwd=REPO,
                                              env={**env, "CONVEYOR_WEBHOOK_METRICS_PORT": str(port)},
                                              stdout=log, stderr=log))
        running.metrics_ports.append(port)
    procs = running.procs
    await asyncio.to_thread(
        wait_until, lambda: all(answers(f"http://127.0.0.1:{p}/metrics") for p in running.metrics_ports),
        "both webhook processes serve /metrics", {f"hooks{i}": p for i, p in enumerate(procs)}, running.logs)
    yield running
    receiver.released.set()  # a held request returns, so RQ's warm shutdown ends its job at once
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    receiver.stop()


async def _delivery(local, job_id: str, field: RecordField, state: str,  # type: ignore[no-untyped-def]
                    timeout: float = 60) -> WebhookDelivery:
    deadline = time.monotonic() + timeout
    while True:
        raw = (await local.record(job_id)).get(field)
        if raw and (delivery := WebhookDelivery.model_validate_json(raw)).state == state:
            return delivery
        assert time.monotonic() < deadline, f"{field}: {raw}"
        await asyncio.sleep(0.05)


async def test_retried_until_delivered_with_one_id_and_a_valid_signature(local, hooks) -> None:  # type: ignore[no-untyped-def]
    receiver = hooks.receiver
    receiver.script("/done", 500, 500, 200)
    receiver.script("/started", 410)  # gone: never tried again
    hook = Webhook(url=receiver.url + "/done", events=["completed"])
    async with local.worker():
        job_id = await local.submit(new_spec(PROMPT, max_new_tokens=6, tenant="alice", webhook=hook))
        started = await local.submit(new_spec(PROMPT, max_new_tokens=2, tenant="alice", webhook=Webhook(
            url=receiver.url + "/started", events=["started"])))
        result = await local.result(job_id)
        requests = await receiver.wait_for("/done", 3)
        delivery = await _delivery(local, job_id, RecordField.WEBHOOK_COMPLETED, "delivered")
        gone = await _delivery(local, started, RecordField.WEBHOOK_STARTED, "gone")

    assert result.status is JobStatus.SUCCEEDED
    assert {r.headers["webhook-id"] for r in requests} == {f"msg_{job_id}_completed"}
    assert len({r.body for r in requests}) == 1  # the same message each time
    for request in requests:  # each attempt signed afresh, each verifies with alice's secret
        payload = Verifier(SECRET).verify(request.body, request.headers)
        assert payload["type"] == "job.completed" and payload["data"]["id"] == job_id
        assert payload["data"]["status"] == "succeeded"
        assert payload["data"]["result"]["usage"]["completion_tokens"] == 6
    body, headers = requests[-1].body, requests[-1].headers
    with pytest.raises(WebhookVerificationError):
        Verifier(SECRET).verify(body.replace(b"succeeded", b"failed"), headers)
    stale = {**headers, **sign(SECRET, headers["webhook-id"], int(time.time()) - 600, body.decode())}
    with pytest.raises(WebhookVerificationError, match="too old"):
        Verifier(SECRET).verify(body, stale)

    assert [a.status_code for a in delivery.attempts] == [500, 500, 200]
    assert [a.attempt for a in delivery.attempts] == [1, 2, 3]
    assert delivery.attempts[0].at < delivery.attempts[1].at < delivery.attempts[2].at
    assert [a.status_code for a in gone.attempts] == [410] and len(receiver.got("/started")) == 1

    samples = hooks.scrape()
    assert samples['conveyor_webhook_deliveries_total{event="completed",outcome="retrying"}'] == 2
    assert samples['conveyor_webhook_deliveries_total{event="completed",outcome="delivered"}'] == 1
    assert samples['conveyor_webhook_deliveries_total{event="started",outcome="gone"}'] == 1
    lines = [json.loads(line) for p in hooks.log_dir.glob("hooks*.log")
             for line in p.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("job_id") == job_id and line.get("webhook_id") == f"msg_{job_id}_completed"
               and line["role"] == "webhooks" for line in lines), hooks.logs()


async def test_a_receiver_that_sleeps_delays_neither_generation_nor_other_deliveries(local, hooks) -> None:  # type: ignore[no-untyped-def]
    receiver = hooks.receiver
    receiver.hold("/slow", 30)  # answers after 30 s (or when the test ends)
    slow = Webhook(url=receiver.url + "/slow", events=["completed"])
    fast = Webhook(url=receiver.url + "/fast", events=["completed"])
    async with local.worker():
        slow_id = await local.submit(new_spec(PROMPT, max_new_tokens=4, tenant="alice", webhook=slow))
        await local.result(slow_id)
        await receiver.wait_for("/slow", 1)  # one webhook process is now stuck in that request
        others = [await local.submit(new_spec(PROMPT, max_new_tokens=16, tenant="alice",
                                              webhook=fast if i == 0 else None)) for i in range(3)]
        results = [await local.result(job_id, timeout=20) for job_id in others]
        [delivered] = await receiver.wait_for("/fast", 1, timeout=20)
        slow_record = await local.record(slow_id)

    assert all(r.status is JobStatus.SUCCEEDED for r in results)
    assert receiver.in_progress["/slow"] == 1  # still sleeping while the others finished and were told
    # The slow attempt has not even timed out yet (10 s): nothing recorded for it so far.
    assert RecordField.WEBHOOK_COMPLETED not in slow_record
    assert delivered.headers["webhook-id"] == f"msg_{others[0]}_completed"
