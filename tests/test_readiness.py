"""tests/readiness.py: a wait for a process fails at once, with its log, when the process exits,
and a process stopped by a port conflict may be started again."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.readiness import BIND_CONFLICT, NotReady, wait_until, without_polls


def python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_an_exited_process_fails_the_wait_at_once_with_its_log() -> None:
    dead = python("raise SystemExit(3)")
    dead.wait(30)
    started = time.monotonic()
    with pytest.raises(NotReady, match=r"(?s)api exited with 3 while waiting for ready.*the api's log"):
        wait_until(lambda: False, "ready", {"api": dead}, lambda: "the api's log", timeout=300)
    assert time.monotonic() - started < 60  # not the bound: the exit ended it


def test_the_event_ends_the_wait_with_its_value() -> None:
    alive = python("import time; time.sleep(60)")
    try:
        answers = iter([None, 0, "ready"])
        assert wait_until(lambda: next(answers), "ready", {"api": alive}, lambda: "") == "ready"
    finally:
        alive.kill()
        alive.wait()


def test_a_respawned_process_is_waited_on_again() -> None:
    processes = {"api": python("raise SystemExit(1)")}
    processes["api"].wait(30)

    def respawn(name: str) -> bool:
        processes[name] = python("import time; time.sleep(60)")
        return True

    polls = iter(range(5))
    try:
        assert wait_until(lambda: next(polls) == 3, "ready", processes, lambda: "", respawn=respawn)
        assert processes["api"].poll() is None
    finally:
        processes["api"].kill()
        processes["api"].wait()


def test_the_bind_conflicts_of_uvicorn_valkey_and_our_metrics_are_recognised() -> None:
    for line in ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8080): "
                 "address already in use",
                 "conveyor: cannot serve /metrics on 127.0.0.1:9400 ([Errno 98] Address already in use)"):
        assert BIND_CONFLICT.search(line)
    assert not BIND_CONFLICT.search("conveyor worker: cannot reach Redis")


def test_a_log_tail_keeps_what_the_process_said_and_drops_our_polls() -> None:
    log = ('15:10:05 INFO  uvicorn.access: 127.0.0.1:49470 - "GET /ready HTTP/1.1" 503\n'
           "15:10:06 INFO  conveyor.engine.engine: KV cache: 364 blocks\n"
           '15:10:07 INFO  uvicorn.access: 127.0.0.1:49484 - "GET /health HTTP/1.1" 200\n')
    assert without_polls(log) == "15:10:06 INFO  conveyor.engine.engine: KV cache: 364 blocks\n"
