"""Soak: 1,000 jobs through two workers with random lengths, sampling parameters, dialects and client
behaviours — stream, follow an async job's events, poll, wait on a sync answer, disconnect
mid-stream, cancel, repeat an Idempotency-Key, ask for a webhook — a bounded number at a time.
Then a table, and the zeros asserted: no job lost, no index missing or twice (client side and in
each job's event stream), no Redis key without a TTL beyond the documented ones, no KV block
still held."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from conveyor.webhooks.rq_keys import persistent_rq_keys
from conveyor.wire.job import RecordField
from tests.api.conftest import TERMINAL, until
from tests.faults.clients import afollow, events_url, headers
from tests.faults.conftest import Cluster, sim_workers
from tests.receiver import Receiver

pytestmark = [pytest.mark.faults, pytest.mark.slow]

JOBS = 1000
CONCURRENCY = 24  # clients at once (each waits for its job): under max_concurrent_requests
SEED = 20251201
SECRET = "whsec_" + base64.b64encode(b"the soak's webhook secret 32 B!!").decode()
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
         "quietly", "judge", "boxing", "matches", "near", "old", "harbours", "full", "of", "ships", "and"]
# What each behaviour's job may end as (a cancel or a disconnect can come after the last token).
BEHAVIOURS = {"stream": 18, "follow": 14, "poll": 18, "sync": 14, "disconnect": 10, "cancel": 12,
              "idempotent": 9, "webhook": 5}
EXPECTED = {"disconnect": {"cancelled", "succeeded"}, "cancel": {"cancelled", "succeeded"}}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """One per soak: its deliveries are counted against that soak's webhook jobs."""
    hooks = Receiver().start()
    yield hooks
    hooks.stop()


@pytest.fixture(scope="module", params=["model", "sim"])
def cluster(request, cluster_factory) -> Cluster:  # type: ignore[no-untyped-def]
    webhook_env = {"CONVEYOR_WEBHOOK_SECRETS": f"alice={SECRET}", "CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32"}
    # "sim": the same soak at a GPU's token rate (2 ms steps: the stream interval coalesces ~10)
    workers = sim_workers(2) if request.param == "sim" else None
    return cluster_factory(2, api_env=webhook_env, webhook_workers=1, worker_env=workers)


@dataclass
class Outcome:
    behaviour: str
    job_id: str | None = None
    problems: list[str] = field(default_factory=list)  # what the client saw that it must not
    refused: int = 0  # 429 / 503 answers (with Retry-After) before it got in


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))


def tgi_body(rng: random.Random, max_new: int) -> dict:
    p: dict = {"max_new_tokens": max_new}
    style = rng.random()
    if style < 0.35:
        pass  # greedy
    elif style < 0.8:
        p.update(do_sample=True, temperature=round(rng.uniform(0.3, 1.5), 2), seed=rng.randrange(2**31),
                 top_k=rng.choice([None, 5, 50]), top_p=rng.choice([None, 0.8, 0.95]))
    else:
        p.update(do_sample=True, repetition_penalty=1.3, typical_p=0.9, frequency_penalty=0.5)
    if rng.random() < 0.2:
        p["stop"] = rng.sample(WORDS, rng.randint(1, 4))
    if rng.random() < 0.15:
        p.update(details=True, top_n_tokens=rng.randint(1, 3))
    return {"inputs": prompt(rng), "parameters": {k: v for k, v in p.items() if v is not None}}


def chat_body(rng: random.Random, max_new: int) -> dict:
    body: dict = {"messages": [{"role": "user", "content": prompt(rng)}], "max_tokens": max_new,
                  "temperature": rng.choice([0, 0.7, 1.3]), "seed": rng.randrange(2**31)}
    if rng.random() < 0.3:
        body.update(top_p=0.9, presence_penalty=0.5, frequency_penalty=-0.5)
    if rng.random() < 0.2:
        body.update(logprobs=True, top_logprobs=2)
    if rng.random() < 0.2:
        body["stop"] = rng.choice(WORDS)
    return body


def completion_body(rng: random.Random, max_new: int) -> dict:
    text: object = prompt(rng) if rng.random() < 0.7 else [rng.randrange(100, 40000) for _ in range(8)]
    return {"prompt": text, "max_tokens": max_new, "temperature": rng.choice([0, 1.0]),
            "ignore_eos": rng.random() < 0.5}


def job_body(rng: random.Random, max_new: int) -> dict:
    return rng.choice([tgi_body, chat_body, completion_body])(rng, max_new)


