"""The console in headless Chromium against a real api and worker: sign in, the overview's live
worker, a playground request streaming into the page, a job's page streaming its tokens and a cancel
ending it, tenants kept apart, the dead-letter page for operators only, and a service of several
models: each model's queue and workers, and the playground's model picker. Each page is saved as a
screenshot (under docs/console/, which the README and docs/console.md show, with
CONVEYOR_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.launcher.redis_server import EmbeddedRedis
from conveyor.wire.heartbeat import WorkerInfo
from tests.api.conftest import keys_of, redis_of, until
from tests.conftest import RunningService, start_service, stop_service, write_twin
from tests.console.conftest import SHOTS, dead_letter, job_view, key_of, wait_ended

CSS = "css selector"


def sign_in(browser: Any, service: RunningService, tenant: str, page: str = "overview") -> None:
    """Through the sign-in form, as a person would (the key lands in sessionStorage only)."""
    browser.get(f"{service.base_url}/console#/{page}")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()  # (a new hash alone would not load the page again)
    field = until(lambda: browser.find_elements(CSS, "[data-testid=api-key]"), "the sign-in form")[0]
    field.send_keys(key_of(tenant))
    browser.find_element(CSS, "[data-testid=sign-in]").click()
    until(lambda: f"tenant {tenant}" in text(browser, "#who"), f"signed in as {tenant}")
    assert key_of(tenant) not in browser.current_url


def go(browser: Any, service: RunningService, page: str) -> None:
    browser.execute_script("location.hash = arguments[0]", f"#/{page}")


def texts(browser: Any, selector: str) -> list[str]:
    """The rendered text of every match, read in one step (the overview re-renders under a test)."""
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)", selector)


def text(browser: Any, selector: str) -> str | None:
    found = texts(browser, selector)
    return found[0] if found else None


def shot(browser: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / name))


def submit(service: RunningService, tenant: str, max_tokens: int, content: str = "Tell me a story") -> str:
    answer = httpx.post(f"{service.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key_of(tenant)}"},
                        json={"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                              "ignore_eos": True}, timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def test_overview_shows_the_live_worker(browser: Any, console_service: RunningService) -> None:
    for _ in range(3):  # something for the per-minute chart
        wait_ended(console_service, submit(console_service, "alice", 24))
    with redis_of(console_service) as redis:
        [key] = list(redis.scan_iter(match=keys_of(console_service).workers_pattern))
        worker = WorkerInfo.model_validate_json(redis.get(key))
    sign_in(browser, console_service, "alice")
    row = f"[data-testid=worker][data-worker='{worker.id}']"
    first_seen = until(lambda: text(browser, row), "the worker's row")
    assert worker.host in first_seen and "live" in first_seen and "s ago" in first_seen
    assert text(browser, "[data-testid=workers]") == "1"
    until(lambda: int(text(browser, "[data-testid=succeeded]") or 0) >= 3, "3 jobs counted")
    # It refreshes by itself, without a reload.
    updated = text(browser, "[data-testid=updated]")
    until(lambda: text(browser, "[data-testid=updated]") not in (None, updated), "a refresh")
    assert text(browser, row)
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
    assert not browser.find_element(CSS, "#nav-dead-letters").get_attribute("hidden")  # alice: an operator
    shot(browser, "overview.png")


def test_playground_streams_tokens_into_the_page(browser: Any, console_service: RunningService) -> None:
    sign_in(browser, console_service, "alice", "playground")
    prompt = until(lambda: browser.find_elements(CSS, "[data-testid=prompt]"), "the playground")[0]
    prompt.clear()
    prompt.send_keys("Count from one to twenty.")
    tokens = browser.find_element(CSS, "[data-testid=max-tokens]")
    tokens.clear()
    tokens.send_keys("200")
    browser.find_element(CSS, "[data-testid=ignore-eos]").click()
    # Watch the output: text must show while the request is still streaming, not only at the end.
    browser.execute_script("""
        window.seen = [];
        const out = document.querySelector('[data-testid=output]');
        new MutationObserver(() => {
          const state = document.querySelector('[data-testid=state]');
          window.seen.push([out.textContent.length, state ? state.textContent : '']);
        }).observe(out, {childList: true, characterData: true, subtree: true});""")
    curl = text(browser, "[data-testid=curl]")
    assert curl.startswith("curl -N ") and "/v1/chat/completions" in curl and '"max_tokens":200' in curl
    assert "$CONVEYOR_API_KEY" in curl and key_of("alice") not in curl
    browser.find_element(CSS, "[data-testid=send]").click()
    until(lambda: text(browser, "[data-testid=state]") == "done", "the stream's end")
    assert text(browser, "[data-testid=tokens-count]") == "200"
    assert text(browser, "[data-testid=finish]") == "length"
    assert text(browser, "[data-testid=ttft]").endswith(" ms")
    assert float(text(browser, "[data-testid=tokens-per-s]") or 0) > 0
    seen = browser.execute_script("return window.seen")
    streaming = [length for length, state in seen if length > 0 and state in ("waiting", "streaming")]
    assert len(streaming) > 10, seen[:20]  # appended token by token while the stream was open
    assert text(browser, "[data-testid=output]")
    shot(browser, "playground.png")


def test_a_jobs_page_streams_its_tokens_and_cancel_ends_it(browser: Any,
                                                            console_service: RunningService) -> None:
    job_id = submit(console_service, "alice", 7900, "Write a very long story")
    sign_in(browser, console_service, "alice", f"jobs/{job_id}")
    until(lambda: int(text(browser, "[data-testid=token-count]") or 0) > 5, "tokens in the page")
    assert text(browser, "[data-testid=tokens]")
    assert text(browser, "[data-testid=job-status]") == "running", text(browser, "main")
    browser.find_element(CSS, "[data-testid=cancel]").click()
    until(lambda: text(browser, "[data-testid=job-status]") == "cancelled", "cancelled")
    until(lambda: text(browser, "[data-testid=stream-state]") == "ended", "the stream ended")
    view = job_view(console_service, job_id)
    assert view["status"] == "cancelled" and view["result"]["usage"]["completion_tokens"] < 7900
    shown = int(text(browser, "[data-testid=token-count]") or 0)
    assert shown == view["result"]["usage"]["completion_tokens"]
    assert text(browser, "[data-testid=finish-reason]") == "cancelled"
    shot(browser, "job.png")
    # The list: newest first, filtered by status.
    go(browser, console_service, "jobs")
    until(lambda: browser.find_elements(CSS, "[data-testid=job]"), "the job list")
    assert browser.find_elements(CSS, "[data-testid=job]")[0].get_attribute("data-job") == job_id
    filter_ = browser.find_element(CSS, "[data-testid=status-filter]")
    filter_.find_element(CSS, "option[value=succeeded]").click()
    until(lambda: all("succeeded" in t for t in texts(browser, "[data-testid=job]"))
          and job_id not in text(browser, "main"), "only succeeded jobs")
    filter_.find_element(CSS, "option[value=cancelled]").click()
    until(lambda: job_id in text(browser, "main"), "the cancelled job listed")
    filter_.find_element(CSS, "option[value='']").click()
    until(lambda: len(browser.find_elements(CSS, "[data-testid=job]")) > 1, "all jobs again")
    shot(browser, "jobs.png")


def test_another_tenant_does_not_see_the_job(browser: Any, console_service: RunningService) -> None:
    job_id = submit(console_service, "alice", 4)
    wait_ended(console_service, job_id)
    sign_in(browser, console_service, "bob", "jobs")
    until(lambda: browser.find_elements(CSS, "[data-testid=job], [data-testid=no-jobs]"), "bob's job list")
    assert job_id not in text(browser, "main")
    go(browser, console_service, f"jobs/{job_id}")
    error = until(lambda: browser.find_elements(CSS, "[data-testid=error]"), "bob's answer to alice's job")[0]
    assert "no job" in error.text
    assert not text(browser, "[data-testid=tokens]")


def test_the_dead_letter_page_is_for_operators_only(browser: Any, console_service: RunningService) -> None:
    entry_id, job_id = dead_letter(console_service, reason="delivered 4 times (max_attempts=3): each "
                                   "worker that ran it stopped before finishing it")
    sign_in(browser, console_service, "bob", "dead-letters")
    notice = until(lambda: browser.find_elements(CSS, "[data-testid=forbidden]"), "bob's refusal")[0]
    assert "Operators only" in notice.text and "admin_tenants" in notice.text
    assert not browser.find_elements(CSS, "[data-testid=dead-letter]")
    assert browser.find_element(CSS, "#nav-dead-letters").get_attribute("hidden") is not None
    assert entry_id not in text(browser, "main")

    sign_in(browser, console_service, "alice", "dead-letters")
    row = f"[data-testid=dead-letter][data-entry='{entry_id}']"
    shown = until(lambda: text(browser, row), "alice sees the entry")
    assert "max_attempts=3" in shown
    assert browser.find_element(CSS, row).get_attribute("data-job") == job_id
    other, _ = dead_letter(console_service, reason="the job's event stream lost tokens (was "
                           "event_stream_maxlen lowered below max_total_tokens?), so it cannot be resumed")
    browser.refresh()
    until(lambda: len(browser.find_elements(CSS, "[data-testid=dead-letter]")) >= 2, "both entries")
    shot(browser, "dead-letters.png")
    browser.find_element(CSS, f"[data-entry='{entry_id}'] [data-testid=requeue]").click()
    until(lambda: f"Requeued job {job_id}" in text(browser, "main"), "the requeue notice")
    assert wait_ended(console_service, job_id)["status"] == "succeeded"
    browser.find_element(CSS, f"[data-entry='{other}'] [data-testid=delete]").click()
    browser.switch_to.alert.accept()  # "Delete dead-letter entry …?"
    until(lambda: f"Deleted entry {other}" in text(browser, "main"), "the delete notice")
    # The list is drawn again after the notice: wait for it rather than read it mid-redraw.
    until(lambda: not browser.find_elements(CSS, f"[data-entry='{other}'], [data-entry='{entry_id}']"),
          "both entries gone from the page")


@pytest.fixture(scope="module")
def models_console(tmp_path_factory: pytest.TempPathFactory, services_redis: EmbeddedRedis,
                   tiny_model_dir: Path) -> Iterator[RunningService]:
    """Three models, no API keys: `tiny` (the default) and `idle` with no worker, `twin` (alias
    `fast`, another vocabulary) with one."""
    twin = write_twin(tmp_path_factory.mktemp("twin") / "twin", tiny_model_dir)
    running = start_service(tmp_path_factory.mktemp("console-models"), services_redis.url, {
        "CONVEYOR_MODEL": str(tiny_model_dir), "CONVEYOR_SERVED_MODEL_NAME": "tiny",
        "CONVEYOR_MODELS": f"twin={twin},idle={twin}", "CONVEYOR_MODEL_ALIASES": "fast=twin",
        "CONVEYOR_KV_CACHE_MEMORY": "16MiB", "CONVEYOR_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_JOB_LEASE_MS": "2000", "OMP_NUM_THREADS": "1",
    }, workers=0)
    try:
        running.metrics_ports["worker0"] = 0
        running.env["CONVEYOR_WORKER_MODEL"] = "twin"
        running.spawn("worker0")
        running.wait_ready(1)
    except BaseException:
        stop_service(running)
        raise
    yield running
    stop_service(running)


def test_the_console_shows_each_model(browser: Any, models_console: RunningService) -> None:
    base = models_console.base_url
    waiting = httpx.post(f"{base}/v1/jobs", timeout=30, json={
        "model": "idle", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert waiting.status_code == 202, waiting.text
    browser.get(f"{base}/console#/overview")  # no keys: no sign-in
    row = "[data-testid=model][data-model='{}']".format
    until(lambda: (text(browser, row("idle")) or "").split("\t") == ["idle", "—", "0", "1", "0"],
          "idle's job queued")
    assert text(browser, row("twin")).split("\t") == ["twin", "fast", "1", "0", "0"]
    assert text(browser, row("tiny")).split("\t") == ["tiny", "—", "0", "0", "0"]
    workers = browser.find_elements(CSS, "[data-testid=worker]")
    assert [w.get_attribute("data-model") for w in workers] == ["twin"]
    assert text(browser, "[data-testid=queued]") == "1"  # every model's queue together

    go(browser, models_console, "playground")
    picker = "select[data-testid=model]"  # the overview's model rows share the test id

    def options() -> list[str] | None:
        from selenium.common.exceptions import StaleElementReferenceException  # as the browser: lazily

        try:  # the picker is drawn again once /v1/models answers: an element read now may go stale
            return [o.get_attribute("value") for o in browser.find_elements(CSS, f"{picker} option")]
        except StaleElementReferenceException:
            return None

    # GET /v1/models: names, then aliases
    until(lambda: options() == ["tiny", "twin", "idle", "fast"], "the model picker lists every model")
    assert '"model":"tiny"' in text(browser, "[data-testid=curl]")  # the default model first
    browser.find_element(CSS, f"{picker} option[value=twin]").click()
    until(lambda: '"model":"twin"' in text(browser, "[data-testid=curl]"), "the curl line names twin")
    browser.find_element(CSS, "[data-testid=send]").click()
    # Only twin has a worker: the request ends only if it went to twin's queue.
    until(lambda: text(browser, "[data-testid=state]") == "done", "twin's answer")
    assert int(text(browser, "[data-testid=tokens-count]") or 0) > 0
    assert httpx.delete(f"{base}/v1/jobs/{waiting.json()['id']}", timeout=30).status_code == 200


@pytest.fixture(autouse=True)
def _no_console_errors(browser: Any) -> Any:
    """No uncaught error in the page's console while a test ran."""
    yield
    # (An answer the page handles, such as the 401 before signing in or bob's 403, logs "Failed to
    # load resource": not an error of the page.)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"
              and "favicon" not in e["message"] and "Failed to load resource" not in e["message"]]
    assert not errors, errors
