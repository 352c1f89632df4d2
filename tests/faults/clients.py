"""The fault suite's clients: SSE followed to its end (sync and asyncio) with what they saw, and
the few requests every module makes, as tenant alice of tests/api's keys."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from conveyor.wire.job import RecordField
from tests.api.conftest import auth

TENANT = "alice"

def headers(**extra: str) -> dict[str, str]:
    return {**auth(TENANT), **extra}


@dataclass
class Followed:
    """What one SSE client saw: (id, data) pairs and how the stream ended — `final` (the job's final
    event or TGI's last token), `done` (OpenAI's [DONE]), `error` (an error event), `dropped` (the
    client left), `closed` (the server closed without an end), `timeout`, `http <status>`, or
    `exception <type>`."""

    status: int = 0
    job_id: str | None = None
    events: list[tuple[int | None, dict]] = field(default_factory=list)
    end: str = ""
    body: str = ""
    _id: int | None = None
    _kind: str = ""

    def feed(self, line: str, stop_after: int | None = None) -> bool:
        """One line of the stream; True once the stream has ended (or the client leaves)."""
        if line.startswith("id:"):
            self._id = int(line[3:].strip())
        elif line.startswith("event:"):
            self._kind = line[6:].strip()
        elif line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                self.end = "done"
                return True
            data = json.loads(payload)
            self.events.append((self._id, data))
            kind, self._id, self._kind = self._kind, None, ""
            if kind == "error" or "error" in data:
                self.end = "error"
            elif data.get("final") or data.get("generated_text") is not None:
                self.end = "final"
            elif stop_after is not None and len(self.events) >= stop_after:
                self.end = "dropped"
            return bool(self.end)
        return False

    def indices(self) -> list[int]:
        return [i if i is not None else int(d.get("index", -1)) for i, d in self.events
                if "error" not in d and "choices" not in d]

    def problems(self, start: int = 0) -> list[str]:
        """Gaps or duplicates in the indices, or an end that is neither the end nor an error."""
        out = []
        indices = self.indices()
        if indices != list(range(start, start + len(indices))):
            out.append(f"indices {indices[:5]}…{indices[-5:]} are not {start}..{start + len(indices) - 1}")
        if self.end not in ("final", "done", "error"):
            out.append(f"stream ended {self.end!r} after {len(self.events)} events {self.body[:300]}")
        return out


SSE_TIMEOUT = httpx.Timeout(30, read=60)  # a keep-alive comes every 15 s: 60 s of silence is a hang


def follow(method: str, url: str, *, json_body: Any = None, extra_headers: dict[str, str] | None = None,
           stop_after: int | None = None, timeout: float = 180, into: Followed | None = None) -> Followed:
    """One SSE client, to the end of the stream (or `stop_after` events), within `timeout` overall:
    keep-alives alone never count as progress. `into` fills a Followed another thread can watch."""
    seen = into if into is not None else Followed()
    deadline = time.monotonic() + timeout
    try:
        with httpx.stream(method, url, json=json_body, headers=headers(**(extra_headers or {})),
                          timeout=SSE_TIMEOUT) as r:
            seen.status, seen.job_id = r.status_code, r.headers.get("x-job-id")
            if r.status_code != 200:
                seen.body, seen.end = r.read().decode(errors="replace"), f"http {r.status_code}"
                return seen
            for line in r.iter_lines():
                if seen.feed(line, stop_after):
                    return seen
                if time.monotonic() > deadline:
                    seen.end = "timeout"
                    return seen
            seen.end = "closed"
    except httpx.HTTPError as exc:
        seen.end = f"exception {type(exc).__name__}: {exc}"
    return seen


async def afollow(client: httpx.AsyncClient, method: str, url: str, *, json_body: Any = None,
                  stop_after: int | None = None, timeout: float = 180) -> Followed:
    """`follow` for an asyncio client (the soak's many concurrent ones)."""
    seen = Followed()
    deadline = time.monotonic() + timeout
    try:
        async with client.stream(method, url, json=json_body, timeout=SSE_TIMEOUT) as r:
            seen.status, seen.job_id = r.status_code, r.headers.get("x-job-id")
            if r.status_code != 200:
                seen.body, seen.end = (await r.aread()).decode(errors="replace"), f"http {r.status_code}"
                return seen
            async for line in r.aiter_lines():
                if seen.feed(line, stop_after):
                    return seen
                if time.monotonic() > deadline:
                    seen.end = "timeout"
                    return seen
            seen.end = "closed"
    except httpx.HTTPError as exc:
        seen.end = f"exception {type(exc).__name__}: {exc}"
    return seen


def submit(base_url: str, body: dict, **extra: str) -> httpx.Response:
    return httpx.post(base_url + "/v1/jobs", json=body, headers=headers(**extra), timeout=60)


def events_url(base_url: str, job_id: str | None) -> str:
    return f"{base_url}/v1/jobs/{job_id}/events"


def text_of(followed: Followed) -> str:
    """The concatenated token texts of a job-events or TGI stream."""
    return "".join(d["token"]["text"] for _i, d in followed.events if d.get("token"))


def result_text(record: dict[str, str]) -> str:
    return json.loads(record[RecordField.RESULT])["generated_text"]
