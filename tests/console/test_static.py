"""The console's files: served by the api under /console with a policy that lets the page load
nothing from anywhere else (no CDN), and nothing else served from that folder."""

from __future__ import annotations

import re

import httpx

from conveyor.api.routes.console import FILES, STATIC
from tests.conftest import RunningService


def test_the_files_load_nothing_from_another_origin() -> None:
    assert {p.name for p in STATIC.iterdir()} == set(FILES)
    for name in FILES:
        source = (STATIC / name).read_text()
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", source), name
        assert "console.log" not in source and "localStorage" not in source, name  # the key stays put


def test_the_api_serves_the_console(console_service: RunningService) -> None:
    page = httpx.get(console_service.base_url + "/console", timeout=10)  # no key needed for the files
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="/console/main.js">' in page.text
    script = httpx.get(console_service.base_url + "/console/main.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for missing in ("/console/nope.js", "/console/..%2Fadmin.py", "/console/conftest.py"):
        assert httpx.get(console_service.base_url + missing, timeout=10).status_code == 404, missing
    overview = httpx.get(console_service.base_url + "/v1/console/overview", timeout=10)
    assert overview.status_code == 401  # the data needs a key