async def admitted(outcome: Outcome, call: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    """The answer once admitted: an overloaded or unavailable api is asked again after Retry-After."""
    for _ in range(60):
        r = await call()
        if r.status_code not in (429, 503) or "retry-after" not in r.headers:
            return r
        outcome.refused += 1
        await asyncio.sleep(float(r.headers["retry-after"]))
    return r


class Soak:
    def __init__(self, c: Cluster, client: httpx.AsyncClient, receiver: Receiver) -> None:
        self.c, self.client, self.receiver = c, client, receiver

    async def run(self, behaviour: str, rng: random.Random) -> Outcome:
        outcome = Outcome(behaviour)
        try:
            await getattr(self, behaviour)(outcome, rng)
        except (httpx.HTTPError, AssertionError, KeyError, ValueError) as exc:
            outcome.problems.append(f"{type(exc).__name__}: {exc}")
        return outcome

    async def _submit(self, outcome: Outcome, body: dict, **extra: str) -> dict:
        r = await admitted(outcome, lambda: self.client.post("/v1/jobs", json=body, headers=extra or None))
        assert r.status_code == 202, f"submit: {r.status_code} {r.text[:200]}"
        outcome.job_id = r.json()["id"]
        return r.json()

    async def _poll(self, job_id: str) -> dict:
        deadline = time.monotonic() + 180
        while True:
            job = (await self.client.get(f"/v1/jobs/{job_id}")).json()
            if job["status"] in TERMINAL:
                return job
            assert time.monotonic() < deadline, f"job {job_id} still {job['status']}"
            await asyncio.sleep(0.1)

    async def stream(self, o: Outcome, rng: random.Random) -> None:
        tgi = rng.random() < 0.6
        max_new = rng.randint(1, 32)
        body = tgi_body(rng, max_new) if tgi else {**chat_body(rng, max_new), "stream": True}
        route = "/generate_stream" if tgi else "/v1/chat/completions"
        seen = await afollow(self.client, "POST", route, json_body=body)
        o.job_id = seen.job_id
        o.problems += seen.problems()
        if seen.end not in ("final", "done"):
            o.problems.append(f"the stream ended {seen.end}: {seen.events[-1:]}")

    async def follow(self, o: Outcome, rng: random.Random) -> None:
        job = await self._submit(o, job_body(rng, rng.randint(1, 32)))
        seen = await afollow(self.client, "GET", events_url("", job["id"]))
        o.problems += seen.problems()
        if seen.end != "final":
            o.problems.append(f"the events ended {seen.end}: {seen.events[-1:]}")

    async def poll(self, o: Outcome, rng: random.Random) -> None:
        job = await self._submit(o, job_body(rng, rng.randint(1, 32)))
        await self._poll(job["id"])

    async def sync(self, o: Outcome, rng: random.Random) -> None:
        route, body = rng.choice([("/generate", tgi_body), ("/v1/chat/completions", chat_body),
                                  ("/v1/completions", completion_body), ("/", tgi_body)])
        r = await admitted(o, lambda: self.client.post(route, json=body(rng, rng.randint(1, 32))))
        o.job_id = r.headers.get("x-job-id")
        assert r.status_code == 200, f"{route}: {r.status_code} {r.text[:200]}"

    async def disconnect(self, o: Outcome, rng: random.Random) -> None:
        body, leave_after = tgi_body(rng, rng.randint(20, 200)), rng.randint(1, 3)
        seen = await afollow(self.client, "POST", "/generate_stream", json_body=body, stop_after=leave_after)
        o.job_id = seen.job_id
        o.problems += [p for p in seen.problems() if "stream ended 'dropped'" not in p]

    async def cancel(self, o: Outcome, rng: random.Random) -> None:
        job = await self._submit(o, job_body(rng, rng.randint(10, 200)))
        await asyncio.sleep(rng.choice([0, 0.01, 0.05, 0.2]))
        r = await self.client.delete(f"/v1/jobs/{job['id']}")
        assert r.status_code in (200, 202), f"cancel: {r.status_code} {r.text[:200]}"

    async def idempotent(self, o: Outcome, rng: random.Random) -> None:
        body, key = job_body(rng, rng.randint(1, 32)), f"soak-{rng.randrange(2**63)}"
        first = await self._submit(o, body, **{"Idempotency-Key": key})
        for _ in range(rng.randint(1, 3)):
            r = await self.client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            replayed = (r.status_code, r.json()["id"], r.headers.get("idempotent-replayed"))
            assert replayed == (202, first["id"], "true"), replayed
        await self._poll(first["id"])

    async def webhook(self, o: Outcome, rng: random.Random) -> None:
        body = {**job_body(rng, rng.randint(1, 16)),
                "webhook": {"url": f"{self.receiver.url}/hook", "events": ["completed"]}}
        job = await self._submit(o, body)
        await self._poll(job["id"])


def event_problems(c: Cluster, job_id: str) -> list[str]:
    """A job's durable event stream: indices 0..n-1 once each, one final event, the last."""
    events = c.events(job_id)
    indices = [e.index for e in events]
    if indices != list(range(len(events))):
        return [f"job {job_id}: event indices {indices[:10]}…"]
    if not events or [e.final for e in events] != [False] * (len(events) - 1) + [True]:
        return [f"job {job_id}: {len(events)} events, final flags {[e.final for e in events][-3:]}"]
    return []


def untimed_keys(c: Cluster) -> list[str]:
    """Keys without a TTL that are neither the fleet's streams nor RQ's documented registries."""
    documented = {*c.keys.fleet_keys, *persistent_rq_keys(c.keys.webhook_queue)}
    with c.redis() as r:
        return sorted(k for k in r.scan_iter(count=1000)
                      if k not in documented and not c.keys.untimed(k) and r.ttl(k) == -1)


async def test_1000_jobs_lose_nothing(cluster: Cluster, receiver: Receiver,
                                      capsys: pytest.CaptureFixture) -> None:
    c = cluster
    rng = random.Random(SEED)
    plan = rng.choices(list(BEHAVIOURS), weights=list(BEHAVIOURS.values()), k=JOBS)
    limits = httpx.Limits(max_connections=CONCURRENCY * 2, max_keepalive_connections=CONCURRENCY)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=c.url, headers=headers(), timeout=120, limits=limits) as client:
        soak, gate = Soak(c, client, receiver), asyncio.Semaphore(CONCURRENCY)

        async def one(i: int, behaviour: str) -> Outcome:
            async with gate:
                return await soak.run(behaviour, random.Random(SEED * 7919 + i))

        outcomes = await asyncio.gather(*(one(i, b) for i, b in enumerate(plan)))
    clients_s = time.monotonic() - started

    problems = [f"{o.behaviour} {o.job_id}: {p}" for o in outcomes for p in o.problems]
    ids = {o.job_id for o in outcomes if o.job_id}
    problems += [f"{o.behaviour}: no job id" for o in outcomes if not o.job_id]
    records = {}
    for job_id in ids:
        try:
            records[job_id] = await asyncio.to_thread(c.wait_terminal, job_id, 120)
        except AssertionError:
            records[job_id] = c.record(job_id)
    statuses = {j: r.get(RecordField.STATUS, "missing") for j, r in records.items()}
    lost = sorted(j for j, s in statuses.items() if s not in TERMINAL)
    index_problems = [p for j in ids if j not in lost for p in event_problems(c, j)]
    unexpected = [f"{o.behaviour} {o.job_id} ended {statuses.get(o.job_id or '')}" for o in outcomes
                  if o.job_id and statuses.get(o.job_id) not in EXPECTED.get(o.behaviour, {"succeeded"})]
    hooks = [o.job_id for o in outcomes if o.behaviour == "webhook" and o.job_id]

    def delivered() -> int:
        return len({r.headers.get("webhook-id") for r in receiver.got("/hook")})

    with contextlib.suppress(AssertionError):  # reported in the table below
        until(lambda: delivered() >= len(hooks), f"{len(hooks)} webhooks delivered", 120)
    with contextlib.suppress(AssertionError):  # reported in the table below
        until(lambda: c.blocks_used() == 0, "KV blocks back to 0", 30)
    kv_blocks = c.blocks_used()
    untimed = untimed_keys(c)
    client_gaps = sum("indices" in p for p in problems)
    failures = Counter(f"{s}: {c.record(j).get(RecordField.RESULT, '')[:120]}" for j, s in statuses.items()
                       if s in ("failed", "expired"))
    by_status = Counter(statuses.values())
    table = [
        f"soak: {JOBS} clients ({', '.join(f'{b} {n}' for b, n in Counter(plan).most_common())}), "
        f"{CONCURRENCY} at a time, 2 workers, {clients_s:.1f}s",
        f"  {'submitted (jobs)':<44}{len(ids):>6}",
        f"  {'succeeded':<44}{by_status['succeeded']:>6}",
        f"  {'cancelled (cancel, disconnect)':<44}{by_status['cancelled']:>6}",
        f"  {'failed / expired':<44}{by_status['failed'] + by_status['expired']:>6}",
        *(f"    {n} × {reason}" for reason, n in failures.items()),
        f"  {'refused with Retry-After, then retried':<44}{sum(o.refused for o in outcomes):>6}",
        f"  {'webhooks delivered (distinct ids)':<44}{delivered():>6}",
        f"  {'lost (never terminal)':<44}{len(lost):>6}",
        f"  {'duplicate or missing indices':<44}{len(index_problems) + client_gaps:>6}",
        f"  {'ended otherwise than its client asked':<44}{len(unexpected):>6}",
        f"  {'client-side problems':<44}{len(problems):>6}",
        f"  {'keys without TTL beyond the documented ones':<44}{len(untimed):>6}",
        f"  {'KV blocks in use after':<44}{kv_blocks:>6}",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(table))
    warnings = [line for line in c.logs().splitlines() if "WARNING" in line or "ERROR" in line]
    found = [*problems, *index_problems, *unexpected, *untimed, *lost][:60]
    detail = "\n".join(table + found + warnings[-30:])
    assert (lost, index_problems, untimed, kv_blocks) == ([], [], [], 0), detail
    assert (problems, unexpected, len(ids), delivered()) == ([], [], JOBS, len(hooks)), detail
